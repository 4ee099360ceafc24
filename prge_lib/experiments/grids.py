"""The grids of chapter 7: each paper table as a named list of rows (a method with fixed settings, and per profile
its learning rates and seeds) over a list of tasks, with the step counts and evaluation intervals of each profile.

Profiles: ``paper`` is App. C (20k ZO steps, 1k FO steps, the full learning-rate grids, 3 seeds, 5 on SST-2 and
RTE for Table 1's ZO LoRA-FA rows); ``cpu`` fits a 2-core CPU (1000 ZO steps, 500 FO steps, one learning rate per
row; 3 seeds for the ZO LoRA-FA rows of Table 1, where the paper's claim lives, 1 elsewhere). Chapter 7 states
both; chapters 8 and 9 run the ``alternatives`` grid. The rows of the ``senszoq`` grid (chapter 8), and Table 1's
MeZO (Full) on the paper profile, run in two stages, a learning-rate sweep and a confirmation at each row's best
rate (:attr:`Row.confirm_seeds`, :mod:`prge_lib.experiments.stages`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import NamedTuple

from prge_lib.data.tasks import TABLE1_TASKS
from prge_lib.models.options import QUANT_MODES
from prge_lib.methods import registry

PROFILES = ("cpu", "paper")


@dataclass(frozen=True)
class Row:
    """One row of a paper table: a method with fixed settings and a learning-rate grid per profile."""
    key: str                               # file-name tag, e.g. "prge-q4-E16"
    label: str                             # as the paper's table prints it
    method: str                            # a TrainConfig method, "zeroshot" or "bench"
    settings: dict = field(default_factory=dict)   # fixed TrainConfig fields (q, E, adapter, …)
    lrs: dict = field(default_factory=dict)        # profile -> learning rates searched
    seeds: dict = field(default_factory=dict)      # profile -> seeds
    task_seeds: dict = field(default_factory=dict)  # profile -> {task: seeds}, where a task runs other seeds
    # profile -> the seeds run at the row's best sweep rate: a two-stage row under that profile, whose ``seeds``
    # sweep its grid first (prge_lib.experiments.stages)
    confirm_seeds: dict = field(default_factory=dict)

    def __hash__(self):
        return hash(self.key)

    @property
    def kind(self) -> str:
        """What its cells are: "zeroshot", "bench", "lm" (the WikiText-2 curves) or "train"."""
        return self.method if self.method in ("zeroshot", "bench", "lm") else "train"

    def staged(self, profile: str) -> bool:
        """Whether this row runs in two stages under ``profile``: a sweep of its grid, then its confirm seeds at
        the best rate (:mod:`~prge_lib.experiments.stages`)."""
        return profile in self.confirm_seeds

    def seeds_for(self, profile: str, task: str) -> tuple:
        """The seeds this row runs on ``task`` under ``profile``: the task's own where it has some, else the
        profile's."""
        return tuple(self.task_seeds.get(profile, {}).get(task, self.seeds[profile]))

    def planned_seeds(self, profile: str, task: str) -> tuple:
        """:meth:`seeds_for`, or () where the row plans no seeds under ``profile``."""
        return self.seeds_for(profile, task) if profile in self.seeds else ()


def staged_rows(grid: str, profile: str | None = None) -> tuple[Row, ...]:
    """The rows of ``grid`` that run in two stages under ``profile`` (under any profile where None)."""
    return tuple(row for row in GRIDS[grid]["rows"]
                 if (row.confirm_seeds if profile is None else row.staged(profile)))


def lr_text(lr: float) -> str:
    """A learning rate as file names carry it: 1e-3, 3e-4, 1.5e-4."""
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


class Bracket(NamedTuple):
    """A sweep's best learning rate with its two neighbours in the grid, both scored below it (:func:`bracket`)."""
    best: float
    lower: float
    upper: float


def best_rate(scores: dict[float, float]) -> float:
    """The rate of ``scores`` ({rate: mean validation score}) that scored best, ties to the smaller rate: how a
    two-stage grid chooses (:mod:`~prge_lib.experiments.stages`)."""
    return max(sorted(scores), key=lambda lr: scores[lr])


