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
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from prge_lib.methods.adapters import ADAPTERS, DEFAULT_R, add_adapter, check_adapter
from prge_lib.data.splits import PROTOCOL, TaskData, sample_task
from prge_lib.training.evaluate import zero_shot
from prge_lib.methods.fo import OPTIMIZERS, FirstOrder
from prge_lib.zo.lora import DEFAULT_TARGETS, NOISE_SOURCES, check_noise_source, inject_lorafa
from prge_lib.methods.mebp import MeBP
from prge_lib.zo.mezo import MeZOFull
from prge_lib.models.loading import QUANT_MODES, load_model, truncate_layers
from prge_lib.models.objective import collate, encode_example
from prge_lib.zo.prge import KEEP_NOISE_BUDGET_MIB, PRGE
from prge_lib.common.provenance import atomic_file, start_commit
from prge_lib.zo.rge import check_zo_settings, mix_seed
from prge_lib.methods.senszoq.sensitivity import MASK_KINDS, SCOPES, check_mask_settings
from prge_lib.methods.senszoq.sparse import build_senszoq
from prge_lib.training.checks import check_numbers, check_step_memory
from prge_lib.data.tasks import get_task

METHODS = ("fo", "fo-lorafa", "mezo", "mezo-lorafa", "prge", "senszoq", "mebp")
ZO_METHODS = ("mezo", "mezo-lorafa", "prge", "senszoq")
# methods that hold their base weights in 4 bits themselves (chapters 8 and 9): the model loads unquantized,
# the method quantizes what it does not train; --quant chooses nf4 (default) or none (an fp32 base)
SELF_QUANTIZING = ("senszoq", "mebp")
TASK_MASK_ROWS = 128     # training rows whose squared gradients rank the weights of a "task" mask
# Gao et al. App. C (Table 10): batch sizes, and one value from each learning-rate grid
DEFAULTS = {
    "fo": {"lr": 1e-5, "batch_size": 8},
    "fo-lorafa": {"lr": 3e-4, "batch_size": 8},
    "mezo": {"lr": 1e-6, "eps": 1e-3, "q": 1, "E": 16, "inner": False},
    "mezo-lorafa": {"lr": 1e-3, "eps": 1e-2, "q": 1, "E": 16, "inner": False},
    "prge": {"lr": 1e-3, "eps": 1e-2, "q": 4, "E": 16, "inner": True},
    # Guo et al. (SensZOQ) App. D: ZO-SGD, ε 1e-3, batch 16. lr probed for the embedded model, 100 SST-2 steps
    # with the C4 mask at 0.1%: mean loss of steps 80-100 7.9 (1e-5), 4.5 (1e-4), 5.5 after spikes to 11 (1e-3)
    "senszoq": {"lr": 1e-4, "eps": 1e-3, "q": 1, "E": 16, "inner": False,
                "sparsity": 1e-3, "mask": "c4", "mask_scope": "layer"},
    # MeBP trains LoRA (A and B) with Adam: the FO LoRA-FA step size and batch
    "mebp": {"lr": 3e-4, "batch_size": 8},
}
# MeZO over a peft adapter (--adapter, chapter 4): the LoRA-FA step size and ε of mezo-lorafa, not the
# full-weight ones (Gao et al. App. B searched lr in {5e-6, 5e-5, 5e-4, 5e-3} and ε in {1e-3, 1e-2})
ADAPTER_DEFAULTS = {"lr": 1e-3, "eps": 1e-2}
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


class TrainingStopped(RuntimeError):
    """The run reached its deadline (a GPU or notebook session about to end): it stopped after a step and
    saved a checkpoint there, so the same run resumes from it."""

    def __init__(self, step: int, steps: int, checkpoint: Path | None):
        self.step, self.steps, self.checkpoint = step, steps, checkpoint
        where = f"its checkpoint is {checkpoint}" if checkpoint else "no checkpoint folder was given"
        super().__init__(f"stopped by the time limit after step {step} of {steps}; {where}")


def _option(default, help: str, **argparse_settings):
    """A TrainConfig field that is also a ``prge train`` option (the CLI builds its options from these)."""
    return field(default=default, metadata={"help": help, **argparse_settings})


