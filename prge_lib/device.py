"""The P-RGE training step as one exportable program (Gao et al. Alg. 1 + 2, §3.3; chapter 10).

Gao et al.'s dual-forwarding LoRA-FA module keeps the +ε and −ε copies of B inside the program and recovers the
previous noise from their difference, because the runtime cannot reset a random generator. Here the noise comes
from the counter-based generator of :mod:`prge_lib.prng` (integer ops, a pure function of seed and position),
so nothing but the master B is needed, and the whole step is a pure function:

    inputs   input_ids (b, L), attention_mask (b, L), targets (b, T)     one batch of b rows, left-padded
             adapter (d,)                                                every LoRA-B, flattened, fp32
             seeds (q,) int64, lr (), eps ()                             tensors, never baked-in constants
    program  the batch repeated 2q times; group c uses B + s_c ε z(seed_c)          Alg. 1 lines 4–9
             losses ℓ±_i = answer-token cross-entropy of each group                   line 9
             g_i = (ℓ+_i − ℓ−_i) / 2ε;   B' = B − (lr/q) Σ_i g_i z_i                  lines 11, 14
    outputs  losses (2, q), adapter' (d,)

The host keeps the adapter between calls (and can save it between app runs); it feeds the batch and the step's
seeds, and keeps ``adapter'`` only when the losses are finite. One call is one full training step, so the
program's trajectory can be compared with the eager trainer step by step.
"""
from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from .lora import LoRAFALinear, keeping_noise, perturbed
from .prge import PRGE, step_seeds
from .prng import counter_normal
from .rge import check_zo_settings
from .objective import Batch, copy_losses


class TrainStep(nn.Module):
    """One P-RGE step (outer and inner loop in one forward) over the LoRA-FA layers of ``model``."""

    def __init__(self, model: nn.Module, q: int):
        super().__init__()
        if q < 1:
            raise ValueError(f"q must be at least 1, got {q}")
        self.q = q
        self.layers = [m for m in model.modules() if isinstance(m, LoRAFALinear)]
        if not self.layers:
            raise ValueError("the model has no LoRA-FA layers; call prge_lib.lora.inject_lorafa first")
        counter = [layer for layer in self.layers if layer.noise_source != "counter"]
        if counter:
            raise ValueError("an exported step needs the counter noise source (inject_lorafa(..., "
                             f"noise='counter')); {len(counter)} layers use {counter[0].noise_source!r}")
        self.loss = CopyLosses(model, 2 * q)
        names = {m: n for n, m in self.loss.named_modules()}
        self.names = [f"{names[layer]}.lora_B" for layer in self.layers]
        self.shapes = [tuple(layer.lora_B.shape) for layer in self.layers]
        self.sizes = [layer.lora_B.numel() for layer in self.layers]
        offsets = [layer.offset for layer in self.layers]
        if offsets != [sum(self.sizes[:j]) for j in range(len(self.sizes))]:
            raise ValueError("the LoRA-FA layers' noise offsets do not tile the adapter in layer order; "
                             "inject the layers with one inject_lorafa call")

    def adapter(self) -> torch.Tensor:
        """The model's current LoRA-B matrices, flattened in layer order: the program's state vector."""
        return torch.cat([layer.lora_B.detach().reshape(-1) for layer in self.layers])

    def load(self, adapter: torch.Tensor) -> None:
        """Write a state vector back into the model's LoRA-B parameters."""
        with torch.no_grad():
            for layer, part in zip(self.layers, self.split(adapter)):
                layer.lora_B.copy_(part)

    def split(self, adapter: torch.Tensor) -> list[torch.Tensor]:
        if adapter.shape != (sum(self.sizes),):
            raise ValueError(f"adapter must have shape ({sum(self.sizes)},), got {tuple(adapter.shape)}")
        return [part.reshape(shape) for part, shape in zip(torch.split(adapter, self.sizes), self.shapes)]

    def forward(self, input_ids, attention_mask, targets, adapter, seeds, lr, eps):
        matrices = self.split(adapter)
        seed_list = [seeds[i] for i in range(self.q)]
        # z_i for every layer in one draw per seed (the layers' counter ranges tile the adapter), kept for
        # the forward and the update: a small graph instead of one generator per layer, seed and use
        noise = [torch.split(counter_normal(s, 0, (sum(self.sizes),)), self.sizes) for s in seed_list]
        given = [{s: z[j].reshape(self.shapes[j]) for s, z in zip(seed_list, noise)} for j in range(len(self.layers))]
        copies = [(s, eps) for s in seed_list] + [(s, -eps) for s in seed_list]
        with keeping_noise(self.layers, given), perturbed(self.layers, copies):
            losses = torch.func.functional_call(self.loss, dict(zip(self.names, matrices)),
                                                (input_ids, attention_mask, targets), strict=False)
        losses = losses.reshape(2, self.q)
        g = (losses[0] - losses[1]) / (2 * eps)                                  # Alg. 1 line 11
        step = sum(gi * z for gi, z in zip(g.unbind(), (torch.cat(parts) for parts in noise)))
        return losses, adapter - (lr / self.q) * step                            # line 14


