"""The P-RGE step with counter noise as a few whole-adapter operations that never wait for the host
(chapters 5 and 10).

:func:`prge_lib.zo.prge.prge_step` draws z per layer and per seed (about 210 layers × q small draws for
SmolLM2), copies the losses to the host and updates each layer's B once per seed from ``g.tolist()``. With
counter noise every layer's z is a slice of one stream (``LoRAFALinear.offset``), so a step can instead:

    Z         = the (q, D) draws of the whole adapter for the q seeds, in one call     (D = Σ numel of the B's)
    forward   the layers read their rows of Z (:func:`prge_lib.zo.lora.keeping_noise`)
    g         = (ℓ⁺ − ℓ⁻) / 2ε on the device; a non-finite loss zeroes the update instead of skipping it
    update    B_flat ← B_flat − (η/q) gᵀ Z, one (q)·(q, D) product added to every B by one foreach add

The same numbers as the per-layer step up to the summation order of the update, and nothing in the step
reads a tensor on the host: the trainer's record is copied out once, after the step (:meth:`FusedPRGE.step`).
Z holds q·D floats during the step, as ``keep_noise`` does.
"""
from __future__ import annotations

from typing import Sequence

import torch

from prge_lib.models.objective import Batch
from prge_lib.zo.lora import LoRAFALinear, keeping_noise
from prge_lib.zo.prge import PRGE, device_losses, projected_gradients, step_record, step_seeds
from prge_lib.zo.prng import counter_normal_seeds
from prge_lib.zo.rge import check_zo_dtype


def adapter_span(layers: Sequence[LoRAFALinear]) -> tuple[int, int]:
    """The counter range [start, end) the layers' B's occupy (one inject_lorafa call tiles [0, D))."""
    if not layers:
        raise ValueError("no LoRA-FA layers given; call prge_lib.zo.lora.inject_lorafa first")
    others = [layer for layer in layers if layer.noise_source != "counter"]
    if others:
        raise ValueError(f"the fused step needs counter noise (inject_lorafa(..., noise='counter')); "
                         f"{len(others)} layers use {others[0].noise_source!r}, the first is layer {others[0].index}")
    return min(layer.offset for layer in layers), max(layer.offset + layer.lora_B.numel() for layer in layers)


