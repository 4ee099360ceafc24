"""Tests of a difference between two rows of a grid over seeds (chapters 7–9, and chapter 11's federated runs).

A seed fixes a run's data sample and its LoRA-A initialisation, so two rows run with the same seeds are paired:
:func:`paired` tests the mean of the per-seed differences (paired t, and a percentile bootstrap over the seeds when
there are at least ``BOOTSTRAP_MIN_N``). Rows with other seeds are compared by Welch's unequal-variance t test
(:func:`welch`) over all their seeds, also where one row ran a seed the other did not: pairing the seeds both ran
would leave 2 degrees of freedom on three shared seeds, and pays only where the rows' scores move together over
seeds, which so few seeds cannot show. :func:`compare_rows` picks the test and words the verdict: "difference" only
when the two-sided p value is below ``ALPHA`` and each side has at least ``MIN_SEEDS`` seeds (an accuracy claim
rests on three; a p value below ``ALPHA`` on fewer is worded :data:`FEW_SEEDS`, not a difference). Where a test
finds no difference, :func:`seeds_needed` says how many seeds a side would detect a given gap at the spread observed
and the level the test was held to (power ``POWER``), and :func:`seeds_for_equivalence` how many would put the
interval inside an equivalence margin. Seeds run beyond a grid's plan after a first test make the next test a second
look, held to ``ALPHA`` divided by the looks (:func:`compare_scores`). Student's t distribution is computed here
from the regularized incomplete beta function (:func:`t_sf`, :func:`t_quantile`).
"""
from __future__ import annotations

import itertools
import math
import random
import statistics

ALPHA = 0.05
BOOTSTRAP_MIN_N = 5
BOOTSTRAP_DRAWS = 20_000
MIN_SEEDS = 3
POWER = 0.8              # the chance of detecting a true gap that seeds_needed plans for
MAX_SEEDS = 10_000       # seeds_needed gives up beyond this many seeds a side
DIFFERENCE, NO_DIFFERENCE, UNTESTED = "difference", "no difference shown", "one seed: untested"
FEW_SEEDS = f"p below {ALPHA:g} on fewer than {MIN_SEEDS} seeds a side: not called a difference"


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz), valid for x < (a + 1)/(a + b + 2)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    value = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            value *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return value


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must lie in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom (df > 0, not necessarily whole)."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|)."""
    return min(1.0, 2 * t_sf(abs(t), df))


def t_quantile(prob: float, df: float) -> float:
    """The t with P(T <= t) = ``prob`` (bisection on :func:`t_sf`)."""
    if not 0.0 < prob < 1.0:
        raise ValueError(f"prob must lie strictly between 0 and 1, got {prob}")
    if prob < 0.5:
        return -t_quantile(1 - prob, df)
    lo, hi = 0.0, 1.0
    while 1 - t_sf(hi, df) < prob:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 1 - t_sf(mid, df) < prob else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2


def _t_test(estimate: float, se: float, df: float,
            alpha: float = ALPHA) -> tuple[float, float, tuple[float, float]]:
    """t, two-sided p and the (1 - alpha) interval of an estimate with standard error ``se`` on ``df`` df; a zero
    standard error gives t = ±inf (p 0) for a non-zero estimate and t = 0 (p 1) for a zero one."""
    if se == 0:
        t = 0.0 if estimate == 0 else math.copysign(math.inf, estimate)
        return t, (1.0 if t == 0 else 0.0), (estimate, estimate)
    t = estimate / se
    half = t_quantile(1 - alpha / 2, df) * se
    return t, two_sided_p(t, df), (estimate - half, estimate + half)


def bootstrap_interval(values: list[float], seed: int = 0, alpha: float = ALPHA) -> tuple[float, float]:
    """Percentile bootstrap interval (1 - alpha) of the mean of ``values``: every resample enumerated when n^n is
    at most BOOTSTRAP_DRAWS, else BOOTSTRAP_DRAWS seeded resamples."""
    n = len(values)
    if n ** n <= BOOTSTRAP_DRAWS:
        means = [statistics.fmean(s) for s in itertools.product(values, repeat=n)]
    else:
        rng = random.Random(seed)
        means = [statistics.fmean(rng.choices(values, k=n)) for _ in range(BOOTSTRAP_DRAWS)]
    means.sort()
    lo = means[math.floor(alpha / 2 * (len(means) - 1))]
    hi = means[math.ceil((1 - alpha / 2) * (len(means) - 1))]
    return lo, hi