def bracket(scores: dict[float, float], grid_lrs) -> Bracket | None:
    """The best-scored rate of ``scores`` ({rate: mean validation score}; ties to the smaller rate) with the rates
    next to it in ``grid_lrs``, where both have scores strictly below it; None where the best lies at an edge of
    the grid or a neighbour has no score yet. A learning rate's validation score rises to one peak and falls
    (every complete sweep of chapter 8 does), so no rate beyond the two neighbours can win: a two-stage grid's
    sweep stops there (:mod:`~prge_lib.experiments.stages`)."""
    if not scores:
        return None
    best = best_rate(scores)
    grid = sorted(grid_lrs)
    if best not in grid:
        return None
    i = grid.index(best)
    if i == 0 or i == len(grid) - 1:
        return None
    lower, upper = grid[i - 1], grid[i + 1]
    if lower in scores and upper in scores and max(scores[lower], scores[upper]) < scores[best]:
        return Bracket(best, lower, upper)
    return None


# ---------------------------------------------------------------- the grids
_ZO_LORAFA_LRS = {"paper": (5e-5, 1e-4, 5e-4, 1e-3), "cpu": (1e-3,)}
_SEEDS_3 = {"paper": (0, 1, 2), "cpu": (0, 1, 2)}
_SEEDS_1 = {"paper": (0, 1, 2), "cpu": (0,)}
STEPS = {"paper": {"zo": 20000, "fo": 1000}, "cpu": {"zo": 1000, "fo": 500}}
EVAL_EVERY = {"paper": {"zo": 500, "fo": 100}, "cpu": {"zo": 100, "fo": 100}}

ZERO_SHOT = Row("zeroshot", "Zero-shot", "zeroshot", seeds=_SEEDS_1)
# The paper profile's ZO LoRA-FA rows, where the claim of Table 1 lives, run five seeds on SST-2 and RTE (the
# columns chapter 7 discusses, where three seeds left the rows' spreads overlapping) and three elsewhere
_ZO_LORAFA_TASK_SEEDS = {"paper": {"sst2": (0, 1, 2, 3, 4), "rte": (0, 1, 2, 3, 4)}}
# MeZO (Full): App. C's grid {1e-7, 5e-7, 1e-6}, then larger rates, so that on this model one of them trains or
# the grid shows that none does (at 1000 steps on the cpu profile 1e-6 stayed at the zero-shot score). On the
# paper profile it runs in two stages, as the senszoq grid does: one seed sweeps the rates, stopping once its best
# is bracketed, then the confirm seeds run at the rate the sweep chose. It is no part of Table 1's claim (the ZO
# LoRA-FA rows, which run every rate at every seed), and it perturbs every weight of its own model copy, so no pack
# shares its steps: at 6 rates x 3 seeds its solo cells would be most of the table's GPU time
_MEZO_FULL_LRS = {"paper": (1e-7, 5e-7, 1e-6, 5e-6, 1e-5, 5e-5), "cpu": (1e-6,)}
_MEZO_FULL_SEEDS = {"paper": (0,), "cpu": (0,)}
_MEZO_FULL_CONFIRM = {"paper": (0, 1, 2)}
TABLE1_ROWS = (
    ZERO_SHOT,
    Row("fo", "FO-Adam (Full)", "fo", {"batch_size": 8},
        {"paper": (1e-5, 5e-5, 8e-5), "cpu": (1e-5,)}, _SEEDS_1),
    Row("fo-lorafa", "FO-Adam (LoRA-FA)", "fo-lorafa", {"batch_size": 8},
        {"paper": (1e-4, 3e-4, 5e-4), "cpu": (3e-4,)}, _SEEDS_1),
    Row("mezo-E16", "MeZO (Full)", "mezo", {"q": 1, "E": 16, "eps": 1e-3}, _MEZO_FULL_LRS, _MEZO_FULL_SEEDS,
        confirm_seeds=_MEZO_FULL_CONFIRM),
    Row("mezo-lorafa-E16", "MeZO (LoRA-FA)", "mezo-lorafa", {"q": 1, "E": 16, "eps": 1e-2},
        _ZO_LORAFA_LRS, _SEEDS_3, _ZO_LORAFA_TASK_SEEDS),
    Row("prge-q4-E16", "P-RGE (q = 4)", "prge", {"q": 4, "E": 16, "eps": 1e-2}, _ZO_LORAFA_LRS, _SEEDS_3,
        _ZO_LORAFA_TASK_SEEDS),
    Row("prge-q16-E16", "P-RGE (q = 16)", "prge", {"q": 16, "E": 16, "eps": 1e-2}, _ZO_LORAFA_LRS, _SEEDS_3,
        _ZO_LORAFA_TASK_SEEDS),
)
TABLE2_LITE_ROWS = (ZERO_SHOT,) + tuple(
    dataclasses.replace(r, seeds=_SEEDS_1, task_seeds={})
    for r in TABLE1_ROWS if r.method in ("mezo-lorafa", "prge"))
