"""The runtime host: a program written by ``prge_lib.deploy.export`` loaded in the ExecuTorch runtime and driven by
the trainer, step by step, with the adapter kept on the host (Gao et al. §4.3; chapter 10).

It sits above the trainer: :func:`build_program_method` gives ``prge_lib.training.trainer.Trainer`` a method object whose
every step runs in the program, and :class:`PythonHost` is that trainer driven from this Python process. The C++
trainer of ``prge_lib.deploy.native_host`` is the other host; ``prge_lib.deploy.device_train`` chooses between
them. Both are fed by :meth:`ProgramPRGE.feed` and recorded by :func:`step_record` and :func:`parity`.
"""
from __future__ import annotations

import dataclasses
import io
import os
import platform
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

from prge_lib.common.measure import status_kib
from prge_lib.models.objective import Batch, fit_width
from prge_lib.zo.prge import PRGE, projected_gradients, step_seeds
from prge_lib.deploy.export import check_program_header, read_program_meta
from prge_lib.deploy.program import TrainStep
from prge_lib.training.config import TrainConfig
from prge_lib.training.trainer import Trainer, build_method


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

        check_program_header(path)
        self.program = Runtime.get().load_program(str(path), enable_etdump=etdump)
        with without_cpu_probe_chatter():
            self.method = self.program.load_method("forward")

    def __call__(self, *inputs):
        return tuple(self.method.execute(list(inputs)))


def step_record(losses: torch.Tensor, eps: float) -> dict:
    """What a host keeps of one step from the program's losses (2, q): their mean, whether all are finite (the
    host keeps the returned adapter only then), and the projected gradients g_i = (ℓ+_i − ℓ−_i) / 2ε."""
    g = projected_gradients(losses, eps)
    return {"loss": float(losses.mean()), "finite": bool(torch.isfinite(losses).all()), "projected_grad": g.tolist()}


class ProgramPRGE(PRGE):
    """P-RGE whose every step runs in an exported program (chapter 10): the trainer's method object.

    The adapter lives on the host: it is fed to the program each step and the returned one is kept when the
    losses are finite. It is also written back into ``model``'s LoRA-B after each step, so evaluation and
    checkpoints work on the eager model exactly as for :class:`prge_lib.zo.prge.PRGE`. With ``load=False`` the
    program is not loaded here: the native host runs it, and uses :meth:`feed` and the adapter state."""

    def __init__(self, model, layers, path, q: int, eps: float, lr: float, seed: int, width: int,
                 pad_id: int = 0, load: bool = True):
        super().__init__(model, layers, q, eps, lr, seed)
        self.state = TrainStep(model, q)
        settings = read_program_meta(path)["settings"]
        expected = {"q": q, "seq_len": width, "adapter_size": sum(self.state.sizes)}
        differ = {k: (settings[k], v) for k, v in expected.items() if settings[k] != v}
        if differ:
            raise ValueError(f"the program {path} was exported for other settings (program, run): {differ}")
        self.width, self.target_width, self.pad_id = width, settings["target_width"], pad_id
        self.path = Path(path)
        self.program = RuntimeStep(path) if load else None

    def feed(self, batch: Batch, t: int) -> tuple:
        """The program's seven inputs for step ``t``: the batch fitted to the program's width, the adapter, the
        step's seeds (a pure function of run seed and step), lr and ε, as the exported signature has them."""
        b = fit_width(batch.to("cpu"), self.width, self.pad_id, self.target_width)
        seeds = torch.tensor(step_seeds(self.seed, t, self.q), dtype=torch.int64)
        return (b.input_ids, b.attention_mask, b.targets, self.state.adapter(), seeds,
                torch.tensor(float(self.lr)), torch.tensor(float(self.eps)))

    def step(self, batch: Batch, t: int) -> dict:
        losses, adapter = self.program(*self.feed(batch, t))
        record = step_record(losses, self.eps)
        if record["finite"]:
            self.state.load(adapter)
        return record


def build_program_method(config: TrainConfig, model, load: bool = True) -> ProgramPRGE:
    """The trainer's method for a config with ``program`` set: P-RGE built as usual (truncated model,
    LoRA-FA layers with counter noise), every step run in the program (``load=False``: by the native host)."""
    prge = build_method(dataclasses.replace(config, program=None), model)
    return ProgramPRGE(prge.model, prge.layers, config.program, config.q, config.eps, config.lr, config.seed,
                       config.max_length, load=load)


def parity(losses, eager_losses) -> dict:
    """The paper's sanity check (§4.3): the relative difference of the per-step losses against eager P-RGE with
    the same seeds and data; within 1e-4 at every step passes."""
    rel = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, eager_losses, strict=True)]
    return {"max_rel_loss_diff": max(rel), "per_step_rel_loss_diff": rel, "steps": len(rel),
            "within_1e-4": max(rel) <= 1e-4}


class PythonHost(Trainer):
    """The Python host: the trainer with :class:`ProgramPRGE` as its method. Its record is this process's resident
    memory (Python, torch, the eager model kept for evaluation, the program) once both are loaded, and its peak
    from then to the end of the run."""

    def __init__(self, config: TrainConfig, checkpoint_dir=None, progress: bool = True):
        super().__init__(config, checkpoint_dir=checkpoint_dir, progress=progress, method_builder=build_program_method)
        self.resident_at_start = status_kib("VmRSS")
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")                # reset the high-water mark (Linux), so the peak is this run's
        except OSError:
            pass

    def host_record(self) -> dict:
        peak = status_kib("VmHWM")
        return {"name": "python", "machine": platform.machine(), "emulated": False,
                "resident_at_start_mib": self.resident_at_start / 1024 if self.resident_at_start else None,
                "peak_resident_mib": peak / 1024 if peak else None}
