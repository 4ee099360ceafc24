"""An ExecuTorch client in a round (chapter 11): the exported step of chapter 10 trains k steps on the device,
the client uploads the steps' seed indices and projected gradients (:class:`prge_lib.distributed.upload.Upload`), and
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

* the program forms S = Σ_i g_i z_i (q products, q − 1 sums: ≤ q u), the factor c = η/q in fp32 (η rounded,
  then divided: 2 u), c·S (u) and B − c·S (u): at most (q + 4) u M_t;
* the eager update (:func:`prge_lib.zo.prge.apply_update`) rounds η g_i / q to fp32 (u), each product α_i z_i
  (u) and each of the q running sums (u each): at most (q + 2) u M_t;
* the runtime's z comes from the same integer hash, but its log, cos and sin are other implementations:
  XNNPACK's approximations differ from PyTorch's by up to about 10⁻⁴ absolute, so this term is measured, not
  derived. :class:`DeviceNoise` exports the generator alone with the program's backend and runs it in the
  runtime: the device's own z̃ (with them, the host's g reproduce the program's update bit for bit:
  ``tests/test_client.py``), which adds (η/q) Σ_i |g_i| |z̃_i − z_i|.

So, element by element after k steps (the difference is carried from step to step unchanged, and its own
rounding is part of the u |B_t| terms),

    |B_runtime − B_replay| ≤ (2q + 6) u Σ_t M_t + Σ_t (η/q) Σ_i |g_t,i| |z̃_t,i − z_t,i|.

:func:`replay_with_envelope` computes that envelope during the replay and :func:`replay_parity` measures the gap
against it. Eager client to eager client, the same upload gives the same bits
(:func:`prge_lib.zo.replay.adapter_digest`).
"""
from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from prge_lib.deploy.device_train import train_in_runtime
from prge_lib.deploy.export import check_program, export_program, read_program_meta
from prge_lib.deploy.program import flat_adapter, load_flat_adapter
from prge_lib.deploy.runtime import ProgramPRGE, RuntimeStep
from prge_lib.zo.replay import checked_steps, replay
from prge_lib.distributed.upload import Upload, check_upload, upload_of_run
from prge_lib.models.loading import load_model
from prge_lib.training.config import TrainConfig
from prge_lib.training.trainer import build_method
from prge_lib.zo.defaults import DEFAULT_TARGETS
from prge_lib.zo.lora import adapter_state, read_adapter
from prge_lib.zo.prge import PRGE, step_seeds, update_alphas
from prge_lib.zo.prng import counter_normal

UNIT_ROUNDOFF = 2.0 ** -24          # fp32


def envelope_constant(q: int) -> int:
    """Roundings per step that separate the runtime's update arithmetic from the eager one, in units of u·M_t."""
    return (q + 4) + (q + 2)          # the program's, the eager update's (module docstring)


class GeneratorStep(nn.Module):
    """The counter generator alone: z(seed) over the whole adapter, as the program draws it."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def forward(self, seed):
        return counter_normal(seed, 0, (self.size,))


class DeviceNoise:
    """The device's own z: :class:`GeneratorStep` exported with the program ``pte``'s backend into ``folder`` and
    run in the ExecuTorch runtime; called with a seed, it returns the flattened adapter's z as the device draws it."""

    def __init__(self, pte, folder):
        settings = read_program_meta(pte)["settings"]
        self.path = Path(folder) / f"generator_{settings['adapter_size']}_{settings['backend']}.pte"
        export_program(GeneratorStep(settings["adapter_size"]), (torch.tensor(0),), self.path, settings["backend"])
        self.program = RuntimeStep(self.path)

    def __call__(self, seed: int) -> torch.Tensor:
        return self.program(torch.tensor(seed, dtype=torch.int64))[0]


@dataclass
class Envelope:
    """Per LoRA-B (by its name in :func:`prge_lib.zo.lora.adapter_state`), the bound on the distance between the
    device's adapter and the replayed one; ``generator_gap``: the largest |z̃ − z| met on the way."""

    bound: dict[str, torch.Tensor]
    generator_gap: float


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


def program_client(setup, program) -> ProgramPRGE:
    """A federated device client (:class:`prge_lib.distributed.federated.FederatedRun` ``device_method``): the
    exported step ``program`` on the setup's eager model and layers, so that it reads the adapter a round starts
    from; refused, with the settings that differ, when it was exported for another run."""
    if not Path(program).is_file():
        raise FileNotFoundError(f"--program {program}: no such file")
    c, method = setup.config, setup.method
    if c.noise != "counter":
        raise ValueError("a device client draws the counter noise of its program; give the run --noise counter, so "
                         "that the eager clients replay its steps with the same z")
    settings = read_program_meta(program)["settings"]
    run = {"task": c.task, "E": c.E, "seed": c.seed, "r": c.r, "alpha": c.alpha, "layers": c.layers}
    differ = {k: (settings.get(k), v) for k, v in run.items() if settings.get(k) != v}
    if differ:       # A is drawn from the seed when the step is exported: another seed would train another adapter
        raise ValueError(f"the program {program} was exported for other settings (program, run): {differ}; export "
                         f"it with this run's task, E, seed, r, alpha and layers")
    return ProgramPRGE(method.model, method.layers, program, c.q, c.eps, c.lr, c.seed, c.max_length,
                       setup.tokenizer.pad_token_id)


