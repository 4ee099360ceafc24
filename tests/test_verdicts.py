"""prge_lib.experiments.verdicts on small synthetic records: each verdict word from the test that gives it."""
import pytest

from prge_lib.experiments import stats, verdicts


def record(label, mean, trained=True):
    return {"label": label, "test_mean": mean, "trained": trained}


CLAIM = ("P-RGE above MeZO (LoRA-FA)", "Gao et al. (arXiv) Table 1")


def test_ordering_words_follow_the_seed_test_and_the_papers_sign():
    a, b = record("P-RGE", 80.0), record("MeZO", 70.0)
    clear = stats.compare_scores({0: 80, 1: 81, 2: 79}, {0: 70, 1: 71, 2: 69})       # p = 0 (same differences)
    assert verdicts.ordering(*CLAIM, 89.1, 87.5, a, b, clear)["verdict"] == verdicts.REPRODUCED
    assert verdicts.ordering(*CLAIM, 87.5, 89.1, a, b, clear)["verdict"] == verdicts.NOT_REPRODUCED
    noisy = stats.compare_scores({0: 80, 1: 60, 2: 75}, {0: 70, 1: 71, 2: 69})
    got = verdicts.ordering(*CLAIM, 89.1, 87.5, a, b, noisy)
    assert got["verdict"] == verdicts.INCONCLUSIVE and "paired t(2)" in got["test"] and got["paper"] == "89.1 vs 87.5 (+1.6)"
    # differences 10, -11, 6: sd 11.2; the paper's +1.6 then needs about 384 paired seeds (80% power)
    assert got["test"].endswith("; the paper's gap (+1.6) needs about 384 seeds a side to be found at this spread "
                                "(80% power)")
    assert stats.seeds_needed(noisy, 1.6) == 384
    # the same seeds tested at a second look (alpha 0.025): the count is planned at that level, and says so
    second = stats.compare_scores({0: 80, 1: 60, 2: 75}, {0: 70, 1: 71, 2: 69}, looks=2)
    later = verdicts.ordering(*CLAIM, 89.1, 87.5, a, b, second)["test"]
    assert later.endswith(f"; the paper's gap (+1.6) needs {stats.seeds_words(stats.seeds_needed(second, 1.6))} seeds "
                          "a side to be found at this spread (80% power at α = 0.025)")
    assert stats.seeds_needed(second, 1.6) > 384
    one = stats.compare_scores({0: 80}, {0: 70})
    assert verdicts.ordering(*CLAIM, 89.1, 87.5, a, b, one)["test"].endswith(stats.UNTESTED)
    stalled = verdicts.ordering(*CLAIM, 89.1, 87.5, a, record("MeZO", 70.0, trained=False), clear)
    assert stalled["verdict"] == verdicts.INCONCLUSIVE and stalled["test"] == "did not train: MeZO"
    assert verdicts.ordering(*CLAIM, 89.1, 87.5, None, b, None)["book"] == "not run yet"
    figure_only = verdicts.ordering(*CLAIM, None, None, a, b, clear)      # the paper's ordering from a figure: a above b
    assert figure_only["verdict"] == verdicts.REPRODUCED and "no numbers in the text" in figure_only["paper"]
    # a clear gap on two seeds a side (Welch: seeds 0, 1 against 0, 1, 2) is tested but gives no verdict
    two = stats.compare_scores({0: 80, 1: 81}, {0: 70, 1: 71, 2: 69})
    few = verdicts.ordering(*CLAIM, 89.1, 87.5, a, b, two)
    assert two["p"] < stats.ALPHA and two["verdict"] == stats.FEW_SEEDS and few["verdict"] == verdicts.INCONCLUSIVE
    assert few["test"].startswith("+") and stats.FEW_SEEDS + "; the paper's gap (+1.6) needs about" in few["test"]
    # a claim from a figure has no gap of the paper's to price: the gap seen is priced, if it lies the claimed way
    wide = stats.compare_scores({0: 70, 1: 75, 2: 68}, {0: 51, 1: 51, 2: 60})       # differences 19, 24, 8
    seen = verdicts.ordering(*CLAIM, None, None, record("C4", 71.0), record("smallest", 54.0), wide)
    assert wide["verdict"] == stats.NO_DIFFERENCE and seen["verdict"] == verdicts.INCONCLUSIVE
    n = stats.seeds_needed(wide, wide["difference"])
    assert 3 < n < 10 and seen["test"].endswith(f"; a gap of the size seen (+17.0) needs "
                                                f"{stats.seeds_words(n)} seeds a side to be found at this spread "
                                                "(80% power)")
    backwards = stats.compare_scores({0: 51, 1: 51, 2: 60}, {0: 70, 1: 75, 2: 68})
    assert "size seen" not in verdicts.ordering(*CLAIM, None, None, record("smallest", 54.0), record("C4", 71.0),
                                                 backwards)["test"]


