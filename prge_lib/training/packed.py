"""Packed training: R ZO runs of one base model trained side by side, every step of all of them in one forward
(``prge_lib.zo.packing``; chapter 5's outer loop, one axis further).

Each run is what :class:`~prge_lib.training.trainer.Trainer` would make of its config: its own data sample and
order, noise seeds, evaluation schedule, checkpoint folder and result, with the same fields as ``Trainer.run()``
(plus ``status`` as the reproduction runner records it, and ``packed``: the pack it ran in). The bookkeeping is
the trainer's own (a ``Trainer`` per run drives it); only the step is shared. What the runs must share is the
model they train: ``model``, ``dtype``, ``quant``, ``device``, ``layers``, ``targets``, ``engine`` and
``buckets``; tasks, q, E, ε, lr, seeds, rank, α, noise source and step counts may all differ (with ``engine``
fused, the shared step draws each run's noise in one call and updates it on the device, so every run needs
counter noise; ``buckets`` pad the pack's batch to a bucket length). Methods: ``prge`` and ``mezo-lorafa``
(P-RGE with q = 1). A pack's step runs every copy of every run in one forward, whatever a run's ``outer``/``inner``
switches say: they change the speed of an unpacked run, not its numbers beyond float rounding (chapter 5).

Evaluations are packed too: the runs due an evaluation after a step (and at step 0 and the end) score their
validation sets in shared forwards, each run's rows through its own adapter (``Pack.each_own``, ``zero_shot_many``),
up to ``eval_together`` runs per forward; a run's ``eval_s`` counts the evaluations it took part in.

A run that reaches its steps leaves the pack; a run whose loss turns non-finite, or with ``stop_rising`` rises
that far (:func:`~prge_lib.training.stopping.loss_rise`), is recorded as diverged (its last good state in its
checkpoint, its result with ``status`` "diverged") and leaves it too, and the others go on. ``step_s`` of a
packed run is the time of the whole pack's step it took part in.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Sequence

from tqdm.auto import tqdm

from prge_lib.common.provenance import provenance, start_commit, write_result
from prge_lib.data.splits import TaskData
from prge_lib.methods import registry
from prge_lib.models.buckets import parse_buckets
from prge_lib.models.loading import load_model, truncate_layers
from prge_lib.models.options import EMBEDDED
from prge_lib.training import stopping
from prge_lib.training.checkpoints import check_checkpoint_folder
from prge_lib.training.config import TrainConfig
from prge_lib.training.records import diverged_record, finished_record
from prge_lib.training.evaluate import zero_shot_many
from prge_lib.training.trainer import Trainer, TrainingDiverged, evaluate_runs, finish_evaluations
from prge_lib.zo.packing import build_pack

PACKABLE = ("prge", "mezo-lorafa")          # the methods whose runs can share a forward
EVAL_TOGETHER = 16     # runs whose evaluation batches share one forward (16 runs × 16 rows by default)
SHARED = ("model", "dtype", "quant", "device", "layers", "targets", "engine", "buckets", "cuda_graphs")   # what every run of a pack must agree on


class PackStopped(RuntimeError):
    """The pack reached its deadline, or a signal asked it to stop (:mod:`prge_lib.training.stopping`): it stopped
    after a step with every unfinished run's checkpoint saved, so the same pack resumes from them (``resume``)."""

    def __init__(self, runs: dict[str, tuple[int, int, Path | None]]):
        self.runs = runs
        where = "; ".join(f"{name} at step {step} of {steps} ({path or 'no checkpoint folder'})"
                          for name, (step, steps, path) in runs.items())
        super().__init__(f"stopped by {stopping.reason()}: {where}")


def run_name(config: TrainConfig) -> str:
    """A run's name in a pack: method, task, q, lr and seed."""
    return f"{config.method}_{config.task}_q{config.q}_lr{config.lr:g}_seed{config.seed}"


