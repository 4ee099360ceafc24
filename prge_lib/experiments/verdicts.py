"""Verdicts on the papers' claims, one row per claim, as chapters 7–9 end with them.

Each row names the claim, its source (paper, version and table or figure number: the arXiv full version and the
ACL version of Gao et al. number their tables differently), the paper's figure, the book's, and one word:
REPRODUCED, NOT_REPRODUCED or INCONCLUSIVE, with the test behind it. Accuracy claims are tested over seeds
(:mod:`prge_lib.experiments.stats`); systems claims compare a measured ratio with a stated threshold.
"""
from __future__ import annotations

import math

from prge_lib.common.paths import RESULTS
from prge_lib.experiments import stats
from prge_lib.experiments.summaries import runs_of

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
# a parameter space is "as accurate" as LoRA-FA when the 95% interval of the difference (wider where the test is
# held below 0.05 over several looks) lies within this many points: Gao et al. (arXiv) Table 7's four spaces span
# 1.1 points, and three such spans are allowed
EQUIVALENCE_POINTS = 3.0


def row(claim: str, source: str, paper: str, book: str, verdict: str, test: str) -> dict:
    """One line of a verdict table."""
    if verdict not in (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE):
        raise ValueError(f"verdict {verdict!r} is not one of {REPRODUCED!r}, {NOT_REPRODUCED!r}, {INCONCLUSIVE!r}")
    return {"claim": claim, "source": source, "paper": paper, "book": book, "verdict": verdict, "test": test}


def seed_test(a: dict, b: dict, grid_a: str = "table1", grid_b: str | None = None, results=RESULTS) -> dict:
    """:func:`stats.compare_rows` of two summary records, each with the runs of its own grid."""
    return stats.compare_rows(a, runs_of(grid_a, a["task"], a["row"], a["lr"], results),
                              b, runs_of(grid_b or grid_a, b["task"], b["row"], b["lr"], results))


def most_seeds(task: str, key: str, tables: dict[str, dict]) -> tuple[str, dict] | None:
    """(grid, summary record) of row ``key`` on ``task`` from the grid of ``tables`` ({grid: ``table_of`` of its
    summary}, in order of preference) whose record has the most seeds; ties go to the earlier grid; None where
    no grid has the row. Chapter 8 reads each mask from the ``senszoq`` grid (every mask at its own rate) before
    the ``alternatives`` grid (every mask at the C4 mask's rate), so a mask's confirm seeds replace its one-rate
    runs in the verdicts as soon as they are as many."""
    found = [(grid, table[task, key]) for grid, table in tables.items() if (task, key) in table]
    return max(found, key=lambda pair: (pair[1]["n"], -list(tables).index(pair[0])), default=None)


SEEDS_NEEDED = f"at least {stats.MIN_SEEDS} seeds a side needed for a verdict"


def _seeds_for_gap(result: dict, paper_a: float | None, paper_b: float | None) -> str:
    """Where a seed test found no difference: how many seeds a side would detect the paper's gap at the spread
    and level the test observed (:func:`stats.seeds_needed`); where the paper orders the rows in a figure only, a
    gap of the size the test saw, if it lies the claimed way (a planning figure: the true gap may be smaller); ""
    where the test has no spread, or saw no gap the claimed way."""
    if result.get("sd") is None:
        return ""
    if paper_a is not None and paper_b is not None:
        gap, what = paper_a - paper_b, "the paper's gap"
    else:
        gap, what = result["difference"], "a gap of the size seen"
        if gap <= 0:
            return ""
    if gap == 0:
        return ""
    return (f"; {what} ({gap:+.1f}) needs {stats.seeds_words(stats.seeds_needed(result, gap))} seeds a side to be "
            f"found at this spread ({stats.POWER:.0%} power{stats.level_words(result)})")


def _seeds_for_margin(others: list[tuple[dict, dict]], margin: float) -> str:
    """Where an equivalence test was too wide or had too few seeds: how many seeds a side would put each interval
    inside ± ``margin`` if the rows are truly equal, at the spread each test observed
    (:func:`stats.seeds_for_equivalence`); "" where no test has a spread."""
    counts = [f"{o['label']} {stats.seeds_words(stats.seeds_for_equivalence(t, margin))}{stats.level_words(t)}"
              for o, t in others if t.get("sd") is not None]
    if not counts:
        return ""
    return (f"; seeds a side for the interval to fit ± {margin:g} points at this spread if the rows are equal "
            f"({stats.POWER:.0%} power): {', '.join(counts)}")


def _interval_words(others: list[tuple[dict, dict]]) -> str:
    """Which intervals an equivalence verdict reads: "95% intervals", or each test's own where a test was held
    below 0.05 over several looks (its interval is then wider, :func:`stats.describe` prints its level)."""
    if all(t.get("alpha", stats.ALPHA) >= stats.ALPHA for _, t in others):
        return f"{100 * (1 - stats.ALPHA):g}% intervals"
    return "intervals at each test's level"


def _untrained(*records: dict) -> list[str]:
    return [r["label"] for r in records if r.get("trained") is False]


