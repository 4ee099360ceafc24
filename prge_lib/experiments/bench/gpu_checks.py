"""Checks of the GPU engine that only a GPU can make, each recorded with its numbers (``prge gpu-check``; the
first stage of a GPU sitting). On the CPU the same checks run where they can (tests/test_gpu_checks.py).

    same_uniforms    the counter generator's uniforms (integer hashing, then exactly rounded float ops) drawn on
                     the device equal the CPU's, bit for bit
    same_z           the counter noise drawn on the device equals the CPU's draw, bit for bit (chapter 10); where
                     it does not (log, cos and sin are each kernel library's), how far: largest |Δz| and in ulps
    no_host_sync     the fused step runs under torch.cuda.set_sync_debug_mode("error") (GPU only)
    graphs_match     steps replayed as CUDA graphs give the losses, g and B of the fused step
    pack_graphs      a pack of runs replayed as CUDA graphs gives the records and B's of the same fused pack
                     stepped without graphs (all runs, then some of them)
    group_graphs     a pack stepped in width groups (Pack.width_groups) and replayed as CUDA graphs, its groups
                     changing runs from step to step, gives the records and B's of the same grouped pack without
                     graphs (one graph per number of runs and shape, its runs read from buffers)
    seed_replay      the runs of a pack replayed as CUDA graphs, rebuilt from their recorded projected gradients
                     (a seed checkpoint's resume, prge_lib.zo.replay.rebuild), give their adapters bit for bit
    fp16_adapter     with an fp16 base, B and the update stay fp32 and the step's losses are finite
"""
from __future__ import annotations

from typing import Callable

import torch

from prge_lib.models.objective import synthetic_batch
from prge_lib.zo.fused import FusedPRGE, draw_all, fused_prge_step, host_record
from prge_lib.zo.graphs import GraphedPRGE
from prge_lib.zo.lora import DEFAULT_TARGETS, inject_lorafa
from prge_lib.zo.packing import build_pack
from prge_lib.zo.prge import step_seeds
from prge_lib.zo.prng import compiles_on, counter_uniforms, tensor_key
from prge_lib.zo.replay import adapter_digest, rebuild

CHECKS = ("same_uniforms", "same_z", "no_host_sync", "graphs_match", "pack_graphs", "group_graphs", "seed_replay",
          "fp16_adapter")


def _adapted(make_model: Callable[[str], torch.nn.Module], dtype: str = "fp32", r: int = 16):
    model = make_model(dtype)
    return model, inject_lorafa(model, DEFAULT_TARGETS, r, seed=0, noise="counter")


