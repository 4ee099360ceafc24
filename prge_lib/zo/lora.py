"""LoRA-FA with n copies of B: the layer P-RGE perturbs (Gao et al. §3.1–3.2, Fig. 1; chapters 4–6).

A LoRA-FA layer adds a low-rank path to a frozen projection W (out × in):

    y = x Wᵀ + (α/r) · (x Aᵀ) Bᵀ,     A ∈ R^{r×in} frozen (random),  B ∈ R^{out×r} trained (starts at 0).

For P-RGE the input batch holds n groups of rows (n = q queries × {+ε, −ε}); group c is multiplied by its own
copy B_c = B + k_c ε z_{i_c}, with one batched matmul. Only the master B is a parameter; the copies exist
during the forward only, and the noise z_i is drawn from the query's seed (``prge_lib.zo.rge.gaussian``) with
the layer's index, so nothing of size q·d outlives a step (within a step the trainer may keep the draws for
the update: :func:`draw_noise`, :func:`keeping_noise`; chapter 5). With ``noise="counter"`` it comes instead
from ``prge_lib.zo.prng``, at the layer's offset in one counter space over the whole adapter, so an exported
program can draw every layer's z in one call (chapter 10).

Shapes follow nn.Linear and peft (A: r × in, B: out × r), so in ≠ out works and adapters move to peft.
"""
from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from prge_lib.zo.defaults import DEFAULT_TARGETS, LORA_ALPHA, LORA_R, NOISE_SOURCES  # noqa: F401 (re-exported)
from prge_lib.zo.prng import counter_normal
from prge_lib.common.provenance import atomic_file
from prge_lib.zo.rge import gaussian



def check_noise_source(noise: str) -> str:
    """``noise`` if it names a noise source, else a ValueError listing the ones there are."""
    if noise not in NOISE_SOURCES:
        raise ValueError(f"unknown noise source {noise!r}; choose from {NOISE_SOURCES}")
    return noise


