"""Packed runs: R independent ZO runs of one base model share every forward (chapter 5's outer loop, one axis
further).

P-RGE's outer loop stacks the 2q perturbed copies of one run's B in one batch (``prge_lib.zo.lora``). Runs
that train the same frozen base are independent in everything but that base, so their copies can share the
forward too: run r, with its own frozen A_r, trained B_r, q_r, ε_r, η_r, run seed and data, puts its
2·q_r copies × b_r rows in the batch, and each projection computes

    y = x Wᵀ  (once, for every row of every run)  +  (α_r/r_r) · (x A_rᵀ) B_{r,c}ᵀ  (per copy c of run r),

with B_{r,c} = B_r ± ε_r z drawn exactly as the unpacked run draws it: each run keeps its own
:class:`~prge_lib.zo.lora.LoRAFALinear` layers (made by ``inject_lorafa`` with the run's seed, so its A,
noise indices and counter offsets are the unpacked run's), only the base product is shared. Each run's step
is then Alg. 1 lines 11 and 14 on its own losses (:func:`prge_lib.zo.prge.estimate_and_update`), with the
noise seeds ``step_seeds(seed_r, t_r, q_r)``. A pack's forward is one forward with the outer and inner loops
on for every run (MeZO on LoRA-FA is the q = 1 run); the switches change speed, not the numbers, up to float
rounding (chapter 5), which is also all that separates a packed run from the same run alone
(tests/test_packing.py derives the bound).

Rows of different runs (other tasks, other prompts) are left-padded to one length and their targets to one
width (``prge_lib.models.objective.fit_width``); the mask keeps padding out of every real row.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from prge_lib.models.buckets import bucket_length
from prge_lib.models.objective import Batch, fit_width, row_losses
from prge_lib.zo.estimator import step_seeds
from prge_lib.zo.fused import adapter_span, draw_all, fused_update, host_record, kept_noise
from prge_lib.zo.lora import LoRAFALinear, draw_noise, inject_lorafa, keeping_noise, perturbed
from prge_lib.zo.prge import estimate_and_update, keeps_noise, step_record
from prge_lib.zo.rge import check_zo_dtype


class PackedLoRAFALinear(nn.Module):
    """One frozen projection shared by R runs, each with its own LoRA-FA layer on it (``runs[r]``).

    In a pack's forward (``rows`` set: (run, rows) in batch order) the base product runs once over all rows and
    each run adds its copies' low-rank path to its own rows; with ``solo`` set the layer is run ``solo``'s
    LoRA-FA layer alone (an ordinary forward: evaluation, or a step of that run by itself)."""

    def __init__(self, runs: Sequence[LoRAFALinear]):
        super().__init__()
        if not runs or any(layer.base is not runs[0].base for layer in runs):
            raise ValueError("a packed layer needs at least one LoRA-FA layer, all on the same base projection")
        self.base = runs[0].base
        self.runs = nn.ModuleList(runs)
        self.rows: list[tuple[int, int]] | None = None
        self.solo: int | None = None

    def extra_repr(self) -> str:
        return f"runs={len(self.runs)}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.solo is not None:
            return self.runs[self.solo](x)
        if self.rows is None:
            raise RuntimeError("a packed LoRA-FA layer runs inside a pack's step or Pack.solo(run)")
        if sum(n for _, n in self.rows) != x.shape[0]:
            raise ValueError(f"a batch of {x.shape[0]} rows, but the pack's runs hold {self.rows} rows")
        out = self.base(x)
        inplace = not torch.is_grad_enabled()
        runs = [self.runs[j] for j, _ in self.rows]
        per_copy = {n // len(layer.copies) for layer, (_, n) in zip(runs, self.rows)}
        if len(per_copy) == 1 and len({(layer.r, layer.scaling) for layer in runs}) == 1:
            # every run has b rows per copy: A and B gathered per copy, two batched products for all C copies
            layer = runs[0]
            counts = [len(layer.copies) for layer in runs]
            a = torch.cat([layer.lora_A.expand(k, -1, -1) for layer, k in zip(runs, counts)])   # (C, r, in)
            # copy c's b rows of L tokens: (C, b·L, in) times A_cᵀ, then times its B_cᵀ (C, r, out)
            h = torch.bmm(x.to(a.dtype).reshape(len(a), -1, x.shape[-1]), a.transpose(1, 2)).to(out.dtype)
            copies = torch.cat([layer.copy_weights() for layer in runs]).transpose(1, 2).to(out.dtype)
            grouped = out.reshape(len(a), -1, self.base.out_features)
            grouped = grouped.baddbmm_(h, copies, alpha=layer.scaling) if inplace else \
                torch.baddbmm(grouped, h, copies, alpha=layer.scaling)
            return grouped.reshape(out.shape)
        # runs with other rows per copy (or ranks): each run's rows in turn, the products of LoRAFALinear
        parts, start = [], 0
        for layer, (_, n) in zip(runs, self.rows):
            rows = out[start:start + n]          # rows of one run: a contiguous block of ``out``
            h = F.linear(x[start:start + n].to(layer.lora_A.dtype), layer.lora_A).to(out.dtype)
            k = len(layer.copies)
            grouped, hg = rows.reshape(k, -1, self.base.out_features), h.reshape(k, -1, layer.r)
            b = layer.copy_weights().transpose(1, 2).to(out.dtype)
            if inplace:
                grouped.baddbmm_(hg, b, alpha=layer.scaling)
            else:
                parts.append(torch.baddbmm(grouped, hg, b, alpha=layer.scaling).reshape(rows.shape))
            start += n
        return out if inplace else torch.cat(parts)


def inject_packed(model: nn.Module, adapters: Sequence[dict]) -> tuple[list[PackedLoRAFALinear],
                                                                        list[list[LoRAFALinear]]]:
    """Put R runs' LoRA-FA layers on ``model``'s projections: ``adapters[r]`` holds run r's keyword arguments of
    :func:`~prge_lib.zo.lora.inject_lorafa` (targets, r, alpha, seed, noise), so its layers are exactly the ones
    an unpacked run makes. Returns the packed layers and each run's own layers (model order)."""
    if not adapters:
        raise ValueError("a pack needs at least one run")
    per_run, names = [], None
    for r, settings in enumerate(adapters):
        layers = inject_lorafa(model, **settings)
        wrapped = [name for name, m in model.named_modules() if isinstance(m, LoRAFALinear)]
        if names is not None and wrapped != names:
            raise ValueError(f"run {r} puts LoRA-FA on other projections than run 0 ({len(wrapped)} vs "
                             f"{len(names)}): the runs of a pack need the same targets")
        names = wrapped
        for name, layer in zip(wrapped, layers):
            model.set_submodule(name, layer.base)        # the next run wraps the same plain projections
        per_run.append(layers)
    packed = [PackedLoRAFALinear([layers[j] for layers in per_run]) for j in range(len(names))]
    for name, layer in zip(names, packed):
        model.set_submodule(name, layer)
    return packed, per_run


