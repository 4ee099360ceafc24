"""The summary of the federated SST-2 runs (chapter 11; ``tools/run_federated``): per configuration (centralised,
federated iid, federated label-skew) the test accuracy over seeds (mean ± sd), and chapter 7's test over seeds of
federated − centralised and label-skew − iid (:func:`prge_lib.experiments.stats.compare_scores`: paired where both
ran the same seeds, Welch otherwise; a p below 0.05 on fewer than three seeds a side is not called a difference),
in its words (:func:`~prge_lib.experiments.stats.describe`). Beside them, accuracy against the clients a round
(``clients/``, ``tools/run_federated_clients``) and when uploads are lost or late (``uploads/``,
``tools/run_federated_uploads``). Written as ``summary.json`` and ``summary.md`` beside the runs.

``python -m prge_lib.experiments.federated_summary data/results/federated``
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from prge_lib.common.paths import RESULTS
from prge_lib.common.provenance import atomic_file
from prge_lib.experiments.stats import compare_scores, describe

CONFIGS = ("centralised", "iid", "label-skew")
LABELS = {"centralised": "centralised P-RGE (same batches as iid)", "iid": "federated, iid shards",
          "label-skew": "federated, label-skew shards (p 0.9)"}
COMPARISONS = (("iid", "centralised"), ("label-skew", "centralised"), ("label-skew", "iid"))
FOLDER = RESULTS / "federated"      # where tools/run_federated writes the runs
ON_TIME = "all on time"             # the uploads condition of a run that lost and delayed none


def read_runs(folder: str | Path = FOLDER) -> dict[str, dict[int, dict]]:
    """Every ``<config>_seed<N>.json`` of ``folder``: {config: {seed: record}}."""
    runs: dict[str, dict[int, dict]] = {c: {} for c in CONFIGS}
    for config in CONFIGS:
        for path in sorted(Path(folder).glob(f"{config}_seed*.json")):
            record = json.loads(path.read_text())
            runs[config][record["seed"]] = record
    return runs


def seed_test(a_runs: dict[int, dict], b_runs: dict[int, dict], a: str, b: str) -> dict:
    """Chapter 7's test over seeds (:func:`~prge_lib.experiments.stats.compare_scores`) of the test accuracy (in %)
    after training of ``a_runs`` − ``b_runs`` ({seed: record}), named a and b; a side without runs is untested."""
    if not a_runs or not b_runs:
        return {"a": a, "b": b, "p": None, "verdict": f"untested: no runs of {b if a_runs else a}"}
    result = compare_scores({s: 100 * r["final"]["test"] for s, r in a_runs.items()},
                            {s: 100 * r["final"]["test"] for s, r in b_runs.items()})
    return result | {"a": a, "b": b, "seeds": (sorted(a_runs), sorted(b_runs))}


def _spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values) if values else None,
            "sd": statistics.stdev(values) if len(values) > 1 else None, "n": len(values)}


def summarize(folder: str | Path = FOLDER) -> dict:
    """The summary of the runs in ``folder`` (accuracies in %)."""
    runs = read_runs(folder)
    rows = {}
    for config, by_seed in runs.items():
        seeds = sorted(by_seed)
        final = [100 * by_seed[s]["final"]["test"] for s in seeds]
        zero = [100 * by_seed[s]["zero_shot"]["test"] for s in seeds]
        rows[config] = {"label": LABELS[config], "seeds": seeds, "final": _spread(final),
                        "zero_shot": _spread(zero), "gain": _spread([f - z for f, z in zip(final, zero)]),
                        "final_by_seed": dict(zip(map(str, seeds), final)),
                        "last_round_loss": _spread([by_seed[s]["round_losses"][-1] for s in seeds])}
        if by_seed and config != "centralised":
            comm = by_seed[seeds[0]]["communication"]
            rows[config]["communication"] = {k: comm[k] for k in ("upload_bytes_per_client_round",
                                                                  "download_bytes_per_client_round",
                                                                  "first_order_fedavg_upload_bytes_per_client_round")}
    tests = [seed_test(runs[a], runs[b], a, b) for a, b in COMPARISONS]
    any_run = next((r for by_seed in runs.values() for r in by_seed.values()), None)
    return {"kind": "federated-summary", "rows": rows, "tests": tests, "clients": clients_summary(folder, runs),
            "uploads": uploads_summary(folder),
            "settings": None if any_run is None else {
                k: any_run["federation"][k] for k in ("clients", "per_round", "local_steps", "rounds")} | {
                k: any_run["config"][k] for k in ("q", "E", "eps", "lr")} | {"n_test": any_run["n_test"],
                                                                             "steps": any_run["steps"]}}


def clients_summary(folder: str | Path, runs: dict[str, dict[int, dict]]) -> dict:
    """Accuracy against the clients a round, C, at one budget of local steps (``tools/run_federated_clients``):
    per C, over seeds, the test accuracy after training, its gain over zero-shot and the last round's loss
    (C 2 is the iid run of ``folder``, the others ``clients/iid_C<C>_seed<N>.json``), and :func:`seed_test` of
    the largest C against the smallest."""
    by_c: dict[int, dict[int, dict]] = {}
    for seed, record in runs["iid"].items():
        by_c.setdefault(record["federation"]["per_round"], {})[seed] = record
    for path in sorted((Path(folder) / "clients").glob("iid_C*_seed*.json")):
        record = json.loads(path.read_text())
        by_c.setdefault(record["federation"]["per_round"], {})[record["seed"]] = record
    rows = {}
    for c in sorted(by_c):
        seeds = sorted(by_c[c])
        final = [100 * by_c[c][s]["final"]["test"] for s in seeds]
        zero = [100 * by_c[c][s]["zero_shot"]["test"] for s in seeds]
        rows[str(c)] = {"per_round": c, "local_steps": by_c[c][seeds[0]]["federation"]["local_steps"],
                        "seeds": seeds, "final": _spread(final), "gain": _spread([f - z for f, z in zip(final, zero)]),
                        "last_round_loss": _spread([by_c[c][s]["round_losses"][-1] for s in seeds])}
    test = None
    if len(by_c) >= 2:
        low, high = min(by_c), max(by_c)
        test = seed_test(by_c[high], by_c[low], f"C {high}", f"C {low}")
        test = test if test["p"] is not None else None
    return {"rows": rows, "test": test}


def uploads_summary(folder: str | Path) -> dict:
    """Accuracy when uploads are lost or late (``tools/run_federated_uploads``): per condition ("drop p": each
    upload lost with chance p; "late p": each comes a round late with chance p), over seeds, the test accuracy, its
    gain over zero-shot, the last round's loss, the shares of uploads lost and late, and the rounds with none
    arrived, at the C and S of those runs; the condition "all on time" is the run of ``clients/`` with that C (or the
    iid run where C is 2); and each condition against it by :func:`seed_test`."""
    runs: dict[str, dict[int, dict]] = {}
    for path in sorted((Path(folder) / "uploads").glob("iid_C*_seed*.json")):
        record = json.loads(path.read_text())
        runs.setdefault(_condition(record["federation"]), {})[record["seed"]] = record
    if not runs:
        return {"rows": {}, "tests": []}
    some = next(iter(next(iter(runs.values())).values()))["federation"]
    c, s = some["per_round"], some["local_steps"]
    plain = Path(folder).glob("iid_seed*.json") if c == 2 else (Path(folder) / "clients").glob(f"iid_C{c}_seed*.json")
    for path in sorted(plain):
        record = json.loads(path.read_text())
        if record["federation"]["local_steps"] == s and _condition(record["federation"]) == ON_TIME:
            runs.setdefault(ON_TIME, {})[record["seed"]] = record
    rows, tests = {}, []
    for condition in sorted(runs, key=lambda k: (k != ON_TIME, k)):
        by_seed = runs[condition]
        seeds = sorted(by_seed)
        final = [100 * by_seed[n]["final"]["test"] for n in seeds]
        zero = [100 * by_seed[n]["zero_shot"]["test"] for n in seeds]
        lost = [by_seed[n]["federation"].get("lost_uploads") or {} for n in seeds]
        late = [by_seed[n]["federation"].get("late_uploads") or {} for n in seeds]
        rows[condition] = {"condition": condition, "drop": lost[0].get("drop", 0.0), "late": late[0].get("late", 0.0),
                           "per_round": c, "local_steps": s, "seeds": seeds, "final": _spread(final),
                           "gain": _spread([f - z for f, z in zip(final, zero)]),
                           "last_round_loss": _spread([by_seed[n]["round_losses"][-1] for n in seeds]),
                           "lost_share": _spread([x["lost"] / x["of"] if x else 0.0 for x in lost]),
                           "late_share": _spread([x["delayed"] / x["of"] if x else 0.0 for x in late]),
                           "rounds_with_none_arrived": _spread([x.get("rounds_with_none_arrived", 0) for x in lost])}
        if condition != ON_TIME:
            tests.append(seed_test(by_seed, runs.get(ON_TIME, {}), condition, ON_TIME))
    return {"rows": rows, "tests": tests}


def _condition(federation: dict) -> str:
    """A run's uploads condition: "all on time", "drop p", "late p" or "drop p, late p"."""
    parts = [f"drop {federation['lost_uploads']['drop']:g}"] if federation.get("lost_uploads") else []
    parts += [f"late {federation['late_uploads']['late']:g}"] if federation.get("late_uploads") else []
    return ", ".join(parts) or ON_TIME


