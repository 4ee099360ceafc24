"""The GPU figures README quotes are those of the committed result files of the GPU sittings
(data/results/gpu-sittings/N): nothing typed in that a file does not hold."""
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITTINGS = ROOT / "data" / "results" / "gpu-sittings"


def minutes_of(sitting: Path) -> dict:
    """Each stage's minutes in a sitting folder's log (every command's entry)."""
    return {s["name"]: s["minutes"] for entry in json.loads((sitting / "sitting.json").read_text())
            for s in entry["stages"] if "minutes" in s}


def test_readme_quotes_the_sittings_files():
    text = " ".join((ROOT / "README.md").read_text().split())
    first, second = SITTINGS / "1", SITTINGS / "2"
    check = json.loads((second / "gpu_check.json").read_text())
    same_z = check["checks"]["same_z"]
    device = check["provenance"]["hardware"]["cuda"]
    share = round(100 * same_z["differing"] / same_z["elements"])
    assert not same_z["passed"] and device == "NVIDIA H200"
    assert (f"on an H200 {share} % of the draws differed from the CPU's, by at most {same_z['max_ulps']:g} ulps, "
            f"`data/results/gpu-sittings/2/gpu_check.json`") in text
    minutes = minutes_of(second)
    assert f"| 1.5 min ({minutes['gpu-check']:g} on an H200) |" in text
    assert f"| 2.5 and 4.5 min ({minutes['engine-bench-sst2']:g} and {minutes['engine-bench-rte']:g} on an H200) |" in text
    assert f"(seed 0: {minutes['paired-fp32-fp16']:g} on an H200;" in text
    fp32 = json.loads((first / "paired" / "sst2_fp32_seed0.json").read_text())
    assert f"the fp32 run alone: {fp32['provenance']['wall_time_s'] / 60:.1f} min in the first sitting)" in text
    # every stage of the second sitting ran on the same machine, and its log joins its three commands
    entries = json.loads((second / "sitting.json").read_text())
    assert len(entries) == 3 and {e["device"] for e in entries} == {"NVIDIA H200"}
    # the third sitting's minutes, which README's stage table quotes beside its estimates
    third = minutes_of(SITTINGS / "3")
    assert f"| 3 min ({third['table13-fp16']:g} on an H200) |" in text
    assert f"| 5 min in fp16 alone ({third['grids-fp16']:g} on an H200)," in text


def test_a_gpu_benchmark_cell_is_priced_from_the_sitting_that_ran_it(tmp_path):
    """--list prices a GPU benchmark cell a sitting ran with the same settings from that run's wall time, not from
    this CPU's timings (minutes where the H200 took about one); other settings keep the CPU's price."""
    from prge_lib.experiments import reproduce as rp
    from prge_lib.experiments.status import price_cells

    fp16, = rp.grid_cells("runtime", "cpu", only="bench-none-L64", device="cuda", dtype="fp16")
    fp32, = rp.grid_cells("runtime", "cpu", only="bench-none-L64", device="cuda", dtype="fp32")
    ran = json.loads((SITTINGS / "3" / "results" / "runtime" / "synthetic" / "bench-none-L64_seed0.json").read_text())
    priced = price_cells([fp16, fp32], results=tmp_path)
    assert priced["seconds"][0] == ran["provenance"]["wall_time_s"] and len(priced["bench_measured"]) == 1
    assert priced["seconds"][1] == rp.estimate_seconds(fp32, 0) > 5 * priced["seconds"][0]
