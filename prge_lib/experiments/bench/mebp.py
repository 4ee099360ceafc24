"""Peak memory and step time of MeBP against plain backpropagation (seed 004 Tables 1–3; chapter 9).

Configurations, all training LoRA (A and B, r 16, α 32, on every projection) with Adam on WikiText-2
language modelling (every next token scored, :func:`prge_lib.methods.mebp.lm_batches`):

    fo-lora      plain autograd over the whole model, fp32 base
    fo-lora-nf4  plain autograd, NF4 base dequantized at each matmul (autograd keeps every dequantized
                 weight for the backward: the whole fp32 base comes back during a step)
    mebp         MeBP, NF4 base (prge_lib.methods.mebp)
    mebp-fp32    MeBP, fp32 base (checkpointing without quantization)

Each configuration runs in two fresh processes (:func:`prge_lib.common.measure.timed_and_metered`): ``held_mib`` is the
memory the loaded model, its adapter and Adam's state hold after one warm-up step, above the process before
loading (``tensors_mib``: the bytes of its tensors, NF4 and Adam's state included); ``step_peak_mib`` the peak
of one step above that, metered in a second fresh process pinned from the start
(:func:`prge_lib.common.measure.timed_and_metered`); ``total_mib`` their sum. MeBP rows
add the share of the forward pass spent dequantizing and of the backward pass dequantizing and reading
checkpoints (seed 004 Table 2). Times compare only within one run on one otherwise idle machine.
"""
from __future__ import annotations

import json
import statistics
import sys
from typing import Sequence

import torch

from prge_lib.common.measure import PeakMemory, held_mib, time_steps, timed_and_metered
from prge_lib.methods.mebp import PHASES, MeBP, add_lazy_lora, lm_batches
from prge_lib.models.objective import row_losses

CONFIGS = {"fo-lora": ("plain", "none"), "fo-lora-nf4": ("plain", "nf4"), "mebp": ("mebp", "nf4"),
           "mebp-fp32": ("mebp", "none")}


class PlainLoRA:
    """The baseline: MeBP's LoRA layers, trained by ordinary ``loss.backward()`` through the whole model."""

    def __init__(self, model, lr: float, quant: str, seed: int = 0):
        add_lazy_lora(model, quant, seed=seed)
        self.model = model.eval()
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.optimizer = torch.optim.Adam(list(self.params.values()), lr=lr)

    def step(self, batch, t: int) -> dict:
        loss = row_losses(self.model, batch).mean()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": float(loss.detach()), "finite": True}


def measure_config(config: str, seq_len: int, batch_size: int, steps: int = 2, warmup: int = 1,
                   device: str = "cpu", lr: float = 1e-4, meter: bool = False) -> dict:
    """One configuration in this process: held memory and step times, or with ``meter`` held memory and the
    peak of one step after the warm-up (the two workers of :func:`mebp_memory_and_time`)."""
    from prge_lib.models.loading import load_model

    if config not in CONFIGS:
        raise ValueError(f"unknown configuration {config!r}; choose one of {list(CONFIGS)}")
    dev = torch.device(device)
    before = held_mib(dev)
    model, tokenizer = load_model(device=device)
    with torch.no_grad():   # private copies: the weights then count as this process's memory, not as pages
        for param in model.parameters():        # of the cached file that the embedding keeps mapped
            param.data = param.data.clone()
    batch = lm_batches(tokenizer, seq_len, batch_size, n_batches=1)[0].to(dev)
    family, quant = CONFIGS[config]
    method = MeBP(model, lr, quant=quant) if family == "mebp" else PlainLoRA(model, lr, quant)
    losses = []
    time_steps(lambda t: losses.append(method.step(batch, t)["loss"]), 0, warmup, dev.type == "cuda")
    held = held_mib(dev) - before
    tensors = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    tensors += sum(layer.nf4.nbytes() for layer in model.modules() if getattr(layer, "nf4", None) is not None)
    tensors += sum(v.numel() * v.element_size() for state in method.optimizer.state.values()
                   for v in state.values() if torch.is_tensor(v))
    row = {"config": config, "seq_len": seq_len, "batch_size": batch_size, "held_mib": round(held, 1),
           "tensors_mib": round(tensors / 2**20, 1)}
    if meter:
        peak_meter = PeakMemory(dev)
        peak_meter.start()
        method.step(batch, warmup)
        peak = peak_meter.peak_mib()
        return {**row, "step_peak_mib": None if peak is None else round(peak, 1)}
    if family == "mebp":
        method.times = dict.fromkeys(PHASES, 0.0)
    times = time_steps(lambda t: losses.append(method.step(batch, t)["loss"]), steps, 0, dev.type == "cuda",
                       first=warmup)
    row.update(step_s=round(statistics.median(times), 3), losses=[round(x, 4) for x in losses])
    if family == "mebp":
        t = method.times
        forward = t["forward"] + t["dequantize_forward"] + t["write"]
        backward = t["read"] + t["dequantize_backward"] + t["recompute_backward"]
        row["phases_s"] = {k: round(v / steps, 4) for k, v in t.items()}
        row["dequantize_share_forward"] = round(t["dequantize_forward"] / forward, 3)
        row["dequantize_share_backward"] = round(t["dequantize_backward"] / backward, 3)
        row["read_share_backward"] = round(t["read"] / backward, 3)
        row["write_share_forward"] = round(t["write"] / forward, 3)
        row["head_share_step"] = round(t["head"] / sum(t.values()), 3)
    return row


def mebp_memory_and_time(configs: Sequence[str] = ("fo-lora", "fo-lora-nf4", "mebp"),
                         seq_lens: Sequence[int] = (128, 512), batch_size: int = 1, steps: int = 2,
                         warmup: int = 1, device: str = "cpu", fresh: bool = True) -> list[dict]:
    """Peak memory and time per step of each configuration at each sequence length, on the embedded
    SmolLM2-135M; each one in a fresh process unless ``fresh`` is False (memory then less meaningful, and
    this process's later steps slower: see :class:`prge_lib.common.measure.PeakMemory`)."""
    rows = []
    for seq_len in seq_lens:
        for config in configs:
            job = {"config": config, "seq_len": seq_len, "batch_size": batch_size, "steps": steps,
                   "warmup": warmup, "device": device}
            if fresh:
                row = timed_and_metered(__name__, job, f"MeBP benchmark {config} at {seq_len} tokens")
            else:   # time first: metering pins this process's allocator, which slows what follows
                timed = measure_config(**job)
                row = {**measure_config(**job, meter=True), **timed}
            peak = row["step_peak_mib"]
            rows.append({**row, "total_mib": None if peak is None else round(row["held_mib"] + peak, 1)})
    return rows


if __name__ == "__main__":
    print(json.dumps(measure_config(**json.loads(sys.argv[1]))))
