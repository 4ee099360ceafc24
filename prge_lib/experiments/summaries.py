"""Summaries of chapter 7's grids (also read by chapters 8 and 9): a grid's result files, the runs of one row, and
one record per (task, row) as the tables print it.

Model selection follows Gao et al. §4.1 / App. C: per (task, row) the learning rate with the best mean
validation score over the seeds is chosen, and the test score at each run's best validation step is
reported as mean ± standard deviation over the seeds (:func:`summarize`). Each record also says whether the
runs trained at all (:func:`left_zero_shot`), what always answering the test split's commonest class scores
(:func:`majority_rate`) and what share of first-order's gain over zero-shot a ZO row reaches (``fo_gain_share``,
beside the same share in Gao et al. Table 1). Whether two rows differ is a test over seeds
(:mod:`prge_lib.experiments.stats`), never read off this table.
"""
from __future__ import annotations

import csv
import functools
import io
import math
import statistics
from pathlib import Path

from prge_lib.common.paths import RESULTS
from prge_lib.common.provenance import atomic_file
from prge_lib.data.splits import sample_task
from prge_lib.data.tasks import PROTOCOL, get_task
from prge_lib.experiments import paper
from prge_lib.experiments.cells import grid_folder
from prge_lib.experiments.grids import GRIDS, Bracket, bracket, lr_text
from prge_lib.experiments.results import check_file_cell, read_result
from prge_lib.methods import registry
from prge_lib.training.stopping import ROSE_PAST


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


def runtime_answers(result: dict) -> dict[str, float]:
    """What one cell of the ``runtime`` grid answers (chapter 7; Gao et al. Table 8 and Fig. 5): how much the
    P-RGE step grows from q 1 to q 16 at fixed E (%, flat would be 0), the outer loop alone ÷ both loops at q 4
    (above 1: the inner loop saves time), MeZO (Full) ÷ P-RGE at q 4 (NaN where the cell has no MeZO (Full):
    quantized weights), and one LoRA-FA forward of 2E rows ÷ two of E rows (the inner loop's bet)."""
    configs, E = result["configs"], result["config"]["E"]
    return {"P-RGE spread over q (%)": 100 * result["ratios"]["prge_spread_over_q"],
            "outer only ÷ both, q 4": (configs["prge-outer@q4"]["step_s"]["median"]
                                       / configs["prge@q4"]["step_s"]["median"]),
            "MeZO (Full) ÷ P-RGE q 4": result["ratios"].get("mezo_over_prge@q4", math.nan),
            "one forward of 2E rows ÷ two of E": (result["floor"][f"lorafa_forward_{2 * E}_rows_s"]
                                                  / (2 * result["floor"][f"lorafa_forward_{E}_rows_s"]))}


BEYOND = ("fo", "fo-lorafa", "prge")     # the methods whose memory beyond MeZO (LoRA-FA) chapter 7 compares


def memory_beyond(configs: dict) -> dict[str, float]:
    """What FO (Full), FO (LoRA-FA) and P-RGE (q 4, both loops) need beyond MeZO (LoRA-FA) in one cell of the
    ``memory`` grid, MiB: what compares with Gao et al.'s totals, which include the weights (chapter 7)."""
    return {k: configs[k]["peak_mib"] - configs["mezo-lorafa"]["peak_mib"] for k in BEYOND}


def paper_memory_beyond(seq_len: int, batch_size: int = 16) -> dict[str, float]:
    """The same from Gao et al.'s memory table (ACL version Table 3, TinyLlama-1.1B, GB), in MiB."""
    table = paper.TABLE3_MEMORY_GB
    col = table["batch_sizes"].index(batch_size)
    return {k: 1024 * (table[k][seq_len][col] - table["mezo-lorafa"][seq_len][col]) for k in BEYOND}


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
    if not steps and "step_s" in result.get("series", {}):      # a long run: each window at its median step
        every, medians = result["series"]["every"], result["series"]["step_s"]
        return sum(m * min(every, result["steps"] - k * every) for k, m in enumerate(medians))
    if not steps:
        return None
    median = statistics.median(steps)
    return sum(s if s <= PAUSE_FACTOR * median else median for s in steps)


def start_val(result: dict) -> float | None:
    """The validation score a run started from: its step-0 evaluation, else the zero-shot score it recorded."""
    first = result["evals"][0]
    if first["step"] == 0:
        return first["val"]
    return result.get("zero_shot_val")


