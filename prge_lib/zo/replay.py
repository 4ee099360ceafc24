"""An adapter rebuilt from its history (chapters 3 and 11): the run's seed and its list of projected gradients.

A ZO-SGD run's trajectory is B_T = B_0 − Σ_t (η/q) Σ_i g_t,i z(s_t,i), with B_0 = 0, A drawn from the run seed and
s_t,i = step_seeds(seed, t, q). Whoever has (config, [g_0 … g_{T−1}]) redraws every z and applies the same updates
in the same order (:func:`prge_lib.zo.prge.apply_update`; a fused run's
:func:`prge_lib.zo.fused.apply_fused_update`): the same floats, bit for bit, as the workers that trained it. A
worker that joins a run late, or a device that receives an adapter, needs T·q numbers instead of the adapter's d;
so does a checkpoint (a *seed checkpoint*, :meth:`prge_lib.training.trainer.Trainer.save_checkpoint`), which
keeps the run's history and the adapter's digest instead of its tensors (:func:`rebuild`).
"""
from __future__ import annotations

import hashlib
from typing import Iterable, Sequence

import torch

from prge_lib.zo.estimator import step_seeds
from prge_lib.zo.fused import FusedPRGE, apply_fused_update, draw_all
from prge_lib.zo.lora import LoRAFALinear
from prge_lib.zo.mezo import MeZOFull, replay_step
from prge_lib.zo.packing import PackedMethod
from prge_lib.zo.prge import PRGE, apply_update


def adapter_digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 of named tensors (names, shapes, dtypes and bytes, in name order): equal digests, equal bits."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        value = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}:{tuple(value.shape)}:{value.dtype}".encode())
        h.update(value.view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return h.hexdigest()


def checked_steps(steps: Iterable[tuple[int, Sequence[float]]], q: int):
    """The (seed index t, its projected gradients) pairs of ``steps``, each refused unless it holds q of them."""
    for t, g in steps:
        if len(g) != q:
            raise ValueError(f"step {t}: {len(g)} projected gradients for a run with q = {q}")
        yield t, g


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
    replay_layers(method.layers, method.seed, method.q, steps, lr)
    return method


@torch.no_grad()
def replay_layers(layers: Sequence[LoRAFALinear], seed: int, q: int, steps: Iterable[tuple[int, Sequence[float]]],
                  lr: float) -> None:
    """The per-layer replay of :func:`replay_steps` on ``layers`` of a run with ``seed`` and ``q``."""
    for t, g in checked_steps(steps, q):
        apply_update(layers, step_seeds(seed, t, q), g, lr)


@torch.no_grad()
def replay_fused(layers: Sequence[LoRAFALinear], seed: int, q: int, steps: Iterable[tuple[int, Sequence[float]]],
                 lr: float) -> None:
    """The replay of a fused run (counter noise) on ``layers``: each step's (q, D) draw redrawn in one call and
    added as the fused step adds it (:func:`prge_lib.zo.fused.apply_fused_update`)."""
    for t, g in checked_steps(steps, q):
        z = draw_all(layers, step_seeds(seed, t, q))
        apply_fused_update(layers, z, torch.tensor([float(v) for v in g], dtype=torch.float32, device=z.device), lr)


def rebuild(method, projected_grads: Sequence[Sequence[float]]) -> None:
    """Bring ``method`` (as built for its run, at step 0) to step T = len(projected_grads) by replaying the
    run's recorded projected gradients, as its steps updated it: P-RGE and MeZO on LoRA-FA, per layer or fused,
    alone or a run of a pack, and MeZO (Full), whose replay redoes each step's ±ε trips over every weight too
    (:func:`prge_lib.zo.mezo.replay_step`: four passes of noise per query and step, quick on a GPU, slow on a CPU),
    and a ZO method that replays itself (``rebuildable``, :meth:`ZerothOrder.rebuild`: SensZOQ's sparse values)
    (:func:`can_rebuild`); a ValueError for any other method (first-order methods, MeBP)."""
    steps = enumerate(projected_grads)
    if isinstance(method, PackedMethod):
        run = method.pack.runs[method.r]
        (replay_fused if method.pack.fused else replay_layers)(run.layers, run.seed, run.q, steps, run.lr)
    elif isinstance(method, PRGE):
        (replay_fused if isinstance(method, FusedPRGE) else replay_layers)(method.layers, method.seed, method.q,
                                                                          steps, method.lr)
    elif type(method) is MeZOFull:
        params = list(method.params.values())
        for t, g in checked_steps(steps, method.q):
            replay_step(params, step_seeds(method.seed, t, method.q), g, method.eps, method.lr)
    elif getattr(method, "rebuildable", False):
        method.rebuild(projected_grads)
    else:
        raise ValueError(f"{type(method).__name__} is not rebuilt from projected gradients; only P-RGE, MeZO on "
                         f"LoRA-FA, MeZO (Full) and SensZOQ are")


def can_rebuild(method) -> bool:
    """Whether :func:`rebuild` can bring ``method`` to a later step from its projected gradients."""
    return isinstance(method, (PackedMethod, PRGE)) or type(method) is MeZOFull or \
        bool(getattr(method, "rebuildable", False))