class CopyLosses(nn.Module):
    """The loss of each of the n copies of a batch (``prge_lib.objective.copy_losses``) as a module."""

    def __init__(self, model: nn.Module, n: int):
        super().__init__()
        self.model, self.n = model, n

    def forward(self, input_ids, attention_mask, targets):
        return copy_losses(self.model, Batch(input_ids, attention_mask, targets).repeat(self.n), self.n)


# ----------------------------------------------------------------- building and exporting the program

BACKENDS = ("xnnpack", "portable")
PROGRAM_DTYPES = ("fp32", "fp16")


def truncate_layers(model: nn.Module, layers: int) -> nn.Module:
    """Keep the first ``layers`` decoder layers (a smaller program for tests and fast mode)."""
    total = len(model.model.layers)
    if not 1 <= layers <= total:
        raise ValueError(f"layers must be between 1 and {total} for this model, got {layers}")
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:layers]
    return model


def fit_width(batch: Batch, width: int, pad_id: int, target_width: int | None = None) -> Batch:
    """Left-pad (or cut from the left) every row to exactly ``width`` tokens, and the targets to
    ``target_width`` columns: a program has fixed shapes. The answer sits at the right end, so cutting from
    the left never loses it."""
    from .objective import IGNORE

    length = batch.input_ids.shape[1]
    if length >= width:
        ids, mask = batch.input_ids[:, -width:], batch.attention_mask[:, -width:]
    else:
        ids = torch.nn.functional.pad(batch.input_ids, (width - length, 0), value=pad_id)
        mask = torch.nn.functional.pad(batch.attention_mask, (width - length, 0), value=0)
    targets = batch.targets
    if target_width is not None:
        if targets.shape[1] > target_width:
            raise ValueError(f"a target of {targets.shape[1]} tokens does not fit the program's "
                             f"{target_width}; export with a larger target width")
        targets = torch.nn.functional.pad(targets, (target_width - targets.shape[1], 0), value=IGNORE)
    return Batch(ids, mask, targets)


def example_inputs(step: TrainStep, rows: int, seq_len: int, target_len: int, vocab: int,
                   pad_id: int = 0) -> tuple:
    """Inputs of the shapes the program is exported for (their values only guide tracing)."""
    ids = torch.randint(1, vocab, (rows, seq_len))
    mask = torch.ones(rows, seq_len, dtype=torch.long)
    ids[0, 0], mask[0, 0] = pad_id, 0            # a padded position, so masking is traced as data
    targets = torch.randint(1, vocab, (rows, target_len))
    return (ids, mask, targets, step.adapter(), torch.arange(step.q, dtype=torch.int64),
            torch.tensor(1e-3), torch.tensor(1e-2))


