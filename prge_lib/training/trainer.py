"""The trainer shared by every method: data order, steps, evaluation, checkpoints, resume, result file
(chapters 5–7). ``prge train`` is a thin wrapper around :class:`Trainer`.

Every random choice is a pure function of (seed, step): the batch of step t comes from a seeded permutation
of the training set, and the ZO noise from ``prge.step_seeds``. A checkpoint therefore only needs the
trained tensors, the optimizer state and the history; resuming reproduces the uninterrupted run's losses
exactly on a CPU. Evaluation: validation every ``eval_every`` steps; the test metric is taken at each new
best validation score (so "test at the best-validation step" needs no saved copy of the model) and at the end.
"""
from __future__ import annotations

import dataclasses
import math
import os
import random
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from prge_lib.common.provenance import atomic_file, processor, start_commit
from prge_lib.data.splits import TaskData, sample_task
from prge_lib.data.tasks import get_task
from prge_lib.methods import registry
from prge_lib.methods.base import check_method
from prge_lib.models.buckets import parse_buckets, to_bucket
from prge_lib.models.loading import load_model
from prge_lib.models.objective import collate, encode_example
from prge_lib.training.checkpoints import (CHECKPOINT_FORMAT, CHECKPOINT_NAME, CheckpointError,
                                           check_checkpoint_folder, read_checkpoint, _python_rng_state,
                                           _set_python_rng_state)
from prge_lib.training.config import IDENTITY_LEGACY, TrainConfig
from prge_lib.training.evaluate import zero_shot
from prge_lib.training import stopping
from prge_lib.training.records import SCHEMA_VERSION, step_series
from prge_lib.zo.replay import adapter_digest, can_rebuild, rebuild
from prge_lib.zo.rge import mix_seed

TASK_MASK_ROWS = 128     # training rows whose squared gradients rank the weights of a "task" mask
# the methods, their families, defaults and builders: prge_lib.methods.registry


def epoch_order(seed: int, epoch: int, n: int) -> list[int]:
    """The order in which epoch ``epoch`` visits the ``n`` training examples: a seeded permutation."""
    return random.Random(mix_seed(seed, 0xDA7A, epoch)).sample(range(n), n)


class TrainingDiverged(RuntimeError):
    """A non-finite loss: the run stops, the last good state is kept in the checkpoint."""


class TrainingStopped(RuntimeError):
    """The run reached its deadline (a GPU or notebook session about to end) or a signal asked it to stop
    (:mod:`prge_lib.training.stopping`): it stopped after a step and saved a checkpoint there, so the same run
    resumes from it."""

    def __init__(self, step: int, steps: int, checkpoint: Path | None, why: str | None = None):
        self.step, self.steps, self.checkpoint = step, steps, checkpoint
        where = f"its checkpoint is {checkpoint}" if checkpoint else "no checkpoint folder was given"
        super().__init__(f"stopped by {why or stopping.reason()} after step {step} of {steps}; {where}")


def build_method(config: TrainConfig, model, tokenizer=None, task_batches=None, start=None):
    """The method object for ``config``, built by its spec's builder (prge_lib.methods.registry): LoRA-FA
    layers or peft adapters are injected as needed (MeZO with an ``adapter`` runs over that peft space's
    trainable parameters, prge_lib.methods.adapters). SensZOQ needs the ``tokenizer`` for its C4 mask and,
    for a "task" mask, ``task_batches()``: the task's training batches. ``start``: a checkpoint's
    ``Method.start`` to build from instead (SensZOQ's mask; only a method that has a start takes one)."""
    extra = {} if start is None else {"start": start}
    return registry.get(config.method).build(config, model, tokenizer, task_batches, **extra)