# The cpu profile runs LoRA-FA at Table 1's ZO learning rate and gives a space a second one where that rate is
# wrong for it: MeZO on LoRA diverged at 1e-3 (loss 7.9 -> 21 by step 400; its A is perturbed and trained too, so
# B A grows from both sides), DoRA trains A the same way, and VeRA's coordinates move the loss far less per unit
# of step (chapter 4). The learning rate is then chosen on validation, as everywhere.
_PEFT_CPU_LRS = {"lora": (1e-4, 1e-3), "lora-fa": (1e-3,), "dora": (1e-4, 1e-3), "vera": (1e-3, 1e-2)}
# The paper profile searches App. B's grid {5e-6, 5e-5, 5e-4, 5e-3} in every space, and VeRA further up: at 1e-3
# and 1e-2 it stayed at the zero-shot score on the cpu profile, and its scaling vectors move the loss far less per
# unit of step than a LoRA matrix does (chapter 4), so its grid goes on by half decades to 1, where it trains or
# diverges
_PEFT_PAPER_LRS = {"lora": (5e-6, 5e-5, 5e-4, 5e-3), "lora-fa": (5e-6, 5e-5, 5e-4, 5e-3),
                   "dora": (5e-6, 5e-5, 5e-4, 5e-3), "vera": (5e-4, 5e-3, 1e-2, 5e-2, 1e-1, 5e-1, 1.0)}
PEFT_ROWS = tuple(
    Row(f"mezo-{a}", label, "mezo", {"adapter": a, "q": 1, "E": 16, "eps": 1e-2},
        {"paper": _PEFT_PAPER_LRS[a], "cpu": _PEFT_CPU_LRS[a]}, _SEEDS_1)
    for a, label in (("lora", "LoRA"), ("lora-fa", "LoRA-FA"), ("dora", "DoRA"), ("vera", "VeRA")))
