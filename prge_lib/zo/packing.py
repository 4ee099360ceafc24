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

The fused pack (``Pack(fused=True)``, counter noise) is what a GPU runs, and it never loops over runs inside a
layer: every run's B lives in one (R, D) tensor whose row r each of run r's ``lora_B`` parameters views, every
layer's A in one (R, r, in) tensor, and a step draws the noise of all its runs in one call, (Σq, D). Each
layer then makes all C = Σ 2q copies with one multiply and one add (broadcast over a run's copies when the runs
share q, gathered per copy otherwise; :func:`copy_weights`),

    B_c = B_{run(c)} + s_c z_{row(c)}        (the same two roundings as the run alone: z·s, then + B)

and, when the working runs have the same q and rows, its low-rank path with two batched products (x A_rᵀ per
run, then (x A_rᵀ) B_cᵀ per copy); the update of all runs is one batched product and one add,
B ← B − (η_r/q) g_rᵀ Z_r. So a step's kernels do not grow with R; only their sizes do.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import ClassVar, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from prge_lib.models.buckets import bucket_length
from prge_lib.models.objective import IGNORE, Batch, fit_width, row_losses
from prge_lib.zo.estimator import step_seeds
from prge_lib.zo.fused import adapter_span, fused_update, host_record
from prge_lib.zo.graphs import capture_graph
from prge_lib.zo.lora import LoRAFALinear, draw_noise, inject_lorafa, keeping_noise, perturbed
from prge_lib.zo.prge import estimate_and_update, keeps_noise, step_record
from prge_lib.zo.prng import counter_normal_seeds
from prge_lib.zo.rge import check_zo_dtype


def check_width_groups(groups: int, option: str = "width_groups") -> int:
    """``groups`` if it is a number of width groups (a whole number ≥ 1), else a ValueError naming it as
    ``option`` (the command line's ``--width-groups``)."""
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{option} takes a whole number of groups ≥ 1, got {groups!r}")
    return groups