def method_state(method, seed_checkpoints: bool) -> dict:
    """What a checkpoint keeps of ``method``: with ``seed_checkpoints``, for a method :func:`~prge_lib.zo.replay.
    rebuild` can rebuild, the digest of its trainable tensors (the run's projected gradients, kept in its history,
    rebuild them); else the tensors themselves; and a first-order method's optimizer state."""
    if seed_checkpoints and can_rebuild(method):
        state = {"replay": "projected_grad", "digest": adapter_digest(method.trainable())}
    else:
        state = {"trainable": {k: v.detach().cpu().clone() for k, v in method.trainable().items()}}
    if method.start:    # what it was built from, and the settings that say how (Method.start)
        state["start"] = {"tensors": {k: v.detach().cpu() for k, v in method.start.items()},
                          "settings": dict(method.settings)}
    if method.optimizer is not None:
        state["optimizer"] = method.optimizer.state_dict()
    return state


def restore_method_state(method, state: dict, grads: list, step: int, path: Path, name: str,
                         processor_name: str | None = None) -> None:
    """Bring ``method`` (as built, at step 0, from the checkpoint's start where it keeps one) to the checkpoint's
    ``step`` from its :func:`method_state`: the tensors copied in, or the steps replayed from ``grads`` (their
    projected gradients) and the result refused unless its digest is the recorded one; then the optimizer state.
    ``name``: the method, ``processor_name``: where the checkpoint's last sitting ran, for the errors."""
    made_on = f" ({processor_name})" if processor_name else ""
    if "replay" in state:
        if not can_rebuild(method):
            raise CheckpointError(path, f"it holds the run's history instead of its adapter (a seed checkpoint), "
                                        f"and {name} cannot be rebuilt from projected gradients")
        if len(grads) != step:
            raise CheckpointError(path, f"a seed checkpoint at step {step} holds the projected gradients of "
                                        f"{len(grads)} steps")
        rebuild(method, grads)
        if adapter_digest(method.trainable()) != state["digest"]:
            start = "" if "start" in state or not method.start else (
                ", or built another start (a SensZOQ mask recomputed here: the checkpoint predates the mask kept "
                "in checkpoints)")
            raise CheckpointError(path, f"replaying its {len(grads)} steps did not give the adapter it recorded "
                                        f"(another digest): this machine rounds the update differently{start}; "
                                        f"resume it where it was made{made_on}")
    else:
        with torch.no_grad():
            for key, tensor in method.trainable().items():
                tensor.copy_(state["trainable"][key])
    if "optimizer" in state:
        method.optimizer.load_state_dict(state["optimizer"])


def score_alone(jobs: list[tuple["Trainer", list[dict]]]) -> list[float]:
    """The metric of each (trainer, examples) job, each trainer evaluating on its own model in turn: the scorer of
    :func:`evaluate_runs` for runs that do not share a forward (a pack scores its runs' jobs together)."""
    return [trainer.evaluate(examples) for trainer, examples in jobs]


def evaluate_runs(trainers: list["Trainer"], score) -> list[dict]:
    """Evaluate each of ``trainers`` at its current step, as ``Trainer.record_evaluation`` does for one: every
    validation set in one call of ``score([(trainer, examples), …]) -> [metric, …]``, then the test sets of the
    runs whose validation is a new best in a second; each evaluation is booked in its run's history."""
    if not trainers:
        return []
    vals = score([(trainer, trainer.data.val) for trainer in trainers])
    testing = [r for r, (trainer, val) in enumerate(zip(trainers, vals)) if trainer.wants_test(val)]
    tests = dict(zip(testing, score([(trainers[r], trainers[r].data.test) for r in testing]) if testing else []))
    return [trainer.book_evaluation(trainer.step, val, tests.get(r)) for r, (trainer, val) in
            enumerate(zip(trainers, vals))]