def test_a_stall_counts_as_the_claimed_outcome_only_for_the_lower_row_and_with_a_reason():
    c4, blind = record("C4 mask", 70.0), record("random mask", 51.0, trained=False)
    clear = stats.compare_scores({0: 70, 1: 72, 2: 69}, {0: 51, 1: 52, 2: 51})
    reason = "no rate up to 1000x the C4 mask's left zero-shot"
    # without a reason a stalled row leaves the claim open, as for an untuned baseline
    assert verdicts.ordering(*CLAIM, None, None, c4, blind, clear)["verdict"] == verdicts.INCONCLUSIVE
    got = verdicts.ordering(*CLAIM, None, None, c4, blind, clear, stall_is_outcome=reason)
    assert got["verdict"] == verdicts.REPRODUCED
    assert got["test"].startswith("random mask did not train, the outcome claimed (" + reason) and "paired t(2)" in got["test"]
    # the paper places b above a: then a is the row whose stall is the outcome
    flipped = stats.compare_scores({0: 51, 1: 52, 2: 51}, {0: 70, 1: 72, 2: 69})
    assert verdicts.ordering(*CLAIM, 60.0, 90.0, blind, c4, flipped, stall_is_outcome=reason)["verdict"] == \
        verdicts.REPRODUCED
    # the upper row stalling is never the claimed outcome, nor are both stalling
    assert verdicts.ordering(*CLAIM, 90.0, 60.0, blind, c4, flipped, stall_is_outcome=reason)["test"] == \
        "did not train: random mask"
    both = verdicts.ordering(*CLAIM, None, None, record("C4 mask", 51.0, trained=False), blind, clear,
                             stall_is_outcome=reason)
    assert both["verdict"] == verdicts.INCONCLUSIVE and both["test"] == "did not train: C4 mask, random mask"
    # one seed of the stalled row: still untested
    one = stats.compare_scores({0: 70}, {0: 51})
    assert verdicts.ordering(*CLAIM, None, None, c4, blind, one, stall_is_outcome=reason)["verdict"] == \
        verdicts.INCONCLUSIVE


