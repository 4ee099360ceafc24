"""An ExecuTorch client in a round (chapter 11): the exported step of chapter 10 trains k steps on the device,
the client uploads the steps' seeds and projected gradients (:class:`prge_lib.distributed.upload.Upload`), and
another client rebuilds the adapter eagerly from the run's config and that upload alone.

**Where the g come from.** The program returns the (2, q) losses and the new adapter
(:mod:`prge_lib.deploy.program`) and computes g = (ℓ⁺ − ℓ⁻) / 2ε inside from those same fp32 losses. The host
derives g from the returned losses (:func:`prge_lib.deploy.runtime.step_record`) with the same fp32 arithmetic:
the difference of the two rows, divided by 2ε rounded to fp32, which is 2·fl(ε), the program's own divisor.
Correctly rounded subtraction and division of the same inputs give the same floats, so the upload holds the g
that the program applied, and the program's outputs stay as chapter 10 exported them (``tests/test_client.py``
checks it against the adapter the program returns).

**The bound.** Runtime and replay apply the same g but with different kernels, so their adapters differ by
rounding only, and, since neither recomputes a loss, the difference is not amplified by 1/2ε (the eager twin of
chapter 10, which computes its own g, is). Per element and step, with u = 2⁻²⁴ and
M_t = |B_t| + (η/q) Σ_i |g_t,i z_t,i|, to first order in u:

* the program forms S = Σ_i g_i z_i (q products, q − 1 sums: ≤ q u), the factor η/q in fp32 (2 u), c·S (u)
  and B − c·S (u): at most (q + 3) u M_t;
* the eager update (:func:`prge_lib.zo.prge.apply_update`) rounds η g_i / q to fp32 (u), each product α_i z_i
  (u) and each of the q running sums (u each): at most (q + 2) u M_t;
* the runtime's z comes from the same integer hash; its log, sqrt, cos and sin are other implementations. With
  each of log, cos and sin within one ulp (2 u) of the exact value in both libraries, and sqrt and the final
  product correctly rounded, the two z differ by at most 10 u relative: at most 10 u M_t.

So |B_runtime − B_replay| ≤ (2q + 15) u Σ_t M_t element by element after k steps (the difference is carried
from step to step unchanged, and its own rounding is part of the u |B_t| terms). :func:`replay_with_envelope`
computes that envelope during the replay and :func:`replay_parity` measures the gap against it. Eager client to
eager client, the same upload gives the same bits (:func:`prge_lib.distributed.replay.adapter_digest`).
"""
from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from prge_lib.deploy.device_train import train_in_runtime
from prge_lib.distributed.replay import replay
from prge_lib.distributed.upload import Upload, check_upload, upload_of_run
from prge_lib.models.loading import load_model
from prge_lib.training.config import TrainConfig
from prge_lib.training.trainer import build_method
from prge_lib.zo.defaults import DEFAULT_TARGETS
from prge_lib.zo.lora import adapter_state, read_adapter
from prge_lib.zo.prge import PRGE

UNIT_ROUNDOFF = 2.0 ** -24          # fp32
GENERATOR_ROUNDINGS = 10            # the two z's largest relative difference, in units of u (docstring)


def envelope_constant(q: int) -> int:
    """Roundings per step that separate the runtime's update from the eager one, in units of u·M_t."""
    return 2 * q + 5 + GENERATOR_ROUNDINGS


@dataclass
class ClientRound:
    """What the device client holds after its round: its training result, its upload and its adapter."""

    result: dict
    upload: Upload
    adapter: dict[str, torch.Tensor]