def _batch(model, rows: int = 2, length: int = 32):
    batch = synthetic_batch(rows, length, model.config.vocab_size, seed=1)
    batch.attention_mask[0, : length // 4] = 0                          # a left-padded row
    return batch.to(next(model.parameters()).device)


def same_z(make_model) -> dict:
    _, layers = _adapted(make_model)
    seeds = step_seeds(0, 3, 4)
    here = draw_all(layers, seeds)
    cpu = draw_all([_CpuView(layer) for layer in layers], seeds)
    here = here.cpu()
    differing = int((here != cpu).sum())
    gap = (here - cpu).abs()
    spacing = torch.nextafter(cpu.abs(), torch.tensor(float("inf"))) - cpu.abs()     # one ulp at each z
    return {"passed": differing == 0, "elements": here.numel(), "differing": differing,
            "max_abs_diff": float(gap.max()), "max_ulps": float((gap / spacing).max()),
            "mean_abs_diff": float(gap.mean()), "compiled": compiles_on(layers[0].lora_B.device.type)}


def same_uniforms(make_model) -> dict:
    _, layers = _adapted(make_model)
    device = layers[0].lora_B.device
    keys = tensor_key(torch.tensor(step_seeds(0, 3, 4), dtype=torch.int64), 0).unsqueeze(1)
    numel = sum(layer.lora_B.numel() for layer in layers)
    here = counter_uniforms(keys.to(device), 0, numel).cpu()
    differing = int((here != counter_uniforms(keys, 0, numel)).sum())
    return {"passed": differing == 0, "elements": here.numel(), "differing": differing}


class _CpuView:
    """What :func:`draw_all` reads of a layer, with its B on the CPU."""

    def __init__(self, layer):
        self.offset, self.noise_source, self.index = layer.offset, layer.noise_source, layer.index
        self.lora_B = torch.empty(layer.lora_B.shape)


def no_host_sync(make_model) -> dict:
    model, layers = _adapted(make_model)
    device = next(model.parameters()).device
    if device.type != "cuda":
        return {"passed": None, "why": "not on a GPU"}
    batch = _batch(model)
    fused_prge_step(model, layers, batch, step_seeds(0, 0, 4), 1e-2, 1e-3)       # lazy initialisation first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = fused_prge_step(model, layers, batch, step_seeds(0, 1, 4), 1e-2, 1e-3)
        error = None
    except RuntimeError as err:
        error = str(err).splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return {"passed": error is None, "error": error} if error else \
        {"passed": True, "finite": host_record(out)["finite"]}


def graphs_match(make_model, steps: int = 3) -> dict:
    model, layers = _adapted(make_model)
    ref_model, ref_layers = _adapted(make_model)
    graphed = GraphedPRGE(model, layers, 4, 1e-2, 1e-2, seed=5)
    batch = _batch(model)
    worst_loss, worst_b = 0.0, 0.0
    for t in range(steps):
        record = graphed.step(batch, t)
        ref = host_record(fused_prge_step(ref_model, ref_layers, batch, step_seeds(5, t, 4), 1e-2, 1e-2,
                                          device_mask=True))
        worst_loss = max(worst_loss, abs(record["loss"] - ref["loss"]),
                         *(abs(a - b) for a, b in zip(record["projected_grad"], ref["projected_grad"])))
        worst_b = max(worst_b, max(float((a.lora_B.detach() - b.lora_B.detach()).abs().max())
                                    for a, b in zip(layers, ref_layers)))
    return {"passed": worst_loss <= 1e-5 and worst_b <= 1e-6, "graphs": graphed.graphs, "shapes": len(graphed.steps),
            "max_loss_or_g_gap": worst_loss, "max_b_gap": worst_b}


def _pack_settings(runs: int) -> list[dict]:
    """``runs`` fused runs of one q (so a pack steps them with its batched update), each with its own seed, lr
    and, every other run, ε."""
    return [{"targets": DEFAULT_TARGETS, "r": 16, "alpha": 16, "noise": "counter", "q": 4, "eps": 1e-2 * (1 + r % 2),
             "lr": 1e-2 * (r + 1), "seed": r, "keep_noise": True} for r in range(runs)]


def _packs_agree(make_model, steps: list[dict[int, int]], width_groups: int = 1) -> dict:
    """The same fused pack with and without CUDA graphs over ``steps`` (each: run → its batch length), with its
    largest gaps in the records (loss, g) and in the B's."""
    runs = 1 + max(r for step in steps for r in step)
    settings = _pack_settings(runs)
    packs = [build_pack(make_model("fp32"), settings, pad_id=0, fused=True, graphs=graphs, width_groups=width_groups)
             for graphs in (False, True)]
    model = packs[0].model
    worst_loss = 0.0
    for t, lengths in enumerate(steps):
        work = {r: (_batch(model, length=n), t) for r, n in lengths.items()}
        plain, graphed = (pack.step(work) for pack in packs)
        worst_loss = max(worst_loss, *(abs(a - b) for r in work for a, b in
                                       zip([plain[r]["loss"], *plain[r]["projected_grad"]],
                                           [graphed[r]["loss"], *graphed[r]["projected_grad"]])))
    worst_b = float((packs[0].flat - packs[1].flat).abs().max())
    return {"passed": worst_loss <= 1e-5 and worst_b <= 1e-6, "runs": runs, "graphs": len(packs[1].buffered),
            "max_loss_or_g_gap": worst_loss, "max_b_gap": worst_b}


def pack_graphs(make_model, runs: int = 4, steps: int = 3) -> dict:
    every, some = {r: 32 for r in range(runs)}, {r: 32 for r in range(0, runs, 2)}      # then some runs only
    return _packs_agree(make_model, [every] * steps + [some])


def group_graphs(make_model) -> dict:
    """Four runs in two width groups; the runs of each group change from step to step (so its graph replays
    for other runs), and so do the groups' widths."""
    lengths = [(16, 32, 16, 32), (32, 16, 32, 16), (16, 16, 32, 32), (32, 32, 16, 16)]
    return {**_packs_agree(make_model, [dict(enumerate(step)) for step in lengths], width_groups=2),
            "width_groups": 2}


def seed_replay(make_model, runs: int = 4, steps: int = 5) -> dict:
    """A pack of runs of one q (the batched update, as CUDA graphs on a GPU) steps ``steps`` times; each run is then
    rebuilt on a fresh pack from its recorded projected gradients alone, and its digest compared."""
    settings = _pack_settings(runs)
    model = make_model("fp32")
    trained = build_pack(model, settings, pad_id=0, fused=True, graphs=next(model.parameters()).device.type == "cuda")
    history = {r: [] for r in range(runs)}
    for t in range(steps):
        for r, record in trained.step({r: (_batch(trained.model), t) for r in range(runs)}).items():
            history[r].append(record["projected_grad"])
    fresh = build_pack(make_model("fp32"), settings, pad_id=0, fused=True)
    equal, gap = 0, 0.0
    for r in range(runs):
        method = fresh.method(r)
        rebuild(method, history[r])
        equal += adapter_digest(method.trainable()) == adapter_digest(trained.method(r).trainable())
        gap = max(gap, float((fresh.flat[r] - trained.flat[r]).abs().max()))
    return {"passed": equal == runs, "runs": runs, "steps": steps, "equal_runs": equal, "max_b_gap": gap}


def fp16_adapter(make_model) -> dict:
    model, layers = _adapted(make_model, "fp16")
    method = FusedPRGE(model, layers, 4, 1e-2, 1e-3, seed=0)
    record = method.step(_batch(model), 0)
    dtypes = sorted({str(layer.lora_B.dtype) for layer in layers} | {str(layer.lora_A.dtype) for layer in layers})
    base = str(layers[0].base.weight.dtype)
    return {"passed": dtypes == ["torch.float32"] and base == "torch.float16" and record["finite"],
            "adapter_dtypes": dtypes, "base_dtype": base, "loss": record["loss"]}


def gpu_checks(make_model: Callable[[str], torch.nn.Module], names=CHECKS) -> dict:
    """Run the named checks on fresh models from ``make_model(dtype)``; each records ``passed`` (None where it
    cannot run here) and its numbers, or the error it stopped with."""
    results = {}
    for name in names:
        if name not in CHECKS:
            raise ValueError(f"unknown check {name!r}; choose from {list(CHECKS)}")
        try:
            results[name] = globals()[name](make_model)
        except Exception as err:            # a check that breaks is a failed check, recorded with its error
            results[name] = {"passed": False, "error": f"{type(err).__name__}: {err}"}
    return results
