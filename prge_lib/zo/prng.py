"""A counter-based Gaussian generator written with integer tensor operations only (chapter 10).

ExecuTorch programs cannot call ``torch.randn``: random ops are not core ATen, and a generator that is reset
from a seed is state the exported graph cannot hold (Gao et al. §3.3 propose a custom op instead). A
counter-based generator needs neither: the draw for element k of tensor t under seed s is a pure function
``normal(s, t, k)``, computed from integer multiplies, shifts and xors that every backend already has.

    key      = mix(mix(mix(s mod 2^32) ^ s div 2^32) ^ (t · golden))     one 32-bit key per (seed, tensor t)
    u1, u2   = uniform(mix(mix(2j) ^ key)), uniform(mix(mix(2j + 1) ^ key))    pair j
    z[2j], z[2j + 1] = sqrt(−2 ln u1) · (cos, sin)(2π u2)                       Box–Muller, both halves

``mix`` is a 32-bit integer finaliser (xor-shift, multiply, xor-shift, multiply, xor-shift). All arithmetic
runs in int64 and is kept below 2^53 by splitting each 32-bit multiply into 16-bit halves, so no operation
overflows on any backend; shifts are written as floor divisions and multiplications, which are core ATen.
``uniform`` keeps the top 24 bits, which float32 represents exactly, and centres them in (0, 1):
``u = (h >> 8 + 0.5) / 2^24``. Using both Box–Muller halves makes one hash per normal draw.

The same function runs eagerly (the library's reference) and inside an exported program (the on-device
trainer), which is what makes eager-vs-runtime parity possible.
"""
from __future__ import annotations

import math
import os
import warnings

import torch

MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9          # 2^32 / φ: spreads consecutive tensor indices over the key space
MULTIPLIERS = (0x7FEB352D, 0x846CA68B)   # a well-mixing 32-bit finaliser's constants (low-bias hash)


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x >> bits for x ≥ 0, as a floor division: the shift operators with a Python scalar are not core ATen."""
    return torch.div(x, 1 << bits, rounding_mode="floor")


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x · c) mod 2^32 for x in [0, 2^32), without leaving 2^53: c is split into 16-bit halves."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + ((x * hi) & 0xFFFF) * 0x10000) & MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit integer hash of int64 tensors holding values in [0, 2^32)."""
    x = x ^ _shr(x, 16)
    x = _mul32(x, MULTIPLIERS[0])
    x = x ^ _shr(x, 15)
    x = _mul32(x, MULTIPLIERS[1])
    return x ^ _shr(x, 16)


def tensor_key(seed: torch.Tensor | int, index: int) -> torch.Tensor:
    """The 32-bit key of tensor ``index`` under ``seed``, a non-negative int below 2^63 (or an int64 tensor
    inside a program); both 32-bit halves of the seed enter the key."""
    seed = torch.as_tensor(seed, dtype=torch.int64)
    low, high = seed & MASK32, _shr(seed, 32)
    return mix32(mix32(mix32(low) ^ high) ^ ((index * GOLDEN) & MASK32))


def counter_normal(seed: torch.Tensor | int, index: int, shape: tuple[int, ...] | torch.Size,
                   dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                   offset: int = 0) -> torch.Tensor:
    """Standard normal draws of ``shape`` for tensor ``index`` under ``seed``, starting at element ``offset``
    of that tensor's stream. Elements 2j and 2j + 1 are the cosine and sine halves of one Box–Muller pair made
    from the hashes of counters 2j and 2j + 1, so a draw depends only on its position (a slice of a long draw
    equals a draw at that offset) and each hash yields one normal."""
    numel = math.prod(shape)
    key = tensor_key(seed, index)
    if device is not None:
        key = key.to(device)
    return _normal_run(key, offset, numel).reshape(tuple(shape)).to(dtype)