def left_zero_shot(result: dict) -> bool | None:
    """Whether a training run moved off its starting point: its best validation score lies above the step-0
    score by more than the standard error of a proportion on the validation set, sqrt(p (1 - p) / n_val)
    (for a score in [0, 1] that bounds the standard error of its mean). None where the run recorded no start."""
    start = start_val(result)
    n_val = (result.get("data_sizes") or {}).get("val") or result["config"].get("n_val") or PROTOCOL["n_val"]
    if start is None:
        return None
    return result["best_val"]["val"] - start > math.sqrt(start * (1 - start) / n_val)


def best_at_end(result: dict) -> bool | None:
    """Whether a run's validation score was at its best at its last evaluation: the step budget ended while the
    score was at its highest, so more steps might have raised it further (the cpu profile stops at 1000 steps,
    Gao et al. train 20,000). None for a run with no evaluation after step 0."""
    later = [e for e in result.get("evals") or () if e["step"] > 0]
    if not later:
        return None
    return max(later, key=lambda e: e["step"])["val"] >= result["best_val"]["val"]


def diverged_at(result: dict) -> str | None:
    """"seed 0 after step 707 of 1000 (loss risen past --stop-rising 3)" for a run recorded as diverged (its loss
    turned non-finite, or rose past its ``stop_rising`` factor: :func:`~prge_lib.training.stopping.loss_rise`);
    None for one that ran its steps."""
    if result.get("status") != "diverged":
        return None
    factor = result["config"].get("stop_rising")
    why = f"loss risen past --stop-rising {factor:g}" if ROSE_PAST in result.get("diverged", "") else \
        "loss not finite"
    return f"seed {result['seed']} after step {result['steps']} of {result['config']['steps']} ({why})"


@functools.cache
def majority_rate(task: str, seed: int, n_train: int, n_val: int, n_test: int) -> float | None:
    """Share of the commonest answer in the test examples the MeZO protocol draws for ``seed`` (the accuracy of
    always giving that answer); None for a task scored by a metric other than accuracy."""
    spec = get_task(task)
    if spec.metric != "accuracy":
        return None
    test = sample_task(spec, seed, n_train, n_val, n_test, test_only=True).test     # the train rows are not needed
    golds = [spec.gold(example) for example in test]
    return max(golds.count(g) for g in set(golds)) / len(golds)


def _majority(runs: list[dict]) -> float | None:
    """:func:`majority_rate` (%) averaged over the runs' seeds, with the sizes each run asked for."""
    rates = []
    for r in runs:
        sizes = {k: r["config"].get(k) or PROTOCOL[k] for k in PROTOCOL}
        rates.append(majority_rate(r["task"], r["seed"], sizes["n_train"], sizes["n_val"], sizes["n_test"]))
    return None if None in rates else round(100 * statistics.fmean(rates), 2)


def _gain_share(value: float | None, zero_shot: float | None, fo: float | None) -> float | None:
    """(value - zero-shot) / (FO - zero-shot), rounded; None where a number is missing or FO gained nothing."""
    if None in (value, zero_shot, fo) or fo - zero_shot <= 0:
        return None
    return round((value - zero_shot) / (fo - zero_shot), 2)


def _add_gain_shares(records: list[dict]) -> None:
    """``fo_gain_share`` and ``paper_fo_gain_share`` of each ZO record whose task has zero-shot and FO LoRA-FA
    records (the paper's from Gao et al. Table 1, arXiv version, for Table 1's rows). None where FO LoRA-FA did not
    train on the task: there is no gain to take a share of."""
    cell = table_of(records)
    for r in records:
        r["fo_gain_share"] = r["paper_fo_gain_share"] = None
        zs, fo = cell.get((r["task"], "zeroshot")), cell.get((r["task"], "fo-lorafa"))
        if r["method"] == "zeroshot" or registry.get(r["method"]).family != "zo" or not (zs and fo):
            continue
        if fo.get("trained") is False:
            continue
        r["fo_gain_share"] = _gain_share(r["test_mean"], zs["test_mean"], fo["test_mean"])
        published = {k: paper.TABLE1.get(k, {}).get(r["task"]) for k in (r["row"], "zeroshot", "fo-lorafa")}
        r["paper_fo_gain_share"] = _gain_share(*published.values())