class LoRAFALinear(nn.Module):
    """A frozen linear layer (plain, INT8 or NF4) plus a LoRA-FA path with ``n`` noise copies of B."""

    def __init__(self, base: nn.Module, r: int = LORA_R, alpha: float = LORA_ALPHA, index: int = 0,
                 generator: torch.Generator | None = None, noise: str = "torch"):
        super().__init__()
        if r < 1:
            raise ValueError(f"LoRA rank r must be at least 1, got {r}")
        self.noise_source = check_noise_source(noise)   # "counter": the generator an exported program can run (chapter 10)
        self.offset = 0                 # counter source: where this B starts in the model's flattened adapter
        self.base = base
        self.in_features, self.out_features = base.in_features, base.out_features
        self.r, self.alpha, self.scaling, self.index = r, alpha, alpha / r, index
        device = next(base.parameters()).device
        # peft's LoRA-A init, U(-1/sqrt(in), 1/sqrt(in)): with A ~ N(0, 1/r) instead, ZO diverges (chapter 4)
        bound = 1 / math.sqrt(self.in_features)
        a = torch.empty(r, self.in_features).uniform_(-bound, bound, generator=generator)
        self.register_buffer("lora_A", a.to(device))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, r, device=device))
        self.copies: list[tuple[int, float]] | None = None   # (seed, signed scale) per group, set by perturbed()
        self.kept: dict[int, torch.Tensor] | None = None     # seed -> z, set by keeping_noise()

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, r={self.r}, alpha={self.alpha}"

    def noise(self, seed: int) -> torch.Tensor:
        """z for this layer under query seed ``seed`` (same draw as MeZO's over the list of B's)."""
        if self.kept is not None and seed in self.kept:
            return self.kept[seed]
        return self.draw(seed)

    def draw(self, seed: int) -> torch.Tensor:
        """A fresh draw of z: a pure function of the seed and the layer's place, whichever thread runs it."""
        if self.noise_source == "counter":
            # one counter space over the whole adapter: a program draws every layer's z in one call
            return counter_normal(seed, 0, self.lora_B.shape, device=self.lora_B.device, offset=self.offset)
        return gaussian(seed, self.index, self.lora_B.shape, self.lora_B.device)

    def copy_weights(self) -> torch.Tensor:
        """The (n, out, r) stack of B + s_c z_c for the current copies (z drawn once per distinct seed).

        Seeds and scales may be tensors (inside an exported program, where ε is an input)."""
        seeds, scales = [seed for seed, _ in self.copies], [scale for _, scale in self.copies]
        distinct = list(dict.fromkeys(seeds))
        blocks = len(seeds) // len(distinct)
        if seeds == distinct * blocks and all(isinstance(scale, float) for scale in scales):
            # every loop setting lists the same seeds in each of its blocks (one per sign, chapter 6): two
            # broadcast passes write all n copies, B + s_c z_c, from the u distinct z's
            # the scales multiply as Python numbers: a tensor of them would be a host-to-device copy per layer
            z = torch.stack([self.noise(seed) for seed in distinct])                        # (u, out, r)
            u = len(distinct)
            parts = []
            for block in range(blocks):
                own = scales[block * u:(block + 1) * u]
                parts.append(z * own[0] if len(set(own)) == 1 else torch.stack([zj * s for zj, s in zip(z, own)]))
            return torch.cat(parts).add_(self.lora_B)                                       # as B + s·z, bit for bit
        draws: dict[int, torch.Tensor] = {}
        copies = []
        for seed, scale in self.copies:
            if seed not in draws:
                draws[seed] = self.noise(seed)
            copies.append(self.lora_B + scale * draws[seed])
        return torch.stack(copies)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        # x Aᵀ as a linear layer (the same product, bit for bit), so an exported program hands it to the
        # backend's fully-connected kernel with A as a constant weight instead of a portable matmul
        h = F.linear(x.to(self.lora_A.dtype), self.lora_A).to(out.dtype)   # (N, L, r), N = n·b
        # accumulate into the fresh base output in place when no graph is recorded (ZO): one pass less
        inplace = not torch.is_grad_enabled()
        if self.copies is None:
            flat, b = out.reshape(-1, self.out_features), self.lora_B.T.to(out.dtype)
            hr = h.reshape(-1, self.r)
            flat = flat.addmm_(hr, b, alpha=self.scaling) if inplace else torch.addmm(flat, hr, b, alpha=self.scaling)
            return flat.reshape(out.shape)
        n = len(self.copies)
        if x.shape[0] % n:
            raise ValueError(f"batch of {x.shape[0]} rows cannot be split into {n} copies")
        # group c = rows c·b … (c+1)·b − 1: one batched matmul with the n copies of B
        grouped, hg = out.reshape(n, -1, self.out_features), h.reshape(n, -1, self.r)
        b = self.copy_weights().transpose(1, 2).to(out.dtype)             # (n, r, out)
        grouped = grouped.baddbmm_(hg, b, alpha=self.scaling) if inplace else \
            torch.baddbmm(grouped, hg, b, alpha=self.scaling)
        return grouped.reshape(out.shape)


def inject_lorafa(model: nn.Module, targets: Sequence[str] = DEFAULT_TARGETS, r: int = LORA_R,
                  alpha: float = LORA_ALPHA, seed: int = 0, noise: str = "torch") -> list[LoRAFALinear]:
    """Wrap every linear layer whose attribute name is in ``targets`` with :class:`LoRAFALinear` and freeze
    everything else. Returns the new layers in model order (their ``index`` is their position).
    ``noise`` picks the generator of the perturbations (``prge_lib.zo.rge.gaussian``)."""
    found = [(name, module) for name, module in model.named_modules()
             if name.rsplit(".", 1)[-1] in targets and hasattr(module, "in_features")]
    if not found:
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if hasattr(m, "in_features")})
        raise ValueError(f"no linear layer named any of {list(targets)}; this model's linear layers: {names}")
    for p in model.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(seed)
    layers, offset = [], 0
    for index, (name, module) in enumerate(found):
        layer = LoRAFALinear(module, r, alpha, index, gen, noise)
        layer.offset, offset = offset, offset + layer.lora_B.numel()
        _replace_submodule(model, name, layer)
        layers.append(layer)
    return layers


def _replace_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, attr, module)


def lorafa_layers(model: nn.Module) -> list[LoRAFALinear]:
    return [m for m in model.modules() if isinstance(m, LoRAFALinear)]


@contextmanager
def perturbed(layers: Sequence[nn.Module], copies: Sequence[tuple[int, float]]):
    """Within the block, a forward's batch is read as len(copies) groups; group c uses B + s_c · z(seed_c).

    ``layers``: LoRA-FA layers, or any layers whose forward reads ``copies`` the same way (SensZOQ's sparse
    values, :class:`prge_lib.methods.senszoq.sparse.SparseDenseLinear`: values + s_c · z(seed_c))."""
    for layer in layers:
        layer.copies = list(copies)
    try:
        yield
    finally:
        for layer in layers:
            layer.copies = None


