"""Randomized gradient estimation (RGE) and MeZO's seed trick (chapters 2 and 3).

RGE, Gao et al. eq. (1), for a loss L of parameters θ ∈ R^d:

    ĝ = (1/q) Σ_i  [L(θ + ε z_i) − L(θ − ε z_i)] / (2ε) · z_i,      z_i ~ N(0, I_d).

MeZO's seed trick, which redraws z from its seed instead of storing it, is in :mod:`prge_lib.zo.mezo`.

All noise in the library comes from :func:`gaussian`: a draw is a pure function of (seed, index, shape), so
MeZO on a parameter subset, P-RGE's LoRA-B copies and the trainer after a resume all see the same z. (LoRA-FA
layers can instead draw from :mod:`prge_lib.zo.prng`, the generator an exported program runs; chapter 10.)
"""
from __future__ import annotations

import math
import threading
from typing import Callable, Iterable, Sequence

import torch

_MIX = 0x9E3779B97F4A7C15


def mix_seed(*parts: int) -> int:
    """Combine integers into one 63-bit generator seed (a splitmix-style hash, so nearby inputs differ)."""
    h = 0
    for part in parts:
        h = (h ^ (int(part) + _MIX + (h << 6) + (h >> 2))) & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
        h = (h * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 27
    return h & 0x7FFFFFFFFFFFFFFF


_LOCAL = threading.local()     # one generator per thread and device: draws may run in parallel threads


def _generator(device: torch.device) -> torch.Generator:
    generators = _LOCAL.__dict__.setdefault("generators", {})
    key = str(device)
    if key not in generators:
        generators[key] = torch.Generator(device=device)
    return generators[key]


def gaussian(seed: int, index: int, shape: Sequence[int], device="cpu",
             dtype: torch.dtype = torch.float32, chunk: int = 0) -> torch.Tensor:
    """The standard normal tensor number ``index`` of noise seed ``seed`` (chunk ``chunk`` of it)."""
    device = torch.device(device)
    gen = _generator(device)
    gen.manual_seed(mix_seed(seed, index, chunk))
    return torch.randn(tuple(shape), generator=gen, device=device, dtype=dtype)


def check_zo_dtype(params: Iterable[torch.Tensor], what: str = "zeroth-order training") -> None:
    """Refuse bf16 trainable tensors: with an 8-bit significand, θ + ε·z rounds back to θ for most
    entries when ε ≈ 1e-3 (Guo et al. App. G.4), so L(θ+εz) − L(θ−εz) measures rounding, not slope."""
    for p in params:
        if p.dtype == torch.bfloat16:
            raise ValueError(
                f"{what} refuses bfloat16 parameters: bf16 keeps 8 significant bits, so a perturbation "
                f"ε·z of relative size below 2^-8 ≈ 0.4% is rounded away and the two losses differ by "
                f"rounding noise (Guo et al. App. G.4). Load the model in fp32 or fp16 instead.")


def check_zo_settings(q: int, E: int, eps: float | None = None, dtype: str | None = None) -> int:
    """The settings checks every zeroth-order entry point shares (trainer, benchmark, exporter), each error
    naming the bad value and what is allowed. Returns B = E / q, the rows per query."""
    if dtype == "bf16":
        raise ValueError(
            "zeroth-order training refuses bf16: its 8-bit significand rounds θ ± ε·z back to θ for "
            "most weights, so the loss difference measures rounding, not slope (Guo et al. App. G.4). "
            "Use --dtype fp32 or fp16.")
    if q < 1 or E < 1:
        raise ValueError(f"q and E must be at least 1, got q = {q}, E = {E}")
    if E % q:
        raise ValueError(f"the effective batch E = {E} must be a multiple of q = {q} "
                         f"(E = q·B with B rows per query); try E = {q * max(1, round(E / q))}")
    if eps is not None and not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a positive number, got {eps}")
    return E // q


def rge(loss: Callable[[torch.Tensor], float], theta: torch.Tensor, q: int, eps: float,
        seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two-sided q-query RGE (Gao et al. eq. 1) of ``loss`` at the flat vector ``theta``.

    Returns (ĝ, z, g): the estimate, the q directions (q, d) and the projected gradients g_i (q,).
    """
    if q < 1:
        raise ValueError(f"q must be at least 1, got {q}")
    if eps <= 0:
        raise ValueError(f"eps must be positive, got {eps}")
    z = torch.stack([gaussian(seed, i, theta.shape, theta.device, theta.dtype) for i in range(q)])
    g = torch.stack([(torch.as_tensor(loss(theta + eps * zi)) - torch.as_tensor(loss(theta - eps * zi)))
                     / (2 * eps) for zi in z]).to(theta.dtype)
    return (g[:, None] * z).mean(0), z, g


def rge_error_theory(d: int, q: int, grad_norm2: float) -> float:
    """E‖ĝ_q − g‖² = (d + 1)‖g‖² / q for the ε → 0 Gaussian estimator (chapter 2 derives it)."""
    return (d + 1) * grad_norm2 / q
