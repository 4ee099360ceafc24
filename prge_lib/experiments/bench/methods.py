"""The method benchmarks: step time and peak memory of every method on synthetic full-length batches (Gao
et al. §4.2, "standard benchmark"; Tables 8, 13, Fig. 5 and 7; chapters 1, 3, 5, 6), measured with the
toolkit of :mod:`prge_lib.common.measure`.

Each configuration gets a fresh model (:class:`FreshModels`: loaded, or on a GPU copied from one untouched model
loaded once). Timing: the median over ``repeats`` rounds, each timing one
step after ``warmup`` steps (rounds interleave the configurations). Memory: the peak above the memory held
once the loaded model has run one tiny forward (which pages memory-mapped weights in), one fresh process per
configuration on a CPU, in this process on a GPU (:func:`step_peak`). Ratios between configurations are
meaningful only within one run on one otherwise idle machine.
"""
from __future__ import annotations

import copy
import json
import random
import statistics
import sys
from typing import Callable, Sequence

import torch

from prge_lib.data.splits import sample_task
from prge_lib.methods import registry
from prge_lib.zo.lora import inject_lorafa
from prge_lib.common.measure import PeakMemory, in_fresh_process, release_memory, time_steps
from prge_lib.zo.mezo import add_noise_
from prge_lib.models.loading import load_model
from prge_lib.models.objective import collate, encode_example, row_losses, synthetic_batch
from prge_lib.zo.rge import check_zo_settings
from prge_lib.data.tasks import get_task
from prge_lib.training.config import TrainConfig
from prge_lib.training.trainer import build_method
from prge_lib.training.records import step_times

FO_LR = 1e-5        # the first-order configurations' step size (any positive value times the same)
CONFIGS = {
    # name: (the registered method it builds, None for a plain forward; P-RGE's outer, inner: None for the
    # method's own, which for MeZO means 2q forwards in turn)
    "inference": (None, None, None),
    "fo": ("fo", None, None),
    "fo-lorafa": ("fo-lorafa", None, None),
    "mezo": ("mezo", None, None),
    "mezo-lorafa": ("mezo-lorafa", False, False),      # q = 1, the two forwards one after the other
    "prge-seq": ("prge", False, False),         # q queries, 2q forwards of B rows
    "prge-outer": ("prge", True, False),
    "prge-inner": ("prge", False, True),
    "prge": ("prge", True, True),               # the trainer's default: z kept for the update when it fits
    "prge-redraw": ("prge", True, True),        # z redrawn from the seeds for the update (nothing kept)
    "prge-fused": ("prge", True, True),         # the fused engine: counter noise for every layer in one draw
    "prge-graphs": ("prge", True, True),        # the fused step replayed as a CUDA graph (a GPU only)
}
# the engine settings of the configurations that do not run the per-layer step (chapter 5, "The GPU engine"); the
# synthetic batches have one length, so the graphed step's one bucket is the benchmark's sequence length
ENGINE_SETTINGS = {"prge-fused": {"noise": "counter", "engine": "fused"},
                   "prge-graphs": {"noise": "counter", "engine": "fused", "cuda_graphs": True}}


class FreshModels:
    """A fresh ``(model, tokenizer)`` for each configuration of a benchmark, as ``load_model(**spec)`` gives it.

    With ``copies`` (default: on a GPU, for weights that are not quantized) the model is loaded once and each call
    returns a deep copy of that untouched original: a copy on the device instead of a read from disk, a dtype
    conversion and a transfer (a ``runtime`` cell asks for about sixty models). The copy holds the same weights as
    a load, and no method's changes (LoRA-FA layers put in, weights perturbed in place) reach the original. Weights
    quantized by bitsandbytes are loaded afresh each time, as on the CPU, where a load maps the file and a copy
    would read it all."""

    def __init__(self, spec: dict, copies: bool | None = None):
        self.spec = dict(spec)
        if copies is None:
            copies = str(self.spec.get("device") or "cpu").startswith("cuda") and \
                self.spec.get("quant", "none") == "none"
        self.copies, self.original = copies, None

    def __call__(self):
        if not self.copies:
            return load_model(**self.spec)
        if self.original is None:
            self.original = load_model(**self.spec)
        model, tokenizer = self.original
        return copy.deepcopy(model), tokenizer