def draw_all(layers: Sequence[LoRAFALinear], seeds: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """Every layer's z for every seed in one vectorized draw: a (q, D) float32 tensor on the layers' device
    whose row i, from column ``layer.offset − start``, holds ``layer.draw(seeds[i])`` flattened, bit for bit
    (start, D from :func:`adapter_span`). ``seeds`` may be an int64 tensor already on the device (a captured
    step reads them from a buffer)."""
    start, end = adapter_span(layers)
    if not isinstance(seeds, torch.Tensor):
        seeds = torch.tensor(list(seeds), dtype=torch.int64)
    return counter_normal_seeds(seeds, 0, end - start, start, device=layers[0].lora_B.device)


def layer_views(layers: Sequence[LoRAFALinear], flat: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's part of a (..., D) tensor laid out as :func:`draw_all`'s rows, shaped (..., out, r): views."""
    start, _ = adapter_span(layers)
    return [flat[..., layer.offset - start:layer.offset - start + layer.lora_B.numel()]
            .view(*flat.shape[:-1], *layer.lora_B.shape) for layer in layers]


def kept_noise(layers: Sequence[LoRAFALinear], z: torch.Tensor, keys: Sequence[int]) -> list[dict]:
    """For :func:`prge_lib.zo.lora.keeping_noise`: layer j's rows of the (q, D) draw ``z`` under ``keys[i]``
    (the seeds, or any q distinct labels the step's copies name)."""
    return [{key: part[i] for i, key in enumerate(keys)} for part in layer_views(layers, z)]


def fused_update(layers: Sequence[LoRAFALinear], z: torch.Tensor, losses: torch.Tensor, eps: float,
                 lr: float) -> dict:
    """Alg. 1 lines 11 and 14 on the device from the (2, q) losses and the (q, D) draw ``z``: g, and
    B ← B − (η/q) gᵀZ as one product and one foreach add, zeroed when a loss is not finite. Returns the losses
    ℓ⁺, ℓ⁻, g and ``finite`` as device tensors."""
    g = projected_gradients(losses, eps)                                           # Alg. 1 line 11
    finite = torch.isfinite(losses).all()
    apply_fused_update(layers, z, torch.where(finite, g, torch.zeros_like(g)), lr)
    return {"loss_plus": losses[0], "loss_minus": losses[1], "projected_grad": g, "finite": finite}


def apply_fused_update(layers: Sequence[LoRAFALinear], z: torch.Tensor, g: torch.Tensor, lr: float) -> None:
    """Alg. 1 line 14 for the whole adapter: B ← B − (η/q) gᵀZ from the (q,) projected gradients ``g`` and the
    (q, D) draw ``z``, one product and one foreach add (what a fused step does, and what a replay of its
    recorded g does again, :func:`prge_lib.zo.replay.replay_fused`)."""
    coefficients = g * (-lr / z.shape[0])
    step = coefficients @ z                                                        # (D,): −(η/q) gᵀZ, line 14
    torch._foreach_add_([layer.lora_B for layer in layers],
                        [part.to(layer.lora_B.dtype) for layer, part in zip(layers, layer_views(layers, step))])


@torch.no_grad()
def fused_prge_step(model, layers: Sequence[LoRAFALinear], batch: Batch, seeds: Sequence[int] | torch.Tensor,
                    eps: float, lr: float, outer: bool = True, inner: bool = True,
                    device_mask: bool | None = None) -> dict:
    """One P-RGE step (Gao et al. Alg. 1) with counter noise, as :func:`prge_lib.zo.prge.prge_step` computes
    it but without a host sync: Z from :func:`draw_all`, kept for the forward and the update
    (:func:`fused_update`). Returns the losses ℓ⁺, ℓ⁻, g and ``finite`` as device tensors; a non-finite loss
    leaves every B as it was (its coefficients are zeroed). ``seeds`` given as a device tensor: the copies
    are labelled 0 … q−1 instead (nothing of the step then depends on the seeds' values on the host).
    ``device_mask``: the attention mask built on the device (default: on a GPU; ``objective.tail_logits``)."""
    check_zo_dtype([layer.lora_B for layer in layers], "P-RGE")
    z = draw_all(layers, seeds)                                                    # (q, D)
    keys = list(range(z.shape[0])) if isinstance(seeds, torch.Tensor) else list(seeds)
    with keeping_noise(layers, kept_noise(layers, z, keys)):
        losses = device_losses(model, layers, batch, keys, eps, outer, inner, device_mask).to(torch.float32)
    return fused_update(layers, z, losses, eps, lr)


def host_record(out: dict) -> dict:
    """The trainer's record (:func:`prge_lib.zo.prge.step_record`) of a fused step: the losses and g come to
    the host in one copy, the step's only sync."""
    host = torch.stack([out["loss_plus"], out["loss_minus"], out["projected_grad"]]).cpu()
    return step_record({"loss_plus": host[0], "loss_minus": host[1], "projected_grad": host[2],
                        "finite": bool(torch.isfinite(host[:2]).all())})


class FusedPRGE(PRGE):
    """:class:`prge_lib.zo.prge.PRGE` with counter noise, stepped by :func:`fused_prge_step` (the noise is
    always kept: q·D floats during a step)."""

    def __init__(self, model, layers: Sequence[LoRAFALinear], q: int, eps: float, lr: float, seed: int = 0,
                 outer: bool = True, inner: bool = True):
        adapter_span(layers)                      # counter noise, or a ValueError now rather than at step 0
        super().__init__(model, layers, q, eps, lr, seed, outer, inner, keep_noise=True)

    def step(self, batch: Batch, t: int) -> dict:
        out = fused_prge_step(self.model, self.layers, batch, step_seeds(self.seed, t, self.q), self.eps,
                              self.lr, self.outer, self.inner)
        return host_record(out)