def counter_normal_seeds(seeds: torch.Tensor, index: int, numel: int, offset: int = 0,
                         device: torch.device | str | None = None, compiled: bool | None = None) -> torch.Tensor:
    """Elements ``offset`` … ``offset + numel − 1`` of tensor ``index``'s stream under each of the (q,) int64
    ``seeds``, as a (q, numel) float32 tensor in one vectorized computation: row i equals
    ``counter_normal(seeds[i], index, (numel,), offset=offset)`` bit for bit (the counters are hashed once and
    combined with the q keys by broadcasting). What draws a whole step's noise at once (chapter 10).

    ``compiled`` (default: on a GPU, unless ``PRGE_COMPILE_NOISE=0``): the same function through
    ``torch.compile``, one fused kernel instead of some thirty passes over (q, numel) int64 tensors, which is
    what the draw costs eagerly. Its uniforms are the eager ones bit for bit; its log, cos and sin are the
    compiler's, so a draw may differ from the eager one by an ulp or so (tests/test_prng.py)."""
    seeds = torch.as_tensor(seeds, dtype=torch.int64)
    if seeds.dim() != 1:
        raise ValueError(f"seeds must be a (q,) tensor, got shape {tuple(seeds.shape)}")
    key = tensor_key(seeds, index)
    if device is not None:
        key = key.to(device, non_blocking=True)       # q keys made on the host: the copy need not wait
    if compiled is None:
        compiled = compiles_on(key.device.type)
    if compiled and not _COMPILE_FAILED:
        try:
            return compiled_normal_run()(key.unsqueeze(1), offset, numel)
        except Exception as err:      # no compiler here (e.g. no Triton): the eager draw, said once
            _COMPILE_FAILED.append(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
            warnings.warn(f"the counter noise could not be compiled ({_COMPILE_FAILED[0]}); drawing it eagerly")
    return _normal_run(key.unsqueeze(1), offset, numel)


def compiles_on(device_type: str) -> bool:
    """Whether :func:`counter_normal_seeds` compiles its draw on this kind of device by default: on a GPU, unless
    ``PRGE_COMPILE_NOISE=0`` or compiling failed earlier in this process."""
    return device_type == "cuda" and os.environ.get("PRGE_COMPILE_NOISE", "1") != "0" and not _COMPILE_FAILED


_COMPILED: list = []
_COMPILE_FAILED: list[str] = []      # why compiling failed, once it has


def compiled_normal_run():
    """:func:`_normal_run` through ``torch.compile``, made once: compiled for the first draw's shape, and once more
    with symbolic sizes when another shape comes (torch.compile's automatic dynamic shapes), so that packs of
    many sizes, as a benchmark runs them, do not each pay a compilation."""
    if not _COMPILED:
        _COMPILED.append(torch.compile(_normal_run, fullgraph=True))
    return _COMPILED[0]


def counter_uniforms(key: torch.Tensor, offset: int, numel: int) -> torch.Tensor:
    """The uniforms in (0, 1) behind :func:`_normal_run`'s draws: one per counter of the Box–Muller pairs that
    elements ``offset`` … ``offset + numel − 1`` touch. Integer operations, then one conversion, one add and one
    multiply, each exactly rounded in IEEE arithmetic: the same bits on every device (the transforms that
    follow, log, cos and sin, are each kernel library's own)."""
    first, last = offset // 2, (offset + numel - 1) // 2                 # the Box–Muller pairs touched
    counters = torch.arange(2 * first, 2 * (last + 1), dtype=torch.int64, device=key.device)
    # hashing the counter before the key enters keeps two tensors' counter ranges from overlapping
    bits = _shr(mix32(mix32(counters) ^ key), 8)                         # 24 random bits per counter
    return (bits.to(torch.float32) + 0.5) * (1.0 / (1 << 24))           # in (0, 1), never 0 or 1


def _normal_run(key: torch.Tensor, offset: int, numel: int) -> torch.Tensor:
    """Normal draws ``offset`` … ``offset + numel − 1`` under ``key`` (a 0-d key gives (numel,), a (q, 1) key
    gives (q, numel)): the counter hash and Box–Muller of :func:`counter_normal`."""
    first = offset // 2                                                  # the first Box–Muller pair touched
    u = counter_uniforms(key, offset, numel)
    radius = torch.sqrt(-2.0 * torch.log(u[..., 0::2]))
    angle = (2 * math.pi) * u[..., 1::2]
    z = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=-1).flatten(-2)
    start = offset - 2 * first
    return z[..., start:start + numel]
