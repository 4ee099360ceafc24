"""A cell of a grid (chapter 7): one run (model × task × method × hyperparameters × seed), its name, where its
result and its checkpoint live, the command that runs it alone, and the cells of a grid under a profile.

A cell writes one JSON result, ``data/results/<grid>/<task>/<row>_lr<lr>_seed<seed>.json`` (``<grid>-paper/`` for
the paper profile, :func:`grid_folder`), and keeps its checkpoint in ``<cache>/reproduce/<grid>/<cell>/``
(:func:`checkpoint_root`) while it runs.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from prge_lib.common.paths import RESULTS
from prge_lib.common.settings import cache_dir
from prge_lib.experiments.grids import (EVAL_EVERY, GRIDS, LM_EVAL_EVERY, LM_STEPS, PROFILES, STEPS, Row, _family,
                                        lr_text)
from prge_lib.methods import registry
from prge_lib.models.buckets import FINE_BUCKETS


def checkpoint_root(root: Path | str | None = None) -> Path:
    """Where interrupted cells keep their checkpoints: ``root`` if given, else ``reproduce`` in the cache folder
    (``PRGE_CACHE_DIR``, default ``~/.cache/prge``). Outside the clone, so a cell longer than one sitting resumes
    from a fresh checkout on the same machine; the trainer refuses a checkpoint made with other settings."""
    return Path(root) if root else cache_dir() / "reproduce"


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
    stage: str = "sweep"     # a two-stage grid's stage (prge_lib.experiments.stages); "sweep" for every other grid

    @property
    def name(self) -> str:
        lr = "" if self.lr is None else f"_lr{lr_text(self.lr)}"
        length = f"-L{self.config()['seq_len']}" if self.kind == "bench" else ""
        return f"{self.task}/{self.row.key}{length}{lr}_seed{self.seed}"

    @property
    def kind(self) -> str:
        return self.row.kind

    def config(self) -> dict:
        return dict(self.settings)

    def steps(self) -> int:
        """Training steps of the cell (the WikiText-2 curves: every method's, summed; 0 for a cell without)."""
        config = self.config()
        return sum(config["lm_steps"].values()) if "lm_steps" in config else config.get("steps", 0)

    def result_path(self, root: Path = RESULTS) -> Path:
        return Path(root) / grid_folder(self.grid, self.profile) / f"{self.name}.json"

    def checkpoint_dir(self, root: Path | None = None) -> Path:
        return checkpoint_root(root) / grid_folder(self.grid, self.profile) / self.name

    def command(self) -> str:
        """The command that runs this cell alone (recorded as the result's provenance): every setting in which
        the cell differs from its grid's default, so that the command makes this very cell again."""
        c, options = self.config(), ""
        if self.seed not in self._own_seeds():
            options += f" --seeds {self.seed}"
        if self.kind == "train" and c["steps"] != STEPS[self.profile][_family(self.row.method)]:
            options += f" --steps {c['steps']}"
        if c.get("model"):
            options += f" --model {shlex.quote(str(c['model']))}"
        if c.get("device", "cpu") != "cpu":
            options += f" --device {c['device']}"
        if c.get("dtype", "fp32") != "fp32" and self.kind == "bench":
            options += f" --dtype {c['dtype']}"
        if c.get("stop_rising") is not None:
            options += f" --stop-rising {c['stop_rising']:g}"
        if c.get("length_groups", 1) != 1:
            options += f" --length-groups {c['length_groups']}"
        if self.stage != "sweep":
            options += f" --stage {self.stage}"
        return f"prge reproduce {self.grid} --profile {self.profile} --only {self.name}{options}"

    def _own_seeds(self) -> tuple:
        """The seeds the cell's grid gives its row and task in its stage (a cell of another seed needs --seeds)."""
        if self.stage == "confirm":
            return tuple(self.row.confirm_seeds[self.profile])
        return self.row.planned_seeds(self.profile, self.task)


def grid_folder(grid: str, profile: str = "cpu") -> str:
    """The folder (under the results and the checkpoint roots) of ``grid``'s cells under ``profile``: the grid's
    name for the cpu profile, ``<grid>-<profile>`` for another, so that profiles never mix in one table."""
    return grid if profile == "cpu" else f"{grid}-{profile}"


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
            cells += row_cells(grid, profile, task, row, row.lrs.get(profile, (None,)),
                               row.seeds_for(profile, task) if seeds is None else tuple(seeds), model, **overrides)
    return select(cells, only)


def row_cells(grid: str, profile: str, task: str, row: Row, lrs: Iterable[float | None], seeds: Iterable[int],
              model: str | None = None, stage: str = "sweep", **overrides) -> list[Cell]:
    """The cells of one row of ``grid`` on ``task``: one per learning rate in ``lrs`` and seed in ``seeds``."""
    spec = GRIDS[grid]
    return [Cell(grid, profile, task, row, lr, seed, tuple(sorted(settings.items())), stage)
            for lr in lrs for seed in seeds
            for settings in _cell_settings(spec, row, profile, task, lr, seed, model, overrides)]


def select(cells: list[Cell], only: str | None) -> list[Cell]:
    """The cells whose name contains ``only``: several comma-separated filters all apply, and a filter of
    alternatives joined by "|" takes a cell that contains any of them ("sst2/prge|sst2/mezo-lorafa"); a whole
    cell name selects that cell alone ("…_seed1" is also inside "…_seed10"). The grid's order is kept."""
    if only:
        for part in map(str.strip, only.split(",")):
            options = [o.strip() for o in part.split("|") if o.strip()]
            exact = {c.name for c in cells if c.name in options}
            cells = [c for c in cells if c.name in exact or any(o in c.name for o in options if o not in exact)]
    return cells


def _cell_settings(spec, row, profile, task, lr, seed, model, overrides):
    if row.method == "bench":
        for seq_len in spec["seq_lens"]:
            s = dict(row.settings, seq_len=seq_len, model=model, E=16)
            # a GPU's cells name their device and dtype; the CPU's settings stay as they were
            s.update({k: overrides[k] for k in ("device", "dtype") if k in overrides})
            s["methods"], s["qs"] = list(s["methods"]), list(s["qs"])
            yield s
        return
    s = {"task": task, "seed": seed, "model": model}
    if row.method == "lm":          # the WikiText-2 curves: every method's steps in one cell
        s.update(row.settings, lm_steps=dict(LM_STEPS[profile]), eval_every=dict(LM_EVAL_EVERY[profile]))
        s.update({k: v for k, v in overrides.items() if k in s or k == "device"})
        yield s
        return
    if row.method != "zeroshot":
        fam = _family(row.method)
        s.update(method=row.method, lr=lr, steps=STEPS[profile][fam], eval_every=EVAL_EVERY[profile][fam],
                 **row.settings)
    s.update({k: v for k, v in overrides.items()
              if (row.method != "zeroshot" or k.startswith("n_") or k == "device")
              and (k != "length_groups" or k in registry.get(row.method).uses)})
    if profile == "paper" and str(s.get("device", "cpu")).startswith("cuda") and row.method != "zeroshot" \
            and "cuda_graphs" in registry.get(row.method).uses:
        # the paper's budget on a GPU runs the optimised engine (chapter 5): each step replayed as a CUDA graph,
        # its batch padded to one of a few lengths
        s.setdefault("buckets", ",".join(map(str, FINE_BUCKETS)))
        s.setdefault("cuda_graphs", True)
    yield s
