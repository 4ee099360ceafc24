"""SensZOQ: zeroth-order SGD on a static sparse set of sensitive weights over a 4-bit dense base
(Guo et al. §3.2, Eq. 7–8, App. F Eq. 20–23; chapter 8). Masks come from :mod:`prge_lib.methods.senszoq.sensitivity`.

Each projection W (out × in) is split by its mask m (Eq. 7): w_sparse = W ⊙ m, kept as a trainable fp32
vector of k values with their sorted flat indices, and w_dense = W ⊙ (1 − m), quantized to NF4. A forward is

    Eq. 23 (mode "dense")  x (deq(Q(w_dense)) + w_sparse)ᵀ   dequantize, write the k values in, one matmul
    Eq. 21 (mode "spmm")   x deq(Q(w_dense))ᵀ + x w_sparseᵀ   dense matmul plus a sparse (COO) matmul

Before training both equal the original layer at the masked entries exactly (they are never quantized).
Training is MeZO (``mezo.mezo_step``: seed trick, two-point estimate, q queries) over the k-vectors only.
"""
from __future__ import annotations

import copy
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from prge_lib.common.measure import time_steps
from prge_lib.zo.mezo import mezo_step, replay_step, step_record, update_
from prge_lib.models.objective import Batch, mean_loss, row_losses, synthetic_batch
from prge_lib.zo.estimator import ZerothOrder, step_seeds
from prge_lib.zo.prge import two_point_losses
from prge_lib.zo.replay import checked_steps
from prge_lib.models.quant import NF4Weight
from prge_lib.zo.rge import check_zo_dtype, gaussian
from prge_lib.methods.senszoq.sensitivity import build_mask, c4_mask, linear_weights, mask_size, task_fisher

QUANTS = ("nf4", "none")
MODES = ("dense", "spmm")     # Eq. 23 (SparseAdd, then DenseMM) and Eq. 21 (DenseMM + SparseAddMM)


def _check(value: str, allowed: tuple, what: str) -> str:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; choose one of {list(allowed)}")
    return value


