"""What each training method costs on the device: the memory it holds, the peak of a step above that, and
the time per step, with every method built exactly as the trainer builds it (chapter 9's closing comparison
of FO, MeBP, MeZO, P-RGE and SensZOQ; seed 004 Table 3 and Gao et al. Fig. 7 measure the same way).

All methods see the same number of prompts per step: ``rows`` synthetic full-length sequences of ``seq_len``
tokens with one answer token (Gao et al.'s standard benchmark). ZO methods use E = rows: MeZO and SensZOQ
evaluate all ``rows`` prompts at each of ±ε; P-RGE takes B = rows / 4 prompts, as the trainer does, and its four
queries and two signs make 2E rows in one forward. FO methods take a batch of ``rows``. SensZOQ uses a random mask: the mask's kind changes neither memory nor time,
and a C4 mask would need minutes of gradients first.

Each method runs in fresh processes. ``held_mib``: the resident memory the method keeps between steps (model,
adapter or sparse values, optimizer state) above the process before loading; ``step_peak_mib``: the peak of
one step above that, metered in a second fresh process whose allocator is pinned from the start
(:func:`prge_lib.common.measure.timed_and_metered`: metering slows steps, so the times come from the first); ``total_mib``: their sum, what a device must have free. The loaded weights are
copied into the process's own memory first, so they count as its memory rather than as pages of the cached
model file. Times compare only within one run on one otherwise idle machine.
"""
from __future__ import annotations

import json
import sys
from typing import Callable, Sequence

import torch

from prge_lib.common.measure import PeakMemory, held_mib, time_steps, timed_and_metered
from prge_lib.models.loading import load_model
from prge_lib.models.options import QUANT_MODES
from prge_lib.models.objective import synthetic_batch
from prge_lib.methods import registry
from prge_lib.training.config import TrainConfig
from prge_lib.training.trainer import build_method
from prge_lib.training.records import step_times

COMPARED = ("fo-lorafa", "mebp", "mezo", "prge", "senszoq")     # the default selection; any registered method runs


def parse_spec(spec: str) -> tuple[str, dict]:
    """``method`` or ``method:quant`` (e.g. ``fo-lorafa:nf4``: plain backprop over an NF4 base, the baseline
    MeBP is compared with in seed 004 Table 3) → (method, settings)."""
    method, _, quant = spec.partition(":")
    if method not in registry.names():
        raise ValueError(f"unknown method {method!r} in {spec!r}; choose from {list(registry.names())}")
    if quant and quant not in QUANT_MODES:
        raise ValueError(f"unknown quantization {quant!r} in {spec!r}; choose from {list(QUANT_MODES)}")
    return method, ({"quant": quant} if quant else {})


def method_config(method: str, rows: int, **settings) -> TrainConfig:
    """The training settings ``method`` is measured with: its defaults, E or batch size = ``rows``, and a random
    mask for a method that takes one."""
    spec = registry.get(method)
    shape = {"E": rows} if spec.family == "zo" else {"batch_size": rows}
    if "mask" in spec.uses:
        shape["mask"] = "random"
    return TrainConfig("sst2", method=method, **{**shape, **settings}).resolved()


def measure_method(spec: str, seq_len: int = 64, rows: int = 16, steps: int = 2, warmup: int = 1,
                   device: str = "cpu", meter: bool = False) -> dict:
    """Held memory and step time of ``spec`` (see :func:`parse_spec`) in this process, or with ``meter`` held
    memory and the peak of one step after the warm-up (the two workers of :func:`footprint`)."""
    method, settings = parse_spec(spec)
    dev = torch.device(device)
    config = method_config(method, rows, device=device, **settings)
    before = held_mib(dev)
    quant = registry.get(method).load_quant(config.quant)
    model, tokenizer = load_model(config.model, dtype=config.dtype, quant=quant, device=device)
    with torch.no_grad():
        for param in model.parameters():
            param.data = param.data.clone()
    built = build_method(config, model, tokenizer)
    batch = synthetic_batch(config.batch_size, seq_len, model.config.vocab_size).to(dev)   # as the trainer feeds it
    step: Callable[[int], dict] = lambda t: built.step(batch, t)     # noqa: E731
    time_steps(step, 0, warmup, dev.type == "cuda")
    row = {"method": spec, "seq_len": seq_len, "rows": rows, "batch_rows": batch.rows, "quant": config.quant,
           "trainable": sum(p.numel() for p in built.trainable().values()),
           "held_mib": round(held_mib(dev) - before, 1), "threads": torch.get_num_threads()}
    if meter:
        peak_meter = PeakMemory(dev)
        peak_meter.start()
        step(warmup)
        peak = peak_meter.peak_mib()
        return {**row, "step_peak_mib": None if peak is None else round(peak, 1)}
    times = time_steps(step, steps, 0, dev.type == "cuda", first=warmup)
    return {**row, "step_s": step_times(times, digits=3)}


def footprint(methods: Sequence[str] = COMPARED, seq_len: int = 64, rows: int = 16, steps: int = 2,
              warmup: int = 1, device: str = "cpu", progress: Callable[[str], None] = print) -> list[dict]:
    """:func:`measure_method` for each of ``methods`` (specs, :func:`parse_spec`): timed in one fresh process,
    metered in another (:func:`prge_lib.common.measure.timed_and_metered`)."""
    for spec in methods:
        parse_spec(spec)
    rows_out = []
    for method in methods:
        job = {"spec": method, "seq_len": seq_len, "rows": rows, "steps": steps, "warmup": warmup,
               "device": device}
        row = timed_and_metered(__name__, job, f"footprint of {method}")
        peak = row["step_peak_mib"]
        row["total_mib"] = None if peak is None else round(row["held_mib"] + peak, 1)
        progress(f"{method}: held {row['held_mib']:.0f} MiB, step peak {row['step_peak_mib']} MiB, "
                 f"{row['step_s']['median']:.2f} s/step")
        rows_out.append(row)
    return rows_out


if __name__ == "__main__":     # the worker behind footprint()
    print(json.dumps(measure_method(**json.loads(sys.argv[1]))))
