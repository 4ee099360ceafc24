"""Summaries of chapter 7's grids (also read by chapters 8 and 9): a grid's result files, the runs of one row, and
one record per (task, row) as the tables print it.

Model selection follows Gao et al. §4.1 / App. C: per (task, row) the learning rate with the best mean
validation score over the seeds is chosen, and the test score at each run's best validation step is
reported as mean ± standard deviation over the seeds (:func:`summarize`).
"""
from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path

from prge_lib.common.paths import RESULTS
from prge_lib.common.provenance import atomic_file
from prge_lib.experiments.cells import grid_folder
from prge_lib.experiments.grids import GRIDS
from prge_lib.experiments.results import check_file_cell, read_result


def load_results(grid: str, results: Path = RESULTS, profile: str = "cpu") -> list[dict]:
    """Every result file of ``grid`` under ``profile`` (validated, :func:`read_result`), with its path relative to
    the grid folder. A training result whose settings are not those of the cell its file name gives is refused
    (:func:`check_file_cell`), so that a misplaced file cannot pass for that cell in a table."""
    folder = Path(results) / grid_folder(grid, profile)
    out = []
    for path in sorted(folder.rglob("*.json")):
        data = read_result(path)
        data["_file"] = str(path.relative_to(folder))
        check_file_cell(grid, data, path)
        out.append(data)
    return out


def _row_of(result: dict) -> str:
    """The row key a result belongs to: from its cell block, or from its file name (runs made by
    ``prge train`` into the grid's folder carry no cell block)."""
    if "cell" in result:
        return result["cell"]["row"]
    return Path(result["_file"]).name.split("_lr")[0].split("_seed")[0]


def runs_of(grid: str, task: str, row: str, lr: float | None = None, results: Path = RESULTS,
            profile: str = "cpu") -> list[dict]:
    """The result files of one row of ``grid`` on ``task`` (validated, in seed order); with ``lr``, only the runs at
    that learning rate, as a :func:`summarize` record names them (``runs_of(grid, r["task"], r["row"], r["lr"])``)."""
    runs = [r for r in load_results(grid, results, profile) if r.get("kind") == "train" and r["task"] == task
            and _row_of(r) == row and (lr is None or r["config"].get("lr") == lr)]
    return sorted(runs, key=lambda r: r["seed"])


PAUSE_FACTOR = 10


def training_seconds(result: dict) -> float | None:
    """Seconds a run spent in its training steps (evaluations excluded), with the time it lay paused taken out.

    ``elapsed_s.train_s`` counts wall time, and a run stopped with SIGSTOP (as the training cells here were while
    a benchmark cell measured alone) books the whole pause on the step it was in. A step over PAUSE_FACTOR times
    the run's median step is such a step and counts as a median one. None where the run recorded no steps."""
    steps = (result.get("step_s") or {}).get("per_step")
    if not steps:
        return None
    median = statistics.median(steps)
    return sum(s if s <= PAUSE_FACTOR * median else median for s in steps)


def summarize(grid: str, results: Path = RESULTS, profile: str = "cpu") -> list[dict]:
    """One record per (task, row): the chosen lr (best mean validation over seeds), the test score at each
    seed's best validation step as mean, standard deviation, min and max over the seeds, the mean training
    minutes per run (:func:`training_seconds`; None for zero-shot rows) and where the runs ran (``device``:
    "cpu", "cuda" or "cpu+cuda"; minutes only compare between records of the same device). Runs of one
    (task, row) that were set to different step counts are an error: their scores do not average."""
    groups: dict[tuple, dict[float | None, list[dict]]] = {}
    for r in load_results(grid, results, profile):
        if r.get("kind") != "train":
            continue
        lr = r["config"].get("lr") if r["method"] != "zeroshot" else None
        groups.setdefault((r["task"], _row_of(r)), {}).setdefault(lr, []).append(r)
    order = {row.key: i for i, row in enumerate(GRIDS[grid]["rows"])} if grid in GRIDS else {}
    tasks = list(GRIDS[grid]["tasks"]) if grid in GRIDS else []
    records = []
    for (task, row), by_lr in sorted(groups.items(), key=lambda kv: (
            tasks.index(kv[0][0]) if kv[0][0] in tasks else 99, order.get(kv[0][1], 99), kv[0][1])):
        planned = {r["config"].get("steps") for runs in by_lr.values() for r in runs}
        if len(planned) > 1:
            raise ValueError(f"{grid_folder(grid, profile)}: the {task}/{row} runs were set to different step "
                             f"counts {sorted(planned)}; keep one count per folder (--results-dir)")
        lr, runs = max(by_lr.items(), key=lambda kv: statistics.fmean(r["best_val"]["val"] for r in kv[1]))
        runs = sorted(runs, key=lambda r: r["seed"])
        tests = [100 * r["best_val"]["test"] for r in runs]
        vals = [100 * r["best_val"]["val"] for r in runs]
        label = next((x.label for x in GRIDS.get(grid, {}).get("rows", ()) if x.key == row), row)
        seconds = [training_seconds(r) for r in runs]
        devices = sorted({device_of(r) for r in runs})
        records.append({
            "task": task, "row": row, "label": label, "lr": lr, "seeds": [r["seed"] for r in runs],
            "n": len(runs), "steps": runs[0]["config"].get("steps", runs[0]["steps"]),
            "val_mean": round(statistics.fmean(vals), 2), "test_mean": round(statistics.fmean(tests), 2),
            "test_sd": round(statistics.stdev(tests), 2) if len(tests) > 1 else None,
            "test_min": round(min(tests), 2), "test_max": round(max(tests), 2),
            "lrs_tried": sorted(k for k in by_lr if k is not None),
            "train_min": round(statistics.fmean(seconds) / 60, 1) if None not in seconds else None,
            "device": "+".join(devices),
        })
    return records


