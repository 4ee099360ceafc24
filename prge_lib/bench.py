"""Step time and peak memory of every method on synthetic full-length batches (Gao et al. §4.2, "standard
benchmark"; Tables 8, 13, Fig. 5 and 7; chapters 1, 3, 5, 6).

Each configuration gets a freshly loaded model. Timing: the median over ``repeats`` steps after ``warmup``
steps. Memory: the peak above the memory held once the loaded model has run one tiny forward (which pages
memory-mapped weights in) — on a CPU the process's
peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs``), on a GPU the CUDA allocator's peak.
Ratios between configurations are meaningful only within one run on one otherwise idle machine.
"""
from __future__ import annotations

import ctypes
import gc
import statistics
import time
from typing import Callable

import torch

from .objective import row_losses, synthetic_batch

CONFIGS = {
    # name: (family, outer, inner)
    "inference": ("inference", None, None),
    "fo": ("fo", None, None),
    "fo-lorafa": ("fo-lorafa", None, None),
    "mezo": ("mezo", None, None),
    "mezo-lorafa": ("prge", False, False),      # q = 1, the two forwards one after the other
    "prge-seq": ("prge", False, False),         # q queries, 2q forwards of B rows
    "prge-outer": ("prge", True, False),
    "prge-inner": ("prge", False, True),
    "prge": ("prge", True, True),
}


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)   # hand freed heap pages back, so RSS reflects live memory
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """Peak memory above the level at ``start()``, in MiB (CPU: resident set; CUDA: allocator)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def start(self) -> None:
        _release_memory()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return
        self.base = _status_kib("VmRSS")
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")           # resets VmHWM to the current resident set (Linux)
        except OSError:
            self.base = None

    def peak_mib(self) -> float | None:
        if self.cuda:
            torch.cuda.synchronize()
            return (torch.cuda.max_memory_allocated() - self.base) / 2**20
        top = _status_kib("VmHWM")
        return None if self.base is None or top is None else (top - self.base) / 1024


def time_steps(step: Callable[[int], object], repeats: int, warmup: int, cuda: bool) -> list[float]:
    times = []
    for t in range(warmup + repeats):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        step(t)
        if cuda:
            torch.cuda.synchronize()
        if t >= warmup:
            times.append(time.perf_counter() - start)
    return times


def _step_function(name: str, model, E: int, q: int, seq_len: int, eps: float, lr: float):
    """(step(t), rows per query, forwards per step) for configuration ``name``."""
    from .fo import FirstOrder
    from .lora import inject_lorafa
    from .prge import PRGE, MeZOFull

    family, outer, inner = CONFIGS[name]
    q = 1 if name in ("mezo-lorafa", "inference", "fo", "fo-lorafa") else q
    if E % q:
        raise ValueError(f"E = {E} must be a multiple of q = {q}")
    rows = E // q
    batch = synthetic_batch(rows, seq_len, model.config.vocab_size).to(next(model.parameters()).device)
    if family == "inference":
        def step(t):
            with torch.no_grad():
                row_losses(model, batch)
        return step, rows, 1
    if family in ("fo", "fo-lorafa"):
        method = FirstOrder(model, 1e-5, "adam", lorafa=family == "fo-lorafa")
        return (lambda t: method.step(batch, t)), rows, 1
    if family == "mezo":
        method = MeZOFull(model, q, eps, lr)
        return (lambda t: method.step(batch, t)), rows, 2 * q
    layers = inject_lorafa(model)
    method = PRGE(model, layers, q, eps, lr, outer=outer, inner=inner)
    forwards = (1 if outer else q) * (1 if inner else 2)
    return (lambda t: method.step(batch, t)), rows, forwards


def bench(load: Callable[[], object], names: list[str], E: int = 16, q: int = 4, seq_len: int = 64,
          repeats: int = 5, warmup: int = 1, eps: float = 1e-2, lr: float = 1e-9,
          progress: Callable[[str], None] = print) -> dict:
    """Benchmark ``names`` (keys of CONFIGS) one after another, each on a model from ``load()``.

    Also measures, on the first model: a plain forward of E and of 2E rows (the floor every ZO step is
    compared with) and one MeZO perturbation pass over all weights (t_perturb; Gao et al. App. A).
    """
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise ValueError(f"unknown benchmark configuration(s) {unknown}; choose from {list(CONFIGS)}")
    results, floor = {}, {}
    for name in ["forward"] + names:
        model = load()
        device = next(model.parameters()).device
        cuda = device.type == "cuda"
        with torch.no_grad():   # page every weight in (loaded weights may be memory-mapped) before the baseline
            row_losses(model, synthetic_batch(1, 4, model.config.vocab_size).to(device))
        meter = PeakMemory(device)
        meter.start()
        if name == "forward":
            from .rge import add_noise_
            params = [p for p in model.parameters() if p.dtype.is_floating_point]
            for rows in (E, 2 * E):
                batch = synthetic_batch(rows, seq_len, model.config.vocab_size).to(device)

                def forward(t, batch=batch):
                    with torch.no_grad():
                        row_losses(model, batch)
                floor[f"forward_{rows}_rows_s"] = statistics.median(time_steps(forward, repeats, warmup, cuda))
            floor["perturb_pass_s"] = statistics.median(time_steps(
                lambda t: add_noise_(params, t, 1e-9), repeats, warmup, cuda))
            floor["weights"] = sum(p.numel() for p in params)
            progress(f"floor: forward {E} rows {floor[f'forward_{E}_rows_s']:.3f} s, "
                     f"{2 * E} rows {floor[f'forward_{2 * E}_rows_s']:.3f} s, "
                     f"perturbation pass {floor['perturb_pass_s']:.3f} s")
        else:
            step, rows, forwards = _step_function(name, model, E, q, seq_len, eps, lr)
            times = time_steps(step, repeats, warmup, cuda)
            results[name] = {"median_s": statistics.median(times), "times_s": times, "rows_per_query": rows,
                             "forwards_per_step": forwards, "peak_mib": meter.peak_mib()}
            progress(f"{name}: {results[name]['median_s']:.3f} s/step, peak +{results[name]['peak_mib']:.0f} MiB")
        del model
        _release_memory()
    return {"floor": floor, "configs": results, "ratios": ratios(floor, results, E)}


def ratios(floor: dict, results: dict, E: int) -> dict:
    """The ratios the issue's targets are stated in, from one run."""
    out = {}
    f2e = floor.get(f"forward_{2 * E}_rows_s")
    if f2e:
        for name, r in results.items():
            out[f"{name}_over_forward_2E"] = r["median_s"] / f2e
        out["mezo_structural_limit"] = 1 + 4 * floor["perturb_pass_s"] / f2e
    for ref in ("mezo", "mezo-lorafa"):
        if ref in results and "prge" in results:
            out[f"{ref}_over_prge"] = results[ref]["median_s"] / results["prge"]["median_s"]
    if "mezo_over_prge" in out:
        out["share_of_structural_limit"] = out["mezo_over_prge"] / out["mezo_structural_limit"]
    return out
