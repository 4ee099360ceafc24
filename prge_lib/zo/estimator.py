"""What every zeroth-order method shares (chapters 2, 3, 5): the noise seeds of a step and the base class of
the ZO methods, with the parts the trainer reads (:class:`prge_lib.methods.base.Method`).
"""
from __future__ import annotations

import math

import torch

from prge_lib.zo.rge import mix_seed


def step_seeds(run_seed: int, step: int, q: int) -> list[int]:
    """The q noise seeds of a training step: a pure function of (run seed, step), so a resumed run
    draws exactly the noise the uninterrupted run would have drawn."""
    return [mix_seed(run_seed, step, i) for i in range(q)]


class ZerothOrder:
    """Common shape of the ZO methods for the trainer: ``step(batch, t)`` → per-step record, and
    ``trainable()`` → the tensors a checkpoint saves (the trainer copies them out and back). ZO-SGD keeps no
    optimizer state (``optimizer`` is None); ``settings`` (what was built), ``times`` (seconds per phase) and
    ``start`` (what a checkpoint keeps of the build) start empty."""

    optimizer = None
    rebuildable = False       # True where :meth:`rebuild` replays the run (a seed checkpoint can stand for it)

    def __init__(self, model, q: int, eps: float, lr: float, seed: int):
        if q < 1:
            raise ValueError(f"q must be at least 1, got {q}")
        if not (eps > 0 and math.isfinite(eps)):
            raise ValueError(f"eps must be a positive number, got {eps}")
        self.model, self.q, self.eps, self.lr, self.seed = model, q, eps, lr, seed
        self.settings: dict = {}
        self.times: dict[str, float] = {}
        self.start: dict[str, torch.Tensor] = {}

    def trainable(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def step(self, batch, t: int) -> dict:
        raise NotImplementedError

    def rebuild(self, projected_grads) -> None:
        """Bring the trainable tensors (as built, at step 0) to step T = len(projected_grads) from the run's
        projected gradients alone, as its steps changed them (MeZO's seed trick, chapter 3): what a method with
        ``rebuildable`` provides for :func:`prge_lib.zo.replay.rebuild`. The engine's own classes (P-RGE, MeZO)
        are replayed there."""
        raise ValueError(f"{type(self).__name__} is not rebuilt from projected gradients")
