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
import pickle
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from prge_lib.methods.adapters import ADAPTERS, DEFAULT_R, check_adapter
from prge_lib.data.splits import PROTOCOL, TaskData, sample_task
from prge_lib.training.evaluate import zero_shot
from prge_lib.methods import registry
from prge_lib.methods.base import check_method
from prge_lib.methods.fo import OPTIMIZERS
from prge_lib.zo.lora import DEFAULT_TARGETS, NOISE_SOURCES, check_noise_source
from prge_lib.models.loading import QUANT_MODES, load_model
from prge_lib.models.objective import collate, encode_example
from prge_lib.zo.prge import KEEP_NOISE_BUDGET_MIB
from prge_lib.common.provenance import atomic_file, start_commit
from prge_lib.zo.rge import check_zo_settings, mix_seed
from prge_lib.methods.senszoq.sensitivity import MASK_KINDS, SCOPES
from prge_lib.data.tasks import get_task

TASK_MASK_ROWS = 128     # training rows whose squared gradients rank the weights of a "task" mask
# the methods, their families, defaults and builders: prge_lib.methods.registry

# settings that change the trajectory: a checkpoint only resumes a run that agrees on all of them
_IDENTITY = ("task", "method", "adapter", "lr", "eps", "q", "E", "batch_size", "outer", "inner", "optimizer",
             "r", "alpha", "targets", "seed", "n_train", "max_length", "model", "dtype", "quant", "noise",
             "layers", "sparsity", "mask", "mask_scope")
# identity keys added later, with the value that checkpoints written before them implied
_IDENTITY_LEGACY = {"adapter": "none", "noise": "torch", "layers": None, "sparsity": None, "mask": None,
                    "mask_scope": None}


def epoch_order(seed: int, epoch: int, n: int) -> list[int]:
    """The order in which epoch ``epoch`` visits the ``n`` training examples: a seeded permutation."""
    return random.Random(mix_seed(seed, 0xDA7A, epoch)).sample(range(n), n)


class TrainingDiverged(RuntimeError):
    """A non-finite loss: the run stops, the last good state is kept in the checkpoint."""


# what a checkpoint holds: tensors and plain values only, read back with torch.load(weights_only=True), so a
# checkpoint from elsewhere cannot run code. Format 1 stored Python's RNG state as a tuple; it reads the same way.
CHECKPOINT_FORMAT = 2
CHECKPOINT_NAME = "checkpoint.pt"         # the file in a run's checkpoint folder
_CHECKPOINT_FIELDS = {"format": int, "config": dict, "step": int, "method": dict, "history": dict,
                      "elapsed": dict, "rng": dict}


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as a checkpoint of this trainer: the message (one line) names the file,
    why, and the two ways on."""

    def __init__(self, path: str | os.PathLike, reason: str, resume: str = "--resume"):
        self.path, self.reason = Path(path), reason
        super().__init__(f"checkpoint {path} cannot be read: {reason}; restore a good copy and resume ({resume}), "
                         f"or discard it (--restart)")


def _load_failure(path: Path, err: Exception) -> str:
    """Why ``torch.load`` refused ``path``, in a few words."""
    text = str(err)
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if isinstance(err, pickle.UnpicklingError) and found:
        return (f"it holds a pickled Python object ({found.group(1)}), which was not loaded: it predates the data "
                f"format of checkpoints, or is not a checkpoint")
    if path.stat().st_size == 0:
        return "the file is empty"
    generic = ("Weights only load failed", "Please file an issue", "Check the documentation")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith(generic)]
    first = (lines[0] if lines else type(err).__name__).split(". ")[0].rstrip(".")
    return f"truncated or not a torch checkpoint ({first[:120]})"


def read_checkpoint(path: str | os.PathLike, mmap: bool = False) -> dict:
    """The payload of a checkpoint written by :meth:`Trainer.save_checkpoint`, loaded as data only
    (``weights_only``: no pickled object is ever run); :class:`CheckpointError` for anything else.
    ``mmap``: map the tensors instead of reading them (to look at the step alone)."""
    path = Path(path)
    try:
        payload = torch.load(path, weights_only=True, map_location="cpu", mmap=mmap)
    except FileNotFoundError:
        raise
    except Exception as err:        # torch raises many kinds for a damaged file; all mean the same here
        raise CheckpointError(path, _load_failure(path, err)) from None
    if not isinstance(payload, dict):
        raise CheckpointError(path, f"it holds a {type(payload).__name__}, not a checkpoint's fields")
    for name, kind in _CHECKPOINT_FIELDS.items():
        if not isinstance(payload.get(name), kind):
            raise CheckpointError(path, f"field {name!r} is {type(payload.get(name)).__name__}, not "
                                        f"{kind.__name__}")
    if payload["format"] > CHECKPOINT_FORMAT:
        raise CheckpointError(path, f"format {payload['format']} is newer than this library's "
                                    f"{CHECKPOINT_FORMAT}")
    return payload


def check_checkpoint_folder(path: Path | None, resume: bool, restart: bool) -> None:
    """Refuse to start a run over the checkpoint ``path`` unless told what to do with it: ``resume`` continues
    it, ``restart`` discards it. Raises before any work (a checkpoint is hours of steps)."""
    if resume and restart:
        raise ValueError("--resume continues the saved run and --restart discards it: give one of them")
    if path is None or resume or restart or not path.is_file():
        return
    step = read_checkpoint(path, mmap=True)["step"]
    raise ValueError(f"{path.parent} already holds the checkpoint of a run at step {step}: continue it with "
                     f"--resume, or discard it with --restart")


def _python_rng_state() -> dict:
    """Python's RNG state as plain values (``random.getstate()`` is a tuple: version, 625 ints, gauss)."""
    version, internal, gauss = random.getstate()
    return {"version": version, "state": list(internal), "gauss": gauss}