def paired(a: list[float], b: list[float], alpha: float = ALPHA) -> dict:
    """Paired t test of mean(a - b), a[i] and b[i] from the same seed: the mean difference, t on n - 1 df, the
    two-sided p, the (1 - alpha) t interval, and the bootstrap interval over seeds where n >= BOOTSTRAP_MIN_N."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"a paired test needs two equally long lists of at least 2 values, got {len(a)} and {len(b)}")
    diffs = [x - y for x, y in zip(a, b)]
    n, mean = len(diffs), statistics.fmean(diffs)
    t, p, ci = _t_test(mean, statistics.stdev(diffs) / math.sqrt(n), n - 1, alpha)
    return {"test": "paired t", "n": n, "difference": mean, "statistic": t, "df": n - 1, "p": p, "ci": ci,
            "sd": statistics.stdev(diffs), "alpha": alpha,
            "bootstrap_ci": bootstrap_interval(diffs, alpha=alpha) if n >= BOOTSTRAP_MIN_N else None}


def welch_df(var_a: float, n_a: int, var_b: float, n_b: int) -> float:
    """Welch–Satterthwaite degrees of freedom (s_a²/n_a + s_b²/n_b)² / (Σ (s²/n)² / (n - 1))."""
    sa, sb = var_a / n_a, var_b / n_b
    if sa + sb == 0:
        return float(n_a + n_b - 2)
    return (sa + sb) ** 2 / (sa ** 2 / (n_a - 1) + sb ** 2 / (n_b - 1))


def welch(a: list[float], b: list[float], alpha: float = ALPHA) -> dict:
    """Welch's t test of mean(a) - mean(b) for independent samples of at least 2 values each, with its
    (1 - alpha) interval."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch's test needs at least 2 values a side, got {len(a)} and {len(b)}")
    var_a, var_b = statistics.variance(a), statistics.variance(b)
    df = welch_df(var_a, len(a), var_b, len(b))
    mean = statistics.fmean(a) - statistics.fmean(b)
    t, p, ci = _t_test(mean, math.sqrt(var_a / len(a) + var_b / len(b)), df, alpha)
    return {"test": "Welch t", "n": (len(a), len(b)), "difference": mean, "statistic": t, "df": df, "p": p,
            "ci": ci, "sd": (math.sqrt(var_a), math.sqrt(var_b)), "alpha": alpha, "bootstrap_ci": None}


def power(gap: float, se: float, df: float, alpha: float = ALPHA) -> float:
    """The chance that a two-sided t test at ``alpha`` finds a true difference ``gap`` whose estimate has standard
    error ``se`` on ``df`` degrees of freedom: P(T > t_{1-alpha/2} - |gap| / se), the shifted central t that
    stands in for the noncentral one (the far tail, below -t_{1-alpha/2}, is left out)."""
    if se == 0:
        return 1.0 if gap else alpha
    return t_sf(t_quantile(1 - alpha / 2, df) - abs(gap) / se, df)


def _standard_error(sd: float | tuple[float, float], n: int) -> tuple[float, float]:
    """(standard error, degrees of freedom) of a test like one with spread ``sd`` run on ``n`` seeds a side: the
    sd of the per-seed differences (paired, n - 1 df) or each row's sd (Welch, n seeds on each side)."""
    if isinstance(sd, tuple):
        var_a, var_b = sd[0] ** 2, sd[1] ** 2
        return math.sqrt((var_a + var_b) / n), welch_df(var_a, n, var_b, n)
    return sd / math.sqrt(n), n - 1