def runtime_round(pte, task: str, steps: int, host: str = "python", progress: bool = False,
                  **settings) -> ClientRound:
    """The device client trains ``steps`` steps of the run from its start with the program ``pte`` in the
    ExecuTorch runtime (``host``: "python" or the C++ trainer, ``prge_lib.deploy.device_train.HOSTS``) and
    keeps the trained adapter. ``settings``: lr, eps, check_eager, n_train, n_val, n_test
    (:func:`prge_lib.deploy.device_train.train_in_runtime`)."""
    with tempfile.TemporaryDirectory(prefix="prge-client-") as folder:
        saved = Path(folder) / "adapter.safetensors"
        result = train_in_runtime(pte, task, steps, host=host, progress=progress, save_adapter_to=saved,
                                  **settings)
        adapter = read_adapter(saved)
    return ClientRound(result, upload_of_run(result), adapter)


def replay_config(record: dict, source: str = "the config") -> TrainConfig:
    """The run's config for an eager client: a training result's ``config`` (a device run's or the trainer's)
    or the config's fields themselves, resolved, without the program a device ran."""
    values = dict(record["config"] if "config" in record else record)
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(values) - known)
    if unknown or "task" not in values:
        raise ValueError(f"{source} is not a training config: {'unknown fields ' + str(unknown[:3]) if unknown else 'no task'} "
                         f"(give a result file of `prge train` or `prge device-train`, or its config)")
    values.update(program=None, targets=tuple(values.get("targets") or DEFAULT_TARGETS))
    return TrainConfig(**values).resolved()


def eager_client(config: TrainConfig, model=None) -> PRGE:
    """Another client: P-RGE built for the run's config (A from the run seed, B = 0) on a freshly loaded model."""
    if model is None:
        model, _ = load_model(config.model, dtype=config.dtype)
    return build_method(config, model)


@torch.no_grad()
def replay_with_envelope(method: PRGE, upload: Upload) -> dict[str, torch.Tensor]:
    """Replay ``upload`` on ``method`` step by step and return, per LoRA-B (by its name in
    :func:`prge_lib.zo.lora.adapter_state`), the bound (2q + 15) u Σ_t M_t on its distance from the adapter the
    runtime computed from the same steps (module docstring)."""
    check_upload(method, upload)
    sums = [torch.zeros_like(layer.lora_B) for layer in method.layers]
    for t, (seeds, g) in enumerate(zip(upload.seeds, upload.projected_grad), upload.start):
        for total, layer in zip(sums, method.layers):
            total += layer.lora_B.abs()
            for seed, gi in zip(seeds, g):
                total += abs(method.lr * gi / method.q) * layer.noise(seed).abs()
        replay(method, [g], start=t)
    names = {module: name for name, module in method.model.named_modules()}
    scale = envelope_constant(method.q) * UNIT_ROUNDOFF
    return {f"{names[layer]}.lora_B": scale * total for layer, total in zip(method.layers, sums)}


def replay_parity(device_adapter: dict[str, torch.Tensor], method: PRGE, envelope: dict[str, torch.Tensor]) -> dict:
    """The device client's adapter against the one ``method`` replayed: the LoRA-A (drawn from the run seed on
    both) bit for bit, and the largest gap of the LoRA-B in units of the envelope (≤ 1 passes), absolute and
    relative to the replayed adapter's norm."""
    mine = adapter_state(method.model)
    if set(mine) != set(device_adapter):
        raise ValueError(f"the device adapter's tensors differ from the run's: {sorted(set(mine) ^ set(device_adapter))[:3]}")
    gaps = {name: (device_adapter[name] - mine[name]).abs() for name in envelope}
    norm = torch.cat([mine[name].reshape(-1) for name in envelope]).norm()
    gap_norm = torch.cat([gap.reshape(-1) for gap in gaps.values()]).norm()
    ratio = max(float((gaps[name] / envelope[name]).max()) for name in envelope)
    return {"a_identical": all(torch.equal(device_adapter[n], mine[n]) for n in mine if n not in envelope),
            "b_identical": all(float(gap.max()) == 0 for gap in gaps.values()),
            "max_abs_gap": max(float(gap.max()) for gap in gaps.values()),
            "rel_gap": float(gap_norm / norm) if norm > 0 else float(gap_norm),
            "envelope_ratio": ratio, "within_envelope": ratio <= 1.0,
            "envelope_constant": envelope_constant(method.q)}

