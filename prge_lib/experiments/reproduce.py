"""The reproduction runner behind chapter 7: the papers' tables as grids of independent cells.

A *grid* is a named list of *cells*; a cell is one run (model × task × method × hyperparameters × seed) that
writes one JSON result, ``data/results/<grid>/<task>/<row>_lr<lr>_seed<seed>.json`` (``<grid>-paper/`` for the
paper profile, :func:`grid_folder`). The runner skips a cell whose result exists (and refuses to go on when a
result there was made with other settings), resumes an interrupted cell from its checkpoint
(``<cache>/reproduce/<grid>/<cell>/``, :func:`checkpoint_root`, removed once the result is written), and so
continues where it stopped when killed and rerun, also from a fresh clone on the same machine. A cell whose
loss turns non-finite is recorded as diverged (the steps it made) and the grid goes on. Cells are independent, so
they can also be dispatched to a Ray cluster (``backend="ray"``).

Model selection follows Gao et al. §4.1 / App. C: per (task, row) the learning rate with the best mean
validation score over the seeds is chosen, and the test score at each run's best validation step is
reported as mean ± standard deviation over the seeds (:func:`summarize`).

Profiles: ``paper`` is App. C (20k ZO steps, 1k FO steps, the full learning-rate grids, 3 seeds); ``cpu`` fits
a 2-core CPU (1000 ZO steps, 500 FO steps, one learning rate per row; 3 seeds for the ZO LoRA-FA rows of
Table 1, where the paper's claim lives, 1 elsewhere). Chapter 7 states both.
"""
from __future__ import annotations

import csv
import dataclasses
import functools
import io
import json
import math
import os
import platform
import random
import re
import shlex
import shutil
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from prge_lib.experiments.bench.methods import bench, configurations
from prge_lib.common.settings import cache_dir
from prge_lib.data.splits import DataUnavailableError, sample_task
from prge_lib.training.evaluate import zero_shot
from prge_lib.models.loading import QUANT_MODES, load_model
from prge_lib.models.options import EMBEDDED
from prge_lib.common.paths import RESULTS
from prge_lib.common.provenance import atomic_file, provenance, write_result
from prge_lib.data.tasks import get_task
from prge_lib.methods import registry
from prge_lib.training.checkpoints import CheckpointError, read_checkpoint
from prge_lib.training.config import TrainConfig
from prge_lib.training.trainer import Trainer, TrainingDiverged, TrainingStopped

EMBEDDED_MODEL = EMBEDDED       # what a result names when no --model was given
PROFILES = ("cpu", "paper")
BACKENDS = ("local", "ray")

# Seconds per training step of each method on SST-2 at its Table 1 batch (FO 8, MeZO 16, P-RGE q 4: 4 examples),
# at 1 torch thread beside one other run, as the committed cells ran (median ``step_time_s`` of their result
# files). A step pads every row to the longest prompt of its batch, so --list scales these by that length
# on the cell's task and batch (:func:`prompt_length_factor`): RTE's steps take about 5x SST-2's.
SECONDS_PER_STEP = {"fo": 3.2, "fo-lorafa": 1.6, "mezo": 5.3, "mezo-lorafa": 3.0, "prge": 2.3, "senszoq": 3.0,
                    "mebp": 2.9}
# MeZO over a peft adapter (the peft grid), per adapter, SST-2, same conditions: the committed cells' median step
# (VeRA, r = 1024: its lr 1e-3 cell's median step; the rank-1024 projections make a step ~3x LoRA's)
ADAPTER_SECONDS_PER_STEP = {"lora": 2.9, "lora-fa": 2.8, "dora": 3.6, "vera": 9.0}
EVAL_SECONDS = 90.0          # SST-2: one validation (500) plus, at a new best, one test (1000) evaluation
# Benchmark cells (warm-up + timed step per configuration and round, then the same in a fresh process for the
# peak): seconds per step = a * (L / 64) ** b per weight format, fitted (least squares in log space) to the nine
# committed runtime cells (fp32 11.8 / 19.7 / 33.7 min at 64 / 128 / 256 tokens, INT8 7.9 / 14.5 / 31.1, NF4
# 7.3 / 10.9 / 19.6), plus a model load of about 4 s. fp32 and NF4 grow about linearly with the length, INT8
# faster than linearly (chapter 7: LLM.int8()'s fp16 columns grow with the rows of a call)
BENCH_STEP_SECONDS = {"none": (3.59, 0.96), "int8": (2.12, 1.35), "nf4": (1.79, 1.06)}
BENCH_LOAD_SECONDS = 4.0


def checkpoint_root(root: Path | str | None = None) -> Path:
    """Where interrupted cells keep their checkpoints: ``root`` if given, else ``reproduce`` in the cache folder
    (``PRGE_CACHE_DIR``, default ``~/.cache/prge``). Outside the clone, so a cell longer than one sitting resumes
    from a fresh checkout on the same machine; the trainer refuses a checkpoint made with other settings."""
    return Path(root) if root else cache_dir() / "reproduce"