_DRAW_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}    # (process, threads) -> pool; a fork starts anew


def draw_noise(layers: Sequence[LoRAFALinear], seeds: Sequence[int]) -> list[dict[int, torch.Tensor]]:
    """Every layer's z for every seed, layer j's in the j-th dict (seed -> z), for :func:`keeping_noise`.

    A drawing kernel runs on one core, so with torch's noise on the CPU the layers are drawn in as many
    threads as torch uses; the values do not depend on it (each draw is seeded by its seed and layer alone).
    Counter noise, whose draw is itself a parallel computation, is drawn in this thread."""
    def draw_layer(layer: LoRAFALinear) -> dict[int, torch.Tensor]:
        return {seed: layer.draw(seed) for seed in dict.fromkeys(seeds)}

    threads = torch.get_num_threads()
    if threads < 2 or any(layer.noise_source != "torch" or layer.lora_B.device.type != "cpu" for layer in layers):
        return [draw_layer(layer) for layer in layers]
    key = (os.getpid(), threads)
    if key not in _DRAW_POOLS:
        _DRAW_POOLS[key] = ThreadPoolExecutor(threads, thread_name_prefix="prge-noise")
    return list(_DRAW_POOLS[key].map(draw_layer, layers))


@contextmanager
def keeping_noise(layers: Sequence[LoRAFALinear], given: Sequence[dict[int, torch.Tensor]]):
    """Within the block layer j uses ``given[j]`` (seed -> z, e.g. from :func:`draw_noise`) instead of drawing,
    so a step draws each z once. Outside the block nothing is kept."""
    for layer, kept in zip(layers, given, strict=True):
        layer.kept = kept
    try:
        yield
    finally:
        for layer in layers:
            layer.kept = None


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trained adapter: one B per layer (and its frozen A), keyed by module name, on the CPU."""
    state = {}
    for name, module in model.named_modules():
        if isinstance(module, LoRAFALinear):
            state[f"{name}.lora_A"] = module.lora_A.detach().cpu().clone()
            state[f"{name}.lora_B"] = module.lora_B.detach().cpu().clone()
    return state


def load_adapter(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy an adapter from :func:`adapter_state` into a model that already has the same LoRA-FA layers."""
    layers = {name: m for name, m in model.named_modules() if isinstance(m, LoRAFALinear)}
    expected = {f"{n}.lora_{k}" for n in layers for k in "AB"}
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise ValueError(f"adapter does not match the model's LoRA-FA layers: missing {missing[:3]}, "
                         f"unexpected {extra[:3]} ({len(missing)} missing, {len(extra)} unexpected)")
    with torch.no_grad():
        for name, layer in layers.items():
            for key, target in (("A", layer.lora_A), ("B", layer.lora_B)):
                value = state[f"{name}.lora_{key}"]
                if value.shape != target.shape:
                    raise ValueError(f"{name}.lora_{key}: shape {tuple(value.shape)} in the adapter, "
                                     f"{tuple(target.shape)} in the model")
                target.copy_(value)


def save_adapter(model: nn.Module, path: str | Path, metadata: dict[str, str] | None = None) -> Path:
    """Write the adapter as safetensors (atomically)."""
    from safetensors.torch import save_file

    with atomic_file(path) as tmp:
        save_file(adapter_state(model), str(tmp), metadata=metadata)
    return Path(path)


def read_adapter(path: str | Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


@torch.no_grad()
def merge_lorafa(model: nn.Module) -> int:
    """Fold every LoRA-FA path into its base weight, W ← W + (α/r) B A, and put the plain layer back.

    Returns the number of layers merged. Quantized bases (INT8/NF4) cannot be merged: evaluate them
    unmerged (a LoRA-FA layer without copies is an ordinary forward)."""
    merged = 0
    for name, module in list(model.named_modules()):
        if not isinstance(module, LoRAFALinear):
            continue
        if type(module.base) is not nn.Linear:
            raise TypeError(f"{name}: cannot merge into a {type(module.base).__name__} base; "
                            f"evaluate the unmerged model instead")
        weight = module.base.weight
        weight.copy_((weight.float() + module.scaling * module.lora_B @ module.lora_A).to(weight.dtype))
        _replace_submodule(model, name, module.base)
        merged += 1
    return merged

