"""The GPU figures README quotes are those of the committed result files of the GPU sittings
(data/results/gpu-sittings/N): nothing typed in that a file does not hold."""
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITTING = ROOT / "data" / "results" / "gpu-sittings" / "1"


def test_readme_quotes_the_sittings_files():
    readme = ROOT / "README.md"
    text = " ".join(readme.read_text().split())
    check = json.loads((SITTING / "gpu_check.json").read_text())
    same_z = check["checks"]["same_z"]
    device = check["provenance"]["hardware"]["cuda"]
    share = round(100 * same_z["differing"] / same_z["elements"])
    assert not same_z["passed"] and device == "NVIDIA H200"
    assert f"on an H200 {share} % of the draws differed from the CPU's" in text
    minutes = {s["name"]: s["minutes"] for sitting in json.loads((SITTING / "sitting.json").read_text())
               for s in sitting["stages"] if "minutes" in s}
    assert f"(SST-2: {minutes['engine-bench-sst2']:g} on an H200)" in text
    assert f"| 1 min ({minutes['gpu-check']:g} on an H200) |" in text
    fp32 = json.loads((SITTING / "paired" / "sst2_fp32_seed0.json").read_text())
    assert f"(the fp32 run: {fp32['provenance']['wall_time_s'] / 60:.1f} min on an H200)" in text