class SparseDenseLinear(nn.Module):
    """A frozen projection split into trainable sparse ``values`` at ``indices`` and a dense remainder
    held in NF4 (``quant="nf4"``) or as is (``"none"``, exact); forward by Eq. 23 or Eq. 21 (``mode``).

    ``indices`` (int64 buffer) and ``values`` (fp32 parameter, no autograd) live on the layer's device and
    in its state dict; the NF4 bytes live in an :class:`NF4Weight` that ``.to()`` moves along. Each Eq. 23
    forward dequantizes the whole remainder into a fresh matrix (as bitsandbytes' own NF4 layer does), writes
    the k values into it with ``index_put_`` and runs one matmul; the matrix is freed after the layer.
    """

    def __init__(self, linear: nn.Linear, indices: torch.Tensor, quant: str = "nf4", mode: str = "dense",
                 name: str = ""):
        super().__init__()
        self.quant, self.mode, self.name = _check(quant, QUANTS, "quant"), _check(mode, MODES, "mode"), name
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        idx = torch.as_tensor(indices, dtype=torch.int64, device=weight.device).reshape(-1)
        if idx.numel() and (int(idx[0]) < 0 or int(idx[-1]) >= weight.numel() or bool((idx.diff() <= 0).any())):
            raise ValueError(f"{name}: mask indices must be sorted, distinct and below {weight.numel()}")
        self.register_buffer("indices", idx)
        self.values = nn.Parameter(weight.reshape(-1)[idx].float().clone(), requires_grad=False)
        remainder = weight.clone()
        remainder.view(-1)[idx] = 0                                  # w_dense = W ⊙ (1 − m), Eq. 7
        self.nf4 = NF4Weight(remainder) if quant == "nf4" else None
        self.register_buffer("dense_weight", None if self.nf4 else remainder)
        self.bias = linear.bias
        self.copies: list[tuple[int, float]] | None = None           # (seed, ±ε) per row group, set by perturbed()
        self.position = 0                                            # its noise index (set by sparsify)

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, k={self.values.numel()}, "
                f"quant={self.quant}, mode={self.mode}")

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)                # .to(device) moves the NF4 bytes too
        if self.nf4 is not None:
            self.nf4.to(fn(torch.empty(0, device=self.nf4.packed.device)).device)
        return self

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """deq(Q(w_dense)), (out, in); unquantized, possibly the stored remainder itself (read only)."""
        return self.nf4.dequantize(dtype) if self.nf4 is not None else self.dense_weight.to(dtype)

    def effective_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """SparseAdd(w_sparse, deq(Q(w_dense))): the k values written into the dequantized matrix (Eq. 22)."""
        w = self.dense(dtype)
        w = w.clone() if w is self.dense_weight else w
        w.view(-1).index_put_((self.indices,), self.values.to(dtype))
        return w

    def sparse_product(self, x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """x Sᵀ for the sparse matrix S with ``values`` at this layer's indices (a COO matmul, Eq. 21)."""
        coords = torch.stack([self.indices // self.in_features, self.indices % self.in_features])
        s = torch.sparse_coo_tensor(coords, values.to(x.dtype), (self.out_features, self.in_features),
                                    is_coalesced=True, check_invariants=False)
        flat = x.reshape(-1, self.in_features)
        return torch.sparse.mm(s, flat.T).T.reshape(*x.shape[:-1], self.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "dense":
            out = F.linear(x, self.effective_weight(x.dtype), self.bias)
        else:
            out = F.linear(x, self.dense(x.dtype), self.bias) + self.sparse_product(x, self.values)
        if self.copies is None:
            return out
        n = len(self.copies)                       # row group c sees values + s_c z(seed_c) (parallel queries)
        groups, xs = out.reshape(n, -1, *out.shape[1:]), x.reshape(n, -1, *x.shape[1:])
        for c, (seed, scale) in enumerate(self.copies):
            z = gaussian(seed, self.position, self.values.shape, self.values.device)   # MeZO's draw
            groups[c] += self.sparse_product(xs[c], scale * z)
        return groups.reshape(out.shape)

    def nbytes(self) -> dict:
        dense = self.nf4.nbytes() if self.nf4 is not None else \
            self.dense_weight.numel() * self.dense_weight.element_size()
        return {"dense": dense, "values": self.values.numel() * self.values.element_size(),
                "indices": self.indices.numel() * self.indices.element_size()}


def sparsify(model: nn.Module, mask: Mapping[str, torch.Tensor], quant: str = "nf4",
             mode: str = "dense") -> list[SparseDenseLinear]:
    """Replace every projection named in ``mask`` by a :class:`SparseDenseLinear` (in place) and freeze
    all other parameters. Returns the new layers in model order."""
    _check(quant, QUANTS, "quant"), _check(mode, MODES, "mode")
    found = linear_weights(model)
    unknown = sorted(set(mask) - set(found))
    if unknown:
        raise ValueError(f"the mask names {len(unknown)} modules this model lacks, e.g. {unknown[0]!r}")
    for p in model.parameters():
        p.requires_grad_(False)
    layers = []
    for name, linear in found.items():
        if name in mask:
            layer = SparseDenseLinear(linear, mask[name], quant, mode, name)
            layer.position = len(layers)     # z drawn as add_noise_ draws it for the list of the layers' values
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent), attr, layer)
            layers.append(layer)
    return layers


def set_mode(layers: Sequence[SparseDenseLinear], mode: str) -> None:
    """Switch the forward of every layer between Eq. 23 ("dense") and Eq. 21 ("spmm")."""
    for layer in layers:
        layer.mode = _check(mode, MODES, "mode")


@torch.no_grad()
def parallel_step(model, layers: Sequence[SparseDenseLinear], batch: Batch, seeds: Sequence[int], eps: float,
                  lr: float, outer: bool = True, inner: bool = True, length_groups: int = 1) -> dict:
    """The step of :func:`mezo.mezo_step` with P-RGE's query copies in shared forwards (Gao et al. Alg. 1):
    the dense product of all rows is shared, each copy adds its own sparse product x (ε z_c)ᵀ (Eq. 21).
    ``layers`` in :func:`sparsify`'s order (each draws its z at its place in that list, as ``mezo_step`` does).
    ``length_groups``: as :func:`prge_lib.zo.prge.device_losses`."""
    losses, g, finite = two_point_losses(model, layers, batch, seeds, eps, outer, inner, torch.float64,
                                         length_groups)
    plus, minus = losses.tolist()
    grads = g.tolist()
    if finite:
        update_([layer.values for layer in layers], seeds, grads, lr)      # mezo_step's update
    return {"loss_plus": plus, "loss_minus": minus, "projected_grad": grads, "finite": finite}


class SensZOQ(ZerothOrder):
    """ZO-SGD on the sparse values of :class:`SparseDenseLinear` layers (Guo et al. Eq. 8, Def. 2; MeZO's
    seed trick over the k-vectors, z_j redrawn from (seed, layer position j)).

    P-RGE-style parallel queries (``outer``/``inner``, :func:`parallel_step`) apply through the Eq. 21
    split: the 2q copies differ from the shared weights only by ±ε z_c on k entries, so one forward of the
    repeated batch runs the dense product once for all rows (like LoRA-FA's shared base) and adds one k-entry
    sparse product per copy; Eq. 23 alone would need 2q dense matrices per layer. The arithmetic is that of
    2q forwards of b rows, so the gain is only in reading and dequantizing each weight once per step: none
    on one CPU thread (measured: 5.4 s against 4.95 s at q = 4), hence off by default (``mezo_step``).
    """

    rebuildable = True          # rebuild() replays a run from its projected gradients (a seed checkpoint)

    def __init__(self, model, layers: Sequence[SparseDenseLinear], q: int, eps: float, lr: float,
                 seed: int = 0, outer: bool = False, inner: bool = False, length_groups: int = 1):
        super().__init__(model, q, eps, lr, seed)
        self.layers, self.outer, self.inner, self.length_groups = list(layers), outer, inner, length_groups
        check_zo_dtype([layer.values for layer in self.layers], "SensZOQ")
        # the mask is the start a checkpoint keeps (Method.start): another processor ranks its Fisher with other
        # roundings, so a few entries at the top-k boundary may differ there (int32: a fifth of a megabyte at 0.1%)
        self.start = {layer.name: layer.indices.to("cpu", torch.int32) for layer in self.layers}

    def trainable(self) -> dict[str, torch.Tensor]:
        return {f"{layer.name}.values": layer.values for layer in self.layers}

    def step(self, batch: Batch, t: int) -> dict:
        seeds = step_seeds(self.seed, t, self.q)
        if self.outer or self.inner:
            out = parallel_step(self.model, self.layers, batch, seeds, self.eps, self.lr, self.outer, self.inner,
                                self.length_groups)
        else:
            out = mezo_step([layer.values for layer in self.layers],
                            lambda: mean_loss(self.model, batch, self.length_groups), seeds, self.eps, self.lr)
        return step_record(out)

    @torch.no_grad()
    def rebuild(self, projected_grads) -> None:
        """The run's k values from its projected gradients alone (MeZO's seed trick over the sparse vector, chapter
        8): each step's ±ε trips and update again (``mezo.replay_step``), or the update alone where the step's
        queries ran in shared forwards (:func:`parallel_step` never perturbs the values in place). A seed
        checkpoint of a SensZOQ run is its history: kilobytes, where the values are k floats."""
        values = [layer.values for layer in self.layers]
        for t, g in checked_steps(enumerate(projected_grads), self.q):
            seeds = step_seeds(self.seed, t, self.q)
            if self.outer or self.inner:
                update_(values, seeds, g, self.lr)
            else:
                replay_step(values, seeds, g, self.eps, self.lr)


def build_senszoq(model, tokenizer, *, mask="c4", sparsity: float = 1e-3, scope: str = "layer",
                  quant: str = "nf4", q: int = 1, eps: float = 1e-3, lr: float = 1e-6, seed: int = 0,
                  task_batches: Sequence[Batch] | None = None, cache: bool = True, mode: str = "dense",
                  outer: bool = False, inner: bool = False, n_c4: int = 64, max_length: int = 256,
                  progress: bool = True, start: Mapping[str, torch.Tensor] | None = None,
                  length_groups: int = 1) -> SensZOQ:
    """The whole SensZOQ recipe (Guo et al. Fig. 4) on an unquantized ``model``: the mask (a kind from
    ``sensitivity.MASK_KINDS`` or a ready mask dict; "c4" is cached, "task" needs ``task_batches``), the
    split with the remainder in NF4, and the ZO method. ``method.settings`` records what was built.
    ``start``: the mask of a run's checkpoint (:attr:`SensZOQ.start`), used instead of computing the one ``mask``
    names, which this machine may round to a few other entries: how a run resumes elsewhere than where it began.
    ``length_groups``: each forward's rows in that many chunks of similar length (``objective.mean_loss``)."""
    _check(quant, QUANTS, "quant"), _check(mode, MODES, "mode")
    settings = {"mask": mask if isinstance(mask, str) else "given", "sparsity": sparsity, "scope": scope,
                "quant": quant, "mode": mode}
    if start is not None:
        mask = {name: torch.as_tensor(idx, dtype=torch.int64) for name, idx in start.items()}
        settings["mask_from"] = "checkpoint"
    elif mask == "c4":
        mask, made = c4_mask(model, tokenizer, sparsity, scope, n_c4, max_length, cache, progress)
        settings.update({k: made[k] for k in ("sequences", "tokens", "seconds") if k in made})
    elif mask == "task":
        if not task_batches:
            raise ValueError("a 'task' mask ranks the task's own gradients: pass task_batches (its training batches)")
        scores = task_fisher(model, task_batches, progress)
        mask = build_mask("task", model, sparsity, scope, seed, scores)
        settings.update(sequences=scores.sequences, tokens=scores.tokens, seconds=round(scores.seconds, 2))
    elif isinstance(mask, str):
        mask = build_mask(mask, model, sparsity, scope, seed)
    method = SensZOQ(model, sparsify(model, mask, quant, mode), q, eps, lr, seed, outer, inner, length_groups)
    method.settings = {**settings, "k": mask_size(mask)}
    return method


def _bench_setup(target, rows, seq_len, sparsity, quant, mask):
    """(fp32 forward, layers, sparse forward, SensZOQ step or None, on cuda) for :func:`compare_forms`."""
    if isinstance(target, tuple):
        torch.manual_seed(0)
        linear = nn.Linear(target[1], target[0], bias=False)
        x = torch.randn(rows * seq_len, target[1])
        k = max(1, round(sparsity * linear.weight.numel()))
        layer = SparseDenseLinear(linear, torch.randperm(linear.weight.numel())[:k].sort().values, quant)
        return lambda t: linear(x), [layer], lambda t: layer(x), None, False
    model = copy.deepcopy(target)                  # the caller's model stays as it is
    device = next(model.parameters()).device
    batch = synthetic_batch(rows, seq_len, model.config.vocab_size).to(device)
    mask = mask if mask is not None else build_mask("random", model, sparsity)
    method = SensZOQ(model, sparsify(model, mask, quant), 1, 1e-3, 0.0)     # lr 0: timing only
    return (lambda t: row_losses(target, batch), method.layers, lambda t: row_losses(model, batch),
            lambda t: method.step(batch, t), device.type == "cuda")


@torch.no_grad()
def compare_forms(target, *, rows: int = 4, seq_len: int = 64, sparsity: float = 1e-3, quant: str = "nf4",
                  mask: Mapping[str, torch.Tensor] | None = None, repeats: int = 3, warmup: int = 1) -> dict:
    """Median seconds of the Eq. 23 and Eq. 21 forms against the original fp32 layers, and the bytes held
    (a benchmark helper for chapter 8, not a test). ``target``: an (out, in) layer shape, timed on rows·seq_len
    tokens, or a causal LM: a copy split by ``mask`` (default random) timed on a synthetic batch, forward
    and one q = 1 SensZOQ step (two forwards and the perturbations of the k values)."""
    fp32, layers, forward, step, cuda = _bench_setup(target, rows, seq_len, sparsity, quant, mask)
    median = lambda fn: sorted(time_steps(fn, repeats, warmup, cuda))[repeats // 2]   # noqa: E731
    out = {"fp32_forward_s": median(fp32)}
    for mode, eq in (("dense", "eq23"), ("spmm", "eq21")):
        set_mode(layers, mode)
        out[f"{eq}_forward_s"] = median(forward)
        if step is not None:
            out[f"{eq}_step_s"] = median(step)
    held = [layer.nbytes() for layer in layers]
    out["bytes"] = {key: sum(h[key] for h in held) for key in ("dense", "values", "indices")}
    out["bytes"]["fp32_dense"] = sum(layer.in_features * layer.out_features * 4 for layer in layers)
    out["k"] = sum(layer.values.numel() for layer in layers)
    out["settings"] = {"rows": rows, "seq_len": seq_len, "sparsity": sparsity, "quant": quant,
                       "threads": torch.get_num_threads()}
    return out