def summarize(grid: str, results: Path = RESULTS, profile: str = "cpu") -> list[dict]:
    """One record per (task, row): the chosen lr (best mean validation over seeds), the test score at each
    seed's best validation step as mean, standard deviation, min and max over the seeds, the mean training
    minutes per run (:func:`training_seconds`; None for zero-shot rows) and where the runs ran (``device``:
    "cpu", "cuda" or "cpu+cuda"; minutes only compare between records of the same device). ``trained`` is
    False when no seed's run left its starting point (:func:`left_zero_shot`; None for zero-shot rows) and
    ``stayed`` how many seeds' runs did not (in a row that trained, their scores sit in its mean),
    ``lrs_trained`` the rates tried at which some run did (None where a run recorded no start),
    ``best_at_end`` how many seeds' runs were at their best validation score at their last evaluation
    (:func:`best_at_end`; None for zero-shot rows), ``diverged`` the runs that stopped as diverged
    (:func:`diverged_at`),
    ``majority`` the test split's commonest-answer rate in % (:func:`majority_rate`), ``fo_gain_share`` and
    ``paper_fo_gain_share`` as :func:`_add_gain_shares` sets them. Runs of one (task, row) that were set to
    different step counts are an error: their scores do not average."""
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
        spec = next((x for x in GRIDS.get(grid, {}).get("rows", ()) if x.key == row), None)
        candidates = list(by_lr.items())
        if spec is not None and spec.staged(profile):   # ties to the smaller rate, as the confirm stage chose
            candidates.sort(key=lambda kv: (kv[0] is not None, kv[0] or 0))
        lr, runs = max(candidates, key=lambda kv: _selection_score(profile, task, spec, kv[1]))
        runs = sorted(runs, key=lambda r: r["seed"])
        tests = [100 * r["best_val"]["test"] for r in runs]
        vals = [100 * r["best_val"]["val"] for r in runs]
        zero_shot = runs[0]["method"] == "zeroshot"
        label = spec.label if spec is not None else row
        seconds = [training_seconds(r) for r in runs]
        devices = sorted({device_of(r) for r in runs})
        moved = [left_zero_shot(r) for r in runs]
        records.append({
            "task": task, "row": row, "label": label, "method": runs[0]["method"], "lr": lr, "seeds": [r["seed"] for r in runs],
            "n": len(runs), "steps": runs[0]["config"].get("steps", runs[0]["steps"]),
            "val_mean": round(statistics.fmean(vals), 2), "test_mean": round(statistics.fmean(tests), 2),
            "test_sd": round(statistics.stdev(tests), 2) if len(tests) > 1 else None,
            "test_min": round(min(tests), 2), "test_max": round(max(tests), 2),
            "lrs_tried": sorted(k for k in by_lr if k is not None),
            "lrs_planned": [] if zero_shot or spec is None else sorted(spec.lrs.get(profile, ())),
            "lrs_bracket": [] if zero_shot else _sweep_bracket(profile, task, spec, by_lr),
            "lrs_added": [] if zero_shot else _sweep_added(profile, spec, by_lr),
            "added_seeds": [] if zero_shot else added_seeds(profile, task, spec, [r["seed"] for r in runs]),
            "lrs_trained": _rates_that_trained(by_lr),
            "train_min": round(statistics.fmean(seconds) / 60, 1) if None not in seconds else None,
            "device": "+".join(devices),
            "gpu_noise": "+".join(sorted({(r.get("config") or {}).get("noise") or "torch" for r in runs
                                          if device_of(r) == "cuda"})) or None,
            "trained": None if zero_shot or None in moved else any(moved),
            "stayed": None if zero_shot or None in moved else moved.count(False),
            "best_at_end": None if zero_shot else sum(bool(best_at_end(r)) for r in runs),
            "diverged": [text for text in map(diverged_at, runs) if text],
            "majority": _majority(runs),
            "processors": "+".join(sorted({name for r in runs for name in processors_of(r)})),
        })
    _add_gain_shares(records)
    return records


def added_seeds(profile: str, task: str, spec, seeds: list[int]) -> list[int]:
    """The seeds of a row's runs beyond what its grid plans for ``profile`` (the row's seeds, and a two-stage
    row's confirm seeds): seeds added after a first look at a comparison, whose tests count the looks
    (:func:`~prge_lib.experiments.stats.compare_scores`); [] for a row no grid names."""
    if spec is None or profile not in spec.seeds:
        return []
    planned = set(spec.planned_seeds(profile, task)) | set(spec.confirm_seeds.get(profile, ()))
    return sorted(set(seeds) - planned)


