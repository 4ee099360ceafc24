"""The per-layer P-RGE step against the fused one (``prge_lib.zo.fused``): median seconds per step of
``PRGE.step`` (z drawn per layer and seed, redrawn for the update or kept) and of ``FusedPRGE.step`` (one draw
for the whole step, one update) on fresh copies of one model with counter noise. A measurement to repeat on a
GPU, where the per-layer step's thousands of small launches and its host reads cost the most.
"""
from __future__ import annotations

import statistics
from typing import Callable

import torch

from prge_lib.common.measure import time_steps
from prge_lib.models.objective import Batch
from prge_lib.zo.fused import FusedPRGE
from prge_lib.zo.lora import DEFAULT_TARGETS, inject_lorafa
from prge_lib.zo.prge import PRGE


def per_layer_vs_fused(make_model: Callable[[], torch.nn.Module], batch: Batch, q: int = 4, eps: float = 1e-2,
                       lr: float = 1e-3, r: int = 16, steps: int = 5, warmup: int = 1, seed: int = 0) -> dict:
    """Time ``steps`` steps (after ``warmup``) of each step kind on a fresh model from ``make_model()`` with
    LoRA-FA (rank ``r``, counter noise) on the default targets; ``batch`` is on the model's device. Returns
    median seconds per step of each (``per_layer_redraw_s``, ``per_layer_kept_s``, ``fused_s``), the adapter
    size and the speed-up of the fused step over the faster per-layer one."""
    kinds = {"per_layer_redraw_s": lambda m, ls: PRGE(m, ls, q, eps, lr, seed, keep_noise=False),
             "per_layer_kept_s": lambda m, ls: PRGE(m, ls, q, eps, lr, seed, keep_noise=True),
             "fused_s": lambda m, ls: FusedPRGE(m, ls, q, eps, lr, seed)}
    result: dict = {"q": q, "rows": batch.rows}
    for name, build in kinds.items():
        model = make_model()
        layers = inject_lorafa(model, DEFAULT_TARGETS, r, seed=seed, noise="counter")
        method = build(model, layers)
        cuda = next(model.parameters()).device.type == "cuda"
        result[name] = statistics.median(time_steps(lambda t, method=method: method.step(batch, t),
                                                    steps, warmup, cuda))
        result["layers"], result["adapter_size"] = len(layers), sum(layer.lora_B.numel() for layer in layers)
        del method, layers, model
    result["speedup"] = min(result["per_layer_redraw_s"], result["per_layer_kept_s"]) / result["fused_s"]
    return result
