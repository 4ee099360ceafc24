"""Where a step's time goes (``prge bench --configs … --profile``; chapter 5, "On a GPU"): one step run under
``torch.profiler``, its kernels (on a GPU) or operators (on the CPU) ranked by their own time, and that time
summed into a few kinds of work, so that a sitting says which part of the step to make faster next.

    attention    scaled-dot-product attention kernels (flash, memory-efficient, cuDNN) and aten's SDPA
    matmul       GEMMs and batched products (cuBLAS / CUTLASS kernels, aten::mm, bmm, addmm, baddbmm, linear)
    compiled     kernels torch.compile generated (Triton): on a GPU here, the counter noise
    copy         copies and casts (memcpy, aten::copy_, to, contiguous, index_select, gather)
    other        everything else: elementwise and reduction kernels (norms, rotary, activations, adds, softmax)

The kind is read from the kernel's or operator's name by the first pattern that matches (:data:`KINDS`).
"""
from __future__ import annotations

import re
from typing import Callable

import torch

KINDS = (("attention", r"flash|fmha|attention|sdpa|aten::_scaled_dot_product"),     # before matmul: fmha_cutlass…
         ("matmul", r"gemm|cutlass|cublas|sm\d+_xmma|wgmma|aten::(mm|bmm|addmm|baddbmm|linear|matmul)$"),
         ("compiled", r"^triton_|^triton\b"),
         ("copy", r"memcpy|memset|aten::(copy_|to|_to_copy|contiguous|index_select|gather|clone)$|copy_kernel|"
                  r"CatArrayBatchedCopy|index_select|gather_kernel|indexSelect"))


def kind_of(name: str) -> str:
    """The kind of work (:data:`KINDS`) a kernel or operator named ``name`` does, "other" if none matches."""
    for kind, pattern in KINDS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return kind
    return "other"


def _self_time_us(event, device: bool) -> float:
    if not device:
        return float(event.self_cpu_time_total)
    for attribute in ("self_device_time_total", "self_cuda_time_total"):   # renamed in torch 2.4
        if hasattr(event, attribute):
            return float(getattr(event, attribute))
    return 0.0


def profile_step(step: Callable[[], object], cuda: bool, top: int = 15) -> dict:
    """Run ``step()`` once under the profiler and return where its time went: the summed self time
    (``total_ms``; the GPU's kernels on a GPU, the CPU's operators otherwise), its split by kind (``kinds``:
    ms and share) and the ``top`` kernels or operators (name, calls, ms, share, kind)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        step()
        if cuda:
            torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        us = _self_time_us(event, cuda)
        if us > 0 and (cuda or not event.key.startswith("ProfilerStep")):
            if cuda and getattr(event, "device_type", None) is not None and "CUDA" not in str(event.device_type):
                continue            # a CPU-side operator: on a GPU only the device's own kernels count
            rows.append((event.key, int(event.count), us / 1e3))
    total = sum(ms for _, _, ms in rows)
    kinds: dict[str, float] = {}
    for name, _, ms in rows:
        kinds[kind_of(name)] = kinds.get(kind_of(name), 0.0) + ms
    ranked = sorted(rows, key=lambda row: -row[2])[:top]
    share = (lambda ms: ms / total) if total else (lambda ms: 0.0)
    return {"where": "GPU kernels (self time)" if cuda else "CPU operators (self time)", "total_ms": total,
            "kinds": {k: {"ms": ms, "share": share(ms)} for k, ms in sorted(kinds.items(), key=lambda kv: -kv[1])},
            "top": [{"name": name[:160], "calls": calls, "ms": ms, "share": share(ms), "kind": kind_of(name)}
                    for name, calls, ms in ranked]}