def trained_bracket(sweep_runs: dict[float, list[dict]], grid_lrs) -> Bracket | None:
    """The :func:`~prge_lib.experiments.grids.bracket` of a two-stage row's sweep, {rate: its sweep seeds' runs}
    (mean validation score per rate), where some run at the best rate left zero-shot (:func:`left_zero_shot`);
    None otherwise: a row that never trained has no peak, only noise. The confirm stage starts on it
    (:func:`~prge_lib.experiments.stages.best_rates`) and the summary says so (:func:`lr_note`)."""
    scores = {lr: statistics.fmean(r["best_val"]["val"] for r in runs) for lr, runs in sweep_runs.items() if runs}
    found = bracket(scores, grid_lrs)
    if found is None or not any(left_zero_shot(r) for r in sweep_runs[found.best]):
        return None
    return found


def _sweep_bracket(profile: str, task: str, spec, by_lr: dict) -> list[float]:
    """[lower, upper]: the neighbours that bracket a two-stage row's chosen rate in its sweep
    (:func:`trained_bracket` of its sweep seeds' runs), which let its sweep stop early; [] where they do not, or in
    a one-stage row (which runs its whole grid)."""
    if spec is None or not spec.staged(profile) or profile not in spec.lrs:
        return []
    found = trained_bracket({lr: _sweep_seeds(profile, task, spec, runs) for lr, runs in by_lr.items()
                             if lr is not None}, spec.lrs[profile])
    return [] if found is None else [found.lower, found.upper]


def _sweep_added(profile: str, spec, by_lr: dict) -> list[float]:
    """The rates of a two-stage row's runs beyond its grid for ``profile``: those its sweep added where its training
    loss turned from falling to rising (:func:`~prge_lib.experiments.stages.refined_cells`, the only cells of such a
    row off its rates); [] for a one-stage row."""
    if spec is None or not spec.staged(profile) or profile not in spec.lrs:
        return []
    return sorted(lr for lr in by_lr if lr is not None and lr not in spec.lrs[profile])


def _sweep_seeds(profile: str, task: str, spec, runs: list[dict]) -> list[dict]:
    """The runs of a two-stage row ``spec`` that its sweep made (its planned seeds), not its confirm seeds;
    [] for a row no grid names."""
    sweep = spec.planned_seeds(profile, task) if spec is not None else ()
    return [r for r in runs if r["seed"] in sweep]


def _rates_that_trained(by_lr: dict) -> list[float] | None:
    """The learning rates at which at least one run left zero-shot; None where some run cannot tell (no step-0
    score recorded)."""
    moved = {lr: [left_zero_shot(r) for r in runs] for lr, runs in by_lr.items() if lr is not None}
    if any(None in flags for flags in moved.values()):
        return None
    return sorted(lr for lr, flags in moved.items() if any(flags))


def _selection_score(profile: str, task: str, spec, runs: list[dict]) -> float:
    """The mean validation score a learning rate is chosen by: over all its runs, or for a two-stage row ``spec``
    (:mod:`~prge_lib.experiments.stages`) over its sweep seeds' runs only, the choice the confirm stage was run at
    (a rate the sweep lacks scores nothing)."""
    if spec is not None and spec.staged(profile):
        runs = _sweep_seeds(profile, task, spec, runs)
        if not runs:
            return float("-inf")
    return statistics.fmean(r["best_val"]["val"] for r in runs)


def device_of(result: dict) -> str:
    """"cpu" or "cuda": the kind of device a result's run trained on (results before --device: cpu)."""
    return str(result.get("config", {}).get("device") or "cpu").split(":")[0]