@dataclass
class TrainConfig:
    task: str = field(metadata={"help": "the task (prge_lib.data.tasks.TASKS)", "required": True})
    method: str = _option("prge", "the training method", choices=METHODS)
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
    quant: str | None = _option(None, "quantized base weights (default none; nf4 for senszoq and mebp, which "
                                      "quantize their base themselves)", choices=QUANT_MODES)
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
        """Fill the method's defaults and check every setting, naming the bad value and what is allowed."""
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose one of {list(METHODS)}")
        check_adapter(self.adapter)
        if self.adapter != "none" and self.method != "mezo":
            raise ValueError(f"--adapter {self.adapter} applies to --method mezo only; {self.method} trains "
                             f"{'LoRA-FA layers of its own' if self.method in ZO_METHODS else 'its own space'} "
                             f"(use --adapter none)")
        values = dataclasses.asdict(self)
        defaults = dict(DEFAULTS[self.method])
        if self.adapter != "none":
            defaults.update(ADAPTER_DEFAULTS)
        defaults["r"] = DEFAULT_R[self.adapter]
        for key, default in defaults.items():
            if values[key] is None:
                values[key] = default
        if values["quant"] is None:
            values["quant"] = "nf4" if self.method in SELF_QUANTIZING else "none"
        c = TrainConfig(**values)
        c.targets = tuple(c.targets)
        check_numbers(dataclasses.asdict(c))
        if c.method in ZO_METHODS:
            if c.method == "mezo-lorafa" and c.q != 1:
                raise ValueError(f"mezo-lorafa is P-RGE with q = 1; got q = {c.q} (use --method prge)")
            c.batch_size = check_zo_settings(c.q, c.E, c.eps, c.dtype)
        else:
            if c.method == "mebp" and c.optimizer != "adam":
                raise ValueError(f"mebp trains with Adam (seed 004); got optimizer {c.optimizer!r}")
            if c.optimizer not in OPTIMIZERS:
                raise ValueError(f"unknown optimizer {c.optimizer!r}; choose one of {list(OPTIMIZERS)}")
            c.q = c.E = c.eps = None
            c.inner = None
        if c.method == "senszoq":
            check_mask_settings(c.mask, c.sparsity, c.mask_scope)
        else:
            c.sparsity = c.mask = c.mask_scope = None
        if c.method in SELF_QUANTIZING and c.quant not in ("nf4", "none"):
            raise ValueError(f"{c.method} dequantizes an NF4 base itself; quant {c.quant!r} is not supported "
                             f"(choose nf4 or none)")
        if c.mmap_dir is not None and c.method != "mebp":
            raise ValueError(f"mmap_dir applies to method mebp only, not {c.method}")
        check_noise_source(c.noise)
        if c.noise != "torch" and c.method not in ("prge", "mezo-lorafa"):
            raise ValueError(f"noise {c.noise!r} applies to prge and mezo-lorafa only, not {c.method}")
        if c.program is not None:
            if c.method != "prge" or not (c.outer and c.inner) or c.noise != "counter":
                raise ValueError("a program runs P-RGE with the outer and inner loops and counter noise: "
                                 "use method prge, outer and inner on, noise 'counter'")
            if c.max_length is None:
                raise ValueError("a program has a fixed sequence length: set max_length to it")
        check_step_memory(c)
        return c

    def identity(self) -> dict:
        values = dataclasses.asdict(self)
        return {k: (list(values[k]) if isinstance(values[k], tuple) else values[k]) for k in _IDENTITY}


