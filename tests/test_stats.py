"""Known answers for prge_lib.experiments.stats: closed forms of the t distribution, Student's sleep data
(paired and Welch, the textbook example every statistics package documents), Welch's df by hand."""
import math
import statistics

import pytest

from prge_lib.experiments import stats


def test_t_distribution_against_closed_forms():
    # df = 1 is Cauchy: P(T > t) = 1/2 - atan(t)/pi; df = 2: P(T > t) = (1 - t / sqrt(t^2 + 2)) / 2
    for t in (-3.0, -0.4, 0.0, 0.7, 2.5, 40.0):
        assert stats.t_sf(t, 1) == pytest.approx(0.5 - math.atan(t) / math.pi, abs=1e-12)
        assert stats.t_sf(t, 2) == pytest.approx((1 - t / math.sqrt(t * t + 2)) / 2, abs=1e-12)
    # large df tends to the normal: P(Z > 1.96) = 0.0249979
    assert stats.t_sf(1.96, 1e7) == pytest.approx(0.0249979, abs=1e-6)
    # df = 2 quantile: t = (2p - 1) sqrt(2 / (4p(1 - p))); p = 0.975 gives 0.95 * sqrt(2 / 0.0975) = 4.302653
    assert stats.t_quantile(0.975, 2) == pytest.approx(4.302653, abs=1e-6)
    assert stats.t_quantile(0.025, 2) == pytest.approx(-4.302653, abs=1e-6)
    assert stats.t_quantile(0.975, 9) == pytest.approx(2.262157, abs=1e-6)     # printed t tables: 2.262
    with pytest.raises(ValueError, match="degrees of freedom must be positive, got 0"):
        stats.t_sf(1.0, 0)


# Student (1908), hours of extra sleep under two drugs, the same ten patients
SLEEP_1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
SLEEP_2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def test_paired_t_on_students_sleep_data():
    # differences 1.2 2.4 1.3 1.3 0 1.0 1.8 0.8 4.6 1.4: mean 1.58, sd 1.2300, se 0.38897, t = 4.0621 on 9 df,
    # p = 0.002833, CI 1.58 ± 2.262157 * 0.38897 = [0.7001, 2.4599]
    r = stats.paired(SLEEP_2, SLEEP_1)
    assert r["difference"] == pytest.approx(1.58)
    assert r["statistic"] == pytest.approx(4.0621, abs=1e-4) and r["df"] == 9
    assert r["p"] == pytest.approx(0.002833, abs=1e-6)
    assert r["ci"] == pytest.approx((0.7001142, 2.4598858), abs=1e-6)
    lo, hi = r["bootstrap_ci"]                                 # ten seeds: the bootstrap interval is there
    assert lo < 1.58 < hi and 0.5 < lo and hi < 2.8


def test_welch_on_students_sleep_data_and_df_by_hand():
    # the same data as two independent groups: t = 1.8608, df = 17.776, p = 0.07939, CI [-0.2055, 3.3655]
    r = stats.welch(SLEEP_2, SLEEP_1)
    assert r["statistic"] == pytest.approx(1.8608, abs=1e-4)
    assert r["df"] == pytest.approx(17.776, abs=1e-3) and r["p"] == pytest.approx(0.07939, abs=1e-5)
    assert r["ci"] == pytest.approx((-0.2054832, 3.3654832), abs=1e-6)
    # a = 1 2 3 (variance 1), b = 2 4 6 8 (variance 20/3): s_a^2/n_a = 1/3, s_b^2/n_b = 5/3, sum 2;
    # df = 2^2 / ((1/3)^2/2 + (5/3)^2/3) = 4 / (1/18 + 25/27) = 4 * 54/53 = 216/53
    assert stats.welch([1, 2, 3], [2, 4, 6, 8])["df"] == pytest.approx(216 / 53)


