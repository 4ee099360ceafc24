"""Packed runs against the same runs alone (``prge_lib.zo.packing``): run-steps per second of R ZO runs sharing
each forward, and of the same R runs each stepped by ``PRGE.step`` on a model of its own. A measurement to
repeat on a GPU, where one forward of R·2q·b rows should cost far less than R forwards of 2q·b rows.
"""
from __future__ import annotations

import statistics
from typing import Callable, Sequence

import torch

from prge_lib.common.measure import time_steps
from prge_lib.models.objective import Batch
from prge_lib.zo.lora import DEFAULT_TARGETS, inject_lorafa
from prge_lib.zo.packing import build_pack
from prge_lib.zo.prge import PRGE

RUN_DEFAULTS = {"targets": DEFAULT_TARGETS, "r": 16, "alpha": 32, "noise": "torch", "q": 4, "eps": 1e-2,
                "lr": 1e-3, "keep_noise": None}


def pack_vs_solo(make_model: Callable[[], torch.nn.Module], runs: Sequence[dict], batches: Sequence[Batch],
                 pad_id: int, steps: int = 3, warmup: int = 1) -> dict:
    """Time ``steps`` steps (after ``warmup``) of the R ``runs`` packed and of each run alone, on fresh models
    from ``make_model()``; ``runs[r]`` overrides :data:`RUN_DEFAULTS` and needs a ``seed``, ``batches[r]`` is run
    r's batch at every step (on the model's device). Returns median seconds per step and run-steps per second
    of both, and their ratio (``speedup``: how many times more run-steps per second the pack makes)."""
    if len(runs) != len(batches):
        raise ValueError(f"{len(runs)} runs but {len(batches)} batches: give one batch per run")
    settings = [{**RUN_DEFAULTS, **run} for run in runs]
    missing = [r for r, s in enumerate(settings) if "seed" not in s]
    if missing:
        raise ValueError(f"runs {missing} have no seed")
    model = make_model()
    cuda = next(model.parameters()).device.type == "cuda"
    pack = build_pack(model, settings, pad_id)
    every = {r: batches[r] for r in range(len(settings))}
    packed = statistics.median(time_steps(lambda t, pack=pack: pack.step({r: (b, t) for r, b in every.items()}),
                                          steps, warmup, cuda))
    del pack, model
    solo = 0.0
    for s, batch in zip(settings, batches):
        model = make_model()
        layers = inject_lorafa(model, s["targets"], s["r"], s["alpha"], seed=s["seed"], noise=s["noise"])
        alone = PRGE(model, layers, s["q"], s["eps"], s["lr"], s["seed"], keep_noise=s["keep_noise"])
        solo += statistics.median(time_steps(lambda t, alone=alone, batch=batch: alone.step(batch, t),
                                                    steps, warmup, cuda))
        del alone, layers, model
    count = len(settings)
    return {"runs": count, "packed_s_per_step": packed, "solo_s_per_step": solo,
            "packed_run_steps_per_s": count / packed, "solo_run_steps_per_s": count / solo,
            "speedup": solo / packed}