class BatchSource:
    """Batches for step t: one fixed synthetic full-length batch, or real training batches of a task drawn
    like the trainer does (a seeded sample each step, left-padded), which brings the task's padding in."""

    def __init__(self, vocab_size: int, seq_len: int, task: str | None = None, tokenizer=None, seed: int = 0,
                 device="cpu"):
        self.vocab_size, self.seq_len, self.seed, self.device = vocab_size, seq_len, seed, device
        self.items, self.pad_id = None, None
        if task is not None:

            spec = get_task(task)
            data = sample_task(spec, seed)
            self.items = [encode_example(spec, tokenizer, ex, seq_len) for ex in data.train]
            self.pad_id = tokenizer.pad_token_id
        self._fixed: dict[tuple[int, str], object] = {}

    def __call__(self, rows: int, t: int, device=None):
        """The batch of step ``t`` on ``device`` (default: the source's; a pack takes its runs' batches on the host
        and copies the assembled batch over once)."""
        device = self.device if device is None else device
        if self.items is None:
            if (rows, str(device)) not in self._fixed:
                self._fixed[rows, str(device)] = synthetic_batch(rows, self.seq_len, self.vocab_size).to(device)
            return self._fixed[rows, str(device)]

        picks = random.Random(self.seed * 1_000_003 + t).sample(range(len(self.items)), rows)
        return collate([self.items[i] for i in picks], self.pad_id).to(device)


def _step_function(name: str, model, E: int, q: int, source: BatchSource, eps: float, lr: float):
    """(step(t), rows per query, forwards per step) for configuration ``name`` with q queries: the method
    built as the trainer builds it (its defaults, seed 0), ZO ones with ``eps`` and ``lr``."""

    method_name, outer, inner = CONFIGS[name]
    rows = check_zo_settings(q, E)
    if method_name is None:
        def step(t):
            with torch.no_grad():
                row_losses(model, source(rows, t))
        return step, rows, 1
    if registry.get(method_name).family == "fo":
        config, forwards = TrainConfig("sst2", method=method_name, lr=FO_LR, batch_size=rows), 1
    else:
        loops = {} if outer is None else {"outer": outer, "inner": inner}
        keep_noise = False if name == "prge-redraw" else None       # None: the trainer's default
        config = TrainConfig("sst2", method=method_name, q=q, E=E, eps=eps, lr=lr, keep_noise=keep_noise, **loops,
                             **engine_settings(name, model, source.seq_len))
        forwards = 2 * q if outer is None else (1 if outer else q) * (1 if inner else 2)
    method = build_method(config.resolved(), model)
    return (lambda t: method.step(source(rows, t), t)), rows, forwards


def engine_settings(name: str, model, seq_len: int) -> dict:
    """The TrainConfig settings that put configuration ``name`` on its engine (:data:`ENGINE_SETTINGS`), with the
    model's device; {} for the per-layer step, which every other configuration times on any device. A graphed
    configuration off a GPU is refused, naming the device."""
    settings = ENGINE_SETTINGS.get(name)
    if settings is None:
        return {}
    device = next(model.parameters()).device
    if settings.get("cuda_graphs") and device.type != "cuda":
        raise ValueError(f"benchmark configuration {name!r} replays CUDA graphs: it needs --device cuda (the model is "
                         f"on {device}); prge-fused times the same step without graphs")
    return {**settings, "device": str(device), **({"buckets": str(seq_len)} if settings.get("cuda_graphs") else {})}


def _floor(model, E: int, source: BatchSource, warmup: int, cuda: bool, first: int) -> dict:
    """One timing each of: a plain forward of E and 2E rows, the same through LoRA-FA layers (B = 0, no
    copies), and one MeZO perturbation pass over every weight (t_perturb; Gao et al. App. A)."""

    params = [p for p in model.parameters() if p.dtype.is_floating_point]
    floor = {"weights": sum(p.numel() for p in params)}
    floor["perturb_pass_s"] = time_steps(lambda t: add_noise_(params, t, 1e-9), 1, warmup, cuda, first)[0]
    for label in ("forward", "lorafa_forward"):
        if label == "lorafa_forward":
            inject_lorafa(model)
        for rows in (E, 2 * E):
            def forward(t, rows=rows):
                with torch.no_grad():
                    row_losses(model, source(rows, t))
            floor[f"{label}_{rows}_rows_s"] = time_steps(forward, 1, warmup, cuda, first)[0]
    return floor


