"""An adapter rebuilt from its history (chapter 11): the run's seed and its list of projected gradients.

A ZO-SGD run's trajectory is B_T = B_0 − Σ_t (η/q) Σ_i g_t,i z(s_t,i), with B_0 = 0, A drawn from the run seed and
s_t,i = step_seeds(seed, t, q). Whoever has (config, [g_0 … g_{T−1}]) redraws every z and applies the same updates
in the same order (:func:`prge_lib.zo.prge.apply_update`): the same floats, bit for bit, as the workers that
trained it. A worker that joins a run late, or a device that receives an adapter, needs T·q numbers instead of
the adapter's d.
"""
from __future__ import annotations

import hashlib
from typing import Iterable, Sequence

import torch

from prge_lib.zo.estimator import step_seeds
from prge_lib.zo.prge import PRGE, apply_update


def adapter_digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 of named tensors (names, shapes, dtypes and bytes, in name order): equal digests, equal bits."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        value = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}:{tuple(value.shape)}:{value.dtype}".encode())
        h.update(value.view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return h.hexdigest()


@torch.no_grad()
def replay(method: PRGE, projected_grads: Sequence[Sequence[float]], start: int = 0) -> PRGE:
    """Apply steps ``start``, ``start + 1``, … of a run to ``method``'s adapter from their projected gradients
    alone (``method`` as built for the run's config, at step ``start``); returns ``method``."""
    return replay_steps(method, enumerate(projected_grads, start), method.lr)


@torch.no_grad()
def replay_steps(method: PRGE, steps: Iterable[tuple[int, Sequence[float]]], lr: float) -> PRGE:
    """Apply the updates of the steps (seed index t, its q projected gradients), in the order given, at learning
    rate ``lr``: B ← B − (lr/q) Σ_i g_t,i z(s_t,i). A federated round replays its clients' steps at lr/C
    (:mod:`prge_lib.distributed.federated`); returns ``method``."""
    if not isinstance(method, PRGE):
        raise ValueError(f"replay rebuilds P-RGE adapters (prge, mezo-lorafa), not {type(method).__name__}")
    for t, g in steps:
        if len(g) != method.q:
            raise ValueError(f"step {t}: {len(g)} projected gradients for a run with q = {method.q}")
        apply_update(method.layers, step_seeds(method.seed, t, method.q), g, lr)
    return method