def cell_text(spread: dict, digits: int = 1) -> str:
    """A table cell: mean ± sd (number of seeds), or a dash."""
    if spread["mean"] is None:
        return "–"
    return f"{spread['mean']:.{digits}f}" + (f" ± {spread['sd']:.{digits}f}" if spread["sd"] is not None else "") + \
        f" ({spread['n']})"


def markdown(summary: dict) -> str:
    lines = ["| configuration | zero-shot | after training | gain (points) |", "|---|---|---|---|"]
    for row in summary["rows"].values():
        lines.append(f"| {row['label']} | {cell_text(row['zero_shot'])} | {cell_text(row['final'])} | {cell_text(row['gain'])} |")
    lines += ["", "Test accuracy (%) on the first 500 test sentences of each seed: mean ± sd over seeds (number of "
              "seeds). Tests over seeds (paired where both ran the same seeds, Welch otherwise; α = 0.05):", ""]
    lines += [test_line(t) for t in summary["tests"]]
    clients = summary.get("clients") or {"rows": {}}
    if len(clients["rows"]) > 1:
        lines += ["", "Clients a round (C), each taking S local steps, at one budget of C·S local steps a round:", "",
                  "| C | S | after training | gain (points) | last round's loss |", "|---|---|---|---|---|"]
        for row in clients["rows"].values():
            lines.append(f"| {row['per_round']} | {row['local_steps']} | {cell_text(row['final'])} | "
                         f"{cell_text(row['gain'])} | {cell_text(row['last_round_loss'], 2)} |")
        if clients["test"]:
            lines += ["", test_line(clients["test"])]
    uploads = summary.get("uploads") or {"rows": {}}
    if uploads["rows"]:
        some = next(iter(uploads["rows"].values()))
        lines += ["", f"Lost and late uploads (C {some['per_round']}, S {some['local_steps']}; a round closed on the "
                  "uploads that arrived, a late one broadcast with the next round's):", "",
                  "| uploads | lost | late | rounds with none arrived | after training | gain (points) | "
                  "last round's loss |", "|---|---|---|---|---|---|---|"]
        for row in uploads["rows"].values():
            lines.append(f"| {row['condition']} | {100 * row['lost_share']['mean']:.0f} % | "
                         f"{100 * row['late_share']['mean']:.0f} % | {row['rounds_with_none_arrived']['mean']:.1f} | "
                         f"{cell_text(row['final'])} | {cell_text(row['gain'])} | "
                         f"{cell_text(row['last_round_loss'], 2)} |")
        lines += [""] + [test_line(t) for t in uploads["tests"]]
    return "\n".join(lines) + "\n"