def configurations(names: Sequence[str], qs: Sequence[int]) -> list[tuple[str, tuple[str, int]]]:
    """(key, (name, q)) for each configuration :func:`bench` measures: P-RGE names once per q in ``qs``
    (keyed "prge@q4" when there are several), every other name once with q = 1."""
    runs = []
    for name in names:
        per_q = name.startswith("prge")
        for q in (qs if per_q else (1,)):
            runs.append((f"{name}@q{q}" if per_q and len(qs) > 1 else name, (name, q)))
    return runs


def bench(model: dict, names: list[str], E: int = 16, qs: tuple[int, ...] = (4,),
          seq_len: int = 64, repeats: int = 5, warmup: int = 1, eps: float = 1e-2, lr: float = 1e-9,
          task: str | None = None, peaks: bool = True, progress: Callable[[str], None] = print,
          copies: bool | None = None) -> dict:
    """Benchmark ``names`` (keys of CONFIGS), each on a fresh model as ``load_model(**model)`` gives it
    (:class:`FreshModels`; ``copies``: copied from one load, by default on a GPU).

    P-RGE configurations run once per q in ``qs`` (keys "prge@q4" when several q are given); inference,
    FO and MeZO (Full) use q = 1, B = E, as in the paper; "mezo-lorafa" is P-RGE with q = 1. The floor
    (see :func:`_floor`) is measured alongside. The work runs in ``repeats`` rounds; each round loads every
    configuration afresh, warms it up and times one step, so a machine whose speed drifts during the run
    biases no configuration against another; the median over rounds is reported. Peak memory is measured
    afterwards, per configuration (:func:`step_peak`). Without ``peaks`` each configuration's ``peak_mib`` is
    None (step times only).
    With ``task`` the batches are real training batches.
    """

    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise ValueError(f"unknown benchmark configuration(s) {unknown}; choose from {list(CONFIGS)}")

    runs = [("floor", None)] + configurations(names, qs)
    times: dict[str, list[float]] = {key: [] for key, _ in runs}
    floors: list[dict] = []
    shape: dict[str, tuple[int, int]] = {}
    source = None       # built once, from the first model loaded (its vocabulary, tokenizer and device)
    fresh = FreshModels(model, copies)
    for round_ in range(repeats):
        first = round_ * (warmup + 1)     # real batches differ from round to round
        for key, spec in runs:
            net, tokenizer = fresh()
            device = next(net.parameters()).device
            cuda = device.type == "cuda"
            if source is None:
                source = BatchSource(net.config.vocab_size, seq_len, task, tokenizer, device=device)
            if spec is None:
                floors.append(_floor(net, E, source, warmup, cuda, first))
                step = None
            else:
                name, q = spec
                step, rows, forwards = _step_function(name, net, E, q, source, eps, lr)
                times[key] += time_steps(step, 1, warmup, cuda, first)
                shape[key] = (rows, forwards)
            del net, step
            release_memory()
        progress(f"round {round_ + 1}/{repeats}: " + ", ".join(
            f"{key} {times[key][-1]:.2f} s" for key, spec in runs if spec is not None))
    floor = {k: statistics.median(f[k] for f in floors) for k in floors[0]}
    results = {}
    for key, spec in runs:
        if spec is None:
            continue
        peak = step_peak(model, spec[0], E, spec[1], seq_len, warmup, task, eps, lr, fresh) if peaks else None
        results[key] = {"config": spec[0], "q": spec[1], "rows_per_query": shape[key][0],
                        "forwards_per_step": shape[key][1], "step_s": step_times(times[key]),
                        "peak_mib": peak}
        peak = results[key]["peak_mib"]
        progress(f"{key}: {results[key]['step_s']['median']:.3f} s/step" +
                 ("" if peak is None else f", peak {peak:+.0f} MiB above the loaded model"))
    return {"floor": floor, "floor_rounds": floors, "configs": results, "ratios": ratios(floor, results, E)}


