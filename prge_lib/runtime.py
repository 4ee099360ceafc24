"""The runtime host: a program written by ``prge_lib.export`` loaded in the ExecuTorch runtime and driven by
the trainer, step by step, with the adapter kept on the host (Gao et al. §4.3; chapter 10).

It sits above the trainer: :func:`build_program_method` gives ``prge_lib.train.Trainer`` a method object whose
every step runs in the program, and :func:`train_in_runtime` (``prge device-train``) runs that trainer, and
optionally the eager twin with the same seeds for the per-step parity check.
"""
from __future__ import annotations

import dataclasses
import io
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

from .export import read_program_meta
from .lora import save_adapter
from .objective import Batch, fit_width
from .prge import PRGE, step_seeds
from .program import TrainStep
from .train import TrainConfig, Trainer, build_method


@contextmanager
def without_cpu_probe_chatter():
    """Drop the lines the runtime logs while XNNPACK probes the CPU at load time ("[cpuinfo_utils.cpp:71]
    Reading file ..."); anything else it writes is passed on. The runtime writes to file descriptor 2, or
    through Python's ``sys.stderr`` when that is not a file (in a notebook), so both are captured."""

    sys.stderr.flush()
    saved_fd, saved_stream, text = os.dup(2), sys.stderr, io.StringIO()
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        sys.stderr = text
        try:
            yield
        finally:
            sys.stderr = saved_stream
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            captured.seek(0)
            lines = (captured.read().decode(errors="replace") + text.getvalue()).splitlines(keepends=True)
            kept = "".join(line for line in lines if not line.startswith("[cpuinfo_utils"))
            if kept:
                sys.stderr.write(kept)


class RuntimeStep:
    """A .pte training step loaded in the ExecuTorch runtime, called like :class:`TrainStep`. With ``etdump``
    the runtime records every operator's time (``program.write_etdump_result_to_file``; chapter 10)."""

    def __init__(self, path, etdump: bool = False):
        from executorch.runtime import Runtime

        self.program = Runtime.get().load_program(str(path), enable_etdump=etdump)
        with without_cpu_probe_chatter():
            self.method = self.program.load_method("forward")

    def __call__(self, *inputs):
        return tuple(self.method.execute(list(inputs)))


class ProgramPRGE(PRGE):
    """P-RGE whose every step runs in an exported program (chapter 10): the trainer's method object.

    The adapter lives on the host: it is fed to the program each step and the returned one is kept when the
    losses are finite. It is also written back into ``model``'s LoRA-B after each step, so evaluation and
    checkpoints work on the eager model exactly as for :class:`prge_lib.prge.PRGE`."""

    def __init__(self, model, layers, path, q: int, eps: float, lr: float, seed: int, width: int,
                 pad_id: int = 0):
        super().__init__(model, layers, q, eps, lr, seed)
        self.state = TrainStep(model, q)
        self.program = RuntimeStep(path)
        settings = read_program_meta(path)["settings"]
        expected = {"q": q, "seq_len": width, "adapter_size": sum(self.state.sizes)}
        differ = {k: (settings[k], v) for k, v in expected.items() if settings[k] != v}
        if differ:
            raise ValueError(f"the program {path} was exported for other settings (program, run): {differ}")
        self.width, self.target_width, self.pad_id = width, settings["target_width"], pad_id

    def step(self, batch: Batch, t: int) -> dict:
        b = fit_width(batch.to("cpu"), self.width, self.pad_id, self.target_width)
        seeds = torch.tensor(step_seeds(self.seed, t, self.q), dtype=torch.int64)
        losses, adapter = self.program(b.input_ids, b.attention_mask, b.targets, self.state.adapter(), seeds,
                                       torch.tensor(float(self.lr)), torch.tensor(float(self.eps)))
        finite = bool(torch.isfinite(losses).all())
        if finite:
            self.state.load(adapter)
        g = (losses[0] - losses[1]) / (2 * self.eps)
        return {"loss": float(losses.mean()), "finite": finite, "projected_grad": g.tolist()}


def build_program_method(config: TrainConfig, model) -> ProgramPRGE:
    """The trainer's method for a config with ``program`` set: P-RGE built as usual (truncated model,
    LoRA-FA layers with counter noise), every step run in the program."""
    prge = build_method(dataclasses.replace(config, program=None), model)
    return ProgramPRGE(prge.model, prge.layers, config.program, config.q, config.eps, config.lr, config.seed,
                       config.max_length)


def train_in_runtime(pte, task: str, steps: int, lr: float | None = None, eps: float | None = None,
                     eval_every: int = 0, check_eager: bool = False, checkpoint_dir=None,
                     checkpoint_every: int = 100, resume: bool = False, save_adapter_to=None,
                     progress: bool = True, **sizes) -> dict:
    """Train ``task`` for ``steps`` steps with the program ``pte`` in the ExecuTorch runtime (Gao et al. §4.3).

    The run's settings (q, E, rank, targets, seed, width) come from the program's sidecar. With
    ``check_eager`` the eager P-RGE trainer runs the same steps with the same seeds and data, and the result
    gains ``parity``: the relative difference of the per-step losses (the paper's sanity check). Checkpoints
    go to ``checkpoint_dir`` (the eager twin's to its ``eager/`` subfolder); ``resume`` continues from them
    with a freshly loaded program. ``sizes``: n_train, n_val, n_test."""

    meta = read_program_meta(pte)
    s = meta["settings"]
    if resume and not checkpoint_dir:
        raise ValueError("resume needs checkpoint_dir (the folder of the run to continue)")
    common = dict(task=task, method="prge", steps=steps, lr=lr, eps=eps, q=s["q"], E=s["E"], outer=True,
                  inner=True, noise="counter", r=s["r"], alpha=s["alpha"], targets=tuple(s["targets"]),
                  seed=s["seed"], layers=s["layers"] if s["truncated"] else None, max_length=s["seq_len"],
                  model=s["model"], dtype=s.get("dtype", "fp32"), eval_every=eval_every,
                  checkpoint_every=checkpoint_every if checkpoint_dir else 0,
                  **sizes)
    runs = {"runtime": TrainConfig(program=str(pte), **common)}
    if check_eager:
        runs["eager"] = TrainConfig(**common)
    runs = {label: config.resolved() for label, config in runs.items()}   # refuse bad settings before any run
    results = {}
    for label, config in runs.items():
        folder = None if not checkpoint_dir else Path(checkpoint_dir) / ("eager" if label == "eager" else "")
        builder = build_program_method if config.program else build_method
        trainer = Trainer(config, checkpoint_dir=folder, progress=progress, method_builder=builder)
        results[label] = trainer.run(resume=resume)
        if label == "runtime" and save_adapter_to:
            save_adapter(trainer.model, save_adapter_to, {"task": task, "method": "prge", "program": Path(pte).name})
    result = {"kind": "device-train", "task": task, "seed": s["seed"], "program": Path(pte).name,
              "program_settings": s, "program_commit": meta.get("provenance", {}).get("commit"),
              **results["runtime"], "status": "finished"}
    if check_eager:
        ours, eager = result["losses"], results["eager"]["losses"]
        rel = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours, eager)]
        result["eager"] = results["eager"]
        result["parity"] = {"max_rel_loss_diff": max(rel), "per_step_rel_loss_diff": rel, "steps": len(rel),
                            "within_1e-4": max(rel) <= 1e-4}
    return result
