"""The trainer of a data-parallel P-RGE run (chapter 11): :class:`~prge_lib.training.trainer.Trainer` on every
worker, with the step of :class:`~prge_lib.distributed.method.DataParallelPRGE`.

Every worker holds the model, the data sample and the adapter, and makes the same calls in the same order. Rank 0
alone evaluates, writes checkpoints and returns the result; at each evaluation every worker hashes its adapter and
the hashes are gathered (32 bytes a worker), recorded as ``replicas_identical``. A stopped run resumes from rank
0's checkpoint, which every worker reads (the checkpoint folder is one all workers see: one machine, or a shared
disk). A signal stops every worker after the same step (:meth:`DistributedTrainer.stop_reason`), rank 0 with a
checkpoint there. The result is a training result (the schema of ``Trainer.run``) plus ``replicas_identical``,
``distributed`` and ``communication``: the bytes measured on the wire per step, beside first-order DDP's for
LoRA-FA and for the full model on the same workers (:mod:`prge_lib.distributed.ddp`).
"""
from __future__ import annotations

import math
import os

import torch

from prge_lib.data.splits import TaskData
from prge_lib.distributed.ddp import SPACES, ddp_bytes_per_step
from prge_lib.distributed.method import DataParallelPRGE, check_data_parallel
from prge_lib.zo.replay import adapter_digest
from prge_lib.distributed.wire import Wire
from prge_lib.training import stopping
from prge_lib.training.config import TrainConfig
from prge_lib.training.trainer import Trainer, build_method


class DistributedTrainer(Trainer):
    """Train ``config`` on this worker of the process group (see the module docstring). ``ddp_steps``: passes of
    first-order DDP measured after training, per parameter space (0: none)."""

    def __init__(self, config: TrainConfig, model=None, tokenizer=None, data: TaskData | None = None,
                 checkpoint_dir: str | os.PathLike | None = None, progress: bool = True, wire: Wire | None = None,
                 ddp_steps: int = 2):
        self.wire = wire or Wire()
        self.rank = self.wire.rank
        check_data_parallel(config.resolved(), self.wire.size)
        self.ddp_steps = ddp_steps
        super().__init__(config, model, tokenizer, data, checkpoint_dir, progress and self.rank == 0,
                         method_builder=lambda c, m: DataParallelPRGE(build_method(c, m), self.wire))
        self.history["replica_checks"] = []
        self.begin_step = 0

    # ----- what rank 0 alone does
    def record_evaluation(self, step: int) -> dict:
        """Every worker: the adapter's hash, gathered and compared; rank 0: the evaluation as the trainer makes it."""
        self.check_replicas(step)
        if self.rank == 0:
            return super().record_evaluation(step)
        return {"step": step, "val": math.nan}

    def save_checkpoint(self):
        return super().save_checkpoint() if self.rank == 0 else None

    def check_replicas(self, step: int) -> bool:
        """Gather every worker's SHA-256 of its adapter (32 bytes each) and record whether they are all equal."""
        digest = adapter_digest(self.method.trainable())
        words = torch.frombuffer(bytearray.fromhex(digest), dtype=torch.int64).to(self.method.device)
        gathered = [w.cpu() for w in self.wire.all_gather(words, "check")]
        identical = all(torch.equal(w, gathered[0]) for w in gathered)
        self.history.setdefault("replica_checks", []).append({"step": step, "identical": identical,
                                                              "sha256": digest})
        return identical

    def stop_reason(self, deadline: float | None) -> str | None:
        """Every worker stops after the same step: each says whether a signal asked it to stop, the answers are
        summed over the workers (4 bytes each, tallied "stop"), and all stop where any was asked. A worker stopped
        by another's signal says so (the launcher forwards a signal to every worker, but not at the same instant:
        one may see it a step before the others, and would otherwise leave them waiting in the next step's
        all-reduce until the launcher kills them, with no checkpoint of that step)."""
        asked = torch.tensor([1.0 if stopping.past(deadline) else 0.0], device=self.method.device)
        if self.wire.all_reduce(asked, "stop").item() == 0:
            return None
        return stopping.reason() if stopping.past(deadline) else "a signal to another worker"

    # ----- the run
    def run(self, resume: bool = False, deadline: float | None = None, restart: bool = False) -> dict | None:
        """``Trainer.run`` on every worker; rank 0 returns the result, the others None. No ``deadline``: workers
        reading their own clocks could stop after different steps."""
        if deadline is not None:
            raise ValueError("a data-parallel run takes no deadline: its workers must stop after the same step")
        result = super().run(resume=resume, restart=restart)
        communication = self.wire.report(self.step - self.begin_step)      # the steps of this sitting
        if self.ddp_steps:
            batch = self.batch(max(self.step - 1, 0))
            communication["first_order_ddp"] = {space: ddp_bytes_per_step(self.model, batch, space, self.wire,
                                                                          self.ddp_steps) for space in SPACES}
        if self.rank != 0:
            return None
        result["communication"] = communication
        return result

    def begin(self, resume: bool = False, restart: bool = False) -> None:
        super().begin(resume, restart)
        self.begin_step = self.step

    def summary(self) -> dict | None:
        checks = self.history.setdefault("replica_checks", [])
        if not checks or checks[-1]["step"] != self.step:
            self.record_evaluation(self.step)          # every worker: the last check is at the last step
        if self.rank != 0:
            return None
        result = super().summary()
        result["replicas_identical"] = all(c["identical"] for c in checks)
        result["distributed"] = {"workers": self.wire.size, "backend": torch.distributed.get_backend(),
                                 "split": "queries: worker k forwards queries i with i mod N = k",
                                 "replica_checks": checks}
        return result
