"""First-order data parallelism's traffic, measured (chapter 11): PyTorch DDP on the same workers, a few
forward/backward passes, every gradient bucket it all-reduces counted by a communication hook.

First-order data parallelism all-reduces every trainable gradient each step: d floats (2.49 M for SmolLM2's
LoRA-FA adapter, 134.5 M for the full model) where data-parallel P-RGE sends q + 1. The hook counts the buckets
DDP actually hands to the all-reduce (:class:`prge_lib.distributed.wire.Wire`, tally ``ddp-<space>``), so the
figure is a measurement of DDP, not of our arithmetic. Nothing is updated: the passes only make gradients.
"""
from __future__ import annotations

import inspect
import warnings

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from prge_lib.distributed.wire import Wire
from prge_lib.models.objective import Batch, row_losses

SPACES = ("lora-fa", "full")      # LoRA-FA's B matrices, or every weight of the base model


def trainable_in(model: torch.nn.Module, space: str) -> list[torch.nn.Parameter]:
    """The parameters first-order training of ``space`` updates: the LoRA-FA B's, or every other weight."""
    if space not in SPACES:
        raise ValueError(f"unknown parameter space {space!r}; choose one of {list(SPACES)}")
    return [p for n, p in model.named_parameters() if n.endswith("lora_B") == (space == "lora-fa")]


def ddp_bytes_per_step(model: torch.nn.Module, batch: Batch, space: str, wire: Wire, steps: int = 2) -> dict:
    """Bytes one worker hands to DDP's gradient all-reduce per step when training ``space`` of ``model`` with
    backprop on its share of ``batch`` (rows rank, rank + N, …), over ``steps`` passes. The model is left as it was
    (its requires_grad flags restored, no gradients kept)."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    chosen = {id(p) for p in trainable_in(model, space)}
    flags = {id(p): p.requires_grad for p in model.parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) in chosen)
    tally = f"ddp-{space}"
    before = wire.sent[tally]

    def counted_allreduce(state, bucket):
        wire.count(tally, bucket.buffer())
        return default_hooks.allreduce_hook(None, bucket)

    device = next(model.parameters()).device
    # the replicas are identical already (the workers' hashes say so): DDP need not send the weights and buffers
    # from rank 0 at the start (init_sync, where this torch has it) nor the frozen buffers (LoRA-FA's A, RoPE) at
    # each forward (broadcast_buffers; its newer spelling would still send them once: its deprecation note)
    extra = {"init_sync": False} if "init_sync" in inspect.signature(DistributedDataParallel).parameters else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        ddp = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None,
                                      broadcast_buffers=False, gradient_as_bucket_view=True, **extra)
    ddp.register_comm_hook(None, counted_allreduce)
    rows = list(range(wire.rank, batch.rows, wire.size)) or [0]
    part = Batch(batch.input_ids[rows], batch.attention_mask[rows], batch.targets[rows])
    try:
        for _ in range(steps):
            row_losses(ddp, part).mean().backward()
            for p in model.parameters():
                p.grad = None
    finally:
        del ddp
        for p in model.parameters():
            p.requires_grad_(flags[id(p)])
            p.grad = None
    return {"space": space, "trainable_parameters": sum(p.numel() for p in model.parameters() if id(p) in chosen),
            "steps": steps, "bytes_per_step": (wire.sent[tally] - before) / steps,
            "counted": "gradient buckets handed to DDP's all-reduce (communication hook)"}