def export_program(step: TrainStep, inputs: tuple, path, backend: str = "xnnpack") -> dict:
    """torch.export → ExecuTorch (XNNPACK-delegated or portable kernels) → ``path`` (.pte).
    Returns the timings, the file size and the operators of the exported graph."""
    import time

    from executorch.exir import to_edge_transform_and_lower

    from .provenance import atomic_file

    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from {BACKENDS}")
    start = time.perf_counter()
    with torch.no_grad():
        exported = torch.export.export(step, inputs)
    export_s = time.perf_counter() - start
    ops = sorted({str(node.target) for node in exported.run_decompositions().graph.nodes
                  if node.op == "call_function"})
    partitioner = []
    if backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        partitioner = [XnnpackPartitioner()]
    start = time.perf_counter()
    program = to_edge_transform_and_lower(exported, partitioner=partitioner).to_executorch()
    lower_s = time.perf_counter() - start
    # the arena the runtime allocates for intermediate tensors (memory planning done at export)
    planned = sum(program.executorch_program.execution_plan[0].non_const_buffer_sizes)
    with atomic_file(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(program.buffer)
    size = Path(path).stat().st_size
    return {"export_s": export_s, "lower_s": lower_s, "pte_bytes": size, "planned_bytes": planned, "ops": ops}


@contextmanager
def without_cpu_probe_chatter():
    """Drop the lines the runtime logs while XNNPACK probes the CPU at load time ("[cpuinfo_utils.cpp:71]
    Reading file ..."); anything else it writes is passed on. The runtime writes to file descriptor 2, or
    through Python's ``sys.stderr`` when that is not a file (in a notebook), so both are captured."""
    import io

    sys.stderr.flush()
    saved_fd, saved_stream, text = os.dup(2), sys.stderr, io.StringIO()
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        sys.stderr = text
        try:
            yield
        finally:
            sys.stderr = saved_stream
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            captured.seek(0)
            lines = (captured.read().decode(errors="replace") + text.getvalue()).splitlines(keepends=True)
            kept = "".join(line for line in lines if not line.startswith("[cpuinfo_utils"))
            if kept:
                sys.stderr.write(kept)


class RuntimeStep:
    """A .pte training step loaded in the ExecuTorch runtime, called like :class:`TrainStep`. With ``etdump``
    the runtime records every operator's time (``program.write_etdump_result_to_file``; chapter 10)."""

    def __init__(self, path, etdump: bool = False):
        from executorch.runtime import Runtime

        self.program = Runtime.get().load_program(str(path), enable_etdump=etdump)
        with without_cpu_probe_chatter():
            self.method = self.program.load_method("forward")

    def __call__(self, *inputs):
        return tuple(self.method.execute(list(inputs)))


class ProgramPRGE(PRGE):
    """P-RGE whose every step runs in an exported program (chapter 10): the trainer's method object.

    The adapter lives on the host: it is fed to the program each step and the returned one is kept when the
    losses are finite. It is also written back into ``model``'s LoRA-B after each step, so evaluation and
    checkpoints work on the eager model exactly as for :class:`prge_lib.prge.PRGE`."""

    def __init__(self, model, layers, path, q: int, eps: float, lr: float, seed: int, width: int,
                 pad_id: int = 0):
        super().__init__(model, layers, q, eps, lr, seed)
        self.state = TrainStep(model, q)
        self.program = RuntimeStep(path)
        settings = read_program_meta(path)["settings"]
        expected = {"q": q, "seq_len": width, "adapter_size": sum(self.state.sizes)}
        differ = {k: (settings[k], v) for k, v in expected.items() if settings[k] != v}
        if differ:
            raise ValueError(f"the program {path} was exported for other settings (program, run): {differ}")
        self.width, self.target_width, self.pad_id = width, settings["target_width"], pad_id

    def step(self, batch: Batch, t: int) -> dict:
        b = fit_width(batch.to("cpu"), self.width, self.pad_id, self.target_width)
        seeds = torch.tensor(step_seeds(self.seed, t, self.q), dtype=torch.int64)
        losses, adapter = self.program(b.input_ids, b.attention_mask, b.targets, self.state.adapter(), seeds,
                                       torch.tensor(float(self.lr)), torch.tensor(float(self.eps)))
        finite = bool(torch.isfinite(losses).all())
        if finite:
            self.state.load(adapter)
        g = (losses[0] - losses[1]) / (2 * self.eps)
        return {"loss": float(losses.mean()), "finite": finite, "projected_grad": g.tolist()}


def meta_path(pte) -> Path:
    """The JSON beside a program that records how it was built (``model.pte`` → ``model.json``)."""
    return Path(pte).with_suffix(".json")


def read_program_meta(pte) -> dict:
    path = meta_path(pte)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: it records the settings {pte} was exported with "
                                "(write both with `prge export`)")
    import json
    return json.loads(path.read_text())