@dataclass(frozen=True)
class Row:
    """One row of a paper table: a method with fixed settings and a learning-rate grid per profile."""
    key: str                               # file-name tag, e.g. "prge-q4-E16"
    label: str                             # as the paper's table prints it
    method: str                            # a TrainConfig method, "zeroshot" or "bench"
    settings: dict = field(default_factory=dict)   # fixed TrainConfig fields (q, E, adapter, …)
    lrs: dict = field(default_factory=dict)        # profile -> learning rates searched
    seeds: dict = field(default_factory=dict)      # profile -> seeds

    def __hash__(self):
        return hash(self.key)


@dataclass(frozen=True)
class Cell:
    """One run of a grid. ``settings`` are the TrainConfig fields (or the benchmark's arguments)."""
    grid: str
    profile: str
    task: str
    row: Row
    lr: float | None
    seed: int
    settings: tuple          # sorted (name, value) pairs

    @property
    def name(self) -> str:
        lr = "" if self.lr is None else f"_lr{lr_text(self.lr)}"
        length = f"-L{self.config()['seq_len']}" if self.kind == "bench" else ""
        return f"{self.task}/{self.row.key}{length}{lr}_seed{self.seed}"

    @property
    def kind(self) -> str:
        return self.row.method if self.row.method in ("zeroshot", "bench") else "train"

    def config(self) -> dict:
        return dict(self.settings)

    def steps(self) -> int:
        return self.config().get("steps", 0)

    def result_path(self, root: Path = RESULTS) -> Path:
        return Path(root) / grid_folder(self.grid, self.profile) / f"{self.name}.json"

    def checkpoint_dir(self, root: Path | None = None) -> Path:
        return checkpoint_root(root) / grid_folder(self.grid, self.profile) / self.name

    def command(self) -> str:
        """The command that runs this cell alone (recorded as the result's provenance): every setting in which
        the cell differs from its grid's default, so that the command makes this very cell again."""
        c, options = self.config(), ""
        if self.seed not in self.row.seeds.get(self.profile, ()):
            options += f" --seeds {self.seed}"
        if self.kind == "train" and c["steps"] != STEPS[self.profile][_family(self.row.method)]:
            options += f" --steps {c['steps']}"
        if c.get("model"):
            options += f" --model {shlex.quote(str(c['model']))}"
        if c.get("device", "cpu") != "cpu":
            options += f" --device {c['device']}"
        return f"prge reproduce {self.grid} --profile {self.profile} --only {self.name}{options}"


def grid_folder(grid: str, profile: str = "cpu") -> str:
    """The folder (under the results and the checkpoint roots) of ``grid``'s cells under ``profile``: the grid's
    name for the cpu profile, ``<grid>-<profile>`` for another, so that profiles never mix in one table."""
    return grid if profile == "cpu" else f"{grid}-{profile}"


def lr_text(lr: float) -> str:
    """A learning rate as file names carry it: 1e-3, 3e-4, 1.5e-4."""
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


# ---------------------------------------------------------------- the grids
_ZO_LORAFA_LRS = {"paper": (5e-5, 1e-4, 5e-4, 1e-3), "cpu": (1e-3,)}
_SEEDS_3 = {"paper": (0, 1, 2), "cpu": (0, 1, 2)}
_SEEDS_1 = {"paper": (0, 1, 2), "cpu": (0,)}
STEPS = {"paper": {"zo": 20000, "fo": 1000}, "cpu": {"zo": 1000, "fo": 500}}
EVAL_EVERY = {"paper": {"zo": 500, "fo": 100}, "cpu": {"zo": 100, "fo": 100}}

ZERO_SHOT = Row("zeroshot", "Zero-shot", "zeroshot", seeds=_SEEDS_1)
TABLE1_ROWS = (
    ZERO_SHOT,
    Row("fo", "FO-Adam (Full)", "fo", {"batch_size": 8},
        {"paper": (1e-5, 5e-5, 8e-5), "cpu": (1e-5,)}, _SEEDS_1),
    Row("fo-lorafa", "FO-Adam (LoRA-FA)", "fo-lorafa", {"batch_size": 8},
        {"paper": (1e-4, 3e-4, 5e-4), "cpu": (3e-4,)}, _SEEDS_1),
    Row("mezo-E16", "MeZO (Full)", "mezo", {"q": 1, "E": 16, "eps": 1e-3},
        {"paper": (1e-7, 5e-7, 1e-6), "cpu": (1e-6,)}, _SEEDS_1),
    Row("mezo-lorafa-E16", "MeZO (LoRA-FA)", "mezo-lorafa", {"q": 1, "E": 16, "eps": 1e-2},
        _ZO_LORAFA_LRS, _SEEDS_3),
    Row("prge-q4-E16", "P-RGE (q = 4)", "prge", {"q": 4, "E": 16, "eps": 1e-2}, _ZO_LORAFA_LRS, _SEEDS_3),
    Row("prge-q16-E16", "P-RGE (q = 16)", "prge", {"q": 16, "E": 16, "eps": 1e-2}, _ZO_LORAFA_LRS, _SEEDS_3),
)
TABLE2_LITE_ROWS = (ZERO_SHOT,) + tuple(
    dataclasses.replace(r, seeds=_SEEDS_1) for r in TABLE1_ROWS if r.method in ("mezo-lorafa", "prge"))
