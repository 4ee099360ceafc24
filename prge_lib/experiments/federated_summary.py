"""The summary of the federated SST-2 runs (chapter 11; ``tools/run_federated``): per configuration (centralised,
federated iid, federated label-skew) the test accuracy over seeds (mean ± sd), and paired t tests over seeds of
federated − centralised and label-skew − iid (:func:`prge_lib.experiments.stats.paired`); a p of 0.05 or more
reads "no difference detected". Written as ``summary.json`` and ``summary.md`` beside the runs.

``python -m prge_lib.experiments.federated_summary data/results/federated``
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from prge_lib.common.paths import RESULTS
from prge_lib.common.provenance import atomic_file
from prge_lib.experiments.stats import DIFFERENCE, paired, verdict_of

CONFIGS = ("centralised", "iid", "label-skew")
LABELS = {"centralised": "centralised P-RGE (same batches as iid)", "iid": "federated, iid shards",
          "label-skew": "federated, label-skew shards (p 0.9)"}
COMPARISONS = (("iid", "centralised"), ("label-skew", "centralised"), ("label-skew", "iid"))
FOLDER = RESULTS / "federated"      # where tools/run_federated writes the runs


def read_runs(folder: str | Path = FOLDER) -> dict[str, dict[int, dict]]:
    """Every ``<config>_seed<N>.json`` of ``folder``: {config: {seed: record}}."""
    runs: dict[str, dict[int, dict]] = {c: {} for c in CONFIGS}
    for config in CONFIGS:
        for path in sorted(Path(folder).glob(f"{config}_seed*.json")):
            record = json.loads(path.read_text())
            runs[config][record["seed"]] = record
    return runs


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
    tests = []
    for a, b in COMPARISONS:
        seeds = sorted(set(runs[a]) & set(runs[b]))
        if len(seeds) < 2:
            tests.append({"a": a, "b": b, "seeds": seeds, "verdict": "fewer than 2 paired seeds: untested"})
            continue
        result = paired([100 * runs[a][s]["final"]["test"] for s in seeds],
                        [100 * runs[b][s]["final"]["test"] for s in seeds])
        result.update(a=a, b=b, seeds=seeds, verdict="difference" if verdict_of(result["p"]) == DIFFERENCE
                      else "no difference detected")
        tests.append(result)
    any_run = next((r for by_seed in runs.values() for r in by_seed.values()), None)
    return {"kind": "federated-summary", "rows": rows, "tests": tests, "clients": clients_summary(folder, runs),
            "settings": None if any_run is None else {
                k: any_run["federation"][k] for k in ("clients", "per_round", "local_steps", "rounds")} | {
                k: any_run["config"][k] for k in ("q", "E", "eps", "lr")} | {"n_test": any_run["n_test"],
                                                                             "steps": any_run["steps"]}}


def clients_summary(folder: str | Path, runs: dict[str, dict[int, dict]]) -> dict:
    """Accuracy against the clients a round, C, at one budget of local steps (``tools/run_federated_clients``):
    per C, over seeds, the test accuracy after training, its gain over zero-shot and the last round's loss
    (C 2 is the iid run of ``folder``, the others ``clients/iid_C<C>_seed<N>.json``), and the paired t test of
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
        seeds = sorted(set(by_c[low]) & set(by_c[high]))
        if len(seeds) >= 2:
            test = paired([100 * by_c[high][s]["final"]["test"] for s in seeds],
                          [100 * by_c[low][s]["final"]["test"] for s in seeds])
            test.update(a=f"C {high}", b=f"C {low}", seeds=seeds,
                        verdict="difference" if verdict_of(test["p"]) == DIFFERENCE else "no difference detected")
    return {"rows": rows, "test": test}


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
              "seeds). Paired t tests over seeds:", ""]
    for t in summary["tests"]:
        if "p" not in t:
            lines.append(f"- {t['a']} − {t['b']}: {t['verdict']}")
            continue
        lines.append(test_line(t))
    clients = summary.get("clients") or {"rows": {}}
    if len(clients["rows"]) > 1:
        lines += ["", "Clients a round (C), each taking S local steps, at one budget of C·S local steps a round:", "",
                  "| C | S | after training | gain (points) | last round's loss |", "|---|---|---|---|---|"]
        for row in clients["rows"].values():
            lines.append(f"| {row['per_round']} | {row['local_steps']} | {cell_text(row['final'])} | "
                         f"{cell_text(row['gain'])} | {cell_text(row['last_round_loss'], 2)} |")
        if clients["test"]:
            lines += ["", test_line(clients["test"])]
    return "\n".join(lines) + "\n"


def test_line(t: dict) -> str:
    """One paired t test as a line: the difference, t, p, its 95% CI and the verdict."""
    return (f"- {t['a']} − {t['b']}: {t['difference']:+.1f} points, t({t['df']}) = {t['statistic']:.2f}, "
            f"p = {t['p']:.2g}, 95% CI [{t['ci'][0]:.1f}, {t['ci'][1]:.1f}]: {t['verdict']}")


def write_summary(folder: str | Path) -> dict:
    summary = summarize(folder)
    for name, text in (("summary.json", json.dumps(summary, indent=2) + "\n"), ("summary.md", markdown(summary))):
        with atomic_file(Path(folder) / name) as tmp:
            tmp.write_text(text)
    return summary


if __name__ == "__main__":
    print(markdown(write_summary(sys.argv[1] if len(sys.argv) > 1 else FOLDER)))