def _set_python_rng_state(saved) -> None:
    """Restore :func:`_python_rng_state` (or format 1's tuple)."""
    if isinstance(saved, dict):
        saved = (saved["version"], saved["state"], saved["gauss"])
    version, internal, gauss = saved
    random.setstate((version, tuple(internal), gauss))


class TrainingStopped(RuntimeError):
    """The run reached its deadline (a GPU or notebook session about to end): it stopped after a step and
    saved a checkpoint there, so the same run resumes from it."""

    def __init__(self, step: int, steps: int, checkpoint: Path | None):
        self.step, self.steps, self.checkpoint = step, steps, checkpoint
        where = f"its checkpoint is {checkpoint}" if checkpoint else "no checkpoint folder was given"
        super().__init__(f"stopped by the time limit after step {step} of {steps}; {where}")


def _option(default, help, **argparse_settings):
    """A TrainConfig field that is also a ``prge train`` option (the CLI builds its options from these). ``help``
    or ``choices`` may be a function: called when the command line is built, so it lists the methods
    registered then (prge_lib.methods.registry)."""
    return field(default=default, metadata={"help": help, **argparse_settings})


def _quant_help() -> str:
    own = " and ".join(n for n in registry.names() if registry.get(n).self_quantizing)
    return f"quantized base weights (default none; nf4 for {own}, which quantize their base themselves)"


