"""The P-RGE training step as one exportable module (Gao et al. Alg. 1 + 2, §3.3; chapter 10).

Gao et al.'s dual-forwarding LoRA-FA module keeps the +ε and −ε copies of B inside the program and recovers the
previous noise from their difference, because the runtime cannot reset a random generator. Here the noise comes
from the counter-based generator of :mod:`prge_lib.zo.prng` (integer ops, a pure function of seed and position),
so nothing but the master B is needed, and the whole step is a pure function:

    inputs   input_ids (b, L), attention_mask (b, L), targets (b, T)     one batch of b rows, left-padded
             adapter (d,)                                                every LoRA-B, flattened, fp32
             seeds (q,) int64, lr (), eps ()                             tensors, never baked-in constants
    program  the batch repeated 2q times; group c uses B + s_c ε z(seed_c)          Alg. 1 lines 4–9
             losses ℓ±_i = answer-token cross-entropy of each group                   line 9
             g_i = (ℓ+_i − ℓ−_i) / 2ε;   B' = B − (lr/q) Σ_i g_i z_i                  lines 11, 14
    outputs  losses (2, q), adapter' (d,)

The host keeps the adapter between calls (and can save it between app runs); it feeds the batch and the step's
seeds, and keeps ``adapter'`` only when the losses are finite. One call is one full training step, so the
program's trajectory can be compared with the eager trainer step by step.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from prge_lib.zo.lora import LoRAFALinear, keeping_noise, perturbed
from prge_lib.models.objective import Batch, copy_losses
from prge_lib.zo.prng import counter_normal


def flat_adapter(layers) -> torch.Tensor:
    """The LoRA-B matrices of ``layers``, flattened in layer order: a program's state vector."""
    return torch.cat([layer.lora_B.detach().reshape(-1) for layer in layers])


def split_adapter(adapter: torch.Tensor, shapes) -> list[torch.Tensor]:
    """A state vector (:func:`flat_adapter`) cut into matrices of ``shapes`` (views), its length checked first."""
    sizes = [math.prod(shape) for shape in shapes]
    if adapter.shape != (sum(sizes),):
        raise ValueError(f"adapter must have shape ({sum(sizes)},), got {tuple(adapter.shape)}")
    return [part.reshape(shape) for part, shape in zip(torch.split(adapter, sizes), shapes)]


@torch.no_grad()
def load_flat_adapter(layers, adapter: torch.Tensor) -> None:
    """Write a state vector (:func:`flat_adapter`) back into the LoRA-B parameters of ``layers``."""
    for layer, part in zip(layers, split_adapter(adapter, [tuple(layer.lora_B.shape) for layer in layers])):
        layer.lora_B.copy_(part)


class TrainStep(nn.Module):
    """One P-RGE step (outer and inner loop in one forward) over the LoRA-FA layers of ``model``."""

    def __init__(self, model: nn.Module, q: int):
        super().__init__()
        if q < 1:
            raise ValueError(f"q must be at least 1, got {q}")
        self.q = q
        self.layers = [m for m in model.modules() if isinstance(m, LoRAFALinear)]
        if not self.layers:
            raise ValueError("the model has no LoRA-FA layers; call prge_lib.zo.lora.inject_lorafa first")
        counter = [layer for layer in self.layers if layer.noise_source != "counter"]
        if counter:
            raise ValueError("an exported step needs the counter noise source (inject_lorafa(..., "
                             f"noise='counter')); {len(counter)} layers use {counter[0].noise_source!r}")
        self.loss = CopyLosses(model, 2 * q)
        names = {m: n for n, m in self.loss.named_modules()}
        self.names = [f"{names[layer]}.lora_B" for layer in self.layers]
        self.shapes = [tuple(layer.lora_B.shape) for layer in self.layers]
        self.sizes = [layer.lora_B.numel() for layer in self.layers]
        offsets = [layer.offset for layer in self.layers]
        if offsets != [sum(self.sizes[:j]) for j in range(len(self.sizes))]:
            raise ValueError("the LoRA-FA layers' noise offsets do not tile the adapter in layer order; "
                             "inject the layers with one inject_lorafa call")

    def adapter(self) -> torch.Tensor:
        """The model's current LoRA-B matrices, flattened in layer order: the program's state vector."""
        return flat_adapter(self.layers)

    def load(self, adapter: torch.Tensor) -> None:
        """Write a state vector back into the model's LoRA-B parameters."""
        load_flat_adapter(self.layers, adapter)

    def forward(self, input_ids, attention_mask, targets, adapter, seeds, lr, eps):
        matrices = split_adapter(adapter, self.shapes)
        seed_list = [seeds[i] for i in range(self.q)]
        # z_i for every layer in one draw per seed (the layers' counter ranges tile the adapter), kept for
        # the forward and the update: a small graph instead of one generator per layer, seed and use
        noise = [torch.split(counter_normal(s, 0, (sum(self.sizes),)), self.sizes) for s in seed_list]
        given = [{s: z[j].reshape(self.shapes[j]) for s, z in zip(seed_list, noise)} for j in range(len(self.layers))]
        copies = [(s, eps) for s in seed_list] + [(s, -eps) for s in seed_list]
        with keeping_noise(self.layers, given), perturbed(self.layers, copies):
            losses = torch.func.functional_call(self.loss, dict(zip(self.names, matrices)),
                                                (input_ids, attention_mask, targets), strict=False)
        losses = losses.reshape(2, self.q)
        g = (losses[0] - losses[1]) / (2 * eps)                                  # Alg. 1 line 11
        step = sum(gi * z for gi, z in zip(g.unbind(), (torch.cat(parts) for parts in noise)))
        return losses, adapter - (lr / self.q) * step                            # line 14


class ReplayStep(nn.Module):
    """One step's update alone, for a device that follows a run by replaying broadcasts (chapter 11): no model,
    no forward, only the counter generator and q scaled additions over the flattened adapter.

    inputs   adapter (d,) fp32, seeds (q,) int64, alphas (q,) fp32 with α_i = −η g_i / q (η the replay's rate)
    program  B ← B + α_i z(seed_i) for i = 1 … q, in that order       Alg. 1 line 14, one seed at a time
    outputs  adapter' (d,)

    The order and the α are those of the eager update (:func:`prge_lib.zo.prge.apply_update`), so the two differ
    only where the kernels do: the runtime's log, cos and sin, and its multiply and add against PyTorch's."""

    def __init__(self, size: int, q: int):
        super().__init__()
        if q < 1 or size < 1:
            raise ValueError(f"a replay step needs q >= 1 and an adapter of at least one number, got q {q}, "
                             f"size {size}")
        self.size, self.q = size, q

    def forward(self, adapter, seeds, alphas):
        for i in range(self.q):
            adapter = adapter + alphas[i] * counter_normal(seeds[i], 0, (self.size,))
        return adapter


class CopyLosses(nn.Module):
    """The loss of each of the n copies of a batch (``prge_lib.models.objective.copy_losses``) as a module."""

    def __init__(self, model: nn.Module, n: int):
        super().__init__()
        self.model, self.n = model, n

    def forward(self, input_ids, attention_mask, targets):
        return copy_losses(self.model, Batch(input_ids, attention_mask, targets).repeat(self.n), self.n)