def build_method(config: TrainConfig, model, tokenizer=None, task_batches=None):
    """The method object for ``config`` (injecting LoRA-FA layers or peft adapters as needed; MeZO with an
    ``adapter`` runs over that peft space's trainable parameters, prge_lib.methods.adapters). SensZOQ needs the
    ``tokenizer`` for its C4 mask and, for a "task" mask, ``task_batches()``: the task's training batches."""

    c = config
    if c.method == "senszoq":
        if c.layers is not None:
            truncate_layers(model, c.layers)
        batches = task_batches() if c.mask == "task" else None
        return build_senszoq(model, tokenizer, mask=c.mask, sparsity=c.sparsity, scope=c.mask_scope,
                             quant=c.quant, q=c.q, eps=c.eps, lr=c.lr, seed=c.seed, task_batches=batches,
                             outer=c.outer and c.q > 1, inner=bool(c.inner))
    if c.method == "mebp":
        if c.layers is not None:
            truncate_layers(model, c.layers)
        return MeBP(model, c.lr, c.r, c.alpha, c.targets, c.quant, c.mmap_dir, c.seed)
    if c.method in ("fo", "fo-lorafa"):
        if c.method == "fo-lorafa":
            torch.manual_seed(c.seed)     # peft draws A from torch's global generator
        return FirstOrder(model, c.lr, c.optimizer, c.method == "fo-lorafa", c.targets, c.r, c.alpha)
    if c.method == "mezo":
        if c.adapter == "none":
            return MeZOFull(model, c.q, c.eps, c.lr, c.seed)
        model, params = add_adapter(model, c.adapter, c.targets, c.r, c.alpha, seed=c.seed)
        return MeZOFull(model, c.q, c.eps, c.lr, c.seed, params=params)
    if c.program is not None:
        raise ValueError("a config with a program trains through the runtime host: Trainer(config, "
                         "method_builder=prge_lib.deploy.runtime.build_program_method), or prge device-train")
    if c.layers is not None:
        truncate_layers(model, c.layers)
    layers = inject_lorafa(model, c.targets, c.r, c.alpha, seed=c.seed, noise=c.noise)
    return PRGE(model, layers, c.q, c.eps, c.lr, c.seed, c.outer, c.inner, c.keep_noise)


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
        c = self.config
        # the data are read (and their rows checked) before the model loads
        self.data = data if data is not None else sample_task(self.task, c.seed, c.n_train, c.n_val, c.n_test)
        if len(self.data.train) < c.batch_size:
            raise ValueError(f"{len(self.data.train)} training examples cannot fill a batch of {c.batch_size}")
        if model is None or tokenizer is None:
            quant = "none" if self.config.method in SELF_QUANTIZING else self.config.quant
            model, tokenizer = load_model(self.config.model, dtype=self.config.dtype, quant=quant,
                                          device=self.config.device)
        self.tokenizer = tokenizer
        self.items = [encode_example(self.task, tokenizer, ex, c.max_length) for ex in self.data.train]
        if method_builder is None:
            self.method = build_method(c, model, tokenizer, self.task_batches)
        else:
            self.method = method_builder(c, model)
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
        return None if self.checkpoint_dir is None else self.checkpoint_dir / "checkpoint.pt"

    def save_checkpoint(self) -> Path | None:
        path = self.checkpoint_path()
        if path is None:
            return None
        epoch = self.epoch_position(self.step)[0]
        method = {"trainable": {k: v.detach().cpu().clone() for k, v in self.method.trainable().items()}}
        if getattr(self.method, "optimizer", None) is not None:      # first-order methods
            method["optimizer"] = self.method.optimizer.state_dict()
        payload = {"format": 1, "config": self.config.identity(), "step": self.step, "device": self.device.type,
                   "method": method, "history": self.history, "elapsed": self.elapsed,
                   "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
                   "epoch": epoch, "epoch_order": self.epoch_order(epoch)}
        with atomic_file(path) as tmp:
            torch.save(payload, tmp)
        return path

    def load_checkpoint(self) -> None:
        path = self.checkpoint_path()
        if path is None or not path.is_file():
            raise FileNotFoundError(f"--resume: no checkpoint at {path}")
        payload = torch.load(path, weights_only=False, map_location="cpu")
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
        random.setstate(payload["rng"]["python"])

    # ----- the loop
    def run(self, resume: bool = False, deadline: float | None = None) -> dict:
        """Train to ``config.steps`` and return :meth:`summary`. ``deadline`` (a ``time.time()`` value): once
        passed, stop after the current step with a checkpoint there (:class:`TrainingStopped`)."""
        c = self.config
        if resume:
            self.load_checkpoint()
            # a result put together over several sittings says where each later one began (its wall time
            # covers the last sitting only; ``elapsed_s`` sums them all)
            self.history.setdefault("resumed_at", []).append(self.step)
        elif c.eval_every:
            self.record_evaluation(0)
        bar = tqdm(total=c.steps, initial=self.step, desc=f"{c.method} {self.task.name}",
                   disable=not self.progress)
        while self.step < c.steps:
            t = self.step
            start = time.perf_counter()
            record = self.method.step(self.batch(t), t)
            took = time.perf_counter() - start
            if not record["finite"]:
                saved = self.save_checkpoint()
                bar.close()
                where = f"the last good state (after step {t}) is in {saved}" if saved else \
                    "no checkpoint folder was given, so nothing was saved"
                raise TrainingDiverged(f"step {t + 1}: the loss is {record['loss']} (not finite); the "
                                       f"update was not applied and training stopped; {where}. Lower "
                                       f"the learning rate (now {c.lr}) or ε.")
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
            bar.set_postfix(postfix)
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
            **({"method_settings": self.method.settings} if getattr(self.method, "settings", None) else {}),
            **({"phase_times_s": {k: round(v, 3) for k, v in self.method.times.items()}}
               if getattr(self.method, "times", None) else {}),
        }
