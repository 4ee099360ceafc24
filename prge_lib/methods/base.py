"""What the trainer needs of a training method (chapters 5–9): the :class:`Method` protocol. Every method
object has all of its parts, so the trainer reads them directly; the optional ones say "nothing" with an
empty value rather than by being absent.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from prge_lib.models.objective import Batch


@runtime_checkable
class Method(Protocol):
    """A training method as the trainer drives it.

    ``step(batch, t)``: one training step on ``batch`` at step ``t``; returns at least ``loss`` (float) and
    ``finite`` (False: the update was not applied), ZO methods also ``projected_grad``.
    ``trainable()``: the tensors a checkpoint saves and restores, by name.
    ``model``: the model the trainer evaluates (with the method's layers in it).
    ``optimizer``: the torch optimizer whose state a checkpoint saves (None for ZO-SGD, which keeps none).
    ``settings``: what was built, recorded in the result (empty: nothing to record).
    ``times``: seconds per phase summed over the steps, recorded in the result (empty: not timed).
    ``start``: tensors beyond the config that the method was built from, which another machine may not compute
    bit for bit (SensZOQ: its mask, ranked by a Fisher whose sums round per processor); a checkpoint keeps them
    and a resume builds the run from them (empty: the config alone fixes the start).
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    settings: dict
    times: dict[str, float]
    start: dict[str, torch.Tensor]

    def step(self, batch: Batch, t: int) -> dict: ...

    def trainable(self) -> dict[str, torch.Tensor]: ...


PARTS = (*Method.__annotations__, "step", "trainable")


def check_method(method, name: str) -> Method:
    """``method`` if it has every part of :class:`Method`, else a TypeError naming method ``name``'s missing
    parts."""
    missing = [part for part in PARTS if not hasattr(method, part)]
    if missing:
        raise TypeError(f"the object built for method {name!r} ({type(method).__name__}) lacks {missing} of "
                        f"the Method protocol (prge_lib.methods.base)")
    return method