def test_words(t: dict) -> str:
    """A :func:`seed_test` in :func:`~prge_lib.experiments.stats.describe`'s words (its verdict alone where a side
    had no runs)."""
    return describe(t) if "difference" in t else t["verdict"]


def test_text(t: dict) -> str:
    """A :func:`seed_test` named: "a − b: " and :func:`test_words`."""
    return f"{t['a']} − {t['b']}: {test_words(t)}"


def test_line(t: dict) -> str:
    """A :func:`seed_test` as a line of the summary's lists."""
    return f"- {test_text(t)}"


def write_summary(folder: str | Path) -> dict:
    summary = summarize(folder)
    for name, text in (("summary.json", json.dumps(summary, indent=2) + "\n"), ("summary.md", markdown(summary))):
        with atomic_file(Path(folder) / name) as tmp:
            tmp.write_text(text)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prge_lib.experiments.federated_summary",
                                     description="Write summary.json and summary.md of the federated runs in a "
                                                 "folder and print the markdown.")
    parser.add_argument("folder", nargs="?", default=str(FOLDER),
                        help="the folder of <config>_seed<N>.json runs (default: the committed federated results)")
    args = parser.parse_args(argv)
    if not Path(args.folder).is_dir():
        parser.error(f"folder {args.folder!r} does not exist: give the folder that tools/run_federated wrote")
    print(markdown(write_summary(args.folder)), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
