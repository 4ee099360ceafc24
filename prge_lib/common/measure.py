"""The measuring toolkit behind every benchmark: wall time of steps, peak memory (CPU resident set or CUDA
allocator), and a measurement in a fresh process (chapters 1, 3, 5, 6, 10).

Memory on a CPU is the process's resident set: its high-water mark (``VmHWM``, reset through
``/proc/self/clear_refs``) combined with a thread sampling it every millisecond; on a GPU the CUDA
allocator's peak. Ratios of times are meaningful only within one run on one otherwise idle machine.
"""
from __future__ import annotations

import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Callable

import torch


def status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)   # hand freed heap pages back, so RSS reflects live memory
    except (OSError, AttributeError):
        pass


def held_mib(device: torch.device) -> float:
    """Memory held now (MiB): the CUDA allocator's, or the process's resident set after a trim."""
    release_memory()
    if device.type == "cuda":
        return torch.cuda.memory_allocated() / 2**20
    return (status_kib("VmRSS") or 0) / 1024


M_MMAP_THRESHOLD = -3          # mallopt parameter (glibc malloc.h)
PINNED_THRESHOLD = 128 * 1024  # glibc's initial threshold, kept from then on


def pin_mmap_threshold(nbytes: int = PINNED_THRESHOLD) -> bool:
    """Serve every block of ``nbytes`` or more from its own mapping, returned to the system when freed
    (for the rest of the process: glibc has no way back to its dynamic threshold).

    glibc raises its mmap threshold each time a mapped block is freed, after which large tensors come from
    the heap, whose freed holes stay resident: the resident set then counts memory no tensor holds (measured:
    FO on LoRA-FA, E 16, L 64: 2040 MiB above the model by default, 995 MiB pinned). Setting the threshold
    turns the raise off, so the resident set follows the live tensors. False where there is no glibc."""
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, int(nbytes)))
    except (OSError, AttributeError):
        return False


class PeakMemory:
    """Peak memory above the level at ``start()``, in MiB (CPU: resident set; CUDA: allocator).

    On a CPU two readings are combined: the kernel's high-water mark (``VmHWM``, reset through
    ``/proc/self/clear_refs``), which Linux refreshes only at some events (unmapping memory, exit), and a
    thread sampling the resident set every millisecond, which catches peaks the high-water mark misses.
    ``start()`` pins glibc's mmap threshold (:func:`pin_mmap_threshold`) for the rest of the process, so
    blocks freed from then on leave the resident set. Blocks the heap kept before stay reusable, so a
    process pinned from its start (``in_fresh_process(..., live_memory=True)``) is what gives the live
    tensors' peak. Pinning makes each later large allocation fault its pages in, so steps get slower
    (measured at E 16, L 64: P-RGE q 4 3.2 -> 4.3 s, FO on LoRA-FA 3.5 -> 6.5 s): time steps in another
    process (:func:`timed_and_metered`), never after ``start()``.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._stop = threading.Event()
        self._sampled = 0

    def _sample(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE") // 1024
        while not self._stop.is_set():
            try:
                with open("/proc/self/statm") as f:
                    self._sampled = max(self._sampled, int(f.read().split()[1]) * page)
            except OSError:
                return
            self._stop.wait(0.001)

    def start(self) -> None:
        if not self.cuda:
            pin_mmap_threshold()       # the resident set then follows live tensors, not the allocator's holes
        release_memory()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return
        self.base = status_kib("VmRSS")
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")           # resets VmHWM to the current resident set (Linux)
        except OSError:
            pass
        self._sampled = self.base or 0
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def peak_mib(self) -> float | None:
        if self.cuda:
            torch.cuda.synchronize()
            return (torch.cuda.max_memory_allocated() - self.base) / 2**20
        self._stop.set()
        self._thread.join()
        top = max(status_kib("VmHWM") or 0, self._sampled)
        return None if self.base is None or not top else (top - self.base) / 1024


def time_steps(step: Callable[[int], object], repeats: int, warmup: int, cuda: bool, first: int = 0) -> list[float]:
    """Wall times of ``repeats`` calls step(t) after ``warmup`` untimed ones (t counts from ``first``)."""
    times = []
    for t in range(first, first + warmup + repeats):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        step(t)
        if cuda:
            torch.cuda.synchronize()
        if t >= first + warmup:
            times.append(time.perf_counter() - start)
    return times


def median_s(fn: Callable[[], object], repeats: int, warmup: int = 1, cuda: bool = False) -> float:
    """Median wall time in seconds of ``repeats`` calls fn() after ``warmup`` untimed ones (:func:`time_steps`)."""
    return statistics.median(time_steps(lambda t: fn(), repeats, warmup, cuda))


LIVE_MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": str(PINNED_THRESHOLD)}   # glibc reads it at start: pinned from the first block


def in_fresh_process(module: str, job: dict, what: str, live_memory: bool = False) -> dict:
    """Run ``python -m module <job as JSON>`` and return the JSON object its last stdout line prints: a
    measurement whose memory is its own. ``what`` names it in the error if the worker fails.

    ``live_memory`` starts the worker with glibc's mmap threshold pinned (:func:`pin_mmap_threshold`) before
    its first allocation. Pinning later, as :class:`PeakMemory` does, cannot undo what the heap already keeps:
    malloc serves a large block from a free heap chunk before it considers a mapping (measured: FO on
    LoRA-FA, E 16, L 64, metered after two unpinned steps: 1839 MiB; pinned from the start: 895 MiB)."""
    env = {**os.environ, **LIVE_MEMORY_ENV} if live_memory else None
    proc = subprocess.run([sys.executable, "-m", module, json.dumps(job)], capture_output=True, text=True,
                          env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def timed_and_metered(module: str, job: dict, what: str) -> dict:
    """The worker of ``module`` twice, each in a fresh process: once timing steps under the default
    allocator (``meter`` False in the job), once metering a step's peak with the allocator pinned from the
    start (``meter`` True). Returns the timed row plus the fields only the metered one has (its peak).
    Timing a pinned process would be slower and unevenly so (each large allocation faults its pages in);
    metering an unpinned one counts the heap's holes."""
    timed = in_fresh_process(module, {**job, "meter": False}, what)
    metered = in_fresh_process(module, {**job, "meter": True}, f"{what} (memory)", live_memory=True)
    return {**metered, **timed}