def export_training_program(task: str, out, model: str | None = None, layers: int | None = None, q: int = 4,
                            E: int = 16, seq_len: int = 64, r: int = 16, alpha: float = 32,
                            targets=None, seed: int = 0, backend: str = "xnnpack", dtype: str = "fp32") -> dict:
    """Build the P-RGE step for ``task`` on the model, export it to ``out`` (.pte) and write its settings,
    the export statistics and provenance beside it (:func:`meta_path`). Returns that record.

    ``dtype`` is the frozen weights' precision (fp32 or fp16); the adapter, its noise and the update stay
    fp32 (chapter 10, "fp16 in the program?")."""
    import time

    from .data import sample_task
    from .lora import DEFAULT_TARGETS, inject_lorafa
    from .models import load_model
    from .objective import encode_example
    from .provenance import provenance, write_result
    from .tasks import get_task

    check_zo_settings(q, E, dtype=dtype)
    if dtype not in PROGRAM_DTYPES:
        raise ValueError(f"a program's weights can be {PROGRAM_DTYPES}, got {dtype!r} (bf16 breaks ZO: the "
                         f"perturbation ε·z falls below its 8-bit mantissa)")
    start = time.perf_counter()
    spec = get_task(task)
    net, tokenizer = load_model(model, dtype=dtype)
    if layers is not None:
        truncate_layers(net, layers)
    # the same attention written as matmul + softmax: the SDPA fallback that export otherwise traces adds
    # masking ops (eq, where, logical_not) that XNNPACK does not take, leaving them to the portable kernels
    net.set_attn_implementation("eager")
    targets = tuple(targets or DEFAULT_TARGETS)
    inject_lorafa(net, targets, r, alpha, seed=seed, noise="counter")
    step = TrainStep(net, q)
    data = sample_task(spec, seed)
    target_width = max(len(encode_example(spec, tokenizer, ex)[1]) for ex in data.train)
    inputs = example_inputs(step, E // q, seq_len, target_width, net.config.vocab_size, tokenizer.pad_token_id)
    stats = export_program(step, inputs, out, backend)
    settings = {"task": task, "model": model, "layers": layers if layers is not None else len(net.model.layers),
                "truncated": layers is not None, "q": q, "E": E, "rows": E // q, "seq_len": seq_len,
                "target_width": target_width, "r": r, "alpha": alpha, "targets": list(targets), "seed": seed,
                "backend": backend, "dtype": dtype, "adapter_size": sum(step.sizes), "adapter_layers": len(step.sizes),
                "inputs": ["input_ids (rows, seq_len) int64", "attention_mask (rows, seq_len) int64",
                           f"targets (rows, {target_width}) int64", f"adapter ({sum(step.sizes)},) float32",
                           f"seeds ({q},) int64", "lr () float32", "eps () float32"],
                "outputs": [f"losses (2, {q}) float32: row 0 +eps, row 1 -eps",
                            f"adapter ({sum(step.sizes)},) float32 after the step"]}
    record = {"kind": "program", "seed": seed, "settings": settings, **stats,
              "provenance": provenance(time.perf_counter() - start)}
    write_result(meta_path(out), record)
    return record


def train_in_runtime(pte, task: str, steps: int, lr: float | None = None, eps: float | None = None,
                     eval_every: int = 0, check_eager: bool = False, checkpoint_dir=None,
                     checkpoint_every: int = 100, resume: bool = False, save_adapter_to=None,
                     progress: bool = True, **sizes) -> dict:
    """Train ``task`` for ``steps`` steps with the program ``pte`` in the ExecuTorch runtime (Gao et al. §4.3).

    The run's settings (q, E, rank, targets, seed, width) come from the program's sidecar. With
    ``check_eager`` the eager P-RGE trainer runs the same steps with the same seeds and data, and the result
    gains ``parity``: the relative difference of the per-step losses (the paper's sanity check). Checkpoints
    go to ``checkpoint_dir`` (the eager twin's to its ``eager/`` subfolder); ``resume`` continues from them
    with a freshly loaded program. ``sizes``: n_train, n_val, n_test."""
    from .lora import save_adapter
    from .train import TrainConfig, Trainer

    meta = read_program_meta(pte)
    s = meta["settings"]
    if resume and not checkpoint_dir:
        raise ValueError("resume needs checkpoint_dir (the folder of the run to continue)")
    common = dict(task=task, method="prge", steps=steps, lr=lr, eps=eps, q=s["q"], E=s["E"], outer=True,
                  inner=True, noise="counter", r=s["r"], alpha=s["alpha"], targets=tuple(s["targets"]),
                  seed=s["seed"], layers=s["layers"] if s["truncated"] else None, max_length=s["seq_len"],
                  model=s["model"], dtype=s.get("dtype", "fp32"), eval_every=eval_every,
                  checkpoint_every=checkpoint_every if checkpoint_dir else 0,
                  **sizes)
    runs = {"runtime": TrainConfig(program=str(pte), **common)}
    if check_eager:
        runs["eager"] = TrainConfig(**common)
    runs = {label: config.resolved() for label, config in runs.items()}   # refuse bad settings before any run
    results = {}
    for label, config in runs.items():
        folder = None if not checkpoint_dir else Path(checkpoint_dir) / ("eager" if label == "eager" else "")
        trainer = Trainer(config, checkpoint_dir=folder, progress=progress)
        results[label] = trainer.run(resume=resume)
        if label == "runtime" and save_adapter_to:
            save_adapter(trainer.model, save_adapter_to, {"task": task, "method": "prge", "program": Path(pte).name})
    result = {"kind": "device-train", "task": task, "seed": s["seed"], "program": Path(pte).name,
              "program_settings": s, "program_commit": meta.get("provenance", {}).get("commit"),
              **results["runtime"], "status": "finished"}
    if check_eager:
        ours, eager = result["losses"], results["eager"]["losses"]
        rel = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours, eager)]
        result["eager"] = results["eager"]
        result["parity"] = {"max_rel_loss_diff": max(rel), "per_step_rel_loss_diff": rel, "steps": len(rel),
                            "within_1e-4": max(rel) <= 1e-4}
    return result
