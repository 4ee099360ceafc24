"""The CPU peak follows live tensors, not memory the allocator keeps after a free (chapter 1's toolkit)."""
import json
import os
import subprocess
import sys

SCRIPT = r"""
import json, torch
from prge_lib.common.measure import PeakMemory
MiB = 2**20
big = torch.ones(30 * MiB // 4); del big           # freeing a mapped block raises glibc's threshold
meter = PeakMemory(torch.device("cpu")); meter.start()
a = torch.ones(20 * MiB // 4)                      # heap block (default) or its own mapping (pinned)
keep = torch.ones(64 * 1024 // 4)                  # a small block after it keeps the heap from shrinking
del a
c = torch.ones(25 * MiB // 4)                      # does not fit the 20 MiB hole
print(json.dumps({"peak": meter.peak_mib()}))
"""


def test_peak_counts_live_tensors_not_the_allocators_holes():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    peak = json.loads(out.stdout.strip().splitlines()[-1])["peak"]
    # live at most 25 MiB (+ the small block); the default allocator keeps the 20 MiB hole resident too
    assert 22 < peak < 35, peak


HOLE_BEFORE_METERING = r"""
import json, torch
from prge_lib.common.measure import PeakMemory
MiB = 2**20
big = torch.ones(30 * MiB // 4); del big           # freeing a mapped block raises glibc's threshold
a = torch.ones(20 * MiB // 4)                      # a heap block unless the threshold was pinned at start
keep = torch.ones(64 * 1024 // 4)
del a                                              # a 20 MiB free chunk the heap keeps
meter = PeakMemory(torch.device("cpu")); meter.start()
c = torch.ones(18 * MiB // 4); del c               # reuses that chunk unless it was a mapping of its own
d = torch.ones(30 * MiB // 4)                      # does not fit it
print(json.dumps({"peak": meter.peak_mib()}))
"""


def test_a_worker_pinned_from_its_start_meters_live_tensors_despite_earlier_holes():
    from prge_lib.common.measure import LIVE_MEMORY_ENV
    env = {**os.environ, **LIVE_MEMORY_ENV}
    out = subprocess.run([sys.executable, "-c", HOLE_BEFORE_METERING], capture_output=True, text=True,
                         check=True, env=env)
    peak = json.loads(out.stdout.strip().splitlines()[-1])["peak"]
    # live at most 30 MiB; metered by PeakMemory alone (pinned only at start()) it reads 48: the kept chunk too
    assert 27 < peak < 40, peak


def test_median_s_is_the_median_of_the_timed_calls_after_the_warmup(monkeypatch):
    from types import SimpleNamespace

    from prge_lib.common import measure

    clock = iter([0.0, 10.0, 19.0, 20.0, 21.0, 30.0, 34.0, 40.0, 42.0])   # warm-up start, then 9, 1, 4, 2 s
    monkeypatch.setattr(measure, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    calls = []
    assert measure.median_s(lambda: calls.append(1), repeats=4, warmup=1) == 3.0   # (2 + 4) / 2
    assert len(calls) == 5