def _fewest_seeds_for(sd: float | tuple[float, float], effect: float, target: float, alpha: float,
                      enough) -> int | None:
    """The first n from MIN_SEEDS at which ``enough(se, df)`` holds, None past MAX_SEEDS. The search starts at the
    normal approximation's count for detecting ``effect`` with probability ``target`` at level ``alpha`` and the
    spread ``sd`` (the differences' sd, or the rows' sds in quadrature), a lower bound for a target above one half
    (t's quantile and tails are larger), and gives up at once when that passes MAX_SEEDS."""
    spread = math.hypot(*sd) if isinstance(sd, tuple) else sd
    z = statistics.NormalDist()
    lower = ((z.inv_cdf(1 - alpha / 2) + z.inv_cdf(target)) * spread / effect) ** 2
    if lower > MAX_SEEDS:
        return None
    for n in range(max(MIN_SEEDS, math.floor(lower)), MAX_SEEDS + 1):
        if enough(*_standard_error(sd, n)):
            return n
    return None


def seeds_needed(result: dict, gap: float, target: float = POWER) -> int | None:
    """How many seeds a side a test like ``result`` (:func:`paired` or :func:`welch`) needs to detect a true
    difference ``gap`` with probability ``target``, at the spread it observed: the sd of the per-seed differences
    (paired, n - 1 df) or of each row (Welch, n seeds on each side), and at the level it was held to (its
    ``alpha``: ALPHA divided by its looks, :func:`compare_scores`; the seeds added would make one look more, held
    lower still, so the count is a lower bound); at least MIN_SEEDS; None beyond MAX_SEEDS or for a test without
    a spread (one seed)."""
    sd = result.get("sd")
    if sd is None or gap == 0:
        return None
    alpha = result.get("alpha", ALPHA)
    return _fewest_seeds_for(sd, gap, target, alpha, lambda se, df: power(gap, se, df, alpha) >= target)


def equivalence_power(gap: float, margin: float, se: float, df: float, alpha: float = ALPHA) -> float:
    """The chance that the (1 - alpha) interval of a difference lies within ± ``margin`` when the true difference
    is ``gap`` and its estimate has standard error ``se`` on ``df`` degrees of freedom (two one-sided tests, each
    at alpha / 2): P(T < (margin - gap) / se - t) - P(T < -(margin + gap) / se + t), t = t_{1-alpha/2}, with the
    same shifted central t as :func:`power`; 0 where the interval cannot fit."""
    if se == 0:
        return 1.0 if abs(gap) < margin else 0.0
    t = t_quantile(1 - alpha / 2, df)
    return max(0.0, 1 - t_sf((margin - gap) / se - t, df) - t_sf((margin + gap) / se - t, df))


def seeds_for_equivalence(result: dict, margin: float, gap: float = 0.0, target: float = POWER) -> int | None:
    """How many seeds a side a test like ``result`` needs for its (1 - alpha) interval to lie within ± ``margin``
    with probability ``target`` when the true difference is ``gap`` (0: the rows are equal, as the claim says),
    at the spread and level it observed (:func:`seeds_needed`'s spreads, level and limits); None where ``gap`` is
    not inside the margin, beyond MAX_SEEDS, or without a spread."""
    sd = result.get("sd")
    if sd is None or not margin > abs(gap):
        return None
    alpha = result.get("alpha", ALPHA)
    return _fewest_seeds_for(sd, margin - abs(gap), target, alpha,
                             lambda se, df: equivalence_power(gap, margin, se, df, alpha) >= target)


def seeds_words(n: int | None) -> str:
    """A :func:`seeds_needed` count in words: "about 94", or "more than 10,000" where it gave up."""
    return f"about {n}" if n is not None else f"more than {MAX_SEEDS:,}"


def fewest_seeds(result: dict) -> int:
    """The smaller side's seed count of a test from :func:`compare_scores` (a paired test has one count)."""
    n = result["n"]
    return min(n) if isinstance(n, tuple) else n


def verdict_of(p: float | None, fewest: int, alpha: float = ALPHA) -> str:
    """The word for a two-sided p value from a test with ``fewest`` seeds on its smaller side: DIFFERENCE below
    ``alpha`` with at least MIN_SEEDS seeds a side, FEW_SEEDS below it with fewer, NO_DIFFERENCE otherwise,
    UNTESTED for None."""
    if p is None:
        return UNTESTED
    if p >= alpha:
        return NO_DIFFERENCE
    return DIFFERENCE if fewest >= MIN_SEEDS else FEW_SEEDS