def test_compare_scores_picks_the_test_and_the_word():
    same = stats.compare_scores({0: 74.2, 1: 73.5, 2: 74.0}, {0: 77.1, 1: 66.1, 2: 74.5})
    assert same["test"] == "paired t" and same["df"] == 2 and same["verdict"] == stats.NO_DIFFERENCE
    # differences 10, 11, 12: mean 11, sd 1, t = 11 sqrt(3) = 19.05 on 2 df, p = 1 - 19.05/sqrt(19.05^2 + 2) = 0.0027
    clear = stats.compare_scores({0: 80, 1: 81, 2: 82}, {0: 70, 1: 70, 2: 70})
    assert clear["statistic"] == pytest.approx(11 * math.sqrt(3))
    assert clear["p"] == pytest.approx(1 - 11 * math.sqrt(3) / math.sqrt(363 + 2)) and clear["verdict"] == stats.DIFFERENCE
    other_seeds = stats.compare_scores({0: 80, 1: 81, 2: 82}, {3: 70, 4: 71, 5: 72})
    assert other_seeds["test"] == "Welch t" and other_seeds["verdict"] == stats.DIFFERENCE
    # a seed more on one side: Welch over all four and three seeds, not paired on the three both ran
    one_more = stats.compare_scores({0: 80, 1: 81, 2: 82, 3: 79}, {0: 70, 1: 70, 2: 70})
    assert one_more["test"] == "Welch t" and one_more["n"] == (4, 3)
    assert one_more["difference"] == pytest.approx(80.5 - 70)
    # the same gap with two seeds on one side: tested (p < ALPHA) but not called a difference
    two = stats.compare_scores({0: 80, 1: 81, 2: 82}, {3: 70, 4: 71})
    assert two["test"] == "Welch t" and two["p"] < stats.ALPHA and two["verdict"] == stats.FEW_SEEDS
    paired_two = stats.compare_scores({0: 80, 1: 82}, {0: 70, 1: 71})
    assert paired_two["p"] < stats.ALPHA and paired_two["verdict"] == stats.FEW_SEEDS
    assert stats.describe(two).endswith(": " + stats.FEW_SEEDS)
    # no difference shown needs no seed count: a large p is reported as such on two seeds
    assert stats.compare_scores({0: 80, 1: 60}, {0: 70, 1: 71})["verdict"] == stats.NO_DIFFERENCE
    one = stats.compare_scores({0: 80}, {0: 70, 1: 71, 2: 72})
    assert one["verdict"] == stats.UNTESTED and one["p"] is None and one["difference"] == pytest.approx(9)
    # identical differences: a zero standard error, the difference is certain
    assert stats.compare_scores({0: 2, 1: 3}, {0: 1, 1: 2})["p"] == 0.0
    assert "p = " in stats.describe(same) and stats.describe(one).endswith(stats.UNTESTED)


def test_a_second_look_is_held_to_a_stricter_level():
    # differences 3, 1, 4, 2: mean 2.5, sd sqrt(5/3), se sqrt(5/3)/2 = 0.6455, t = 3.873 on 3 df, p = 0.0305:
    # a difference at 0.05, none at 0.05 / 2 (two looks), whose 97.5% interval 2.5 ± t(0.9875; 3) * se crosses 0
    a, b = {0: 73, 1: 71, 2: 74, 3: 72}, {0: 70, 1: 70, 2: 70, 3: 70}
    first, second = stats.compare_scores(a, b), stats.compare_scores(a, b, looks=2)
    assert first["p"] == second["p"] == pytest.approx(0.03047, abs=1e-5)
    assert first["verdict"] == stats.DIFFERENCE and second["verdict"] == stats.NO_DIFFERENCE
    se = math.sqrt(5 / 3) / 2
    assert second["ci"] == pytest.approx((2.5 - 4.176535 * se, 2.5 + 4.176535 * se), abs=1e-5)
    assert second["alpha"] == 0.025 and second["looks"] == 2 and first["looks"] == 1
    assert "95% CI" in stats.describe(first) and " at α" not in stats.describe(first)
    assert stats.describe(second).endswith("97.5% CI [-0.2, 5.2]: no difference shown at α = 0.025 (2 looks)")
    # rows' added seeds count the looks, once each seed: seed 3 added to both rows is one more look
    runs = lambda scores: [{"seed": k, "best_val": {"test": v / 100}} for k, v in scores.items()]  # noqa: E731
    rec_a = {"row": "a", "task": "sst2", "added_seeds": [3]}
    rec_b = {"row": "b", "task": "sst2", "added_seeds": [3]}
    both = stats.compare_rows(rec_a, runs(a), rec_b, runs(b))
    assert both["looks"] == 2 and both["added_seeds"] == [3] and both["verdict"] == stats.NO_DIFFERENCE
    assert stats.describe(both).endswith("at α = 0.025 (2 looks: seed 3 added after the first)")
    plain = stats.compare_rows({"row": "a", "task": "sst2"}, runs(a), {"row": "b", "task": "sst2"}, runs(b))
    assert plain["looks"] == 1 and plain["verdict"] == stats.DIFFERENCE
    with pytest.raises(ValueError, match="looks must be a whole number >= 1, got 0"):
        stats.compare_scores(a, b, looks=0)


def test_bootstrap_enumerates_small_samples():
    # n = 3: 27 equally likely resamples; their means run from 0 to 3, the 2.5% and 97.5% points are 0 and 3
    assert stats.bootstrap_interval([0.0, 1.5, 3.0]) == (0.0, 3.0)
    assert stats.paired([1, 2, 3], [0, 0, 0])["bootstrap_ci"] is None     # fewer than BOOTSTRAP_MIN_N seeds