# step time and peak memory: one benchmark per (sequence length, quantization), on synthetic batches
_BENCH_METHODS = ("mezo", "mezo-lorafa", "prge-outer", "prge-inner", "prge")
BENCH_ROWS = {
    # MeZO (Full) perturbs every weight in place, which INT8 / NF4 weights do not allow: quantized cells time
    # the adapter methods only (Gao et al.'s Fig. 6, the inner loop's speedup under INT8 and NF4, does the same)
    "runtime": tuple(Row(f"bench-{quant}", f"step time ({quant})", "bench",
                         {"methods": _BENCH_METHODS[quant != "none":], "quant": quant, "qs": (1, 4, 16), "repeats": 5},
                         seeds={"paper": (0,), "cpu": (0,)})
                     for quant in QUANT_MODES),
    # the memory grid's figures are the peaks, each measured in a fresh process, which other load on the
    # machine does not change; one timing round suffices there (step times are the runtime grid's)
    "memory": (Row("bench-memory", "peak memory", "bench",
                   {"methods": ("inference", "fo", "fo-lorafa") + _BENCH_METHODS, "quant": "none", "qs": (4,),
                    "repeats": 1},
                   seeds={"paper": (0,), "cpu": (0,)}),),
}
# Chapters 8 and 9: SensZOQ's masks (Guo et al. Fig. 6a: the C4 mask against four baselines at 0.1%, and the
# C4 mask at 1% and 0.01%) and MeBP, on the protocol of Table 1 so that chapter 9 can set them beside it. The two
# rows chapter 9 compares with P-RGE (the C4 mask at 0.1%, MeBP) run three seeds, like Table 1's ZO rows.
_SENSZOQ_LRS = {"paper": (1e-5, 1e-4, 5e-4), "cpu": (1e-4,)}
ALTERNATIVE_ROWS = tuple(
    Row(f"senszoq-{mask}-s{lr_text(sparsity)}", f"SensZOQ ({mask} mask, {100 * sparsity:g}%)", "senszoq",
        {"mask": mask, "sparsity": sparsity, "mask_scope": "layer", "q": 1, "E": 16, "eps": 1e-3},
        _SENSZOQ_LRS, _SEEDS_3 if (mask, sparsity) == ("c4", 1e-3) else _SEEDS_1)
    for mask, sparsity in (("c4", 1e-3), ("task", 1e-3), ("random", 1e-3), ("largest", 1e-3), ("smallest", 1e-3),
                           ("c4", 1e-2), ("c4", 1e-4))
) + (Row("mebp", "MeBP (LoRA, NF4 base)", "mebp", {"batch_size": 8}, {"paper": (1e-4, 3e-4, 5e-4), "cpu": (3e-4,)},
         _SEEDS_3),)
# Guo et al. Fig. 6a as a fair test, in two stages. Their Table 9 tunes each mask's rate on its own (RTE, 0.1%,
# Llama2-7B: paper.SENSZOQ_TABLE9_RTE): a mask that picks weights blind to the loss needed steps 100-500x the C4
# mask's there. The sweep stage runs one seed over a grid per mask wide enough to bracket its
# best rate on this model (C4 at 0.1% trained at 1e-4 on the cpu profile: the sensitive masks from 1e-6 to 1e-3,
# the blind ones from 1e-4 to 1e-1); the confirm stage (CONFIRM_SEEDS) runs each row at the rate the sweep chose
# on validation. ZO's noise grows with the number of coordinates it perturbs (chapter 2), so the C4 mask's grid
# reaches lower at 1% and higher at 0.01%. The like-for-like baselines of their Table 1 on the same NF4 base
# (bitsandbytes' 4-bit blocks of 64, the quantizer of prge_lib.models.quant): ZO-SGD on LoRA (r 8, alpha 16, every
# linear layer, eps 1e-3: their App. G) and P-RGE (q 4, E 16) on LoRA-FA.
_SENSITIVE_LRS = (1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3)
_BLIND_LRS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
_MASK_SWEEP = {("c4", 1e-3): _SENSITIVE_LRS, ("task", 1e-3): _SENSITIVE_LRS, ("random", 1e-3): _BLIND_LRS,
               ("largest", 1e-3): _BLIND_LRS, ("smallest", 1e-3): _BLIND_LRS,
               ("c4", 1e-2): (1e-7, 3e-7) + _SENSITIVE_LRS, ("c4", 1e-4): _SENSITIVE_LRS + (3e-3, 1e-2)}
