"""What the GPU sittings committed, read beside this CPU's results (chapters 6, 7 and 10).

A sitting (``tools/gpu_sitting.py``, :mod:`prge_lib.experiments.sitting`) writes under
``data/results/gpu-sittings/<n>/``: the grid cells it ran under ``results/`` (the cells and schema of the CPU's
grids, run with ``--device cuda``), and its own benchmarks and runs in folders beside them (``table13/``, Gao et
al.'s standard benchmark of the inner loop; ``jetson/``, chapter 10's Jetson path). Sittings are numbered in the
order they ran; where two wrote the same file, the later one's is read. Every file names its device
(``provenance.hardware.cuda``), which the chapters print beside its figures.

Nothing here runs on a GPU: these functions read files, so a chapter shows a sitting's figures once its files are
committed, and says that none ran before then.
"""
from __future__ import annotations

from pathlib import Path

from prge_lib.common.paths import RESULTS
from prge_lib.experiments.results import read_result
from prge_lib.experiments.summaries import load_results

SITTINGS = RESULTS / "gpu-sittings"


def sitting_folders(root: Path = SITTINGS) -> list[Path]:
    """The sittings' folders in the order they ran (named 1, 2, …; other names are not sittings)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def _latest(root: Path, read) -> list[dict]:
    """``read(sitting folder)`` gives (key, result) pairs; the latest sitting's result for each key, in key order,
    each with ``_sitting``, the folder's name."""
    latest = {}
    for sitting in sitting_folders(root):
        for key, result in read(sitting):
            result["_sitting"] = sitting.name
            latest[key] = result
    return [latest[key] for key in sorted(latest)]


def sitting_results(grid: str, root: Path = SITTINGS) -> list[dict]:
    """Every cell of ``grid`` a sitting ran (read and checked as :func:`~prge_lib.experiments.summaries.load_results`
    reads the CPU's), the latest sitting's file where several ran the same cell, in file order; each with
    ``_sitting``, the folder's name."""
    return _latest(root, lambda sitting: ((r["_file"], r) for r in load_results(grid, sitting / "results")))


def sitting_files(folder: str, root: Path = SITTINGS, pattern: str = "*.json") -> list[dict]:
    """The result files matching ``pattern`` in ``<sitting>/<folder>/`` of every sitting (read and checked,
    :func:`~prge_lib.experiments.results.read_result`), the latest sitting's where two hold the same name, in name
    order; each with ``_sitting`` and ``_file`` (its name)."""
    return _latest(root, lambda sitting: ((path.name, {**read_result(path), "_file": path.name})
                                          for path in sorted((sitting / folder).glob(pattern))))


def device_name(result: dict) -> str:
    """The device a result ran on, by name, as its provenance records it: the GPU's name, else the CPU's."""
    hardware = result["provenance"]["hardware"]
    return hardware.get("cuda") or f"CPU ({hardware.get('cpu') or hardware.get('machine', 'unknown')})"


def inner_speedups(results: list[dict]) -> list[dict]:
    """Gao et al.'s standard benchmark (Fig. 5 and 6; Table 13 of the ACL version) from ``prge bench --method
    mezo-lorafa,prge-inner --q 1`` files: one row per file with its weights (fp16, int8, nf4: the dtype where the
    base is not quantized), length L, batch size B (= E at q 1), both median step times and the inner loop's
    speed-up, MeZO (LoRA-FA)'s time ÷ the inner loop's, and the device; sorted by weights, L and B."""
    rows = []
    for r in results:
        configs = r["configs"]
        missing = [name for name in ("mezo-lorafa", "prge-inner") if name not in configs]
        if missing or r.get("q") != [1]:
            raise ValueError(f"{r.get('_file', 'a result')}: not a standard-benchmark file (it needs mezo-lorafa and "
                             f"prge-inner at q 1; missing {missing}, q {r.get('q')})")
        sequential, inner = (configs[name]["step_s"]["median"] for name in ("mezo-lorafa", "prge-inner"))
        weights = r.get("dtype", "fp32") if r.get("quant", "none") == "none" else r["quant"]
        rows.append({"weights": weights, "L": r["seq_len"], "B": r["E"], "mezo_lorafa_s": sequential,
                     "inner_s": inner, "speedup": sequential / inner, "device": device_name(r),
                     "sitting": r.get("_sitting")})
    return sorted(rows, key=lambda row: (row["weights"], row["L"], row["B"]))


# the engines of the flat-in-q benchmark (stage flat-q-engines), as the chapters name them
ENGINE_LABELS = {"prge": "per-layer", "prge-fused": "fused", "prge-graphs": "fused, CUDA graph"}


def flat_in_q(results: list[dict]) -> list[dict]:
    """Gao et al. Table 8's question by engine, from ``prge bench --method prge,prge-fused,prge-graphs --q 1,4,16``
    files (stage flat-q-engines): one row per file and engine with its length L, E, the median step time at each
    q (``q1_s``, ``q4_s``, …), the slowest ÷ the fastest (``spread``: flat would be 1) and the device; sorted by
    engine and L. An engine a file did not measure at several q is left out of it."""
    rows = []
    for r in results:
        for config, label in ENGINE_LABELS.items():
            times = {c["q"]: c["step_s"]["median"] for c in r["configs"].values() if c["config"] == config}
            if len(times) < 2:
                continue
            rows.append({"engine": label, "L": r["seq_len"], "E": r["E"],
                         **{f"q{q}_s": t for q, t in sorted(times.items())},
                         "spread": max(times.values()) / min(times.values()), "device": device_name(r),
                         "sitting": r.get("_sitting")})
    order = list(ENGINE_LABELS.values())
    return sorted(rows, key=lambda row: (order.index(row["engine"]), row["L"]))