# The cpu profile runs LoRA-FA at Table 1's ZO learning rate and gives a space a second one where that rate is
# wrong for it: MeZO on LoRA diverged at 1e-3 (loss 7.9 -> 21 by step 400; its A is perturbed and trained too, so
# B A grows from both sides), DoRA trains A the same way, and VeRA's coordinates move the loss far less per unit
# of step (chapter 4). The learning rate is then chosen on validation, as everywhere.
_PEFT_CPU_LRS = {"lora": (1e-4, 1e-3), "lora-fa": (1e-3,), "dora": (1e-4, 1e-3), "vera": (1e-3, 1e-2)}
PEFT_ROWS = tuple(
    Row(f"mezo-{a}", label, "mezo", {"adapter": a, "q": 1, "E": 16, "eps": 1e-2},
        {"paper": (5e-6, 5e-5, 5e-4, 5e-3), "cpu": _PEFT_CPU_LRS[a]}, _SEEDS_1)
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
GRIDS = {
    "table1": {"tasks": ("sst2", "rte", "mrpc", "qqp", "qnli", "wnli"), "rows": TABLE1_ROWS,
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
}


def _family(method: str) -> str:
    return registry.get(method).family


def grid_cells(grid: str, profile: str = "cpu", seeds: Iterable[int] | None = None,
               only: str | None = None, model: str | None = None, **overrides) -> list[Cell]:
    """The cells of ``grid`` under ``profile`` (``seeds`` replaces every row's seeds; ``only`` keeps the
    cells whose name contains it, several comma-separated filters all apply; ``overrides`` replace
    TrainConfig fields of every training cell, e.g. ``steps`` or ``n_train`` for small tests)."""
    if grid not in GRIDS:
        raise ValueError(f"unknown grid {grid!r}; choose one of {list(GRIDS)}")
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {list(PROFILES)}")
    spec = GRIDS[grid]
    cells = []
    for task in spec["tasks"]:
        for row in spec["rows"]:
            for lr in row.lrs.get(profile, (None,)):
                for seed in (row.seeds[profile] if seeds is None else tuple(seeds)):
                    for settings in _cell_settings(spec, row, profile, task, lr, seed, model, overrides):
                        cells.append(Cell(grid, profile, task, row, lr, seed, tuple(sorted(settings.items()))))
    if only:
        for part in map(str.strip, only.split(",")):
            # a whole cell name selects that cell alone ("…_seed1" is also inside "…_seed10")
            exact = [c for c in cells if c.name == part]
            cells = exact or [c for c in cells if part in c.name]
    return cells


def _cell_settings(spec, row, profile, task, lr, seed, model, overrides):
    if row.method == "bench":
        for seq_len in spec["seq_lens"]:
            s = dict(row.settings, seq_len=seq_len, model=model, E=16)
            s["methods"], s["qs"] = list(s["methods"]), list(s["qs"])
            yield s
        return
    s = {"task": task, "seed": seed, "model": model}
    if row.method != "zeroshot":
        fam = _family(row.method)
        s.update(method=row.method, lr=lr, steps=STEPS[profile][fam], eval_every=EVAL_EVERY[profile][fam],
                 **row.settings)
    s.update({k: v for k, v in overrides.items()
              if row.method != "zeroshot" or k.startswith("n_") or k == "device"})
    yield s


# ---------------------------------------------------------------- running one cell
def cell_matches(cell: Cell, result: dict) -> list[str]:
    """The settings in which an existing result differs from the cell (empty: it is this cell's result).

    The device is not a setting of the cell: a cell run on a GPU is the same cell (its result records the
    device and the hardware; the ZO noise then comes from torch's CUDA generator, other draws of the same law)."""
    if cell.kind == "bench":
        return [] if result.get("kind") == "bench" else ["kind"]
    saved = result.get("config", {})
    return [k for k, v in cell.config().items()
            if k != "device" and saved.get(k) != (list(v) if isinstance(v, tuple) else v)]


def result_differs(cell: Cell, results: Path = RESULTS) -> list[str] | None:
    """None where ``cell`` has no result file, else the settings in which that file differs (:func:`cell_matches`).
    A file that cannot be read as a result raises :class:`ResultFileError`."""
    path = cell.result_path(results)
    return cell_matches(cell, read_result(path)) if path.is_file() else None


class ResultFileError(ValueError):
    """A result file that cannot be read as one, or that holds another cell's run: names the file and why."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path, self.reason = Path(path), reason
        super().__init__(f"{path}: {reason}")


def _short(value) -> str:
    """A JSON value in at most 40 characters."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:39] + "…"


def _schema_failure(err) -> str:
    """A jsonschema error in a few words: the failing field and what is wrong with it (never the whole file)."""
    where = ".".join(map(str, err.absolute_path))
    if err.validator == "required":
        missing = re.match(r"'(.+)' is a required property", err.message)
        name = missing.group(1) if missing else str(err.validator_value)
        return f"field {where + '.' if where else ''}{name} is missing"
    if not isinstance(err.validator, str):        # a check of validate_result's own
        return f"field {where or '(top level)'}: {err.message}"
    return (f"field {where or '(top level)'} is {_short(err.instance)}, which fails "
            f"{err.validator} {_short(err.validator_value)}")


def read_result(path: str | os.PathLike) -> dict:
    """A result file, read and validated (:func:`validate_result`); :class:`ResultFileError` naming the file and
    the failing field otherwise."""
    import jsonschema

    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ResultFileError(path, f"not valid JSON ({err.msg}: line {err.lineno} column {err.colno})") from None
    except UnicodeDecodeError:
        raise ResultFileError(path, "not a text file") from None
    if not isinstance(data, dict):
        raise ResultFileError(path, f"holds a JSON {type(data).__name__}, not a result object")
    try:
        validate_result(data)
    except jsonschema.ValidationError as err:
        raise ResultFileError(path, _schema_failure(err)) from None
    return data


def conflicting_results(cells: list[Cell], results: Path = RESULTS) -> dict[str, list[str]]:
    """{cell name: settings that differ} for the cells whose result file was made with other settings."""
    return {cell.name: differ for cell in cells if (differ := result_differs(cell, results))}


def cell_status(cell: Cell, results: Path = RESULTS, checkpoints: Path | None = None) -> dict:
    """{"state": "done" | "running" | "partial" | "missing" | "other settings (…)" | "unreadable: …", "step": steps
    done, "steps": steps of the cell}. "other settings": a result file made with other settings
    (:func:`cell_matches`); "running": another process holds the cell's lock (:func:`cell_lock`); "unreadable": a
    result file or checkpoint that cannot be read, with the reason."""
    steps = cell.steps()
    try:
        differ = result_differs(cell, results)
    except ResultFileError as err:
        return {"state": f"unreadable: {err.reason}", "step": 0, "steps": steps}
    if differ is not None:
        state = "other settings (" + ", ".join(differ) + ")" if differ else "done"
        return {"state": state, "step": steps, "steps": steps}
    running = cell_holder(cell, checkpoints) is not None
    ckpt = cell.checkpoint_dir(checkpoints) / "checkpoint.pt"
    step = 0
    if ckpt.is_file():
        try:
            step = read_checkpoint(ckpt, mmap=True)["step"]      # mapped: no tensor is read
        except CheckpointError as err:
            if not running:
                return {"state": f"unreadable: {err.reason}", "step": 0, "steps": steps}
    state = "running" if running else "partial" if ckpt.is_file() else "missing"
    return {"state": state, "step": step, "steps": steps}


def _batch_examples(config: dict) -> int:
    """Examples per training step: FO's batch size, or E / q for the ZO methods (each query sees them all)."""
    if "batch_size" in config:
        return config["batch_size"]
    return max(1, config.get("E", 16) // config.get("q", 1))


@functools.lru_cache(maxsize=None)
def _prompt_lengths(task: str, seed: int = 0) -> tuple[tuple[int, ...], int]:
    """Lengths in characters of the texts a training step reads from ``task``'s training sample (prompt and
    answer), and how many examples one evaluation reads (validation + test)."""
    t = get_task(task)
    data = sample_task(t, seed)
    lengths = [sum(map(len, t.training_pair(r))) for r in data.train]
    return tuple(lengths), len(data.val) + len(data.test)


@functools.lru_cache(maxsize=None)
def _longest_prompt(task: str, examples: int) -> float:
    """Mean over random batches of ``examples`` training examples of the longest prompt's length: a step pads
    every row to it, so step time follows it."""
    lengths, _ = _prompt_lengths(task)
    rng = random.Random(0)
    return statistics.mean(max(rng.sample(lengths, min(examples, len(lengths)))) for _ in range(500))


def prompt_length_factor(task: str, config: dict) -> float:
    """How much longer a step of ``config`` on ``task`` pads its rows than the same method's SST-2 step at the
    batch SECONDS_PER_STEP was measured at (1.0 where the task's data cannot be read)."""
    reference = _batch_examples(registry.get(config["method"]).defaults)     # SECONDS_PER_STEP's batch
    try:
        return _longest_prompt(task, _batch_examples(config)) / _longest_prompt("sst2", reference)
    except DataUnavailableError:
        return 1.0


def evaluation_factor(task: str) -> float:
    """How much longer one evaluation of ``task`` takes than SST-2's: mean prompt length times examples read."""
    try:
        (lengths, rows), (sst2, sst2_rows) = _prompt_lengths(task), _prompt_lengths("sst2")
    except DataUnavailableError:
        return 1.0
    return statistics.mean(lengths) * rows / (statistics.mean(sst2) * sst2_rows)


def estimate_seconds(cell: Cell, remaining_steps: int) -> float:
    """Rough time of the rest of ``cell`` on a 2-core CPU (what --list prints): a training cell at 1 torch
    thread beside one other cell, a benchmark cell alone on the idle machine."""
    if cell.kind == "zeroshot":
        return EVAL_SECONDS * evaluation_factor(cell.task)
    if cell.kind == "bench":
        c = cell.config()
        configs = len(configurations(c["methods"], c["qs"]))
        steps = configs * (c["repeats"] + 1) * 2     # timing rounds, then the peak's process
        a, b = BENCH_STEP_SECONDS[c["quant"]]
        return steps * a * (c["seq_len"] / 64) ** b + (configs + 1) * c["repeats"] * BENCH_LOAD_SECONDS
    c = cell.config()
    evals = remaining_steps // max(1, c.get("eval_every") or remaining_steps) + 1
    # MeZO on an adapter (the peft grid) is priced by its adapter, not as MeZO on every weight
    adapter = c.get("adapter", "none")
    if c["method"] == "mezo" and adapter != "none":
        rate = ADAPTER_SECONDS_PER_STEP.get(adapter, SECONDS_PER_STEP["mezo-lorafa"])
    else:
        rate = SECONDS_PER_STEP[c["method"]]
    step = rate * prompt_length_factor(cell.task, c)
    return remaining_steps * step + evals * EVAL_SECONDS * evaluation_factor(cell.task)


class CellBusy(RuntimeError):
    """Another process runs the cell (it holds the cell's lock): this one leaves it alone."""


LOCK_WAIT_S = 0.5      # how long a cell waits for its lock (a --list looking at the lock holds it for microseconds)


def _lock_files(cell: Cell, checkpoints: Path | None) -> tuple[Path, Path]:
    """The cell's lock file and its owner record, beside the cell's checkpoint folder."""
    folder = cell.checkpoint_dir(checkpoints)
    return folder.with_name(folder.name + ".lock"), folder.with_name(folder.name + ".owner.json")


def _owner_text(owner: Path) -> str:
    try:
        o = json.loads(owner.read_text())
        return f"pid {o['pid']} on {o['host']}, since {o['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return f"its owner record {owner} is missing or unreadable"


@contextmanager
def cell_lock(cell: Cell, checkpoints: Path | None = None):
    """Hold ``cell``'s lock for the block: one process at a time runs a cell, writes its checkpoints and removes
    them. The lock (``filelock``) sits beside the checkpoint folder with an owner record (pid, host, start
    time) for the others to name; the operating system releases the lock of a process that dies, even by
    kill -9. Raises :class:`CellBusy`, naming the holder, when another process has it."""
    from filelock import FileLock, Timeout

    lock_path, owner = _lock_files(cell, checkpoints)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(lock_path)
    try:
        lock.acquire(timeout=LOCK_WAIT_S)
    except Timeout:
        raise CellBusy(f"cell {cell.name} is running in another process ({_owner_text(owner)}); "
                       f"left to it") from None
    try:
        with atomic_file(owner) as tmp:
            tmp.write_text(json.dumps({"pid": os.getpid(), "host": platform.node(),
                                       "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
        yield
    finally:
        owner.unlink(missing_ok=True)
        lock.release()


def cell_holder(cell: Cell, checkpoints: Path | None = None) -> str | None:
    """Who runs ``cell`` now ("pid … on …, since …"), or None when no process holds its lock."""
    from filelock import FileLock, Timeout

    lock_path, owner = _lock_files(cell, checkpoints)
    if not lock_path.is_file():
        return None
    lock = FileLock(lock_path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return _owner_text(owner)
    lock.release()
    return None


def run_cell(cell: Cell, results: Path = RESULTS, checkpoints: Path | None = None,
             progress: bool = True, threads: int | None = None, deadline: float | None = None,
             restart: bool = False) -> Path:
    """Run one cell (resuming its checkpoint if one exists, discarding it with ``restart``) and write its result;
    return the result path.

    The cell runs under its lock (:func:`cell_lock`): a cell another process runs raises :class:`CellBusy`. An
    existing result made with other settings is an error, not something to overwrite silently. A training
    cell still running at ``deadline`` raises :class:`~prge_lib.training.trainer.TrainingStopped` after saving its
    checkpoint, and writes no result. A cell whose loss turns non-finite writes the steps it made, with
    ``status`` "diverged". Once the result is written the cell's checkpoint folder is removed."""

    path = cell.result_path(results)
    if _result_done(cell, results):
        return path
    with cell_lock(cell, checkpoints):
        if _result_done(cell, results):         # written by another process while this one waited
            return path
        if threads:
            import torch
            torch.set_num_threads(threads)
        start = time.perf_counter()
        if cell.kind == "zeroshot":
            result = _run_zeroshot(cell)
        elif cell.kind == "bench":
            result = _run_bench(cell)
        else:
            result = _run_train(cell, cell.checkpoint_dir(checkpoints), progress, deadline, restart)
        result["cell"] = {"grid": cell.grid, "profile": cell.profile, "name": cell.name, "row": cell.row.key,
                          "label": cell.row.label, "lr": cell.lr}
        result.setdefault("seed", cell.seed)
        result["provenance"] = provenance(time.perf_counter() - start, command=cell.command())
        validate_result(result)
        written = write_result(path, result)
        # the result holds everything the checkpoint did that a table needs; a full-model checkpoint is ~1 GB
        shutil.rmtree(cell.checkpoint_dir(checkpoints), ignore_errors=True)
    return written


def _result_done(cell: Cell, results: Path) -> bool:
    """Whether ``cell``'s result exists; an error if the file there holds a run with other settings."""
    differ = result_differs(cell, results)
    if differ:
        raise ValueError(f"{cell.result_path(results)} holds a result made with other settings ({differ}); "
                         f"move it away to rerun cell {cell.name}")
    return differ is not None


def _run_train(cell: Cell, checkpoint_dir: Path, progress: bool, deadline: float | None = None,
               restart: bool = False) -> dict:

    config = TrainConfig(**cell.config())
    trainer = Trainer(config, checkpoint_dir=checkpoint_dir, progress=progress)
    resume = trainer.checkpoint_path().is_file() and not restart
    try:
        result = trainer.run(resume=resume, deadline=deadline, restart=restart)
        result["status"] = "finished"
    except CheckpointError as err:      # a cell resumes by the same command, not by --resume
        raise CheckpointError(err.path, err.reason, resume="the same command") from None
    except TrainingDiverged as diverged:
        # the same seeds would diverge at the same step on every rerun: record the run as far as it went (its
        # evaluations, and one at the last good state), so the grid goes on and the table can say so
        result = trainer.summary()
        result.update(status="diverged", diverged=str(diverged))
    result["model"] = config.model or EMBEDDED_MODEL
    return result


def _run_zeroshot(cell: Cell) -> dict:

    c = cell.config()
    task = get_task(c["task"])
    sizes = {k: c[k] for k in ("n_train", "n_val", "n_test") if k in c}
    data = sample_task(task, c["seed"], **sizes)
    model, tokenizer = load_model(c.get("model"), device=c.get("device", "cpu"))
    val = zero_shot(task, model, tokenizer, data.val)["value"]
    test = zero_shot(task, model, tokenizer, data.test)["value"]
    point = {"step": 0, "val": val, "test": test}
    return {"kind": "train", "task": task.name, "title": task.title, "method": "zeroshot", "metric": task.metric,
            "seed": c["seed"], "config": {**c, "method": "zeroshot", "steps": 0}, "steps": 0,
            "data_sizes": data.sizes(), "data_notes": data.notes, "zero_shot_val": val,
            "best_val": point, "final": point, "evals": [point], "losses": [], "status": "finished",
            "model": c.get("model") or EMBEDDED_MODEL}


def _run_bench(cell: Cell) -> dict:

    c = cell.config()
    spec = {"name": c["model"], "dtype": "fp32", "quant": c["quant"], "device": "cpu"}
    result = bench(spec, c["methods"], E=c["E"], qs=tuple(c["qs"]), seq_len=c["seq_len"],
                   repeats=c["repeats"])
    result.update(kind="bench", config=c, seed=cell.seed)
    return result


# ---------------------------------------------------------------- result schema
_TRAIN_SCHEMA = {
    "type": "object",
    "required": ["kind", "task", "method", "seed", "config", "steps", "best_val", "final", "evals", "losses",
                 "provenance"],
    "properties": {
        "kind": {"const": "train"},
        "seed": {"type": "integer"},
        "steps": {"type": "integer", "minimum": 0},
        "config": {"type": "object", "required": ["task", "seed"]},
        "best_val": {"$ref": "#/$defs/point"},
        "final": {"$ref": "#/$defs/point"},
        "evals": {"type": "array", "minItems": 1,
                  "items": {"type": "object", "required": ["step", "val"],
                            "properties": {"step": {"type": "integer"}, "val": {"type": "number"},
                                           "test": {"type": "number"}}}},
        "losses": {"type": "array", "items": {"type": "number"}},
        "provenance": {"type": "object",
                       "required": ["command", "commit", "versions", "hardware", "wall_time_s"]},
    },
    "$defs": {"point": {"type": "object", "required": ["step", "val", "test"],
                        "properties": {"step": {"type": "integer"},
                                       "val": {"type": "number", "minimum": 0, "maximum": 1},
                                       "test": {"type": "number", "minimum": 0, "maximum": 1}}}},
}
_BENCH_SCHEMA = {"type": "object", "required": ["kind", "configs", "floor", "ratios", "config", "provenance"],
                 "properties": {"kind": {"const": "bench"}}}


@functools.cache
def _validator(kind: str):
    """A jsonschema validator for ``kind``'s schema, checked and built once (``jsonschema.validate`` re-checks the
    schema on every call, which was most of the time of reading a grid's results)."""
    import jsonschema

    schema = _BENCH_SCHEMA if kind == "bench" else _TRAIN_SCHEMA
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def validate_result(result: dict) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``result`` is a well-formed cell result."""
    import jsonschema

    _validator("bench" if result.get("kind") == "bench" else "train").validate(result)
    if result.get("kind") == "train" and result["steps"] != len(result["losses"]):
        raise jsonschema.ValidationError(f"steps = {result['steps']} but {len(result['losses'])} losses",
                                         path=("losses",))


# ---------------------------------------------------------------- running a grid
def run_grid(cells: list[Cell], backend: str = "local", address: str | None = None,
             results: Path = RESULTS, checkpoints: Path | None = None, progress: bool = True,
             cpus_per_cell: int = 1, say: Callable[[str], None] = print,
             deadline: float | None = None, restart: bool = False) -> list[Path]:
    """Run the cells that have no result yet, in order (``local``) or as Ray tasks (``ray``); return the
    result paths written. ``deadline`` (a ``time.time()`` value, e.g. a GPU session's end): no cell starts
    after it, and a training cell running past it stops at a checkpoint, to resume on the next run. A cell
    another process runs is left to it (:class:`CellBusy`); ``restart`` discards the checkpoints of the cells
    this call runs."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {list(BACKENDS)}")
    conflicts = conflicting_results(cells, results)
    if conflicts:
        named = "; ".join(f"{name} ({', '.join(keys)})" for name, keys in list(conflicts.items())[:5])
        raise ValueError(f"{len(conflicts)} cells have a result under {Path(results)} made with other settings: "
                         f"{named}{' …' if len(conflicts) > 5 else ''}. Give these runs their own --results-dir, "
                         "or move those files away to rerun the cells")
    todo = [c for c in cells if not c.result_path(results).is_file()]
    checkpoints = checkpoint_root(checkpoints)
    say(f"{len(cells) - len(todo)} of {len(cells)} cells done; running {len(todo)}")
    if backend == "ray":
        return _run_on_ray(todo, address, results, checkpoints, cpus_per_cell, say, deadline, restart)
    from tqdm.auto import tqdm
    paths = []
    for i, cell in enumerate(tqdm(todo, desc="cells", disable=not progress or len(todo) < 2)):
        if not _fits_before(cell, deadline):
            say(f"time limit reached: {len(todo) - i} cells not run; the same command continues")
            break
        say(f"cell {cell.name}")
        try:
            paths.append(run_cell(cell, results, checkpoints, progress, deadline=deadline, restart=restart))
        except CellBusy as busy:
            say(str(busy))
        except TrainingStopped as stop:
            say(f"cell {cell.name}: {stop}; the same command resumes it")
            break
    return paths


def _fits_before(cell: Cell, deadline: float | None) -> bool:
    """Whether ``cell`` may start: a training cell until the deadline (it stops at a checkpoint when the deadline
    comes), a zero-shot or benchmark cell, which cannot stop halfway, only if its estimate ends before it."""
    if deadline is None:
        return True
    needs = 0.0 if cell.kind == "train" else estimate_seconds(cell, cell.steps())
    return time.time() + needs < deadline


def connect_ray(ray, address: str | None) -> None:
    """``ray.init``: the cluster at ``address``, secured by its operators (chapter 7); with no address, a Ray
    started on this machine with no dashboard (its web and job APIs run code for whoever reaches them) and
    with token authentication (RAY_AUTH_MODE=token unless set otherwise; Ray 2.52 and later), so that its APIs
    and the connections between its processes need the token Ray keeps in ~/.ray/auth_token. Where it listens
    stays Ray's choice: Ray rewrites a loopback ``_node_ip_address`` to this machine's reachable address
    (``ray._private.services.resolve_ip_for_localhost``, Ray 2.60), so that setting cannot confine it."""
    found = tuple(int(part) for part in ray.__version__.split(".")[:2])
    if found < (2, 52):
        raise RuntimeError(f"--backend ray needs Ray 2.52 or later (token authentication); found {ray.__version__}: "
                           f"pip install -e '.[cluster]'")
    if address is not None:
        ray.init(address=address, log_to_driver=False)
        return
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    ray.init(include_dashboard=False, log_to_driver=False)


def _run_on_ray(cells, address, results, checkpoints, cpus_per_cell, say, deadline=None,
                restart=False) -> list[Path]:
    try:
        import ray
    except ImportError:
        raise RuntimeError("--backend ray needs Ray: pip install -e '.[cluster]' (or pip install ray)") from None
    if not ray.is_initialized():
        connect_ray(ray, address)
    task = ray.remote(num_cpus=cpus_per_cell)(_ray_cell)
    env = {"PRGE_DATA_DIR": os.environ.get("PRGE_DATA_DIR", ""), "PRGE_FAST": os.environ.get("PRGE_FAST", "")}
    pending = {task.remote(cell, str(results), str(checkpoints), cpus_per_cell, env, deadline, restart): cell
               for cell in cells}
    paths = []
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        cell = pending.pop(done[0])
        path, stopped = ray.get(done[0])
        if path is None:
            say(f"cell {cell.name}: {stopped}; the same command resumes it")
            continue
        paths.append(Path(path))
        say(f"cell {cell.name} done ({len(cells) - len(pending)}/{len(cells)})")
    return paths


def _ray_cell(cell: Cell, results: str, checkpoints: str, threads: int, env: dict,
              deadline: float | None = None, restart: bool = False) -> tuple[str | None, str | None]:
    """(result path, None), or (None, why) for a cell the deadline stopped or kept from starting, or that another
    process runs."""
    os.environ.update({k: v for k, v in env.items() if v})
    if not _fits_before(cell, deadline):
        return None, "not started: time limit reached"
    try:
        return str(run_cell(cell, Path(results), Path(checkpoints), progress=False, threads=threads,
                            deadline=deadline, restart=restart)), None
    except (TrainingStopped, CellBusy) as stop:
        return None, str(stop)


# ---------------------------------------------------------------- listing and summarizing
def list_cells(cells: list[Cell], results: Path = RESULTS, checkpoints: Path | None = None) -> str:
    """A plain-text table: each cell's state (done / running / partial at step k / missing / unreadable, see
    :func:`cell_status`) and its time left."""
    lines, left, done = [], 0.0, 0
    for cell in cells:
        st = cell_status(cell, results, checkpoints)
        done += st["state"] == "done"
        seconds = estimate_seconds(cell, max(0, st["steps"] - st["step"])) \
            if st["state"] in ("partial", "missing", "running") else 0.0
        left += seconds
        state = f"{st['state']} {st['step']}/{st['steps']}" if st["state"] in ("partial", "running") and st["steps"] \
            else st["state"]
        lines.append(f"{cell.name:<44} {state:<16} {'' if not seconds else _hours(seconds)}")
    basis = ("benchmark cells alone on an idle machine" if all(c.kind == "bench" for c in cells) else
             "training cells at 1 torch thread each; two side by side on a 2-core CPU take about half as long")
    lines.append(f"{done}/{len(cells)} done; about {_hours(left)} left ({basis})")
    return "\n".join(lines)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


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


_CELL_FILE = re.compile(r"(?P<row>.+?)(?:-L(?P<seq_len>\d+))?(?:_lr(?P<lr>[^_]+))?_seed(?P<seed>\d+)")


def check_file_cell(grid: str, result: dict, path: Path) -> None:
    """Refuse (:class:`ResultFileError`) a training result whose task, row, learning rate or seed, or a fixed
    setting of its row, differs from the cell its place gives (``<task>/<row>[_lr<lr>]_seed<seed>.json``)."""
    if result.get("kind") != "train":
        return
    file = Path(result["_file"])
    m = _CELL_FILE.fullmatch(file.stem)
    if m is None:
        raise ResultFileError(path, "its name is not a cell's (<task>/<row>[_lr<lr>]_seed<seed>.json), so its "
                                    "row is unknown; rename it or move it away")
    config, cell = result["config"], result.get("cell", {})
    lr = None if result["method"] == "zeroshot" else config.get("lr")
    try:
        named_lr = None if m["lr"] is None else float(m["lr"])
    except ValueError:
        named_lr = math.nan
    differ = []
    if len(file.parts) > 1 and result["task"] != file.parts[0]:
        differ.append(f"task {result['task']} (the folder says {file.parts[0]})")
    if result["seed"] != int(m["seed"]):
        differ.append(f"seed {result['seed']} (the name says {m['seed']})")
    same_lr = lr is None and named_lr is None or (isinstance(lr, (int, float)) and named_lr is not None
                                                  and math.isclose(lr, named_lr, rel_tol=1e-9))
    if not same_lr:
        differ.append(f"lr {lr} (the name says {m['lr']})")
    if "row" in cell and cell["row"] != m["row"]:
        differ.append(f"row {cell['row']} (the name says {m['row']})")
    row = next((r for r in GRIDS.get(grid, {}).get("rows", ()) if r.key == m["row"]), None)
    fixed = {} if row is None else {**row.settings, **({"method": row.method} if row.method != "zeroshot" else {})}
    differ += [f"{k} {config[k]} (row {row.key} has {v})" for k, v in fixed.items() if k in config and config[k] != v]
    if differ:
        raise ResultFileError(path, f"its settings are not those of cell {file.with_suffix('')}: "
                                    f"{'; '.join(differ)}; move it to its own cell's name or away")


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
    steps = (result.get("step_time_s") or {}).get("per_step")
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