_SWEEP_SEEDS = {"paper": (0,), "cpu": (0,)}
CONFIRM_SEEDS = {"paper": (0, 1, 2), "cpu": (0, 1, 2)}
SENSZOQ_ROWS = tuple(
    Row(f"senszoq-{mask}-s{lr_text(sparsity)}", f"SensZOQ ({mask} mask, {100 * sparsity:g}%)", "senszoq",
        {"mask": mask, "sparsity": sparsity, "mask_scope": "layer", "q": 1, "E": 16, "eps": 1e-3},
        # the cpu profile: every other rate of the paper's grid (a 1000-step preview, not run here)
        {"paper": lrs, "cpu": lrs[::2]}, _SWEEP_SEEDS, confirm_seeds=CONFIRM_SEEDS)
    for (mask, sparsity), lrs in _MASK_SWEEP.items()
) + (
    Row("mezo-lora-r8-nf4", "ZO-SGD (LoRA r 8, NF4 base)", "mezo",
        {"adapter": "lora", "r": 8, "alpha": 16, "quant": "nf4", "q": 1, "E": 16, "eps": 1e-3},
        {"paper": (1e-5, 3e-5, 1e-4, 3e-4, 1e-3), "cpu": (1e-5, 1e-4, 1e-3)}, _SWEEP_SEEDS,
        confirm_seeds=CONFIRM_SEEDS),
    Row("prge-q4-E16-nf4", "P-RGE (q = 4, NF4 base)", "prge", {"quant": "nf4", "q": 4, "E": 16, "eps": 1e-2},
        # cpu: 3e-3 added once 1e-3 validated best, at the grid's edge, so that the sweep brackets its rate
        {"paper": (5e-5, 1e-4, 5e-4, 1e-3, 3e-3), "cpu": (1e-4, 1e-3, 3e-3)}, _SWEEP_SEEDS,
        confirm_seeds=CONFIRM_SEEDS),
)
# Song and Tang Fig. 1 (MeBP, seed 004; chapter 9): ZO against MeBP on WikiText-2 language modelling, per step
# and per second, one cell training every method on one stream of windows (prge_lib.experiments.bench.lm_curves).
# The paper trains MeBP 1000 steps and ZO 100,000; the paper profile MeBP 500 and ZO 5000 (a GPU sitting), the cpu
# profile the 60 steps of each that chapter 9 runs live.
LM_STEPS = {"paper": {"mebp": 500, "mezo": 5000, "prge": 5000}, "cpu": {"mebp": 60, "mezo": 60, "prge": 60}}
LM_EVAL_EVERY = {"paper": {"mebp": 25, "mezo": 250, "prge": 250}, "cpu": {"mebp": 15, "mezo": 15, "prge": 15}}
LM_ROWS = (Row("lm-curves", "ZO against MeBP on WikiText-2", "lm", {"seq_len": 64, "n_held": 16},
               seeds={"paper": (0,), "cpu": (0,)}),)
GRIDS = {
    "table1": {"tasks": TABLE1_TASKS, "rows": TABLE1_ROWS,
               "source": "Gao et al. Table 1 (TinyLlama-1.1B)"},
    "table2-lite": {"tasks": ("boolq", "wsc", "wic", "multirc", "copa", "winogrande", "squad"),
                    "rows": TABLE2_LITE_ROWS, "source": "Gao et al. Table 2 (Llama2-7B)"},
    "peft": {"tasks": ("sst2",), "rows": PEFT_ROWS, "source": "Gao et al. Table 7 (OPT-1.3B)"},
    "runtime": {"tasks": ("synthetic",), "rows": BENCH_ROWS["runtime"], "seq_lens": (64, 128, 256),
                "source": "Gao et al. Fig. 5, 6, Tables 8 and 13"},
    "alternatives": {"tasks": ("sst2", "rte"), "rows": ALTERNATIVE_ROWS,
                     "source": "Guo et al. Fig. 6a (SensZOQ); Table 1's protocol for MeBP"},
    "memory": {"tasks": ("synthetic",), "rows": BENCH_ROWS["memory"], "seq_lens": (64, 128, 256),
               "source": "Gao et al. Fig. 7; ACL version Table 3"},
    "fig1": {"tasks": ("wikitext2",), "rows": LM_ROWS, "source": "Song and Tang Fig. 1 (MeBP, seed 004)"},
    # two stages for every row (prge_lib.experiments.stages): "sweep" runs the rows' seeds over their grids,
    # "confirm" runs CONFIRM_SEEDS at each row's best sweep rate, into the same folder
    "senszoq": {"tasks": ("sst2", "rte"), "rows": SENSZOQ_ROWS,
                "source": "Guo et al. Fig. 6a and Table 9 (masks, each at its own rate); their Table 1's ZO LoRA "
                          "on the same 4-bit base; P-RGE on that base"},
}
STAGES = ("sweep", "confirm")


def _family(method: str) -> str:
    return registry.get(method).family
