"""The P-RGE step (Gao et al. Alg. 1) with its two switches, and the zeroth-order training methods.

One step with q query seeds s_1 … s_q on a batch of b rows:

    copies    (s_i, +ε) and (s_i, −ε) for i = 1 … q          2q perturbed versions of every LoRA-B
    outer on  the q queries share one forward (batch repeated q times, q copies of B; chapter 5)
    inner on  a query's +ε and −ε share one forward (batch repeated twice; chapter 6)
    g_i       = (ℓ(s_i, +ε) − ℓ(s_i, −ε)) / 2ε                                       Alg. 1 line 11
    update    B ← B − (η/q) Σ_i g_i z_i, z_i redrawn from s_i per layer              Alg. 1 line 14
              (or kept from the forward when it fits the memory budget; chapter 5)

Both switches off is sequential multi-query RGE (2q forwards of b rows); q = 1 is MeZO on LoRA-FA. The four
settings compute the same numbers up to float rounding (tests/test_prge.py); they differ in speed only.
"""
from __future__ import annotations

import contextlib
from typing import Sequence

import torch

from prge_lib.common.provenance import as_float32
from prge_lib.zo.lora import LoRAFALinear, draw_noise, keeping_noise, perturbed
from prge_lib.models.objective import Batch, grouped_copy_losses
from prge_lib.zo.estimator import ZerothOrder, step_seeds  # noqa: F401  (step_seeds: re-exported)
from prge_lib.zo.defaults import KEEP_NOISE_BUDGET_MIB
from prge_lib.zo.rge import check_zo_dtype




def keeps_noise(layers: Sequence[LoRAFALinear], q: int, keep_noise: bool | None = None) -> bool:
    """``keep_noise``, or for None (the default) whether q·d floats of noise fit ``KEEP_NOISE_BUDGET_MIB``."""
    if keep_noise is not None:
        return bool(keep_noise)
    return q * sum(layer.lora_B.nbytes for layer in layers) <= KEEP_NOISE_BUDGET_MIB * 2 ** 20


def forward_groups(q: int, outer: bool, inner: bool) -> list[list[tuple[int, int]]]:
    """Which (query, sign) copies share a forward, for each forward of the step, in order."""
    plus, minus = [(i, +1) for i in range(q)], [(i, -1) for i in range(q)]
    if outer and inner:
        return [plus + minus]
    if outer:
        return [plus, minus]
    if inner:
        return [[p, m] for p, m in zip(plus, minus)]
    return [[c] for pair in zip(plus, minus) for c in pair]


@torch.no_grad()
def prge_step(model, layers: Sequence[LoRAFALinear], batch: Batch, seeds: Sequence[int], eps: float,
              lr: float, outer: bool = True, inner: bool = True, update: bool = True,
              keep_noise: bool = False, length_groups: int = 1) -> dict:
    """One P-RGE step on ``batch`` (Gao et al. Alg. 1). Returns per-query losses ℓ⁺, ℓ⁻ and g (q,) tensors.

    With ``update=False`` (or a non-finite loss) the adapter is left untouched. ``keep_noise`` draws every z
    of the step once, up front and in parallel threads (:func:`prge_lib.zo.lora.draw_noise`), and keeps it for
    the forward and the update instead of drawing it again: half the random draws, for q·d floats of memory
    during the step (the paper's master-copy design keeps nothing; chapter 5 weighs the two).
    """
    check_zo_dtype([layer.lora_B for layer in layers], "P-RGE")
    with keeping_noise(layers, draw_noise(layers, seeds)) if keep_noise else contextlib.nullcontext():
        return _prge_step(model, layers, batch, seeds, eps, lr, outer, inner, update, length_groups)


def device_losses(model, layers: Sequence, batch: Batch, seeds: Sequence[int], eps: float, outer: bool = True,
                  inner: bool = True, device_mask: bool | None = None, length_groups: int = 1) -> torch.Tensor:
    """The 2q losses of a step's copies (s_i, ±ε), forwarded in the groups of :func:`forward_groups` with
    ``layers`` :func:`perturbed`: a (2, q) tensor (row 0 ℓ⁺, row 1 ℓ⁻) of the losses' dtype (fp32 or fp64) left
    on the model's device.
    ``layers``: LoRA-FA layers, or any layers that read ``copies`` the same way (SensZOQ's sparse values).
    ``device_mask``: as :func:`prge_lib.models.objective.tail_logits` (default: on a GPU). ``length_groups``: each
    forward's rows in that many chunks of similar length (:func:`prge_lib.models.objective.grouped_copy_losses`;
    1, the default: one padded batch)."""
    q = len(seeds)
    values, order = [], []
    for group in forward_groups(q, outer, inner):
        with perturbed(layers, [(seeds[i], sign * eps) for i, sign in group]):
            values.append(grouped_copy_losses(model, batch, len(group), length_groups, device_mask))
        order += [(0 if sign > 0 else 1) * q + i for i, sign in group]
    flat = torch.cat(values)
    if order != list(range(2 * q)):       # forwards in another order than ℓ⁺ then ℓ⁻: put each loss in place
        position = {k: n for n, k in enumerate(order)}
        flat = torch.stack([flat[position[k]] for k in range(2 * q)])
    return flat.view(2, q)