def check_packable(configs: Sequence[TrainConfig]) -> list[TrainConfig]:
    """The resolved configs, if they can share one model's forward; otherwise a ValueError naming the run and the
    setting."""
    if not configs:
        raise ValueError("a pack needs at least one run config")
    resolved = [c.resolved() for c in configs]
    for i, c in enumerate(resolved):
        if c.method not in PACKABLE:
            raise ValueError(f"run {i}: method {c.method!r} cannot be packed; choose one of {list(PACKABLE)}")
        if c.program is not None:
            raise ValueError(f"run {i}: a config with a program trains through the runtime host, not in a pack")
        if c.length_groups != 1:
            raise ValueError(f"run {i}: length_groups {c.length_groups} cuts one run's batch; a pack cuts its forwards "
                             f"by batch width instead (width_groups)")
        for key in SHARED:
            if getattr(c, key) != getattr(resolved[0], key):
                raise ValueError(f"run {i}: {key} = {getattr(c, key)!r}, but run 0 has {getattr(resolved[0], key)!r}; "
                                 f"the runs of a pack train one model and must agree on {list(SHARED)}")
    return resolved


class PackedTrainer:
    """Train the runs of ``configs`` together (see the module docstring). ``data[r]`` and ``checkpoint_dirs[r]``
    are run r's (None: sampled by its seed / no checkpoints); ``names`` default to :func:`run_name`;
    ``width_groups``: each step's runs in that many forwards by batch width (``prge_lib.zo.packing.Pack``);
    ``eval_together``: at most this many runs' evaluation batches in one forward."""

    def __init__(self, configs: Sequence[TrainConfig], model=None, tokenizer=None,
                 data: Sequence[TaskData | None] | None = None,
                 checkpoint_dirs: Sequence[str | os.PathLike | None] | None = None,
                 names: Sequence[str] | None = None, progress: bool = True, width_groups: int = 1,
                 eval_together: int = EVAL_TOGETHER):
        configs = check_packable(configs)
        if isinstance(eval_together, bool) or not isinstance(eval_together, int) or eval_together < 1:
            raise ValueError(f"eval_together takes a whole number of runs ≥ 1, got {eval_together!r}")
        self.eval_together = eval_together
        count = len(configs)
        data = list(data) if data is not None else [None] * count
        checkpoint_dirs = list(checkpoint_dirs) if checkpoint_dirs is not None else [None] * count
        self.names = list(names) if names is not None else [run_name(c) for c in configs]
        for what, given in (("data", data), ("checkpoint_dirs", checkpoint_dirs), ("names", self.names)):
            if len(given) != count:
                raise ValueError(f"{what}: {len(given)} given for {count} runs")
        if len(set(self.names)) != count:
            raise ValueError(f"the runs of a pack need distinct names, got {self.names}")
        folders = [Path(d).resolve() for d in checkpoint_dirs if d is not None]
        if len(set(folders)) != len(folders):
            raise ValueError(f"two runs share a checkpoint folder: {[str(f) for f in folders]}")
        start_commit()
        first = configs[0]
        if model is None or tokenizer is None:
            quant = registry.get(first.method).load_quant(first.quant)
            model, tokenizer = load_model(first.model, dtype=first.dtype, quant=quant, device=first.device)
        if first.layers is not None:
            truncate_layers(model, first.layers)
        self.pack = build_pack(model, [{"targets": c.targets, "r": c.r, "alpha": c.alpha, "seed": c.seed,
                                        "noise": c.noise, "q": c.q, "eps": c.eps, "lr": c.lr,
                                        "keep_noise": c.keep_noise} for c in configs],
                               tokenizer.pad_token_id, fused=first.engine == "fused",
                               buckets=parse_buckets(first.buckets), graphs=bool(first.cuda_graphs),
                               width_groups=width_groups)
        self.trainers = [Trainer(c, model, tokenizer, d, folder, progress=False,
                                 method_builder=lambda c, m, r=r: self.pack.method(r))
                         for r, (c, d, folder) in enumerate(zip(configs, data, checkpoint_dirs))]
        self.model, self.tokenizer, self.progress = model, tokenizer, progress
        self.diverged: dict[int, TrainingDiverged] = {}

    def run(self, resume: bool | Sequence[bool] = False, deadline: float | None = None,
            restart: bool = False) -> list[dict]:
        """Train every run to its steps and return one result per run (in config order). ``resume``,
        ``restart`` and ``deadline`` mean what they mean for ``Trainer.run``, for every run's checkpoint
        (``resume`` may also be one flag per run: a pack can join resumed and new runs); at the deadline
        every unfinished run is checkpointed and :class:`PackStopped` raised."""
        resumes = [resume] * len(self.trainers) if isinstance(resume, bool) else list(resume)
        if len(resumes) != len(self.trainers):
            raise ValueError(f"resume: {len(resumes)} flags given for {len(self.trainers)} runs")
        for trainer, again in zip(self.trainers, resumes):   # every folder checked before any run starts
            check_checkpoint_folder(trainer.checkpoint_path(), again, restart)
        for trainer, again in zip(self.trainers, resumes):
            trainer.begin(again, restart, evaluate=False)
        evaluate_runs([t for t in self.trainers if t.config.eval_every and not t.history["evals"]], self.score)
        active = [r for r, trainer in enumerate(self.trainers) if trainer.step < trainer.config.steps]
        bar = tqdm(total=max(t.config.steps for t in self.trainers), initial=min(t.step for t in self.trainers),
                   desc=f"pack of {len(self.trainers)}", disable=not self.progress)
        while active:
            work = {r: (self.trainers[r].batch(self.trainers[r].step), self.trainers[r].step) for r in active}
            start = time.perf_counter()
            records = self.pack.step(work)
            took = time.perf_counter() - start
            for r in list(active):
                trainer, t = self.trainers[r], work[r][1]
                if records[r]["finite"]:
                    trainer.book_step(t, records[r], took)
                    rising = trainer.rising()
                    if rising is not None:          # over: recorded as diverged, and it leaves the pack
                        self.diverged[r] = trainer.rose(rising)
                        active.remove(r)
                else:
                    self.diverged[r] = trainer.diverged(t, records[r])
                    active.remove(r)
            evaluate_runs([self.trainers[r] for r in active if self.trainers[r].evaluation_due()], self.score)
            for r in list(active):
                trainer = self.trainers[r]
                trainer.checkpoint_if_due()
                if trainer.step >= trainer.config.steps:
                    active.remove(r)
            bar.update(1)
            if stopping.past(deadline) and active:
                bar.close()
                stopped = {}
                for r in active:
                    trainer = self.trainers[r]
                    stopped[self.names[r]] = (trainer.step, trainer.config.steps, trainer.save_checkpoint())
                raise PackStopped(stopped)
        bar.close()
        finish_evaluations(self.trainers, self.score)
        return [self.result(r) for r in range(len(self.trainers))]

    def score(self, jobs: list[tuple[Trainer, list[dict]]]) -> list[float]:
        """Each (trainer, examples) job's metric, the jobs of up to ``eval_together`` runs sharing each forward
        (each run's rows through its own adapter); every run's ``eval_s`` gains the time of the evaluations it
        was part of."""
        run_of = {id(trainer): r for r, trainer in enumerate(self.trainers)}
        values = []
        for first in range(0, len(jobs), self.eval_together):
            chunk = jobs[first:first + self.eval_together]
            runs = [run_of[id(trainer)] for trainer, _ in chunk]
            start = time.perf_counter()
            results = zero_shot_many([(trainer.task, examples) for trainer, examples in chunk], self.model,
                                     self.tokenizer, [trainer.config.eval_batch_size for trainer, _ in chunk],
                                     rows=lambda parts: self.pack.each_own([(runs[j], n) for j, n in parts]))
            took = time.perf_counter() - start
            for trainer in {id(trainer): trainer for trainer, _ in chunk}.values():
                trainer.elapsed["eval_s"] += took
            values += [result["value"] for result in results]
        return values

    def result(self, r: int) -> dict:
        """Run ``r``'s result: ``Trainer.summary()`` (evaluated on run r's adapter alone), its status, model and
        the pack it ran in."""
        trainer = self.trainers[r]
        with self.pack.solo(r):
            result = trainer.summary()
        model = trainer.config.model or EMBEDDED     # what a result names when no model was given
        result = diverged_record(result, self.diverged[r], model) if r in self.diverged else \
            finished_record(result, model)
        result["packed"] = {"runs": len(self.trainers), "index": r, "name": self.names[r],
                            "with": [name for i, name in enumerate(self.names) if i != r]}
        return result

    def write_results(self, results: Sequence[dict], paths: Sequence[str | os.PathLike],
                      wall_time_s: float | None = None, command: str | None = None) -> list[Path]:
        """Write each run's result (with provenance naming ``command``, else this process's arguments) to its
        path."""
        if len(paths) != len(results):
            raise ValueError(f"{len(paths)} result paths for {len(results)} results")
        return [write_result(path, {**result, "provenance": provenance(wall_time_s, command)})
                for result, path in zip(results, paths)]
