"""The CPU peak follows live tensors, not memory the allocator keeps after a free (chapter 1's toolkit)."""
import json
import subprocess
import sys

SCRIPT = r"""
import json, torch
from prge_lib.measure import PeakMemory
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