@dataclass
class PackedRun:
    """One run of a pack: its LoRA-FA layers and ZO settings (those of ``prge_lib.zo.prge.PRGE``)."""

    layers: list[LoRAFALinear]
    q: int
    eps: float
    lr: float
    seed: int
    keep_noise: bool


class Pack:
    """R ZO runs on one model (:func:`inject_packed`); :meth:`step` trains any subset of them in one forward.

    ``fused``: each run's noise drawn in one counter-generator call and its update made on the device
    (:mod:`prge_lib.zo.fused`; needs counter noise), the records read in one copy after the step.
    ``buckets``: the pack's batch padded to the smallest of these lengths that holds it."""

    def __init__(self, model: nn.Module, layers: Sequence[PackedLoRAFALinear], runs: Sequence[PackedRun],
                 pad_id: int, fused: bool = False, buckets: Sequence[int] | None = None):
        self.model, self.layers, self.runs, self.pad_id = model, list(layers), list(runs), pad_id
        self.fused, self.buckets = fused, tuple(buckets) if buckets else None
        for r, run in enumerate(self.runs):
            check_zo_dtype([layer.lora_B for layer in run.layers], f"P-RGE (packed run {r})")
            if fused:
                adapter_span(run.layers)          # counter noise, or a ValueError naming the layer now

    @contextlib.contextmanager
    def solo(self, r: int):
        """Within the block the model is run ``r``'s model alone (its B, no copies)."""
        for layer in self.layers:
            layer.solo = r
        try:
            yield
        finally:
            for layer in self.layers:
                layer.solo = None

    @torch.no_grad()
    def step(self, work: dict[int, tuple[Batch, int]]) -> dict[int, dict]:
        """One step of each run in ``work`` (run → (its batch, its step t)), all in one forward; returns each
        run's record (that of ``PRGE.step``). A run whose losses are not finite is not updated (``finite``
        False); the others are not affected by it."""
        order = list(work)
        unknown = [r for r in order if not 0 <= r < len(self.runs)]
        if unknown:
            raise ValueError(f"runs {unknown} are not in this pack of {len(self.runs)}")
        seeds = {r: step_seeds(self.runs[r].seed, work[r][1], self.runs[r].q) for r in order}
        width = max(work[r][0].input_ids.shape[1] for r in order)
        if self.buckets:
            width = bucket_length(width, self.buckets)
        target_width = max(work[r][0].targets.shape[1] for r in order)
        parts, rows = [], []
        for r in order:
            copies = 2 * self.runs[r].q
            parts.append(fit_width(work[r][0], width, self.pad_id, target_width).repeat(copies))
            rows.append((r, parts[-1].rows))
        batch = Batch(*(torch.cat([getattr(p, f) for p in parts]) for f in ("input_ids", "attention_mask",
                                                                              "targets")))
        with contextlib.ExitStack() as stack:
            noise = {}
            for r in order:
                run = self.runs[r]
                if self.fused:
                    noise[r] = draw_all(run.layers, seeds[r])                        # (q, D) in one call
                    stack.enter_context(keeping_noise(run.layers, kept_noise(run.layers, noise[r], seeds[r])))
                elif run.keep_noise:
                    stack.enter_context(keeping_noise(run.layers, draw_noise(run.layers, seeds[r])))
                eps = run.eps
                stack.enter_context(perturbed(run.layers, [(s, eps) for s in seeds[r]] +
                                              [(s, -eps) for s in seeds[r]]))
            stack.enter_context(_rows(self.layers, rows))
            values = row_losses(self.model, batch)
            if not self.fused:
                values = values.cpu()
            records, start = {}, 0
            for r, n in rows:
                run = self.runs[r]
                losses = values[start:start + n].reshape(2 * run.q, -1).mean(1).reshape(2, run.q)
                start += n
                if self.fused:
                    records[r] = fused_update(run.layers, noise[r], losses.to(torch.float32), run.eps, run.lr)
                else:
                    records[r] = step_record(estimate_and_update(run.layers, seeds[r], losses, run.eps, run.lr))
        if self.fused:                  # after the step: the records come to the host
            records = {r: host_record(out) for r, out in records.items()}
        return records

    def method(self, r: int) -> "PackedMethod":
        """Run ``r`` as a training method (``prge_lib.methods.base.Method``) for the trainer's bookkeeping."""
        return PackedMethod(self, r)