@dataclass
class TrainConfig:
    task: str = field(metadata={"help": "the task (prge_lib.data.tasks.TASKS)", "required": True})
    method: str = _option("prge", "the training method", choices=registry.names)
    adapter: str = _option("none", "mezo only: the parameter space, built with peft (none: every weight; lora-fa "
                                   "freezes LoRA's A; chapter 4)", choices=ADAPTERS)
    steps: int = _option(1000, "training steps")
    lr: float | None = _option(None, "learning rate (default: the method's)")
    eps: float | None = _option(None, "ZO perturbation scale ε (default: the method's)")
    q: int | None = _option(None, "ZO queries per step")
    E: int | None = _option(None, "ZO effective batch E = q·B (B rows per query)")
    batch_size: int | None = _option(None, "FO rows per step")
    outer: bool = _option(True, "P-RGE: the q queries in one forward")
    inner: bool | None = _option(None, "P-RGE: +ε and −ε in one forward (default on for prge, off for mezo-lorafa)")
    keep_noise: bool | None = _option(None, "P-RGE: keep each z of the forward for the update instead of redrawing "
                                            "it (same numbers, faster, q·d floats of memory; default: when they "
                                            f"fit {KEEP_NOISE_BUDGET_MIB} MiB)")
    noise: str = _option("torch", "P-RGE: where z comes from; counter: the generator an exported program runs",
                         choices=NOISE_SOURCES)
    layers: int | None = _option(None, "keep only the first N decoder layers (small exported programs)")
    program: str | None = _option(None, "P-RGE: run each step in this ExecuTorch program (prge export); needs "
                                        "--noise counter and --max-length")
    optimizer: str = _option("adam", "FO optimizer (ZO methods are ZO-SGD)", choices=tuple(OPTIMIZERS))
    r: int | None = _option(None, "adapter rank (default 16; VeRA 1024)")
    alpha: float = _option(32, "LoRA alpha")
    targets: tuple[str, ...] = _option(DEFAULT_TARGETS, "comma-separated projection names")
    seed: int = _option(0, "data sample, adapter initialisation and noise")
    eval_every: int = _option(100, "validation every N steps (0: at the end)")
    n_train: int = _option(PROTOCOL["n_train"], "training examples")
    n_val: int = _option(PROTOCOL["n_val"], "validation examples")
    n_test: int = _option(PROTOCOL["n_test"], "test examples")
    max_length: int | None = _option(None, "truncate prompts to this many tokens")
    eval_batch_size: int = _option(16, "rows per evaluation forward")
    checkpoint_every: int = _option(100, "steps between checkpoints")
    model: str | None = _option(None, "hub id or local folder (default: the embedded SmolLM2-135M)")
    dtype: str = _option("fp32", "precision of the weights", choices=("fp32", "fp16", "bf16"))
    quant: str | None = _option(None, _quant_help, choices=QUANT_MODES)
    sparsity: float | None = _option(None, "senszoq: the share of the decoder's projection weights trained "
                                           "(default 1e-3)")
    mask: str | None = _option(None, "senszoq: which weights are trained: c4 (sensitivity on C4 text, the "
                                     "default), task (on the task's own data), random, largest or smallest "
                                     "magnitude", choices=MASK_KINDS)
    mask_scope: str | None = _option(None, "senszoq: top-k per projection (layer, default) or over all of them "
                                           "(global)", choices=SCOPES)
    mmap_dir: str | None = _option(None, "mebp: folder for the memory-mapped block inputs (default: a "
                                         "temporary folder)")
    device: str = _option("cpu", "cpu or cuda")
    notes: list[str] = field(default_factory=list)

    def resolved(self) -> "TrainConfig":
        """Fill the method's defaults and check every setting, naming the bad value and what is allowed. The
        method's spec (prge_lib.methods.registry) gives its defaults and the method-scoped settings it uses:
        the others are dropped (None) or, set away from their default, refused; then its own checks run."""
        spec = registry.get(self.method)
        check_adapter(self.adapter)
        if self.adapter != "none" and "adapter" not in spec.uses:
            raise ValueError(f"--adapter {self.adapter} applies to --method {' or '.join(registry.users('adapter'))} "
                             f"only; {self.method} trains "
                             f"{'LoRA-FA layers of its own' if spec.family == 'zo' else 'its own space'} "
                             f"(use --adapter none)")
        values = dataclasses.asdict(self)
        defaults = dict(spec.defaults)
        if self.adapter != "none":
            defaults.update(spec.adapter_defaults)
        defaults["r"] = DEFAULT_R[self.adapter]
        for key, default in defaults.items():
            if values[key] is None:
                values[key] = default
        if values["quant"] is None:
            values["quant"] = "nf4" if spec.self_quantizing else "none"
        c = TrainConfig(**values)
        c.targets = tuple(c.targets)
        if c.steps < 1:
            raise ValueError(f"steps must be at least 1, got {c.steps}")
        if not (c.lr > 0 and math.isfinite(c.lr)):
            raise ValueError(f"lr must be a positive number, got {c.lr}")
        if spec.family == "zo":
            c.batch_size = check_zo_settings(c.q, c.E, c.eps, c.dtype)
        else:
            if c.batch_size < 1:
                raise ValueError(f"batch_size must be at least 1, got {c.batch_size}")
            if c.optimizer not in OPTIMIZERS:
                raise ValueError(f"unknown optimizer {c.optimizer!r}; choose one of {list(OPTIMIZERS)}")
        for name in registry.NULLED:
            if name not in spec.uses:
                setattr(c, name, None)
        if spec.self_quantizing and c.quant not in ("nf4", "none"):
            raise ValueError(f"{c.method} dequantizes an NF4 base itself; quant {c.quant!r} is not supported "
                             f"(choose nf4 or none)")
        if c.eval_every < 0 or c.checkpoint_every < 0:
            raise ValueError("eval_every and checkpoint_every must be 0 (off) or positive")
        check_noise_source(c.noise)
        unset = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
        for name in registry.REFUSED:
            if name not in spec.uses and getattr(c, name) != unset[name]:
                users = registry.users(name)
                raise ValueError(f"{name} applies to method{'s' if len(users) > 1 else ''} {' and '.join(users)} "
                                 f"only, not {c.method} (got {getattr(c, name)!r})")
        if spec.check is not None:
            spec.check(c)
        return c

    def identity(self) -> dict:
        values = dataclasses.asdict(self)
        return {k: (list(values[k]) if isinstance(values[k], tuple) else values[k]) for k in _IDENTITY}