def projected_gradients(losses: torch.Tensor, eps: float) -> torch.Tensor:
    """g_i = (ℓ⁺_i − ℓ⁻_i) / 2ε (Gao et al. Alg. 1 line 11) from the (2, q) losses (row 0 ℓ⁺, row 1 ℓ⁻), on
    their device and in their dtype."""
    return (losses[0] - losses[1]) / (2 * eps)


def two_point_losses(model, layers: Sequence, batch: Batch, seeds: Sequence[int], eps: float, outer: bool = True,
                     inner: bool = True, dtype: torch.dtype = torch.float32,
                     length_groups: int = 1) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The losses of :func:`device_losses` on the host, as a (2, q) tensor of ``dtype``, the projected gradients
    g_i = (ℓ⁺_i − ℓ⁻_i) / 2ε (Gao et al. Alg. 1 line 11) in that dtype, and whether every loss is finite."""
    losses = device_losses(model, layers, batch, seeds, eps, outer, inner, length_groups=length_groups).cpu().to(dtype)
    return losses, projected_gradients(losses, eps), bool(torch.isfinite(losses).all())


def _prge_step(model, layers, batch, seeds, eps, lr, outer, inner, update, length_groups=1) -> dict:
    losses, _, _ = two_point_losses(model, layers, batch, seeds, eps, outer, inner, length_groups=length_groups)
    return estimate_and_update(layers, seeds, losses, eps, lr, update)


def estimate_and_update(layers: Sequence[LoRAFALinear], seeds: Sequence[int], losses: torch.Tensor, eps: float,
                        lr: float, update: bool = True) -> dict:
    """Alg. 1 lines 11 and 14 from the (2, q) losses ℓ⁺ (row 0) and ℓ⁻ (row 1) of a step: g and, when every
    loss is finite and ``update`` is set, B ← B − (η/q) Σ_i g_i z_i. Shared by the step above and by packed
    runs (:mod:`prge_lib.zo.packing`), which get their losses from a forward shared with other runs."""
    g = projected_gradients(losses, eps)
    finite = bool(torch.isfinite(losses).all())
    if update and finite:
        apply_update(layers, seeds, g, lr)
    return {"loss_plus": losses[0], "loss_minus": losses[1], "projected_grad": g, "finite": finite}


def apply_update(layers: Sequence[LoRAFALinear], seeds: Sequence[int], g: torch.Tensor | Sequence[float],
                 lr: float) -> None:
    """B ← B − (η/q) Σ_i g_i z_i (Gao et al. Alg. 1 line 14), z_i redrawn from s_i (or kept): the whole update
    from the q seeds and q projected gradients, so any holder of (seeds, g) applies it bit for bit (chapter 11)."""
    alphas = update_alphas(g, lr, len(seeds))
    for layer in layers:
        for seed, alpha in zip(seeds, alphas):
            layer.lora_B.add_(layer.noise(seed), alpha=alpha)            # z_i from s_i (redrawn unless kept)


def update_alphas(g: torch.Tensor | Sequence[float], lr: float, q: int) -> list[float]:
    """−(η/q) g_i for each of a step's projected gradients, the scale of z_i in :func:`apply_update` (and in the
    runtime replayer, :class:`prge_lib.deploy.client.ProgramReplayer`). The g are float32: a tensor's, or a
    recorded list cast back to float32 (a result file writes each with the fewest digits that name it,
    :func:`prge_lib.common.provenance.as_float32`), so a replay from any record gives the run's own alphas."""
    values = g.tolist() if isinstance(g, torch.Tensor) else as_float32([float(gi) for gi in g])
    return [-lr * gi / q for gi in values]


def step_record(out: dict) -> dict:
    """The trainer's record of a step from :func:`estimate_and_update`'s output: mean loss, finite, g."""
    return {"loss": float((out["loss_plus"] + out["loss_minus"]).mean() / 2), "finite": out["finite"],
            "projected_grad": out["projected_grad"].tolist()}


class PRGE(ZerothOrder):
    """P-RGE on LoRA-FA layers already injected into ``model`` (q = 1: MeZO on LoRA-FA)."""

    def __init__(self, model, layers: Sequence[LoRAFALinear], q: int, eps: float, lr: float, seed: int = 0,
                 outer: bool = True, inner: bool = True, keep_noise: bool | None = None, length_groups: int = 1):
        super().__init__(model, q, eps, lr, seed)
        self.layers, self.outer, self.inner, self.length_groups = list(layers), outer, inner, length_groups
        self.keep_noise = keeps_noise(self.layers, q, keep_noise)   # same numbers either way, only speed

    def trainable(self):
        return {f"{layer.index}.lora_B": layer.lora_B for layer in self.layers}

    def step(self, batch: Batch, t: int) -> dict:
        out = prge_step(self.model, self.layers, batch, step_seeds(self.seed, t, self.q), self.eps, self.lr,
                        self.outer, self.inner, keep_noise=self.keep_noise, length_groups=self.length_groups)
        return step_record(out)