@contextlib.contextmanager
def _rows(layers: Sequence[PackedLoRAFALinear], rows: list[tuple[int, int]]):
    for layer in layers:
        layer.rows = rows
    try:
        yield
    finally:
        for layer in layers:
            layer.rows = None


class PackedMethod:
    """Run ``r`` of a pack seen as one method: its trainable B's under the keys ``PRGE.trainable`` uses (so a
    packed run's checkpoint is the unpacked run's), and ``step`` trains it alone (a pack of one)."""

    optimizer = None

    def __init__(self, pack: Pack, r: int):
        self.pack, self.r, self.model = pack, r, pack.model
        self.settings: dict = {}
        self.times: dict[str, float] = {}

    def trainable(self) -> dict[str, torch.Tensor]:
        return {f"{layer.index}.lora_B": layer.lora_B for layer in self.pack.runs[self.r].layers}

    def step(self, batch: Batch, t: int) -> dict:
        return self.pack.step({self.r: (batch, t)})[self.r]


def build_pack(model: nn.Module, settings: Sequence[dict], pad_id: int, fused: bool = False,
               buckets: Sequence[int] | None = None) -> Pack:
    """A pack of R runs on ``model``; ``settings[r]`` holds run r's targets, r, alpha, noise, q, eps, lr, seed
    and keep_noise (None: by the memory budget, as ``PRGE`` decides); ``fused`` and ``buckets``: :class:`Pack`."""
    adapters = [{k: s[k] for k in ("targets", "r", "alpha", "seed", "noise")} for s in settings]
    packed, per_run = inject_packed(model, adapters)
    runs = [PackedRun(layers, s["q"], s["eps"], s["lr"], s["seed"], keeps_noise(layers, s["q"], s["keep_noise"]))
            for layers, s in zip(per_run, settings)]
    return Pack(model, packed, runs, pad_id, fused, buckets)