def replay_config(record: dict, source: str = "the config") -> TrainConfig:
    """The run's config for an eager client: a training result's ``config`` (a device run's or the trainer's)
    or the config's fields themselves, resolved, without the program a device ran."""
    values = dict(record["config"] if "config" in record else record)
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(values) - known)
    if unknown or "task" not in values:
        what = f"unknown fields {unknown[:3]}" if unknown else "no task"
        raise ValueError(f"{source} is not a training config: {what} (give a result file of `prge train` or "
                         f"`prge device-train`, or its config)")
    values.update(program=None, targets=tuple(values.get("targets") or DEFAULT_TARGETS))
    return TrainConfig(**values).resolved()


def eager_client(config: TrainConfig, model=None) -> PRGE:
    """Another client: P-RGE built for the run's config (A from the run seed, B = 0) on a freshly loaded model."""
    if model is None:
        model, _ = load_model(config.model, dtype=config.dtype)
    return build_method(config, model)


@torch.no_grad()
def replay_with_envelope(method: PRGE, upload: Upload, device_noise: DeviceNoise) -> Envelope:
    """Replay ``upload`` on ``method`` step by step and return the envelope of the module docstring on its distance
    from the adapter the device computed from the same steps, with the device's z from ``device_noise``."""
    check_upload(method, upload)
    arithmetic = [torch.zeros_like(layer.lora_B) for layer in method.layers]
    generator = [torch.zeros_like(layer.lora_B) for layer in method.layers]
    largest = 0.0
    for (t, g), seeds in zip(upload.steps, upload.seeds()):
        drawn = [device_noise(seed) for seed in seeds]
        for layer, total, differ in zip(method.layers, arithmetic, generator):
            total += layer.lora_B.abs()
            for seed, gi, device_z in zip(seeds, g, drawn):
                z = layer.noise(seed)
                gap = (device_z[layer.offset:layer.offset + z.numel()].reshape(z.shape) - z).abs()
                largest = max(largest, float(gap.max()))
                total += abs(method.lr * gi / method.q) * z.abs()
                differ += abs(method.lr * gi / method.q) * gap
        replay(method, [g], start=t)
    names = {module: name for name, module in method.model.named_modules()}
    scale = envelope_constant(method.q) * UNIT_ROUNDOFF
    return Envelope({f"{names[layer]}.lora_B": scale * total + differ
                     for layer, total, differ in zip(method.layers, arithmetic, generator)}, largest)


def replay_parity(device_adapter: dict[str, torch.Tensor], method: PRGE, envelope: Envelope) -> dict:
    """The device client's adapter against the one ``method`` replayed: the LoRA-A (drawn from the run seed on
    both) bit for bit, and the largest gap of the LoRA-B in units of the envelope (≤ 1 passes), absolute and
    relative to the replayed adapter's norm."""
    mine, bound = adapter_state(method.model), envelope.bound
    if set(mine) != set(device_adapter):
        differ = sorted(set(mine) ^ set(device_adapter))
        raise ValueError(f"the device adapter's tensors differ from the run's: {differ[:3]}")
    gaps = {name: (device_adapter[name] - mine[name]).abs() for name in bound}
    norm = torch.cat([mine[name].reshape(-1) for name in bound]).norm()
    gap_norm = torch.cat([gap.reshape(-1) for gap in gaps.values()]).norm()
    ratio = max(float((gaps[name] / bound[name]).max()) for name in bound)
    return {"a_identical": all(torch.equal(device_adapter[n], mine[n]) for n in mine if n not in bound),
            "b_identical": all(float(gap.max()) == 0 for gap in gaps.values()),
            "max_abs_gap": max(float(gap.max()) for gap in gaps.values()),
            "rel_gap": float(gap_norm / norm) if norm > 0 else float(gap_norm),
            "envelope_ratio": ratio, "within_envelope": ratio <= 1.0,
            "envelope_constant": envelope_constant(method.q), "generator_gap": envelope.generator_gap}


class ProgramReplayer:
    """A device that follows a run in the ExecuTorch runtime: the update-only program ``pte``
    (:func:`prge_lib.deploy.export.export_replay_program`) applies each step's update to the adapter, which the host
    keeps flattened between calls. Called like :func:`prge_lib.zo.replay.replay_steps`, so it stands in
    for it in :func:`prge_lib.distributed.federated.apply_broadcast` (``replay=``)."""

    def __init__(self, pte):
        self.settings = check_program(pte)["settings"]
        if self.settings.get("program") != "replay":
            raise ValueError(f"{pte} is not an update-only program (export one with export_replay_program)")
        self.path, self.program = Path(pte), RuntimeStep(pte)

    @torch.no_grad()
    def __call__(self, method: PRGE, steps, lr: float) -> PRGE:
        adapter = flat_adapter(method.layers)
        if (adapter.numel(), method.q) != (self.settings["adapter_size"], self.settings["q"]):
            raise ValueError(f"{self.path} replays adapters of {self.settings['adapter_size']} numbers with q "
                             f"{self.settings['q']}; this run's has {adapter.numel()} with q {method.q}")
        for t, g in checked_steps(steps, method.q):
            seeds = torch.tensor(step_seeds(method.seed, t, method.q), dtype=torch.int64)
            alphas = torch.tensor(update_alphas(g, lr, method.q), dtype=torch.float32)   # as the eager update
            adapter = self.program(adapter, seeds, alphas)[0]
        load_flat_adapter(method.layers, adapter)
        return method