def finish_evaluations(trainers: list["Trainer"], score) -> None:
    """What ``Trainer.summary`` evaluates before a result, for many runs at once (:func:`evaluate_runs`): an
    evaluation at the last step where there is none, then the test set wherever that last one lacks it."""
    evaluate_runs([trainer for trainer in trainers if trainer.final_evaluation_missing()], score)
    lacking = [trainer for trainer in trainers if "test" not in trainer.history["evals"][-1]]
    for trainer, test in zip(lacking, score([(trainer, trainer.data.test) for trainer in lacking]) if lacking else []):
        trainer.history["evals"][-1]["test"] = test


class Trainer:
    """Train ``config.method`` on ``config.task``; see the module docstring for the protocol.

    ``method_builder(config, model)`` makes the method object (default :func:`build_method`); the runtime
    host passes its own, whose steps run in an exported program (``prge_lib.deploy.runtime``).

    ``seed_checkpoints`` (default: the environment's ``PRGE_SEED_CHECKPOINTS=1``): a checkpoint of a run whose
    adapter can be rebuilt from its projected gradients (P-RGE, MeZO on LoRA-FA, MeZO (Full) and SensZOQ,
    :func:`prge_lib.zo.replay.rebuild`) keeps the history and the adapter's SHA-256 instead of its tensors, some
    kilobytes per thousand steps instead of the adapter's megabytes: small enough to carry between machines.
    Resuming replays the steps and refuses the result unless its digest is the recorded one."""

    def __init__(self, config: TrainConfig, model=None, tokenizer=None, data: TaskData | None = None,
                 checkpoint_dir: str | os.PathLike | None = None, progress: bool = True,
                 method_builder=None, seed_checkpoints: bool | None = None):

        self.config = config.resolved()
        start_commit()      # the code this run starts with, read before the model loads
        self.task = get_task(self.config.task)
        c = self.config
        # the data are read (and their rows checked) before the model loads
        self.data = data if data is not None else sample_task(self.task, c.seed, c.n_train, c.n_val, c.n_test)
        if len(self.data.train) < c.batch_size:
            raise ValueError(f"{len(self.data.train)} training examples cannot fill a batch of {c.batch_size}")
        self.loads_model = model is None or tokenizer is None   # then it may load it again (adopt_start)
        if self.loads_model:
            model, tokenizer = self.load_model()
        self.tokenizer = tokenizer
        self.items = [encode_example(self.task, tokenizer, ex, c.max_length) for ex in self.data.train]
        self.method_builder = method_builder
        # a method built from a start (SensZOQ's mask) is built on first use (Trainer.method), so that a resume
        # builds it from its checkpoint's start, never ranking a mask only to set it aside; any other now
        self._method, self._unbuilt = None, model
        if method_builder is not None or not registry.get(c.method).builds_from_start:
            self.set_method(self.build(model))
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.seed_checkpoints = os.environ.get("PRGE_SEED_CHECKPOINTS", "") == "1" if seed_checkpoints is None \
            else bool(seed_checkpoints)
        self.progress = progress
        self.history = {"losses": [], "step_s": [], "evals": [], "projected_grad": []}
        self.step = 0
        self.started_from_checkpoint = False    # built from a checkpoint's start (Trainer.take_start)
        self.elapsed = {"train_s": 0.0, "eval_s": 0.0}

    # ----- the model and the method
    def load_model(self):
        """(model, tokenizer) as the config names them, loaded for this run (quantized as its method asks)."""
        quant = registry.get(self.config.method).load_quant(self.config.quant)
        return load_model(self.config.model, dtype=self.config.dtype, quant=quant, device=self.config.device)

    def build(self, model, start=None):
        """The method for this run on ``model`` (``method_builder``'s, else :func:`build_method`), from ``start``
        where given: a checkpoint's ``Method.start`` (which :meth:`adopt_start` passes only without a builder)."""
        if self.method_builder is not None:
            return self.method_builder(self.config, model)
        return build_method(self.config, model, self.tokenizer, self.task_batches, start)

    @property
    def method(self):
        """The run's method object, built (:meth:`build`) on first use."""
        if self._method is None:
            self.set_method(self.build(self._unbuilt))
        return self._method

    @property
    def model(self):
        return self.method.model

    @property
    def device(self) -> torch.device:
        """Where the run's model is (read without building the method: a checkpoint is checked before it)."""
        return next((self._unbuilt if self._method is None else self._method.model).parameters()).device

    def set_method(self, method) -> None:
        self._method, self._unbuilt = check_method(method, self.config.method), None

    def take_start(self, saved: dict, path: Path) -> bool:
        """Build the method from a checkpoint's start (``saved``: its tensors and the settings they were built
        with): at once where it is not built yet, else through :meth:`adopt_start`. Returns whether the method now
        comes from that start."""
        if self._method is not None or self.method_builder is not None:
            return self.adopt_start(saved, path)
        self.build_from(saved, self._unbuilt)
        return True

    def build_from(self, saved: dict, model) -> None:
        """The method on ``model`` from a checkpoint's start (``saved``), with the settings that start was built with."""
        self.set_method(self.build(model, start=saved["tensors"]))
        self.method.settings = {**saved["settings"], **self.method.settings}

    def adopt_start(self, saved: dict, path: Path) -> bool:
        """Build the run again from a checkpoint's start (``saved``, as in :meth:`take_start`) where the method
        already built here started elsewhere: a SensZOQ mask that this processor ranks with a few other entries.
        Returns whether it did; a Trainer given its model cannot, and says so."""
        if adapter_digest(self.method.start) == adapter_digest(saved["tensors"]):     # the same start, bit for bit
            return False
        if not self.loads_model or self.method_builder is not None:
            raise CheckpointError(path, f"its run was built from another start than this one ({self.config.method}"
                                        f"'s Method.start: a mask as the processor that began it ranked it), and a "
                                        f"Trainer given its model or method_builder cannot build the model again: "
                                        f"resume with a Trainer that loads its model (model=None), as prge train "
                                        f"and prge reproduce do")
        self._method = None     # the model built here goes before another loads
        self.build_from(saved, self.load_model()[0])
        return True

    # ----- data order: a pure function of (seed, step)
    def epoch_order(self, epoch: int) -> list[int]:
        return epoch_order(self.config.seed, epoch, len(self.items))

    def epoch_position(self, t: int) -> tuple[int, int]:
        """(epoch, offset in that epoch's order) of step t's first example; a last partial batch is dropped."""
        b = self.config.batch_size
        return divmod(t * b, len(self.items) - len(self.items) % b)

    def batch_indices(self, t: int) -> list[int]:
        epoch, offset = self.epoch_position(t)
        return self.epoch_order(epoch)[offset:offset + self.config.batch_size]

    def task_batches(self) -> list:
        """The first ``TASK_MASK_ROWS`` training examples in batches: the data a "task" mask is ranked on."""
        items = self.items[:TASK_MASK_ROWS]
        return [collate(items[i:i + 8], self.tokenizer.pad_token_id).to(self.config.device)
                for i in range(0, len(items), 8)]

    def batch(self, t: int):
        return self.batch_of(self.batch_indices(t))

    def batch_of(self, indices):
        """The batch of training examples ``indices``, collated (and bucketed) as every step's batch is."""
        items = [self.items[i] for i in indices]
        batch = to_bucket(collate(items, self.tokenizer.pad_token_id), parse_buckets(self.config.buckets),
                          self.tokenizer.pad_token_id)
        return batch.to(self.device)

    # ----- evaluation
    def evaluate(self, examples: list[dict]) -> float:
        """The task's metric on ``examples`` with the run's current adapter (its time counts as evaluation)."""
        start = time.perf_counter()
        value = zero_shot(self.task, self.model, self.tokenizer, examples, self.config.eval_batch_size)["value"]
        self.elapsed["eval_s"] += time.perf_counter() - start
        return value

    def evaluation_due(self) -> bool:
        """Whether the schedule evaluates after the step just booked."""
        return bool(self.config.eval_every) and self.step % self.config.eval_every == 0

    def wants_test(self, val: float) -> bool:
        """Whether a validation score is a new best, so the test set is scored with it."""
        return val > max((e["val"] for e in self.history["evals"]), default=-math.inf)

    def book_evaluation(self, step: int, val: float, test: float | None = None) -> dict:
        record = {"step": step, "val": val, **({"test": test} if test is not None else {})}
        self.history["evals"].append(record)
        return record

    def record_evaluation(self, step: int) -> dict:
        """Validation accuracy at ``step``, plus test accuracy when it is the best validation so far (the
        paper's model selection: test is reported at the best validation step); appended to the history.
        ``step`` is the step the run is at (it names the evaluation)."""
        if step != self.step:
            raise ValueError(f"an evaluation at step {step}, but the run is at step {self.step}")
        return evaluate_runs([self], score_alone)[0]

    def final_evaluation_missing(self) -> bool:
        """Whether the result still lacks an evaluation at the last step."""
        evals = self.history["evals"]
        return not evals or evals[-1]["step"] != self.step

    # ----- checkpoints
    def checkpoint_path(self) -> Path | None:
        return None if self.checkpoint_dir is None else self.checkpoint_dir / CHECKPOINT_NAME

    def save_checkpoint(self) -> Path | None:
        path = self.checkpoint_path()
        if path is None:
            return None
        epoch = self.epoch_position(self.step)[0]
        payload = {"format": CHECKPOINT_FORMAT, "config": self.config.identity(), "step": self.step,
                   "device": self.device.type, "method": method_state(self.method, self.seed_checkpoints),
                   "history": self.history, "elapsed": self.elapsed,
                   "rng": {"torch": torch.get_rng_state(), "python": _python_rng_state()},
                   "epoch": epoch, "epoch_order": self.epoch_order(epoch)}
        with atomic_file(path) as tmp:
            torch.save(payload, tmp)
        return path

    def load_checkpoint(self) -> None:
        path = self.checkpoint_path()
        if path is None or not path.is_file():
            raise FileNotFoundError(f"--resume: no checkpoint at {path}")
        payload = read_checkpoint(path)
        saved, current = {**IDENTITY_LEGACY, **payload["config"]}, self.config.identity()
        differ = {k: (saved.get(k), current[k]) for k in current if saved.get(k) != current[k]}
        if differ:
            raise ValueError(f"the checkpoint in {path.parent} was made with other settings "
                             f"(saved, now): {differ}; resume with the same settings or another folder")
        made_on = payload.get("device", "cpu")          # checkpoints from before the field: the CPU
        if made_on != self.device.type:
            # the ZO noise of each step comes from the device's generator: the rest of the run would draw
            # other numbers than the run that made the checkpoint, so its result would stand for neither device
            raise ValueError(f"the checkpoint in {path.parent} was made on {made_on}, this run is on "
                             f"{self.device.type}: resume it with --device {made_on}, or move the folder away "
                             f"to start the run again here")
        if payload["step"] > self.config.steps:
            raise ValueError(f"the checkpoint in {path.parent} is at step {payload['step']}, past this run's "
                             f"{self.config.steps} steps: give at least --steps {payload['step']}, or move the "
                             f"folder away to start the run again")
        sittings = payload["history"].get("sittings") or [{}]
        self.started_from_checkpoint = "start" in payload["method"] and self.take_start(payload["method"]["start"],
                                                                                         path)
        restore_method_state(self.method, payload["method"], payload["history"].get("projected_grad", []),
                             payload["step"], path, self.config.method, sittings[-1].get("processor"))
        self.history, self.elapsed, self.step = payload["history"], payload["elapsed"], payload["step"]
        if "step_time_s" in self.history:       # a checkpoint written before step times were named step_s
            self.history["step_s"] = self.history.pop("step_time_s")
        torch.set_rng_state(payload["rng"]["torch"])
        _set_python_rng_state(payload["rng"]["python"])

    # ----- the loop (its parts are shared with packed runs, prge_lib.training.packed)
    def begin(self, resume: bool = False, restart: bool = False, evaluate: bool = True) -> None:
        """What precedes the first step: the checkpoint folder's check, then the checkpoint resumed (``resume``)
        or discarded (``restart``), else the evaluation at step 0 (left to the caller with ``evaluate`` False:
        a pack evaluates its runs together)."""
        check_checkpoint_folder(self.checkpoint_path(), resume, restart)
        if restart and self.checkpoint_path() is not None:
            self.checkpoint_path().unlink(missing_ok=True)
        if resume:
            self.load_checkpoint()
            # a result put together over several sittings says where each later one began (its wall time
            # covers the last sitting only; ``elapsed_s`` sums them all)
            self.history.setdefault("resumed_at", []).append(self.step)
        # and on which processor each sitting ran (and in how many length groups its forwards were cut, where not
        # one): one resumed on another machine, or cut otherwise, rounds otherwise from there on
        # (and, where the method was built from the checkpoint's start, that it was)
        self.history.setdefault("sittings", []).append(
            {"step": self.step, "processor": processor(self.device),
             **({"start": "checkpoint"} if self.started_from_checkpoint else {}),
             **({"length_groups": self.config.length_groups} if self.config.length_groups != 1 else {})})
        if not resume and self.config.eval_every and evaluate:
            self.record_evaluation(0)

    def diverged(self, t: int, record: dict) -> TrainingDiverged:
        """Step ``t`` gave a non-finite loss (its update was not applied): save the last good state and return
        the error that says so."""
        return self._stopped_diverged(f"step {t + 1}: the loss is {record['loss']} (not finite); the update was "
                                      f"not applied and training stopped", "the last good state", t)

    def rising(self) -> str | None:
        """Why the run should stop as diverged after the step just booked (:func:`~prge_lib.training.stopping.
        loss_rise` under ``config.stop_rising``), or None; never after its last step, which finishes it."""
        if self.step >= self.config.steps:
            return None
        return stopping.loss_rise(self.history["losses"], self.config.stop_rising)

    def rose(self, why: str) -> TrainingDiverged:
        """The loss, still finite, has risen past ``config.stop_rising`` (``why``: :func:`~prge_lib.training.
        stopping.loss_rise`) after the step just booked: save the state and return the error that says so."""
        return self._stopped_diverged(f"step {self.step}: {why}; training stopped", "its state", self.step)

    def _stopped_diverged(self, what: str, state: str, t: int) -> TrainingDiverged:
        saved = self.save_checkpoint()
        where = f"{state} (after step {t}) is in {saved}" if saved else \
            "no checkpoint folder was given, so nothing was saved"
        return TrainingDiverged(f"{what}; {where}. Lower the learning rate (now {self.config.lr}) or ε.")

    def book_step(self, t: int, record: dict, took: float) -> dict:
        """Book the finite step ``t`` (its record, ``took`` seconds); returns the progress bar's postfix."""
        self.step = t + 1
        self.elapsed["train_s"] += took
        self.history["losses"].append(record["loss"])
        self.history["step_s"].append(round(took, 5))
        if "projected_grad" in record:
            self.history["projected_grad"].append(record["projected_grad"])
        return {"loss": f"{record['loss']:.3f}"}

    def checkpoint_if_due(self) -> None:
        every = self.config.checkpoint_every
        if every and self.step % every == 0:
            self.save_checkpoint()

    def record_step(self, t: int, record: dict, took: float) -> dict:
        """Book the finite step ``t``, then evaluate and checkpoint where the schedule says; returns the progress
        bar's postfix."""
        postfix = self.book_step(t, record, took)
        if self.evaluation_due():
            postfix["val"] = f"{self.record_evaluation(self.step)['val']:.3f}"
        self.checkpoint_if_due()
        return postfix

    def run(self, resume: bool = False, deadline: float | None = None, restart: bool = False) -> dict:
        """Train to ``config.steps`` and return :meth:`summary`. ``deadline`` (a ``time.time()`` value): once
        passed, or once a signal asks (:func:`~prge_lib.training.stopping.stop_on_signals`), stop after the
        current step with a checkpoint there (:class:`TrainingStopped`). A non-finite loss, or with
        ``config.stop_rising`` a loss risen that far (:func:`~prge_lib.training.stopping.loss_rise`), raises
        :class:`TrainingDiverged` with the state saved. An existing
        checkpoint is continued with ``resume`` or discarded with ``restart``; with neither, the run refuses to
        start over it (:func:`check_checkpoint_folder`)."""
        c = self.config
        self.begin(resume, restart)
        bar = tqdm(total=c.steps, initial=self.step, desc=f"{c.method} {self.task.name}",
                   disable=not self.progress)
        while self.step < c.steps:
            t = self.step
            start = time.perf_counter()
            record = self.method.step(self.batch(t), t)
            took = time.perf_counter() - start
            if not record["finite"]:
                bar.close()
                raise self.diverged(t, record)
            bar.set_postfix(self.record_step(t, record, took))
            bar.update(1)
            rising = self.rising()
            if rising is not None:
                bar.close()
                raise self.rose(rising)
            why = self.stop_reason(deadline) if self.step < c.steps else None
            if why is not None:
                bar.close()
                raise TrainingStopped(self.step, c.steps, self.save_checkpoint(), why)
        bar.close()
        return self.summary()

    def stop_reason(self, deadline: float | None) -> str | None:
        """Why the run should stop after the step it just made (:func:`~prge_lib.training.stopping.reason`: a
        signal, or ``deadline`` passed), or None to go on."""
        return stopping.reason() if stopping.past(deadline) else None

    def summary(self) -> dict:
        """The result: settings, per-step losses, evaluations, test at best validation and at the end."""
        c = self.config
        if self.final_evaluation_missing():
            self.record_evaluation(self.step)
        finish_evaluations([self], score_alone)
        evals = self.history["evals"]
        last = evals[-1]
        # a test score exists for every new best validation score, so the earliest best has one
        best = max(evals, key=lambda e: (e["val"], -e["step"]))
        return {
            "kind": "train", "schema_version": SCHEMA_VERSION, "task": self.task.name, "title": self.task.title, "method": c.method,
            "adapter": c.adapter,
            "metric": self.task.metric, "seed": c.seed, "config": dataclasses.asdict(c),
            "trainable_parameters": sum(p.numel() for p in self.method.trainable().values()),
            "data_sizes": self.data.sizes(), "data_notes": self.data.notes,
            "steps": self.step, "zero_shot_val": evals[0]["val"] if evals[0]["step"] == 0 else None,
            "best_val": {"step": best["step"], "val": best["val"], "test": best["test"]},
            "final": {"step": last["step"], "val": last["val"], "test": last["test"]},
            "evals": evals,
            **step_series(self.history["losses"], self.history["projected_grad"], self.history["step_s"]),
            "elapsed_s": {k: round(v, 2) for k, v in self.elapsed.items()},
            "resumed_at_steps": self.history.get("resumed_at", []),
            "sittings": self.history.get("sittings", []),
            **({"method_settings": self.method.settings} if self.method.settings else {}),
            **({"phase_times_s": {k: round(v, 3) for k, v in self.method.times.items()}}
               if self.method.times else {}),
            # on a GPU: the most memory torch held for tensors at any time in this process (model, steps, evaluations)
            **({"cuda_peak_mib": round(torch.cuda.max_memory_allocated(self.device) / 2**20, 1)}
               if self.device.type == "cuda" else {}),
        }