class PackedLoRAFALinear(nn.Module):
    """One frozen projection shared by R runs, each with its own LoRA-FA layer on it (``runs[r]``).

    In a pack's forward (``rows`` set: (run, rows) in batch order) the base product runs once over all rows and
    each run adds its copies' low-rank path to its own rows (with ``own`` set: its own B, no copies, the runs'
    evaluations in one forward); with ``solo`` set the layer is run ``solo``'s LoRA-FA layer alone (an ordinary
    forward: a step of that run by itself)."""

    def __init__(self, runs: Sequence[LoRAFALinear]):
        super().__init__()
        if not runs or any(layer.base is not runs[0].base for layer in runs):
            raise ValueError("a packed layer needs at least one LoRA-FA layer, all on the same base projection")
        self.base = runs[0].base
        self.runs = nn.ModuleList(runs)
        self.rows: list[tuple[int, int]] | None = None
        self.own = False                               # rows through each run's own B (Pack.each_own)
        self.solo: int | None = None
        self.span: tuple[int, int] | None = None      # fused pack: this layer's columns [start, end) of the (R, D) B's
        self.fused: "_StepState | None" = None        # set during a fused pack's step

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
        if self.own:
            return self._own_forward(x, out)
        if self.fused is not None:
            return self._fused_forward(x, out, self.fused)
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

    def _own_forward(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Each run's rows plus (α/r) (x A_rᵀ) B_rᵀ, its own adapter: with one row count and rank for all, two
        batched products over the runs; else each run's rows in turn (as ``LoRAFALinear`` without copies)."""
        if torch.is_grad_enabled():
            raise RuntimeError("a pack's evaluation forward (Pack.each_own) runs under torch.no_grad()")
        runs = [self.runs[r] for r, _ in self.rows]
        if len({n for _, n in self.rows}) == 1 and len({(layer.r, layer.scaling) for layer in runs}) == 1:
            a = torch.stack([layer.lora_A for layer in runs])                              # (k, r, in)
            b = torch.stack([layer.lora_B for layer in runs]).transpose(1, 2).to(out.dtype)  # (k, r, out)
            h = torch.bmm(x.to(a.dtype).reshape(len(runs), -1, x.shape[-1]), a.transpose(1, 2)).to(out.dtype)
            out.view(len(runs), -1, self.base.out_features).baddbmm_(h, b, alpha=runs[0].scaling)
            return out
        start = 0
        for layer, (_, n) in zip(runs, self.rows):
            h = F.linear(x[start:start + n].to(layer.lora_A.dtype), layer.lora_A).to(out.dtype)
            rows = out[start:start + n].view(-1, self.base.out_features)
            rows.addmm_(h.reshape(-1, layer.r), layer.lora_B.T.to(out.dtype), alpha=layer.scaling)
            start += n
        return out

    def _fused_forward(self, x: torch.Tensor, out: torch.Tensor, state: "_StepState") -> torch.Tensor:
        """The fused pack's low-rank path: every copy of every working run in a few batched operations."""
        plan, layer = state.plan, self.runs[0]
        start, end = self.span
        out_features, rank = layer.out_features, layer.r
        b = state.flat[:, start:end].view(-1, out_features, rank)                  # (R, out, r): views
        z = state.z[:, start:end].view(-1, out_features, rank)                     # (Σq, out, r)
        copies = copy_weights(plan, z, b).transpose(1, 2).to(out.dtype)            # (C, r, out)
        n = len(plan.seed_row)
        if state.rows_per_copy is None:          # runs with other rows per copy: each run's rows in turn
            first, c = 0, 0
            low = state.low_rank_input(x, layer.lora_A.dtype)
            for r, rows in state.rows:
                own = self.runs[r]
                k = 2 * plan.q_of[r]
                h = F.linear(low[first:first + rows], own.lora_A).to(out.dtype)
                out[first:first + rows].view(k, -1, out_features).baddbmm_(
                    h.view(k, -1, rank), copies[c:c + k], alpha=layer.scaling)
                first, c = first + rows, c + k
            return out
        stack = self.a_compute                   # A in fp32, or in the activations' dtype (Pack.lowp_lora)
        if state.rows_per_run is not None:       # the same rows per run: x A_rᵀ as one product per run
            a = stack if plan.all_runs else stack.index_select(0, plan.work)
        else:                                    # the same rows per copy only: A gathered per copy
            a = stack.index_select(0, plan.run_of_copy)
        h = torch.bmm(state.low_rank_input(x, a.dtype).reshape(len(a), -1, x.shape[-1]), a.transpose(1, 2))
        grouped = out.reshape(n, -1, out_features)
        grouped.baddbmm_(h.to(out.dtype).reshape(n, -1, rank), copies, alpha=layer.scaling)
        return out


def copy_weights(plan: "_Plan", z: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The (C, out, r) copies of one layer's B for a fused step: B_c = z_row(c) · s_c + B_run(c), the multiply
    and the add of ``LoRAFALinear.copy_weights`` in its order, from the step's (Σq, out, r) draw ``z`` and the
    (R, out, r) B's ``b``. Runs of one q broadcast each run's q rows of z and its B over its 2q copies; runs of
    mixed q gather them per copy. The same operations on the same operands: the same copies, bit for bit."""
    if plan.q is None:
        return (z.index_select(0, plan.seed_row) * plan.scales).add_(b.index_select(0, plan.run_of_copy))
    q, (out_features, rank) = plan.q, b.shape[1:]
    own = b if plan.all_runs else b.index_select(0, plan.work)                          # (W, out, r)
    copies = z.view(-1, 1, q, out_features, rank) * plan.scales.view(-1, 2, q, 1, 1)   # (W, ±, q, out, r)
    return copies.add_(own.view(-1, 1, 1, out_features, rank)).view(-1, out_features, rank)


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
    ``buckets``: the pack's batch padded to the smallest of these lengths that holds it.
    ``graphs``: a fused step of runs with one q and one row count is recorded as a CUDA graph per number of runs
    and batch shape, and replayed for any runs of that number (which runs, their ε and η are read from buffers;
    on a GPU; on the CPU the same buffered step runs eagerly).
    ``width_groups``: a step of many runs is split into this many forwards of runs of similar batch width (runs
    sorted by width, then cut into near-equal groups), each padded to its own width: a short prompt of one run is
    no longer padded to the longest prompt of all runs (chapter 5, "On a GPU"). Runs do not interact, so the
    records are those of one forward up to the rounding a padded length brings (``tests/test_packing.py``).
    ``lowp_lora`` (fused, a measurement option of ``prge bench``, not what the grids train with): the fused step's
    x A_rᵀ in the activations' dtype (an fp16 base: fp16 products, A rounded to fp16 once) instead of casting the
    projections' inputs to fp32 for it (four copies a decoder layer, :meth:`_StepState.low_rank_input`); B, its
    noise and the update stay fp32. On an fp32 base nothing changes.
    ``compiled`` (fused, a measurement option of ``prge bench`` too): the model's decoder through ``torch.compile``,
    one graph for the whole stack of layers with its packed projections (no graph breaks, one more compilation for
    a second batch shape, then dynamic sizes; ``tests/test_packing.py``), so the casts and the elementwise work
    between the products run fused; its records differ from the eager step's by the rounding of fused kernels."""

    def __init__(self, model: nn.Module, layers: Sequence[PackedLoRAFALinear], runs: Sequence[PackedRun],
                 pad_id: int, fused: bool = False, buckets: Sequence[int] | None = None, graphs: bool = False,
                 width_groups: int = 1, lowp_lora: bool = False, compiled: bool = False):
        self.model, self.layers, self.runs, self.pad_id = model, list(layers), list(runs), pad_id
        self.fused, self.buckets, self.graphs = fused, tuple(buckets) if buckets else None, graphs
        if graphs and not fused:
            raise ValueError("a pack's step is replayed as a CUDA graph only when fused (fused=True)")
        if lowp_lora and not fused:
            raise ValueError("lowp_lora changes the fused step's low-rank product: it needs fused=True")
        self.lowp_lora = lowp_lora
        if compiled and not fused:
            raise ValueError("compiled runs the fused step's forward through torch.compile: it needs fused=True")
        self.compiled = compiled
        self.width_groups = check_width_groups(width_groups)
        self.buffered: dict[tuple, _BufferedPackStep] = {}
        for r, run in enumerate(self.runs):
            check_zo_dtype([layer.lora_B for layer in run.layers], f"P-RGE (packed run {r})")
            if fused:
                adapter_span(run.layers)          # counter noise, or a ValueError naming the layer now
        self.plans: dict[tuple[int, ...], _Plan] = {}
        if fused:
            self._stack()
        if compiled:
            model.get_decoder().compile()

    @torch.no_grad()
    def _stack(self) -> None:
        """Every run's B as row r of one (R, D) tensor (each ``lora_B`` becomes a view of it, keeping its value)
        and every layer's A as one (R, r, in) tensor (each run's ``lora_A`` a view of it)."""
        spans = {adapter_span(run.layers) for run in self.runs}
        if len(spans) != 1:
            raise ValueError(f"the runs of a fused pack need the same adapter layout; their counter spans are "
                             f"{sorted(spans)}")
        (self.start, end), first = spans.pop(), self.runs[0].layers[0].lora_B
        self.flat = torch.zeros(len(self.runs), end - self.start, dtype=first.dtype, device=first.device)
        for r, run in enumerate(self.runs):
            for layer in run.layers:
                begin = layer.offset - self.start
                view = self.flat[r, begin:begin + layer.lora_B.numel()].view(layer.lora_B.shape)
                view.copy_(layer.lora_B)
                layer.lora_B = nn.Parameter(view, requires_grad=layer.lora_B.requires_grad)
        for j, packed in enumerate(self.layers):
            own = [run.layers[j] for run in self.runs]
            packed.span = (own[0].offset - self.start, own[0].offset - self.start + own[0].lora_B.numel())
            packed.a_stack = torch.stack([layer.lora_A for layer in own])
            for r, layer in enumerate(own):
                layer.lora_A = packed.a_stack[r]
            # A is frozen: its copy in the activations' dtype is made once (lowp_lora)
            packed.a_compute = packed.a_stack.to(self.compute_dtype()) if self.lowp_lora else packed.a_stack

    def compute_dtype(self) -> torch.dtype:
        """The dtype the model computes its activations in: that of its input embeddings."""
        return self.model.get_input_embeddings().weight.dtype

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

    @contextlib.contextmanager
    def each_own(self, rows: Sequence[tuple[int, int]]):
        """Within the block a forward's batch is the rows of several runs in order ((run, rows) pairs), each run's
        through its own adapter (no copies): the evaluations of many runs in one forward
        (``prge_lib.training.evaluate.zero_shot_many``). Runs without gradients."""
        rows = [(int(r), int(n)) for r, n in rows]
        unknown = [r for r, _ in rows if not 0 <= r < len(self.runs)]
        if unknown or len({r for r, _ in rows}) != len(rows):
            raise ValueError(f"each_own takes distinct runs of this pack of {len(self.runs)}, "
                             f"got {[r for r, _ in rows]}")
        for layer in self.layers:
            layer.rows, layer.own = rows, True
        try:
            yield
        finally:
            for layer in self.layers:
                layer.rows, layer.own = None, False

    @torch.no_grad()
    def step(self, work: dict[int, tuple[Batch, int]]) -> dict[int, dict]:
        """One step of each run in ``work`` (run → (its batch, its step t)), all in one forward; returns each
        run's record (that of ``PRGE.step``). A run whose losses are not finite is not updated (``finite``
        False); the others are not affected by it."""
        order = list(work)
        unknown = [r for r in order if not 0 <= r < len(self.runs)]
        if unknown:
            raise ValueError(f"runs {unknown} are not in this pack of {len(self.runs)}")
        records = {}
        for group in group_by_width(order, {r: work[r][0].input_ids.shape[1] for r in order}, self.width_groups):
            records.update(self._step_runs(group, work))
        return {r: records[r] for r in order}

    def _step_runs(self, order: list[int], work: dict[int, tuple[Batch, int]]) -> dict[int, dict]:
        """One forward's step of the runs ``order`` (:meth:`step`)."""
        seeds = {r: step_seeds(self.runs[r].seed, work[r][1], self.runs[r].q) for r in order}
        width = max(work[r][0].input_ids.shape[1] for r in order)
        if self.buckets:
            width = bucket_length(width, self.buckets)
        target_width = max(work[r][0].targets.shape[1] for r in order)
        batch, rows = self._assemble(order, work, width, target_width)
        if self.fused:
            return self._fused_step(order, seeds, batch, rows)
        with contextlib.ExitStack() as stack:
            for r in order:
                run = self.runs[r]
                if run.keep_noise:
                    stack.enter_context(keeping_noise(run.layers, draw_noise(run.layers, seeds[r])))
                eps = run.eps
                stack.enter_context(perturbed(run.layers, [(s, eps) for s in seeds[r]] +
                                              [(s, -eps) for s in seeds[r]]))
            stack.enter_context(_rows(self.layers, rows))
            values = row_losses(self.model, batch).cpu()
            records, start = {}, 0
            for r, n in rows:
                run = self.runs[r]
                losses = values[start:start + n].reshape(2 * run.q, -1).mean(1).reshape(2, run.q)
                start += n
                records[r] = step_record(estimate_and_update(run.layers, seeds[r], losses, run.eps, run.lr))
        return records

    def _assemble(self, order: list[int], work: dict[int, tuple[Batch, int]], width: int,
                  target_width: int) -> tuple[Batch, list[tuple[int, int]]]:
        """The pack's batch: each run's rows left-padded to ``width`` (targets to ``target_width``) and repeated
        for its 2q copies, in ``order``; returns it on the model's device, with each run's row count. Runs of one
        q and one row count are written into one padded tensor and their copies made by one expand (a few
        operations, not a few per run); batches given on the host are assembled there and copied over once."""
        device = next(self.model.parameters()).device
        counts = {(work[r][0].rows, self.runs[r].q) for r in order}
        if len(counts) != 1:
            parts, rows = [], []
            for r in order:
                parts.append(fit_width(work[r][0], width, self.pad_id, target_width).repeat(2 * self.runs[r].q))
                rows.append((r, parts[-1].rows))
            batch = Batch(*(torch.cat([getattr(p, f) for p in parts]) for f in ("input_ids", "attention_mask",
                                                                                  "targets")))
            return batch.to(device), rows
        (b, q), = counts
        first = work[order[0]][0]
        ids = torch.full((len(order), b, width), self.pad_id, dtype=first.input_ids.dtype, device=first.input_ids.device)
        mask = torch.zeros((len(order), b, width), dtype=first.attention_mask.dtype, device=ids.device)
        targets = torch.full((len(order), b, target_width), IGNORE, dtype=first.targets.dtype, device=ids.device)
        for k, r in enumerate(order):                 # right-aligned: the same left padding as fit_width
            one = work[r][0]
            length, answer = one.input_ids.shape[1], one.targets.shape[1]
            ids[k, :, width - length:] = one.input_ids
            mask[k, :, width - length:] = one.attention_mask
            targets[k, :, target_width - answer:] = one.targets
        copies = [t.unsqueeze(1).expand(-1, 2 * q, -1, -1).reshape(-1, t.shape[-1]) for t in (ids, mask, targets)]
        return Batch(*copies).to(device), [(r, 2 * q * b) for r in order]

    def plan(self, order: Sequence[int]) -> "_Plan":
        """The device tensors a fused step of the runs ``order`` reads (made once per set of working runs)."""
        key = tuple(order)
        if key not in self.plans:
            if len(self.plans) >= 256:        # width groups change their runs every step: keep the cache small
                self.plans.clear()
            self.plans[key] = _Plan.of(self, key)
        return self.plans[key]

    def _fused_step(self, order: list[int], seeds: dict[int, list[int]], batch: Batch,
                    rows: list[tuple[int, int]]) -> dict[int, dict]:
        """One fused step of the runs ``order``: their noise in one draw, the forward with every copy made
        per layer in one go, the updates of runs with one q and row count as one batched product (module
        docstring); with ``graphs``, that uniform step is replayed as a CUDA graph per shape and set of runs."""
        plan = self.plan(order)
        flat_seeds = torch.tensor([s for r in order for s in seeds[r]], dtype=torch.int64)
        if plan.q is not None and len({n for _, n in rows}) == 1:
            if self.graphs:       # one graph per number of runs and shape; which runs is in the plan's buffers
                key = (len(order), plan.q, plan.all_runs, batch.rows, batch.input_ids.shape[1],
                       batch.targets.shape[1])
                if key not in self.buffered:
                    self.buffered[key] = _BufferedPackStep(self, plan, rows, batch)
                out = self.buffered[key].run(batch, flat_seeds, plan)
            else:
                out = self._uniform_step(plan, flat_seeds, batch, rows)
            # each run's record (that of step_record: mean loss in fp32, finite, g), copied out in one go
            host = out.cpu().tolist()                                                      # the step's one sync
            return {r: {"loss": row[0], "finite": bool(row[1]), "projected_grad": row[2:]}
                    for r, row in zip(order, host)}
        z = self._draw(flat_seeds)
        per_copy = {n // (2 * self.runs[r].q) for r, n in rows}
        state = _StepState(self.flat, z, plan, rows, per_copy.pop() if len(per_copy) == 1 else None, None)
        with _rows(self.layers, rows, state):
            values = row_losses(self.model, batch)
        records, first, row = {}, 0, 0
        for r, n in rows:                         # runs of other q or rows: each its own product (fused_update)
            run = self.runs[r]
            losses = values[first:first + n].reshape(2 * run.q, -1).mean(1).reshape(2, run.q)
            records[r] = fused_update(run.layers, z[row:row + run.q], losses.to(torch.float32), run.eps, run.lr)
            first, row = first + n, row + run.q
        return {r: host_record(out) for r, out in records.items()}

    def _draw(self, seeds: torch.Tensor) -> torch.Tensor:
        """The (Σq, D) noise of a step's runs, for their seeds in order, in one counter call."""
        return counter_normal_seeds(seeds, 0, self.flat.shape[1], self.start, device=self.flat.device)

    def _uniform_step(self, plan: "_Plan", seeds: torch.Tensor, batch: Batch, rows: list[tuple[int, int]]):
        """The step of W runs of one q and one row count, on the device alone (what a CUDA graph records):
        draw, forward, g, every run's update; returns the (W, 2 + q) records (mean loss, finite, g)."""
        q, w = plan.q, len(plan.order)
        z = self._draw(seeds)                                                                # (W·q, D)
        state = _StepState(self.flat, z, plan, rows, rows[0][1] // (2 * q), rows[0][1])
        with _rows(self.layers, rows, state):
            values = row_losses(self.model, batch)
        losses = values.reshape(w, 2, q, -1).mean(-1).to(torch.float32)                     # (W, 2, q)
        g = (losses[:, 0] - losses[:, 1]) / plan.two_eps                                    # Alg. 1 line 11
        finite = torch.isfinite(losses).flatten(1).all(1, keepdim=True)
        coefficients = torch.where(finite, g, torch.zeros_like(g)) * plan.step_scale       # −η/q, 0 if not finite
        step = torch.bmm(coefficients.unsqueeze(1), z.view(w, q, -1)).squeeze(1)          # line 14
        if plan.all_runs:
            self.flat.add_(step)
        else:
            self.flat.index_add_(0, plan.work, step)
        loss = (losses[:, 0] + losses[:, 1]).mean(1, keepdim=True) / 2
        return torch.cat([loss, finite.to(loss.dtype), g], 1)

    def method(self, r: int) -> "PackedMethod":
        """Run ``r`` as a training method (``prge_lib.methods.base.Method``) for the trainer's bookkeeping."""
        return PackedMethod(self, r)


def group_by_width(order: Sequence[int], widths: dict[int, int], groups: int) -> list[list[int]]:
    """The runs ``order`` sorted by their batch width (``widths[r]``; ties by run) and cut into ``groups``
    contiguous groups of near-equal size (the larger first), none empty: each group is one forward padded to its
    widest run. One group, or fewer runs than groups allow: as many groups as runs need."""
    ranked = sorted(order, key=lambda r: (widths[r], r))
    count = min(groups, len(ranked))
    size, extra = divmod(len(ranked), count) if count else (0, 0)
    cuts, start = [], 0
    for g in range(count):
        end = start + size + (1 if g < extra else 0)
        cuts.append(ranked[start:end])
        start = end
    return cuts if groups > 1 else [list(order)]


@dataclass
class _Plan:
    """A fused step's constants for one set of working runs ``order``, on the device: for each copy c its run
    and its row of the step's draw, and its scale ±ε (C, 1, 1); per run its 2ε and −η/q; ``q`` when the runs
    share one."""

    order: tuple[int, ...]
    work: torch.Tensor
    run_of_copy: torch.Tensor
    seed_row: torch.Tensor
    scales: torch.Tensor
    two_eps: torch.Tensor
    step_scale: torch.Tensor
    q: int | None
    q_of: dict[int, int]
    all_runs: bool

    BUFFERS: ClassVar[tuple[str, ...]] = ("work", "run_of_copy", "seed_row", "scales", "two_eps", "step_scale")

    @classmethod
    def of(cls, pack: "Pack", order: tuple[int, ...]) -> "_Plan":
        run_of_copy, seed_row, scales, row = [], [], [], 0
        for r in order:
            run = pack.runs[r]
            for sign in (1.0, -1.0):              # the copies of run r: +ε for its q seeds, then −ε (Pack.step)
                run_of_copy += [r] * run.q
                seed_row += range(row, row + run.q)
                scales += [sign * run.eps] * run.q
            row += run.q
        qs = {pack.runs[r].q for r in order}
        device, dtype = pack.flat.device, pack.flat.dtype

        def on_device(values, kind=dtype):
            return torch.tensor(values, dtype=kind).to(device)

        return cls(order, on_device(list(order), torch.long), on_device(run_of_copy, torch.long),
                   on_device(seed_row, torch.long), on_device(scales).view(-1, 1, 1),
                   on_device([[2 * pack.runs[r].eps] for r in order]),
                   on_device([[-pack.runs[r].lr / pack.runs[r].q] for r in order]),
                   qs.pop() if len(qs) == 1 else None, {r: pack.runs[r].q for r in order},
                   order == tuple(range(len(pack.runs))))


class _BufferedPackStep:
    """The uniform fused step of one set of runs and one batch shape, reading fixed buffers (the batch and the
    seeds), recorded as a CUDA graph at its first step on a GPU (as :mod:`prge_lib.zo.graphs` does for a run
    alone: warm-up runs on a side stream, one recorded run, every B restored after them); on the CPU it runs
    eagerly from the same buffers."""

    def __init__(self, pack: Pack, plan: "_Plan", rows: list[tuple[int, int]], batch: Batch):
        device = pack.flat.device
        # the plan's tensors as buffers of their own, refilled for the runs of each step
        self.plan = replace(plan, **{name: getattr(plan, name).clone() for name in _Plan.BUFFERS})
        self.pack, self.rows = pack, rows
        self.batch = Batch(*(torch.empty_like(t, device=device) for t in (batch.input_ids, batch.attention_mask,
                                                                           batch.targets)))
        self.seeds = torch.zeros(len(plan.order) * plan.q, dtype=torch.int64, device=device)
        self.graph, self.out = None, None

    def compute(self) -> torch.Tensor:
        return self.pack._uniform_step(self.plan, self.seeds, self.batch, self.rows)

    def run(self, batch: Batch, seeds: torch.Tensor, plan: "_Plan") -> torch.Tensor:
        """The step of the runs of ``plan`` (as many as this step's, of its q) on ``batch`` with ``seeds``."""
        for buffer, value in zip((self.batch.input_ids, self.batch.attention_mask, self.batch.targets),
                                 (batch.input_ids, batch.attention_mask, batch.targets)):
            buffer.copy_(value, non_blocking=True)
        for name in _Plan.BUFFERS:
            getattr(self.plan, name).copy_(getattr(plan, name), non_blocking=True)
        self.plan.order, self.plan.q_of = plan.order, plan.q_of
        self.seeds.copy_(seeds, non_blocking=True)
        if self.pack.flat.device.type != "cuda":
            return self.compute()
        if self.graph is None:
            self.capture()
        self.graph.replay()
        return self.out

    def capture(self) -> None:
        self.graph, self.out = capture_graph(self.compute, [self.pack.flat])


@dataclass
class _StepState:
    """What the packed layers read during a fused step: the (R, D) B's, the step's (Σq, D) draw, the plan, the
    rows of each run in batch order, and the rows per copy (per run) when every run has the same, else None;
    ``cast``: the last projection input in the low-rank product's dtype (:meth:`low_rank_input`)."""

    flat: torch.Tensor
    z: torch.Tensor
    plan: _Plan
    rows: list[tuple[int, int]]
    rows_per_copy: int | None
    rows_per_run: int | None
    cast: tuple | None = None

    def low_rank_input(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``x`` in ``dtype`` for the product x A_rᵀ, cast once for every projection that reads the same input:
        a decoder layer's q, k and v read one tensor, and so do gate and up, so over an fp16 base a layer makes
        four fp32 copies of its inputs instead of seven (the same cast, so the same numbers, bit for bit). The
        copy is kept until a projection reads another input (or the step ends). Under ``torch.compile`` every
        projection casts, and the compiler merges the identical casts itself."""
        if torch.compiler.is_compiling():
            return x.to(dtype)
        if self.cast is not None:
            source, version, kind, value = self.cast
            if source is x and version == x._version and kind == dtype:
                return value
        value = x.to(dtype)
        self.cast = (x, x._version, dtype, value)
        return value


@contextlib.contextmanager
def _rows(layers: Sequence[PackedLoRAFALinear], rows: list[tuple[int, int]], fused: _StepState | None = None):
    for layer in layers:
        layer.rows, layer.fused = rows, fused
    try:
        yield
    finally:
        for layer in layers:
            layer.rows, layer.fused = None, None


class PackedMethod:
    """Run ``r`` of a pack seen as one method: its trainable B's under the keys ``PRGE.trainable`` uses (so a
    packed run's checkpoint is the unpacked run's), and ``step`` trains it alone (a pack of one)."""

    optimizer = None

    def __init__(self, pack: Pack, r: int):
        self.pack, self.r, self.model = pack, r, pack.model
        self.settings: dict = {}
        self.times: dict[str, float] = {}
        self.start: dict[str, torch.Tensor] = {}

    def trainable(self) -> dict[str, torch.Tensor]:
        return {f"{layer.index}.lora_B": layer.lora_B for layer in self.pack.runs[self.r].layers}

    def step(self, batch: Batch, t: int) -> dict:
        return self.pack.step({self.r: (batch, t)})[self.r]


def build_pack(model: nn.Module, settings: Sequence[dict], pad_id: int, fused: bool = False,
               buckets: Sequence[int] | None = None, graphs: bool = False, width_groups: int = 1,
               lowp_lora: bool = False, compiled: bool = False) -> Pack:
    """A pack of R runs on ``model``; ``settings[r]`` holds run r's targets, r, alpha, noise, q, eps, lr, seed
    and keep_noise (None: by the memory budget, as ``PRGE`` decides); ``fused``, ``buckets``, ``graphs``,
    ``width_groups``, ``lowp_lora`` and ``compiled``: :class:`Pack`."""
    adapters = [{k: s[k] for k in ("targets", "r", "alpha", "seed", "noise")} for s in settings]
    packed, per_run = inject_packed(model, adapters)
    runs = [PackedRun(layers, s["q"], s["eps"], s["lr"], s["seed"], keeps_noise(layers, s["q"], s["keep_noise"]))
            for layers, s in zip(per_run, settings)]
    return Pack(model, packed, runs, pad_id, fused, buckets, graphs, width_groups, lowp_lora, compiled)