def test_seeds_needed_matches_the_standard_power_tables():
    # G*Power's sample sizes for a two-sided t test at alpha 0.05 and 80% power: paired, effect d = 1: 10 pairs,
    # d = 2: 5; two independent groups, d = 1: 17 a group, d = 0.5: 64
    assert stats.seeds_needed({"sd": 1.0}, 1.0) == 10 and stats.seeds_needed({"sd": 0.5}, 1.0) == 5
    assert stats.seeds_needed({"sd": (1.0, 1.0)}, 1.0) == 17 and stats.seeds_needed({"sd": (1.0, 1.0)}, -0.5) == 64
    # never below the seed rule's three; none without a spread, or past MAX_SEEDS
    assert stats.seeds_needed({"sd": 0.01}, 1.0) == stats.MIN_SEEDS
    assert stats.seeds_needed({"sd": None}, 1.0) is None and stats.seeds_needed({"sd": 100.0}, 0.01) is None
    assert stats.seeds_words(94) == "about 94" and stats.seeds_words(None) == "more than 10,000"
    # the power it plans for: d = 1 with 10 pairs is just above 0.8, with 9 just below
    assert stats.power(1.0, 1 / math.sqrt(10), 9) >= 0.8 > stats.power(1.0, 1 / math.sqrt(9), 8)
    assert stats.paired([80, 60, 75], [70, 71, 69])["sd"] == pytest.approx(statistics.stdev([10, -11, 6]))


def test_seeds_needed_plans_at_the_level_the_test_was_held_to():
    # a test over three looks is held to alpha 0.05 / 3: the same gap and spread need more seeds than at 0.05
    # (d = 1 paired: 14 pairs instead of 10; Welch: 23 a side instead of 17), and the count is where the power at
    # that level first reaches 0.8
    three_looks = stats.compare_scores({0: 80, 1: 60, 2: 75}, {0: 70, 1: 71, 2: 69}, looks=3)
    assert three_looks["alpha"] == pytest.approx(stats.ALPHA / 3)
    at_level = stats.seeds_needed({"sd": 1.0, "alpha": three_looks["alpha"]}, 1.0)
    assert at_level == 14 > stats.seeds_needed({"sd": 1.0}, 1.0)
    level = stats.ALPHA / 3
    assert stats.power(1.0, 1 / math.sqrt(14), 13, level) >= 0.8 > stats.power(1.0, 1 / math.sqrt(13), 12, level)
    assert stats.seeds_needed({"sd": (1.0, 1.0), "alpha": stats.ALPHA / 3}, 1.0) == 23
    one_look = stats.compare_scores({0: 80, 1: 60, 2: 75}, {0: 70, 1: 71, 2: 69})
    assert stats.seeds_needed(three_looks, 1.6) > stats.seeds_needed(one_look, 1.6) == 384
    # the interval's counterpart narrows with the level too: a 98.3% interval needs more seeds to fit the margin
    assert stats.seeds_for_equivalence({"sd": 1.0, "alpha": stats.ALPHA / 3}, 1.0) > \
        stats.seeds_for_equivalence({"sd": 1.0}, 1.0)


def test_seeds_for_equivalence_fits_the_interval_inside_the_margin_as_often_as_planned():
    # paired differences with sd 1 and a true difference 0, margin ± 1: the 95% interval fits with 80%
    # probability from 13 seeds (counted here over 200,000 simulated experiments), not at 12
    import numpy as np

    n = stats.seeds_for_equivalence({"sd": 1.0}, 1.0)
    assert n == 13

    def fits(n):
        draws = np.random.default_rng(0).normal(0.0, 1.0, (200_000, n))
        half = stats.t_quantile(1 - stats.ALPHA / 2, n - 1) * draws.std(axis=1, ddof=1) / math.sqrt(n)
        return float(np.mean(np.abs(draws.mean(axis=1)) + half <= 1.0))

    assert fits(n) >= stats.POWER > fits(n - 1)
    assert stats.equivalence_power(0.0, 1.0, 1 / math.sqrt(n), n - 1) >= stats.POWER > \
        stats.equivalence_power(0.0, 1.0, 1 / math.sqrt(n - 1), n - 2)
    # a true gap inside the margin needs more seeds; one at or beyond it can never fit; Welch needs more a side
    assert stats.seeds_for_equivalence({"sd": 1.0}, 1.0, gap=0.3) > n
    assert stats.seeds_for_equivalence({"sd": 1.0}, 1.0, gap=1.0) is None
    assert stats.seeds_for_equivalence({"sd": (1.0, 1.0)}, 1.0) > n
    assert stats.seeds_for_equivalence({"sd": None}, 1.0) is None
    assert stats.seeds_for_equivalence({"sd": 0.01}, 1.0) == stats.MIN_SEEDS
    assert stats.seeds_for_equivalence({"sd": 100.0}, 0.01) is None                 # past MAX_SEEDS