def build_method(config: TrainConfig, model, tokenizer=None, task_batches=None):
    """The method object for ``config``, built by its spec's builder (prge_lib.methods.registry): LoRA-FA
    layers or peft adapters are injected as needed (MeZO with an ``adapter`` runs over that peft space's
    trainable parameters, prge_lib.methods.adapters). SensZOQ needs the ``tokenizer`` for its C4 mask and,
    for a "task" mask, ``task_batches()``: the task's training batches."""
    return registry.get(config.method).build(config, model, tokenizer, task_batches)


class Trainer:
    """Train ``config.method`` on ``config.task``; see the module docstring for the protocol.

    ``method_builder(config, model)`` makes the method object (default :func:`build_method`); the runtime
    host passes its own, whose steps run in an exported program (``prge_lib.deploy.runtime``)."""

    def __init__(self, config: TrainConfig, model=None, tokenizer=None, data: TaskData | None = None,
                 checkpoint_dir: str | os.PathLike | None = None, progress: bool = True,
                 method_builder=None):

        self.config = config.resolved()
        start_commit()      # the code this run starts with, read before the model loads
        self.task = get_task(self.config.task)
        if model is None or tokenizer is None:
            quant = registry.get(self.config.method).load_quant(self.config.quant)
            model, tokenizer = load_model(self.config.model, dtype=self.config.dtype, quant=quant,
                                          device=self.config.device)
        self.tokenizer = tokenizer
        c = self.config
        self.data = data if data is not None else sample_task(self.task, c.seed, c.n_train, c.n_val, c.n_test)
        if len(self.data.train) < c.batch_size:
            raise ValueError(f"{len(self.data.train)} training examples cannot fill a batch of {c.batch_size}")
        self.items = [encode_example(self.task, tokenizer, ex, c.max_length) for ex in self.data.train]
        if method_builder is None:
            self.method = build_method(c, model, tokenizer, self.task_batches)
        else:
            self.method = method_builder(c, model)
        check_method(self.method, c.method)
        self.model = self.method.model
        self.device = next(self.model.parameters()).device
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.progress = progress
        self.history = {"losses": [], "step_time_s": [], "evals": [], "projected_grad": []}
        self.step = 0
        self.elapsed = {"train_s": 0.0, "eval_s": 0.0}

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
        items = [self.items[i] for i in self.batch_indices(t)]
        return collate(items, self.tokenizer.pad_token_id).to(self.device)

    # ----- evaluation
    def evaluate(self, examples: list[dict]) -> float:

        start = time.perf_counter()
        value = zero_shot(self.task, self.model, self.tokenizer, examples, self.config.eval_batch_size)["value"]
        self.elapsed["eval_s"] += time.perf_counter() - start
        return value

    def record_evaluation(self, step: int) -> dict:
        """Validation accuracy at ``step``, plus test accuracy when it is the best validation so far (the
        paper's model selection: test is reported at the best validation step); appended to the history."""
        record = {"step": step, "val": self.evaluate(self.data.val)}
        best = max((e["val"] for e in self.history["evals"]), default=-math.inf)
        if record["val"] > best:
            record["test"] = self.evaluate(self.data.test)
        self.history["evals"].append(record)
        return record

    # ----- checkpoints
    def checkpoint_path(self) -> Path | None:
        return None if self.checkpoint_dir is None else self.checkpoint_dir / CHECKPOINT_NAME

    def save_checkpoint(self) -> Path | None:
        path = self.checkpoint_path()
        if path is None:
            return None
        epoch = self.epoch_position(self.step)[0]
        method = {"trainable": {k: v.detach().cpu().clone() for k, v in self.method.trainable().items()}}
        if self.method.optimizer is not None:      # first-order methods
            method["optimizer"] = self.method.optimizer.state_dict()
        payload = {"format": CHECKPOINT_FORMAT, "config": self.config.identity(), "step": self.step,
                   "device": self.device.type, "method": method, "history": self.history, "elapsed": self.elapsed,
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
        saved, current = {**_IDENTITY_LEGACY, **payload["config"]}, self.config.identity()
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
        with torch.no_grad():
            for name, tensor in self.method.trainable().items():
                tensor.copy_(payload["method"]["trainable"][name])
        if "optimizer" in payload["method"]:
            self.method.optimizer.load_state_dict(payload["method"]["optimizer"])
        self.history, self.elapsed, self.step = payload["history"], payload["elapsed"], payload["step"]
        torch.set_rng_state(payload["rng"]["torch"])
        _set_python_rng_state(payload["rng"]["python"])

    # ----- the loop (its parts are shared with packed runs, prge_lib.training.packed)
    def begin(self, resume: bool = False, restart: bool = False) -> None:
        """What precedes the first step: the checkpoint folder's check, then the checkpoint resumed (``resume``)
        or discarded (``restart``), else the evaluation at step 0."""
        check_checkpoint_folder(self.checkpoint_path(), resume, restart)
        if restart and self.checkpoint_path() is not None:
            self.checkpoint_path().unlink(missing_ok=True)
        if resume:
            self.load_checkpoint()
            # a result put together over several sittings says where each later one began (its wall time
            # covers the last sitting only; ``elapsed_s`` sums them all)
            self.history.setdefault("resumed_at", []).append(self.step)
        elif self.config.eval_every:
            self.record_evaluation(0)

    def diverged(self, t: int, record: dict) -> TrainingDiverged:
        """Step ``t`` gave a non-finite loss (its update was not applied): save the last good state and return
        the error that says so."""
        saved = self.save_checkpoint()
        where = f"the last good state (after step {t}) is in {saved}" if saved else \
            "no checkpoint folder was given, so nothing was saved"
        return TrainingDiverged(f"step {t + 1}: the loss is {record['loss']} (not finite); the "
                                f"update was not applied and training stopped; {where}. Lower "
                                f"the learning rate (now {self.config.lr}) or ε.")

    def record_step(self, t: int, record: dict, took: float) -> dict:
        """Book the finite step ``t`` (its record, ``took`` seconds), evaluate and checkpoint where the schedule
        says; returns the progress bar's postfix."""
        c = self.config
        self.step = t + 1
        self.elapsed["train_s"] += took
        self.history["losses"].append(record["loss"])
        self.history["step_time_s"].append(round(took, 5))
        if "projected_grad" in record:
            self.history["projected_grad"].append(record["projected_grad"])
        postfix = {"loss": f"{record['loss']:.3f}"}
        if c.eval_every and self.step % c.eval_every == 0:
            postfix["val"] = f"{self.record_evaluation(self.step)['val']:.3f}"
        if c.checkpoint_every and self.step % c.checkpoint_every == 0:
            self.save_checkpoint()
        return postfix

    def run(self, resume: bool = False, deadline: float | None = None, restart: bool = False) -> dict:
        """Train to ``config.steps`` and return :meth:`summary`. ``deadline`` (a ``time.time()`` value): once
        passed, stop after the current step with a checkpoint there (:class:`TrainingStopped`). An existing
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
            if deadline is not None and time.time() >= deadline and self.step < c.steps:
                bar.close()
                raise TrainingStopped(self.step, c.steps, self.save_checkpoint())
        bar.close()
        return self.summary()

    def summary(self) -> dict:
        """The result: settings, per-step losses, evaluations, test at best validation and at the end."""
        c, evals = self.config, self.history["evals"]
        if not evals or evals[-1]["step"] != self.step:
            self.record_evaluation(self.step)
            evals = self.history["evals"]
        last = evals[-1]
        if "test" not in last:
            last["test"] = self.evaluate(self.data.test)
        # a test score exists for every new best validation score, so the earliest best has one
        best = max(evals, key=lambda e: (e["val"], -e["step"]))
        times = sorted(self.history["step_time_s"])
        return {
            "kind": "train", "task": self.task.name, "title": self.task.title, "method": c.method,
            "adapter": c.adapter,
            "metric": self.task.metric, "seed": c.seed, "config": dataclasses.asdict(c),
            "trainable_parameters": sum(p.numel() for p in self.method.trainable().values()),
            "data_sizes": self.data.sizes(), "data_notes": self.data.notes,
            "steps": self.step, "zero_shot_val": evals[0]["val"] if evals[0]["step"] == 0 else None,
            "best_val": {"step": best["step"], "val": best["val"], "test": best["test"]},
            "final": {"step": last["step"], "val": last["val"], "test": last["test"]},
            "evals": evals, "losses": self.history["losses"],
            "projected_grad": self.history["projected_grad"],
            "step_time_s": {"median": times[len(times) // 2] if times else None,
                            "per_step": self.history["step_time_s"]},
            "elapsed_s": {k: round(v, 2) for k, v in self.elapsed.items()},
            "resumed_at_steps": self.history.get("resumed_at", []),
            **({"method_settings": self.method.settings} if self.method.settings else {}),
            **({"phase_times_s": {k: round(v, 3) for k, v in self.method.times.items()}}
               if self.method.times else {}),
        }