def test_equivalence_needs_every_interval_inside_the_margin():
    ref = record("LoRA-FA", 70.0)
    tight = stats.compare_scores({0: 70.5, 1: 71.0, 2: 70.0}, {0: 70.0, 1: 70.4, 2: 69.6})   # CI about ± 0.3
    wide = stats.compare_scores({0: 80, 1: 60, 2: 75}, {0: 70, 1: 71, 2: 69})
    far = stats.compare_scores({0: 60, 1: 61, 2: 59}, {0: 70, 1: 71, 2: 69})                # -10, certain
    check = lambda *others: verdicts.equivalence("spaces alike", "Table 7", "1.1-point span", ref,
                                                 [(record("DoRA", 70.5), t) for t in others])["verdict"]
    assert check(tight) == verdicts.REPRODUCED
    assert check(tight, wide) == verdicts.INCONCLUSIVE
    # the wide test (differences 10, -11, 6: sd 11.2) says how many seeds would fit it inside ± 3 points
    wide_row = verdicts.equivalence("spaces alike", "Table 7", "1.1-point span", ref, [(record("VeRA", 71.7), wide)])
    assert wide_row["test"].endswith(
        "; seeds a side for the interval to fit ± 3 points at this spread if the rows are equal (80% power): VeRA "
        f"about {stats.seeds_for_equivalence(wide, 3.0)}")
    assert "seeds a side for the interval" not in verdicts.equivalence(
        "spaces alike", "Table 7", "1.1-point span", ref, [(record("DoRA", 70.5), tight)])["test"]
    assert "(95% intervals within ± 3 points needed)" in wide_row["test"]
    # the same test at a second look (alpha 0.025): a wider interval, so more seeds, and the line names the level
    later = stats.compare_scores({0: 80, 1: 60, 2: 75}, {0: 70, 1: 71, 2: 69}, looks=2)
    later_row = verdicts.equivalence("spaces alike", "Table 7", "1.1-point span", ref, [(record("VeRA", 71.7), later)])
    more = stats.seeds_for_equivalence(later, 3.0)
    assert more > stats.seeds_for_equivalence(wide, 3.0)
    assert later_row["test"].endswith(f": VeRA about {more} at α = 0.025")
    assert "(intervals at each test's level within ± 3 points needed)" in later_row["test"]
    assert check(tight, far) == verdicts.NOT_REPRODUCED
    assert check(stats.compare_scores({0: 70}, {0: 70})) == verdicts.INCONCLUSIVE
    assert check(stats.compare_scores({0: 60, 1: 61}, {0: 70, 1: 71})) == verdicts.INCONCLUSIVE     # two seeds a side


def test_threshold_claims_compare_the_measured_ratio_with_its_bound():
    flat = verdicts.threshold("flat in q", "Table 8", 1.06, 1.12, at_most=1.25, what="q 16 ÷ q 1")
    assert flat["verdict"] == verdicts.REPRODUCED and flat["test"] == "q 16 ÷ q 1 1.12, ≤ 1.25 needed"
    assert verdicts.threshold("inner pays", "Table 12", 1.53, 1.02, at_least=1.1)["verdict"] == verdicts.NOT_REPRODUCED
    assert verdicts.threshold("inner pays", "Table 12", 1.53, None, at_least=1.1)["verdict"] == verdicts.INCONCLUSIVE
    with pytest.raises(ValueError, match="needs at_least or at_most"):
        verdicts.threshold("x", "y", 1.0, 1.0)
    with pytest.raises(ValueError, match="verdict 'maybe' is not one of"):
        verdicts.row("x", "y", "p", "b", "maybe", "t")
    rows = [flat, verdicts.threshold("x", "y", None, None, at_least=1)]
    assert verdicts.counts(rows) == {"reproduced": 1, "not reproduced": 0, "inconclusive": 1}


def test_a_row_is_read_from_the_grid_that_tested_it_over_the_most_seeds_ties_to_the_earlier_grid():
    def rec(n, lr):
        return {"n": n, "lr": lr}

    one_rate = {("sst2", "senszoq-random-s1e-3"): rec(1, 1e-4), ("sst2", "senszoq-c4-s1e-3"): rec(3, 1e-4)}
    own_rate = {("sst2", "senszoq-random-s1e-3"): rec(1, 1e-1), ("sst2", "senszoq-c4-s1e-3"): rec(1, 1e-5)}
    tables = {"senszoq": own_rate, "alternatives": one_rate}
    assert verdicts.most_seeds("sst2", "senszoq-random-s1e-3", tables) == ("senszoq", rec(1, 1e-1))   # a tie
    assert verdicts.most_seeds("sst2", "senszoq-c4-s1e-3", tables) == ("alternatives", rec(3, 1e-4))
    own_rate["sst2", "senszoq-c4-s1e-3"] = rec(3, 1e-5)                                      # its confirm seeds
    assert verdicts.most_seeds("sst2", "senszoq-c4-s1e-3", tables) == ("senszoq", rec(3, 1e-5))
    assert verdicts.most_seeds("sst2", "senszoq-c4-s1e-3", dict(reversed(tables.items()))) == \
        ("alternatives", rec(3, 1e-4))
    assert verdicts.most_seeds("rte", "senszoq-c4-s1e-3", tables) is None
    assert verdicts.most_seeds("sst2", "senszoq-c4-s1e-3", {}) is None