def step_peak(model: dict, name: str, E: int, q: int, seq_len: int, warmup: int, task: str | None, eps: float,
              lr: float, fresh: FreshModels | None = None) -> float | None:
    """Peak memory (MiB above the loaded model) of ``warmup`` + 1 steps of ``name``. On a CPU in a fresh process
    (:func:`peak_in_subprocess`): within one long process the heap keeps memory freed by earlier configurations
    resident and hides later peaks. On a GPU in this process: the CUDA allocator's peak, reset at the start,
    counts the bytes of live tensors only, whatever the allocator keeps cached, and a fresh process would cost
    a start, imports and a CUDA context per configuration; the model comes from ``fresh`` where given (the
    benchmark's :class:`FreshModels`, whose original is held before the peak's start and so not counted)."""
    if str(model.get("device") or "cpu").startswith("cuda"):
        release_memory()
        return _measure_peak({"model": model, "name": name, "E": E, "q": q, "seq_len": seq_len, "warmup": warmup,
                              "task": task, "eps": eps, "lr": lr}, fresh)
    return peak_in_subprocess(model, name, E, q, seq_len, warmup, task, eps, lr)


def peak_in_subprocess(model: dict, name: str, E: int, q: int, seq_len: int, warmup: int,
                       task: str | None, eps: float, lr: float) -> float | None:
    """Peak memory (MiB above the loaded model) of ``warmup`` + 1 steps of ``name``, in a fresh process."""
    job = {"model": model, "name": name, "E": E, "q": q, "seq_len": seq_len, "warmup": warmup, "task": task,
           "eps": eps, "lr": lr}
    return in_fresh_process("prge_lib.experiments.bench.methods", job, f"memory measurement of {name!r}", live_memory=True)["peak_mib"]


def _measure_peak(job: dict, fresh: FreshModels | None = None) -> float | None:

    model, tokenizer = (fresh or FreshModels(job["model"], copies=False))()
    device = next(model.parameters()).device
    source = BatchSource(model.config.vocab_size, job["seq_len"], job["task"], tokenizer, device=device)
    with torch.no_grad():   # page every weight in (weights may be memory-mapped) before the baseline
        row_losses(model, synthetic_batch(1, 4, model.config.vocab_size).to(device))
    meter = PeakMemory(device)
    meter.start()
    step, _, _ = _step_function(job["name"], model, job["E"], job["q"], source, job["eps"], job["lr"])
    time_steps(step, 1, job["warmup"], device.type == "cuda")
    return meter.peak_mib()


def ratios(floor: dict, results: dict, E: int) -> dict:
    """The ratios the performance claims are stated in, all from one run."""
    out = {}
    for label in ("forward", "lorafa_forward"):
        reference = floor.get(f"{label}_{2 * E}_rows_s")
        if reference:
            for name, r in results.items():
                out[f"{name}_over_{label}_2E"] = r["step_s"]["median"] / reference
    if floor.get(f"forward_{2 * E}_rows_s"):
        out["mezo_structural_limit"] = 1 + 4 * floor["perturb_pass_s"] / floor[f"forward_{2 * E}_rows_s"]
    prge = [k for k in results if results[k]["config"] == "prge"]
    main = next((k for k in prge if results[k]["q"] == 4), prge[0] if prge else None)
    for ref in ("mezo", "mezo-lorafa"):
        if ref in results and main:
            out[f"{ref}_over_{main}"] = results[ref]["step_s"]["median"] / results[main]["step_s"]["median"]
    if main and "mezo" in results and "mezo_structural_limit" in out:
        out["share_of_structural_limit"] = out[f"mezo_over_{main}"] / out["mezo_structural_limit"]
    # Table 8's question for each step measured at several q: slowest ÷ fastest q, less 1 (flat would be 0)
    for config in dict.fromkeys(r["config"] for r in results.values() if r["config"].startswith("prge")):
        times = [r["step_s"]["median"] for r in results.values() if r["config"] == config]
        if len(times) > 1:
            out[f"{config.replace('-', '_')}_spread_over_q"] = max(times) / min(times) - 1
    return out


if __name__ == "__main__":     # the worker behind peak_in_subprocess
    print(json.dumps({"peak_mib": _measure_peak(json.loads(sys.argv[1]))}))