def processors_of(result: dict) -> list[str]:
    """The processors a result's run computed on, in order of its sittings (``sittings``; a file from before them:
    the one its provenance names, the GPU's on a GPU run); "unknown" where none is named."""
    names = [s.get("processor") for s in result.get("sittings") or ()]
    if not names:
        hardware = (result.get("provenance") or {}).get("hardware") or {}
        names = [hardware.get("cuda") if device_of(result) == "cuda" else hardware.get("cpu")]
    return list(dict.fromkeys(name or "unknown" for name in names))


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
    a GPU say so: "56.3 (1, GPU)". A row whose runs never left zero-shot shows "did not train" instead of a score
    (``trained`` False: :func:`left_zero_shot`)."""
    where = {"cpu": "", "cuda": ", GPU"}.get(record.get("device", "cpu"), ", CPU and GPU")
    if record.get("trained") is False:
        return f"did not train ({record['n']}{where})"
    if record["n"] == 1:
        return f"{record['test_mean']:.1f} (1{where})"
    return f"{record['test_mean']:.1f} ± {record['test_sd']:.1f} ({record['n']}{where})"


def lr_note(record: dict) -> str:
    """How a record's learning rate was set: "lr 1e-3 chosen on validation from {1e-4, 1e-3}" where several were
    tried (saying so where no run at any of them left zero-shot, and where the rate chosen lies at an edge of those
    tried, so that a better one may lie beyond it), "lr 1e-3 (one rate tried)" where one was; and the rates of
    the row's grid (``lrs_planned``) that have not run yet, or, in a sweep that stopped once its neighbours
    bracketed its best rate (``lrs_bracket``), that it left out; and the rates a two-stage sweep added to a row that
    never trained (``lrs_added``), where its training loss turned from falling to rising
    (:func:`~prge_lib.experiments.stages.stability_rates`)."""
    if record["lr"] is None:
        return "no training"
    tried = record["lrs_tried"]
    waiting = [lr for lr in record.get("lrs_planned") or () if lr not in tried]
    beyond = record.get("lrs_added") or ()
    added = (f"{{{', '.join(map(lr_text, beyond))}}} added to its grid where its training loss turned from falling "
             f"to rising") if beyond else ""
    later = f"{{{', '.join(map(lr_text, waiting))}}} of its grid still to run" if waiting else ""
    if waiting and record.get("lrs_bracket"):
        lower, upper = record["lrs_bracket"]
        later = (f"{{{', '.join(map(lr_text, waiting))}}} of its grid not run: {lr_text(lower)} and "
                 f"{lr_text(upper)} scored lower, which brackets its best rate")
    if len(tried) == 1:
        return f"lr {lr_text(record['lr'])} (one rate tried{'; ' + later if later else ''})"
    chosen = f"lr {lr_text(record['lr'])} chosen on validation from {{{', '.join(map(lr_text, tried))}}}"
    notes = []
    if record.get("lrs_trained") == []:
        chosen += ", where no rate trained: the choice is the noise of a validation score"
    elif record["lr"] in (tried[0], tried[-1]):
        notes.append("at an edge of the rates tried, so a better one may lie beyond it")
    notes += [text for text in (added, later) if text]
    return chosen + (f" ({'; '.join(notes)})" if notes else "")


def _joined_by_task(records: list[dict], text) -> str:
    """``text(record)`` for a row's records: once if it is the same on every task, else per task."""
    notes = {r["task"]: text(r) for r in records}
    if len(set(notes.values())) == 1:
        return next(iter(notes.values()))
    return "; ".join(f"{task}: {note}" for task, note in notes.items())


def _share_text(record: dict | None) -> str:
    """"0.45 (paper 0.83)": a record's ``fo_gain_share`` beside the paper's; "–" where it has none."""
    if not record or record.get("fo_gain_share") is None:
        return "–"
    # a row that never left zero-shot has no share of a gain: its ratio would only measure noise
    ours = "did not train" if record.get("trained") is False else f"{record['fo_gain_share']:.2f}"
    if record.get("paper_fo_gain_share") is None:
        return ours
    return f"{ours} (paper {record['paper_fo_gain_share']:.2f})"


def _add_paragraph(lines: list[str], lead: str, parts: list[str]) -> None:
    """A blank line, then ``lead`` and ``parts`` joined by semicolons; nothing where ``parts`` is empty."""
    if parts:
        lines += ["", lead + "; ".join(parts) + "."]


