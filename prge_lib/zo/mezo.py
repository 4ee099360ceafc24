"""MeZO: zeroth-order SGD with the seed trick, over every weight or any chosen set of tensors
(Malladi et al. 2023; Gao et al. Alg. 3; chapter 3).

MeZO never stores z: it keeps the seed s_i and redraws z_i from it (``prge_lib.zo.rge.gaussian``) whenever it is
needed (perturb +ε, perturb −2ε, restore +ε, update), so the extra memory is one chunk of noise however large
the model. The price is four sequential passes over the parameters per query.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from prge_lib.models.loading import is_quantized
from prge_lib.models.objective import Batch, mean_loss
from prge_lib.zo.estimator import ZerothOrder, step_seeds
from prge_lib.zo.rge import check_zo_dtype, gaussian

_CHUNK = 1 << 20   # largest number of noise elements drawn at once (4 MiB in fp32)


def _chunks(param: torch.Tensor):
    """Row blocks of ``param`` holding at most ``_CHUNK`` elements (a 1-D or 0-D tensor is one block)."""
    if param.dim() < 2 or param.numel() <= _CHUNK:
        yield 0, param
        return
    rows = max(1, _CHUNK // (param.numel() // param.shape[0]))
    for k, start in enumerate(range(0, param.shape[0], rows)):
        yield k, param[start:start + rows]


def add_noise_(params: Sequence[torch.Tensor], seed: int, scale: float) -> None:
    """θ_j ← θ_j + scale · z_j for every tensor, z regenerated from ``seed`` (Gao et al. Alg. 3, l. 22–28).

    The noise is drawn in chunks of at most 2^20 elements, so the extra memory is O(1) in the model size.
    """
    with torch.no_grad():
        for index, param in enumerate(params):
            for chunk, block in _chunks(param):
                z = gaussian(seed, index, block.shape, block.device, torch.float32, chunk)
                if block.dtype == torch.float32:
                    block.add_(z, alpha=scale)
                else:
                    block.copy_((block.float() + scale * z).to(block.dtype))


def explicit_noise(params: Sequence[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """The z that :func:`add_noise_` applies for ``seed``, materialised (for tests and chapter 3)."""
    out = []
    for index, param in enumerate(params):
        blocks = [gaussian(seed, index, b.shape, param.device, torch.float32, k) for k, b in _chunks(param)]
        out.append(torch.cat(blocks) if len(blocks) > 1 else blocks[0].reshape(param.shape))
    return out


@torch.no_grad()
def mezo_step(params: Sequence[torch.Tensor], loss: Callable[[], float], seeds: Sequence[int],
              eps: float, lr: float) -> dict:
    """One MeZO step with q = len(seeds) queries over ``params`` (Gao et al. Alg. 3).

    For each seed: perturb +ε, evaluate, perturb −2ε, evaluate, perturb +ε (restore), g_i = (ℓ+ − ℓ−)/2ε.
    Then θ ← θ − (lr/q) Σ_i g_i z_i, each z_i regenerated from its seed. ``loss`` evaluates the current
    parameters on the step's batch. A non-finite loss cancels the update (the parameters are restored).
    Returns the losses, the projected gradients and whether every loss was finite.
    """
    params = list(params)
    check_zo_dtype(params, "MeZO")
    plus, minus = [], []
    for seed in seeds:
        lp, lm = perturbation_trip(params, seed, eps, loss)
        plus.append(lp)
        minus.append(lm)
    grads = [(lp - lm) / (2 * eps) for lp, lm in zip(plus, minus)]
    finite = all(math.isfinite(v) for v in plus + minus)
    if finite:
        update_(params, seeds, grads, lr)
    return {"loss_plus": plus, "loss_minus": minus, "projected_grad": grads, "finite": finite}


def perturbation_trip(params: Sequence[torch.Tensor], seed: int, eps: float,
                      loss: Callable[[], float] | None = None) -> tuple[float | None, float | None]:
    """Perturb +ε, evaluate, perturb −2ε, evaluate, restore +ε (``loss`` None: no evaluations). In floating point
    the trip does not give θ back bit for bit, so a replay of a run makes the trips too (:func:`replay_step`)."""
    add_noise_(params, seed, eps)
    plus = None if loss is None else float(loss())
    add_noise_(params, seed, -2 * eps)
    minus = None if loss is None else float(loss())
    add_noise_(params, seed, eps)
    return plus, minus


def update_(params: Sequence[torch.Tensor], seeds: Sequence[int], grads: Sequence[float], lr: float) -> None:
    """θ ← θ − (lr/q) Σ_i g_i z_i, each z_i regenerated from its seed (Gao et al. Alg. 3, the update)."""
    for seed, g in zip(seeds, grads):
        add_noise_(params, seed, -lr * g / len(seeds))


@torch.no_grad()
def replay_step(params: Sequence[torch.Tensor], seeds: Sequence[int], grads: Sequence[float], eps: float,
                lr: float) -> None:
    """A finite :func:`mezo_step` again from its projected gradients, without its forwards: the same trips and the
    same update, so the same parameters bit for bit on the device that ran it (a seed checkpoint's resume,
    ``prge_lib.zo.replay.rebuild``)."""
    params = list(params)
    for seed in seeds:
        perturbation_trip(params, seed, eps)
    update_(params, seeds, grads, lr)


def step_record(out: dict) -> dict:
    """The trainer's record of a step's result ``out`` (the q losses ℓ⁺ and ℓ⁻ and the projected gradients, as
    :func:`mezo_step` returns them): the mean of the 2q losses, whether all were finite, and the gradients."""
    q = len(out["loss_plus"])
    return {"loss": (sum(out["loss_plus"]) + sum(out["loss_minus"])) / (2 * q),
            "finite": out["finite"], "projected_grad": out["projected_grad"]}


class MeZOFull(ZerothOrder):
    """MeZO with the seed trick over every weight of the model, or a chosen subset (Gao et al. Alg. 3)."""

    def __init__(self, model, q: int, eps: float, lr: float, seed: int = 0,
                 params: dict[str, torch.Tensor] | None = None, length_groups: int = 1):
        super().__init__(model, q, eps, lr, seed)
        self.length_groups = length_groups
        if params is None:
            params = dict(model.named_parameters())   # tied weights appear once
        if is_quantized(params.values()):
            raise ValueError("MeZO (Full) perturbs every weight in place and cannot perturb INT8/NF4 "
                             "quantized weights; use --quant none, or an adapter method (prge, mezo-lorafa)")
        check_zo_dtype(params.values(), "MeZO")
        self.params = params

    def trainable(self):
        return self.params

    def step(self, batch: Batch, t: int) -> dict:
        return step_record(mezo_step(list(self.params.values()),
                                     lambda: mean_loss(self.model, batch, self.length_groups),
                                     step_seeds(self.seed, t, self.q), self.eps, self.lr))