def ordering(claim: str, source: str, paper_a: float | None, paper_b: float | None, a: dict | None,
             b: dict | None, result: dict | None, stall_is_outcome: str | None = None) -> dict:
    """Verdict on "row a scores above (or below) row b", the paper's scores ``paper_a``, ``paper_b`` (None where
    the paper gives the ordering only in a figure: then "a above b"): REPRODUCED when the seed test finds a
    difference of the paper's sign, NOT_REPRODUCED when it finds one of the other sign, INCONCLUSIVE when it
    finds none, cannot test (one seed), has fewer than ``stats.MIN_SEEDS`` seeds a side (its word is then
    ``stats.FEW_SEEDS``, not a difference), or a row never trained. A test that found no difference adds how
    many seeds a side would find the paper's gap at the spread observed (for a claim from a figure, the gap seen).

    ``stall_is_outcome``: where the claim is that the lower row does not learn what the upper one does (Guo et
    al. Fig. 6a: only the sensitive mask trains), the caller's reason why the lower row's stall is that outcome
    and not a setting left untuned (e.g. its rates reached beyond the paper's own). The lower row staying at
    zero-shot then goes to the seed test like any score; the upper row's stall still leaves the claim
    inconclusive."""
    if paper_a is None or paper_b is None:
        paper, paper_gap = "a above b in a figure (no numbers in the text)", 1.0
    else:
        paper, paper_gap = f"{paper_a:.1f} vs {paper_b:.1f} ({paper_a - paper_b:+.1f})", paper_a - paper_b
    if not (a and b and result):
        return row(claim, source, paper, "not run yet", INCONCLUSIVE, "no result files")
    book = f"{a['test_mean']:.1f} vs {b['test_mean']:.1f} ({result['difference']:+.1f})"
    upper, lower = (a, b) if paper_gap > 0 else (b, a)
    stalled, excused = _untrained(a, b), ""
    if stall_is_outcome and _untrained(lower) and not _untrained(upper):
        stalled, excused = [], f"{lower['label']} did not train, the outcome claimed ({stall_is_outcome}); "
    if stalled:
        return row(claim, source, paper, book, INCONCLUSIVE, f"did not train: {', '.join(stalled)}")
    test = excused + stats.describe(result)
    if result["verdict"] != stats.DIFFERENCE:
        return row(claim, source, paper, book, INCONCLUSIVE, test + _seeds_for_gap(result, paper_a, paper_b))
    same_sign = math.copysign(1, result["difference"]) == math.copysign(1, paper_gap)
    return row(claim, source, paper, book, REPRODUCED if same_sign else NOT_REPRODUCED, test)


def equivalence(claim: str, source: str, paper: str, reference: dict | None, others: list[tuple[dict, dict]],
                margin: float = EQUIVALENCE_POINTS) -> dict:
    """Verdict on "these rows are as accurate as ``reference``": ``others`` holds (record, test against the
    reference) pairs. REPRODUCED when every test's interval (95%, or at its own lower level over several looks)
    lies within ± ``margin`` points, NOT_REPRODUCED when a test finds a difference larger than ``margin``,
    INCONCLUSIVE otherwise (untested, too wide, fewer than ``stats.MIN_SEEDS`` seeds a side, or a row that never
    trained). A test too wide or on too few seeds adds how many seeds a side would fit the interval inside the
    margin if the rows are equal, at that test's level."""
    if not reference or not others:
        return row(claim, source, paper, "not run yet", INCONCLUSIVE, "no result files")
    book = ", ".join(f"{r['label']} {r['test_mean']:.1f}" for r in (reference, *(o for o, _ in others)))
    stalled = _untrained(reference, *(o for o, _ in others))
    if stalled:
        return row(claim, source, paper, book, INCONCLUSIVE, f"did not train: {', '.join(stalled)}")
    tests = "; ".join(f"{o['label']}: {stats.describe(t)}" for o, t in others)
    if any(stats.fewest_seeds(t) < stats.MIN_SEEDS for _, t in others if t["verdict"] != stats.UNTESTED):
        return row(claim, source, paper, book, INCONCLUSIVE,
                   f"{tests} ({SEEDS_NEEDED})" + _seeds_for_margin(others, margin))
    if any(t["verdict"] == stats.DIFFERENCE and abs(t["difference"]) > margin for _, t in others):
        return row(claim, source, paper, book, NOT_REPRODUCED, f"{tests} (margin ± {margin:g} points)")
    inside = all(t["ci"] and -margin <= t["ci"][0] and t["ci"][1] <= margin for _, t in others)
    test = f"{tests} ({_interval_words(others)} within ± {margin:g} points needed)"
    return row(claim, source, paper, book, REPRODUCED if inside else INCONCLUSIVE,
               test if inside else test + _seeds_for_margin(others, margin))


def threshold(claim: str, source: str, paper_value: float | str | None, ours: float | None, *,
              at_least: float | None = None, at_most: float | None = None, what: str = "ratio") -> dict:
    """Verdict on a systems claim: ``ours`` (a ratio measured here) must be at least ``at_least`` and/or at most
    ``at_most``; the paper's own value (or its words, where it gives no ratio) stands beside it. INCONCLUSIVE
    while not measured."""
    if at_least is None and at_most is None:
        raise ValueError("a threshold claim needs at_least or at_most")
    bounds = " and ".join(b for b in ((f"≥ {at_least:g}" if at_least is not None else ""),
                                      (f"≤ {at_most:g}" if at_most is not None else "")) if b)
    paper = ("no figure in the text" if paper_value is None else paper_value if isinstance(paper_value, str)
             else f"{what} {paper_value:.2f}")
    if ours is None or (isinstance(ours, float) and math.isnan(ours)):
        return row(claim, source, paper, "not measured yet", INCONCLUSIVE, f"{what} {bounds} needed")
    ok = (at_least is None or ours >= at_least) and (at_most is None or ours <= at_most)
    return row(claim, source, paper, f"{what} {ours:.2f}", REPRODUCED if ok else NOT_REPRODUCED,
               f"{what} {ours:.2f}, {bounds} needed")


def counts(rows: list[dict]) -> dict[str, int]:
    """How many rows carry each verdict word."""
    return {word: sum(r["verdict"] == word for r in rows) for word in (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)}