def device_of(result: dict) -> str:
    """"cpu" or "cuda": the kind of device a result's run trained on (results before --device: cpu)."""
    return str(result.get("config", {}).get("device") or "cpu").split(":")[0]


def write_summary(grid: str, results: Path = RESULTS, profile: str = "cpu") -> tuple[Path, Path]:
    """``summary.csv`` and ``summary.md`` in the grid's folder, from :func:`summarize`."""

    records = summarize(grid, results, profile)
    folder = Path(results) / grid_folder(grid, profile)
    if not records:
        raise ValueError(f"grid {grid!r} has no training results under {folder}")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(records[0]), lineterminator="\n")
    writer.writeheader()
    for r in records:
        writer.writerow({k: (";".join(map(str, v)) if isinstance(v, list) else v) for k, v in r.items()})
    csv_path, md_path = folder / "summary.csv", folder / "summary.md"
    with atomic_file(csv_path) as tmp:
        tmp.write_text(buffer.getvalue())
    with atomic_file(md_path) as tmp:
        tmp.write_text(summary_markdown(records))
    return csv_path, md_path


def format_score(record: dict) -> str:
    """"74.1 ± 2.0 (3)": mean ± standard deviation over n seeds; one seed shows the value alone. Runs made on
    a GPU say so: "56.3 (1, GPU)"."""
    where = {"cpu": "", "cuda": ", GPU"}.get(record.get("device", "cpu"), ", CPU and GPU")
    if record["n"] == 1:
        return f"{record['test_mean']:.1f} (1{where})"
    return f"{record['test_mean']:.1f} ± {record['test_sd']:.1f} ({record['n']}{where})"


def summary_markdown(records: list[dict]) -> str:
    tasks = list(dict.fromkeys(r["task"] for r in records))
    rows = list(dict.fromkeys((r["row"], r["label"]) for r in records))
    cell = table_of(records)
    lines = ["| method | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    for key, label in rows:
        lines.append(f"| {label} | " + " | ".join(
            format_score(cell[(t, key)]) if (t, key) in cell else "–" for t in tasks) + " |")
    lines.append("")
    lines.append("Test score at each run's best validation step: mean ± standard deviation over seeds "
                 "(number of seeds); learning rate chosen by mean validation score.")
    if any(r.get("device", "cpu") != "cpu" for r in records):
        lines.append("")
        lines.append("GPU: the runs trained on a GPU (the result files name it), with the same data, adapter "
                     "initialisation and settings; their ZO noise came from torch's CUDA generator.")
    return "\n".join(lines) + "\n"


def table_of(records: list[dict]) -> dict[tuple[str, str], dict]:
    """Summary records keyed by (task, row)."""
    return {(r["task"], r["row"]): r for r in records}


def spread_separates(a: dict, b: dict) -> bool:
    """True when the two rows' test means differ by more than the larger of their standard deviations
    (the book calls a difference a difference only then; one-seed rows never qualify)."""
    if a["test_sd"] is None or b["test_sd"] is None:
        return False
    return abs(a["test_mean"] - b["test_mean"]) > max(a["test_sd"], b["test_sd"])