def summary_markdown(records: list[dict]) -> str:
    tasks = list(dict.fromkeys(r["task"] for r in records))
    rows = list(dict.fromkeys((r["row"], r["label"]) for r in records))
    cell = table_of(records)
    lines = ["| method | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    for key, label in rows:
        lines.append(f"| {label} | " + " | ".join(
            format_score(cell[(t, key)]) if (t, key) in cell else "–" for t in tasks) + " |")
    majority = []
    for t in tasks:
        rates = sorted({r["majority"] for r in records if r["task"] == t and r["majority"] is not None})
        majority.append(" / ".join(f"{v:.1f}" for v in rates) or "–")
    lines.append("| *always the commonest answer* | " + " | ".join(majority) + " |")
    lines.append("")
    lines.append("Test score at each run's best validation step: mean ± standard deviation over seeds "
                 "(number of seeds). \"did not train\": no seed's best validation score rose above its step-0 "
                 "score by more than the standard error of a proportion on the validation set, "
                 "sqrt(p (1 - p) / n_val). The last line is the accuracy of always giving the answer that is "
                 "commonest in the test examples the protocol draws. Differences between rows are tested over "
                 "seeds in the chapters, not read off this table.")
    lines.append("")
    lines.append("Learning rates:")
    lines.append("")
    for key, label in rows:
        lines.append(f"- {label}: " + _joined_by_task([r for r in records if r["row"] == key], lr_note))
    _add_paragraph(lines, "Seeds beyond the grid's plan, run after a first look at a comparison (the chapters' tests "
                   "count the looks): ", [f"{r['label']} on {r['task']}: seed{'s' * (len(r['added_seeds']) > 1)} "
                                          f"{', '.join(map(str, r['added_seeds']))}"
                                          for r in records if r.get("added_seeds")])
    _add_paragraph(lines, "Best validation score at the last evaluation, where the step budget ended while the score "
                   "was at its highest and more steps might have raised it: ",
                   [f"{r['label']} on {r['task']} ({r['best_at_end']} of {r['n']} seed{'s' * (r['n'] > 1)})"
                    for r in records if r.get("best_at_end")])
    _add_paragraph(lines, "Seeds whose run did not leave its step-0 score (the rule above) in a row whose other seeds "
                   "did, counted in the row's mean at their best validation step: ",
                   [f"{r['label']} on {r['task']} ({r['stayed']} of {r['n']} seeds)"
                    for r in records if r.get("trained") and r.get("stayed")])
    _add_paragraph(lines, "Runs stopped as diverged, their test score read at their best validation step before "
                   "the stop: ", [f"{r['label']} on {r['task']}: {', '.join(r['diverged'])}"
                                  for r in records if r.get("diverged")])
    shares = [r for r in records if r.get("fo_gain_share") is not None]
    if shares:
        lines.append("")
        lines.append("Share of first-order LoRA-FA's gain over zero-shot, (ZO − zero-shot) ÷ (FO − zero-shot), "
                     "ours and in Gao et al. Table 1 (arXiv version):")
        lines.append("")
        share_tasks = list(dict.fromkeys(r["task"] for r in shares))
        lines.append("| method | " + " | ".join(share_tasks) + " |")
        lines.append("|---|" + "---|" * len(share_tasks))
        for key, label in rows:
            got = [cell.get((t, key)) for t in share_tasks]
            if not any(g and g.get("fo_gain_share") is not None for g in got):
                continue
            lines.append(f"| {label} | " + " | ".join(_share_text(g) for g in got) + " |")
    gpu = [r for r in records if r.get("device", "cpu") != "cpu"]
    if gpu:
        # before the counter generator became the GPU's default, GPU runs drew from torch's CUDA generator
        sources = sorted({s for r in gpu for s in (r.get("gpu_noise") or "torch").split("+")}, reverse=True)
        named = {"torch": "torch's CUDA generator", "counter": "the counter generator (the z of a CPU run with "
                 "--noise counter)"}
        lines.append("")
        lines.append("GPU: the runs trained on a GPU (the result files name it), with the same data, adapter "
                     f"initialisation and settings; their ZO noise came from {' or '.join(named[s] for s in sources)}.")
    processors = sorted({name for r in records for name in r["processors"].split("+")})
    if len(processors) > 1:
        lines.append("")
        lines.append(f"Processors: the runs ran on {_and(processors)} (each row's in summary.csv, each run's in its "
                     "file). Floats round differently on each, so a seed's run on one is not bit for bit its run on "
                     "another.")
    return "\n".join(lines) + "\n"


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def table_of(records: list[dict]) -> dict[tuple[str, str], dict]:
    """Summary records keyed by (task, row)."""
    return {(r["task"], r["row"]): r for r in records}