def compare_scores(a: dict[int, float], b: dict[int, float], looks: int = 1) -> dict:
    """Test of the difference between two rows' scores, each given as {seed: score}: paired when both rows have
    the same seeds (at least two), Welch otherwise (at least two a side), untested with a single seed.

    ``looks``: how many times this comparison has been tested as seeds came in. Seeds added because a first test
    came out inconclusive make the last test one of several, and a test at ALPHA each time would call a
    difference more often than ALPHA when there is none; each look is then held to ALPHA / looks (Bonferroni
    over the looks: conservative, and valid however the looks were spaced), its interval widened to match."""
    if not (isinstance(looks, int) and looks >= 1):
        raise ValueError(f"looks must be a whole number >= 1, got {looks!r}")
    alpha = ALPHA / looks
    if sorted(a) == sorted(b) and len(a) >= 2:
        seeds = sorted(a)
        result = paired([a[s] for s in seeds], [b[s] for s in seeds], alpha)
    elif len(a) >= 2 and len(b) >= 2:
        result = welch(list(a.values()), list(b.values()), alpha)
    else:
        result = {"test": "none", "n": (len(a), len(b)),
                  "difference": statistics.fmean(a.values()) - statistics.fmean(b.values()),
                  "statistic": None, "df": None, "p": None, "ci": None, "alpha": alpha, "bootstrap_ci": None}
    result["looks"] = looks
    result["verdict"] = verdict_of(result["p"], fewest_seeds(result), alpha)
    return result


def compare_rows(a: dict, runs_a: list[dict], b: dict, runs_b: list[dict]) -> dict:
    """:func:`compare_scores` of two summary records (``summaries.summarize``) from their runs
    (``summaries.runs_of(grid, task, row, lr)``): the test score (%) at each run's best validation step, by seed.
    Each seed that either record ran beyond its grid's plan (``added_seeds``) counts as one more look (the most
    there can have been: seeds added together were one). The record adds both rows' keys and the added seeds."""
    def scores(runs):
        return {r["seed"]: 100 * r["best_val"]["test"] for r in runs}

    added = sorted(set(a.get("added_seeds") or ()) | set(b.get("added_seeds") or ()))
    result = compare_scores(scores(runs_a), scores(runs_b), looks=1 + len(added))
    result.update(a=a["row"], b=b["row"], task=a["task"], added_seeds=added)
    return result


def level_words(result: dict) -> str:
    """The level of a test held below ALPHA (several looks, :func:`compare_scores`) in words, " at α = 0.025";
    "" for a test at ALPHA."""
    alpha = result.get("alpha", ALPHA)
    return f" at α = {alpha:.2g}" if alpha < ALPHA else ""


def describe(result: dict) -> str:
    """One line: "+1.4 points, paired t(2) = 0.52, p = 0.66, 95% CI [-10.2, 13.0]: no difference shown"; a test
    over several looks (:func:`compare_scores`) says its level and why: "... 97.5% CI [...]: no difference shown
    at α = 0.025 (2 looks: seed 3 added after the first)"."""
    alpha = result.get("alpha", ALPHA)
    level = f"{100 * (1 - alpha):.1f}".rstrip("0").rstrip(".")
    head = f"{result['difference']:+.1f} points"
    looks, added = result.get("looks", 1), result.get("added_seeds") or ()
    why = ""
    if looks > 1:
        after = f": seed{'s' if len(added) > 1 else ''} {', '.join(map(str, added))} added after the first" \
            if added else ""
        why = f"{level_words(result)} ({looks} looks{after})"
    if result["p"] is None:
        return f"{head}: {result['verdict']}"
    df = f"{result['df']:.0f}" if float(result["df"]).is_integer() else f"{result['df']:.1f}"
    text = (f"{head}, {result['test']}({df}) = {result['statistic']:.2f}, p = {result['p']:.2g}, "
            f"{level}% CI [{result['ci'][0]:.1f}, {result['ci'][1]:.1f}]")
    if result.get("bootstrap_ci"):
        text += f", bootstrap [{result['bootstrap_ci'][0]:.1f}, {result['bootstrap_ci'][1]:.1f}]"
    return f"{text}: {result['verdict']}{why}"
