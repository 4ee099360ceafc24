"""The exported training program beside eager P-RGE at identical shapes: step time, memory of the process,
and where the runtime spends a step (chapter 10).

A program has fixed shapes, so the host pads every batch to the exported width, while the eager trainer pads
each batch only to its own longest row. Comparing a runtime run with an eager training run therefore mixes two
things; here both sides get the same random batch of the program's shapes. Each side runs in a fresh process
(``python -m prge_lib.experiments.bench.program``) so that its memory is its own. Memory is the resident set: after loading
(Python, torch and the weights or the program included) and the peak of a step above that level, metered in a
second process whose allocator is pinned from the start (:func:`prge_lib.common.measure.timed_and_metered`). On a phone the C++ runtime needs neither Python nor torch, so the load
figure is an upper bound there.
"""
from __future__ import annotations

import collections
import json
import sys
import tempfile
import time
import warnings

import torch

from prge_lib.deploy.export import read_program_meta
from prge_lib.zo.lora import inject_lorafa
from prge_lib.common.measure import PeakMemory, status_kib, time_steps, timed_and_metered
from prge_lib.models.loading import load_model, truncate_layers
from prge_lib.deploy.program import TrainStep
from prge_lib.deploy.runtime import RuntimeStep
from prge_lib.training.records import step_times


def program_inputs(settings: dict, seed: int = 0) -> list:
    """A batch of the program's shapes (random tokens, no padding), a small random adapter and step seeds."""
    gen = torch.Generator().manual_seed(seed)
    rows, width, answer = settings["rows"], settings["seq_len"], settings["target_width"]
    vocab = 1000                   # token ids below any real vocabulary's size; their values do not change timing
    return [torch.randint(1, vocab, (rows, width), generator=gen),
            torch.ones(rows, width, dtype=torch.long),
            torch.randint(1, vocab, (rows, answer), generator=gen),
            1e-3 * torch.randn(settings["adapter_size"], generator=gen),
            torch.arange(settings["q"], dtype=torch.int64),
            torch.tensor(1e-3), torch.tensor(1e-2)]


def _eager_step(settings: dict):

    net, _ = load_model(settings["model"], dtype=settings.get("dtype", "fp32"))
    if settings["truncated"]:
        truncate_layers(net, settings["layers"])
    inject_lorafa(net, tuple(settings["targets"]), settings["r"], settings["alpha"], seed=settings["seed"],
                  noise="counter")
    return TrainStep(net, settings["q"])


def _measure(job: dict) -> dict:
    """In a fresh process: load one side, then time ``repeats`` steps after ``warmup``, or with ``meter``
    the peak of one step after the first."""

    torch.set_grad_enabled(False)
    settings = read_program_meta(job["pte"])["settings"]
    inputs = program_inputs(settings)
    before = status_kib("VmRSS")
    start = time.perf_counter()
    step = RuntimeStep(job["pte"]) if job["side"] == "runtime" else _eager_step(settings)
    load_s = time.perf_counter() - start
    step(*inputs)                                  # first call: pages the weights in, plans memory
    loaded = status_kib("VmRSS")
    row = {"load_s": load_s, "resident_before_load_mib": before / 1024 if before else None,
           "resident_after_first_step_mib": loaded / 1024 if loaded else None}
    if job.get("meter"):
        meter = PeakMemory(torch.device("cpu"))
        meter.start()
        step(*inputs)
        return {**row, "peak_during_steps_mib": meter.peak_mib()}
    times = time_steps(lambda t: step(*inputs), job["repeats"], job["warmup"], cuda=False)
    return {**row, "step_s": step_times(times)}


def measure(pte, side: str, repeats: int = 5, warmup: int = 1) -> dict:
    """Step time and memory of ``side`` ("runtime": the .pte in the ExecuTorch runtime; "eager": the same
    step as a PyTorch module): timed in one fresh process, the peak metered in another
    (:func:`prge_lib.common.measure.timed_and_metered`)."""
    if side not in ("runtime", "eager"):
        raise ValueError(f"side must be 'runtime' or 'eager', got {side!r}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    job = {"pte": str(pte), "side": side, "repeats": repeats, "warmup": warmup}
    return timed_and_metered("prge_lib.experiments.bench.program", job, f"measuring the {side} step of {pte}")


def compare(pte, repeats: int = 5, warmup: int = 1) -> dict:
    """Both sides, one after the other, and the eager/runtime step-time ratio (> 1: the runtime is faster)."""
    runtime = measure(pte, "runtime", repeats, warmup)
    eager = measure(pte, "eager", repeats, warmup)
    return {"runtime": runtime, "eager": eager, "eager_over_runtime": eager["step_s"]["median"] / runtime["step_s"]["median"]}


def profile(pte, steps: int = 2, workdir=None) -> dict:
    """Where the runtime spends a step, from its ETDump trace: milliseconds per step in XNNPACK-delegated
    work and in operators run by the portable kernels, and the largest entries of each."""
    from pathlib import Path

    from executorch.devtools import Inspector

    inputs = program_inputs(read_program_meta(pte)["settings"])
    step = RuntimeStep(pte, etdump=True)
    with torch.no_grad():
        for _ in range(steps):
            step(*inputs)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        trace = Path(tmp) / "trace.etdp"
        step.program.write_etdump_result_to_file(str(trace), str(Path(tmp) / "debug.bin"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # "no debug buffer": we record timings only
            inspector = Inspector(etdump_path=str(trace))
    totals = collections.Counter()
    for block in inspector.event_blocks:
        if block.name != "Execute":
            continue
        for event in block.events:
            if event.perf_data is not None:
                totals[event.name] += sum(event.perf_data.raw) / steps
    portable = collections.Counter({name.removeprefix("native_call_"): ms for name, ms in totals.items()
                                    if name.startswith("native_call_")})
    delegated = collections.Counter()
    for name, ms in totals.items():        # XNNPACK's own events: "Fully Connected (NC, F32) GEMM #1", ...
        if name not in ("Method::execute", "DELEGATE_CALL", "OPERATOR_CALL") and \
                not name.startswith("native_call_"):
            delegated[name.split(" #")[0]] += ms
    return {"steps": steps, "step_ms": totals["Method::execute"],
            "delegated_ms": totals["DELEGATE_CALL"], "portable_ms": totals["OPERATOR_CALL"],
            "delegated_top": dict(delegated.most_common(8)), "portable_top": dict(portable.most_common(12))}


if __name__ == "__main__":     # the worker behind measure()
    print(json.dumps(_measure(json.loads(sys.argv[1]))))
