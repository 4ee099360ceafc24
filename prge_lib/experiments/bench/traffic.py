"""Where a step's memory traffic goes (``prge bench --configs … --traffic``; chapter 5, "Where the bytes go"):
one step run with every ATen operator it dispatches counted, the bytes of the tensors each one writes (its
outputs, in-place results included, views not) and reads (its tensor inputs, a broadcast dimension counted
once), summed into the kinds of :mod:`~prge_lib.experiments.bench.profile` and, apart from them, the noise draw.

A count, not a timing: it is the same on any machine for the same operators, so a CPU can say how a GPU step's
bytes split before a GPU is at hand. It is an upper bound on what a device moves, not a measurement of DRAM
traffic: a kernel that fuses several operators (a compiled one, or SDPA's flash kernel) keeps their
intermediates in registers and caches. A small model's step is memory-bound on a GPU (chapter 5, "On a GPU"),
so bytes are the quantity to shrink; the counter noise, which a GPU draws compiled (``prge_lib.zo.prng``), is
kept apart because its eager count says little about its compiled cost.
"""
from __future__ import annotations

import contextlib
import math
from collections import Counter
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from prge_lib.experiments.bench.profile import kind_of


def tensor_bytes(t: torch.Tensor) -> int:
    """The bytes of ``t``'s elements, a dimension of stride 0 (an expand) counted once."""
    return math.prod(n for n, s in zip(t.shape, t.stride()) if s != 0) * t.element_size()


class ByteCount(TorchDispatchMode):
    """Counts, per operator, the bytes its outputs write and its tensor inputs read; ``phase`` (when set) files
    the bytes under that name instead of the operator's."""

    def __init__(self):
        super().__init__()
        self.written, self.read, self.calls = Counter(), Counter(), Counter()
        self.phase: str | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = self.phase or f"aten::{func.overloadpacket.__name__}"
        returns = func._schema.returns
        view = bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write
        if view or name == "aten::_unsafe_view":      # a view writes nothing (_unsafe_view is one by another name)
            return out
        self.calls[name] += 1
        self.written[name] += sum(tensor_bytes(t) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        seen = set()
        for t in tree_flatten((args, kwargs or {}))[0]:
            if isinstance(t, torch.Tensor) and id(t) not in seen:
                seen.add(id(t))
                self.read[name] += tensor_bytes(t)
        return out


def kind_of_operator(name: str) -> str:
    """The kind of ``name`` (``aten::baddbmm_`` is a matmul as ``aten::baddbmm`` is); "noise" for the draw."""
    if name == "noise":
        return name
    kind = kind_of(name)
    return kind_of(name[:-1]) if kind == "other" and name.endswith("_") else kind


@contextlib.contextmanager
def marking_noise(mark: Callable[[], contextlib.AbstractContextManager]):
    """Within the block, the fused steps' counter draws (a pack's and a run's alone) run inside ``mark()``."""
    from prge_lib.zo import fused, packing

    real = packing.counter_normal_seeds

    def marked(*args, **kwargs):
        with mark():
            return real(*args, **kwargs)
    saved = fused.counter_normal_seeds, packing.counter_normal_seeds
    fused.counter_normal_seeds = packing.counter_normal_seeds = marked
    try:
        yield
    finally:
        fused.counter_normal_seeds, packing.counter_normal_seeds = saved


def count_step(step: Callable[[], object], top: int = 15) -> dict:
    """Run ``step()`` once, counting its operators' bytes (module docstring), the fused steps' noise draws under
    "noise". Returns the totals (``written_bytes``, ``read_bytes``), their split by kind (``kinds``: bytes written
    and read, and the share of both) and the ``top`` operators by bytes moved."""
    count = ByteCount()

    @contextlib.contextmanager
    def mark():
        count.phase = "noise"
        try:
            yield
        finally:
            count.phase = None

    with marking_noise(mark), torch.no_grad(), count:
        step()
    moved = {name: count.written[name] + count.read[name] for name in count.calls}
    total = sum(moved.values())
    kinds: dict[str, list[int]] = {}
    for name in count.calls:
        kind = kind_of_operator(name)
        totals = kinds.setdefault(kind, [0, 0])
        totals[0] += count.written[name]
        totals[1] += count.read[name]
    share = (lambda b: b / total) if total else (lambda b: 0.0)
    ranked = sorted(moved, key=lambda name: -moved[name])[:top]
    return {"where": "ATen operators (bytes of the tensors they write and read; views not counted)",
            "written_bytes": sum(count.written.values()), "read_bytes": sum(count.read.values()),
            "kinds": {k: {"written_bytes": w, "read_bytes": r, "share": share(w + r)}
                      for k, (w, r) in sorted(kinds.items(), key=lambda kv: -sum(kv[1]))},
            "top": [{"name": name, "calls": count.calls[name], "written_bytes": count.written[name],
                     "read_bytes": count.read[name], "share": share(moved[name]),
                     "kind": kind_of_operator(name)} for name in ranked]}
