"""Exporting the P-RGE step (``prge_lib.deploy.program.TrainStep``) to an ExecuTorch program, and the settings file
written beside it (chapter 10): torch.export, then lowering to XNNPACK or the portable kernels.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from prge_lib.zo.defaults import LORA_ALPHA, LORA_R
from prge_lib.data.pools import sha256
from prge_lib.data.splits import sample_task
from prge_lib.zo.lora import DEFAULT_TARGETS, inject_lorafa
from prge_lib.models.loading import load_model, truncate_layers
from prge_lib.models.objective import encode_example
from prge_lib.deploy.program import ReplayStep, TrainStep
from prge_lib.common.provenance import atomic_file, provenance, write_result
from prge_lib.zo.rge import check_zo_settings
from prge_lib.data.tasks import get_task

BACKENDS = ("xnnpack", "portable")
PROGRAM_DTYPES = ("fp32", "fp16")
# An ExecuTorch program is a flatbuffer whose file identifier, bytes 4 to 8, is the schema's "ET12"
# (executorch/schema/program.fbs); the runtime reads at least 64 bytes of head (Program::kMinHeadBytes)
PROGRAM_IDENTIFIER = b"ET12"
PROGRAM_HEAD_BYTES = 64


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
    from executorch.exir import to_edge_transform_and_lower

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
    return {"export_s": export_s, "lower_s": lower_s, "pte_bytes": size, "pte_sha256": sha256(path),
            "planned_bytes": planned, "ops": ops}


def meta_path(pte) -> Path:
    """The JSON beside a program that records how it was built (``model.pte`` → ``model.json``)."""
    return Path(pte).with_suffix(".json")


def check_program_path(out) -> None:
    """Refuse a program path that is not ``<name>.pte``: its settings go to ``<name>.json`` beside it, so
    ``x.json`` would be overwritten by its own settings."""
    if Path(out).suffix != ".pte":
        raise ValueError(f"--out {out}: a program's name ends in .pte (its settings go to "
                         f"{meta_path(out)} beside it); use --out {Path(out).with_suffix('.pte')}")


def read_program_meta(pte) -> dict:
    path = meta_path(pte)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: it records the settings {pte} was exported with "
                                "(write both with `prge export`)")
    return json.loads(path.read_text())


def check_program_header(pte) -> None:
    """Refuse a file that does not start like an ExecuTorch program (:data:`PROGRAM_IDENTIFIER`), naming it:
    the runtime would fail on it without its name, or abort the process."""
    path = Path(pte)
    if not path.is_file():
        raise FileNotFoundError(f"no program at {path}")
    with open(path, "rb") as f:
        head = f.read(PROGRAM_HEAD_BYTES)
    if len(head) < PROGRAM_HEAD_BYTES or head[4:8] != PROGRAM_IDENTIFIER:
        found = f"{len(head)} bytes long" if len(head) < PROGRAM_HEAD_BYTES else f"bytes 4-8 read {head[4:8]!r}"
        raise ValueError(f"{path} is not an ExecuTorch program ({found}; a program has at least "
                         f"{PROGRAM_HEAD_BYTES} bytes and {PROGRAM_IDENTIFIER.decode()} at bytes 4-8): "
                         f"write it again with `prge export`")


def check_program(pte, say=None) -> dict:
    """The settings record of the program ``pte`` (:func:`read_program_meta`), after checking that the file
    is an ExecuTorch program and is the one the record describes: its size and SHA-256. A record without the
    digest (programs exported before it was kept) has its size checked only, which ``say`` is told."""
    meta = read_program_meta(pte)
    check_program_header(pte)
    size, expected = Path(pte).stat().st_size, meta.get("pte_bytes")
    if expected is not None and size != expected:
        raise ValueError(f"{pte} is {size} bytes, but {meta_path(pte)} records {expected}: the program is not "
                         f"the one exported with these settings (export it again)")
    if "pte_sha256" not in meta:
        if say is not None:
            say(f"{meta_path(pte)} records no SHA-256 of {pte} (exported before it was kept): its header "
                f"{'and size were' if expected is not None else 'was'} checked, its content was not")
    elif sha256(pte) != meta["pte_sha256"]:
        raise ValueError(f"{pte} does not match the SHA-256 in {meta_path(pte)}: the program changed after "
                         f"export (export it again)")
    return meta


def export_training_program(task: str, out, model: str | None = None, layers: int | None = None, q: int = 4,
                            E: int = 16, seq_len: int = 64, r: int = LORA_R, alpha: float = LORA_ALPHA,
                            targets=None, seed: int = 0, backend: str = "xnnpack", dtype: str = "fp32",
                            command: str | None = None) -> dict:
    """Build the P-RGE step for ``task`` on the model, export it to ``out`` (.pte) and write its settings,
    the export statistics and provenance (naming ``command``) beside it (:func:`meta_path`). Returns that record.

    ``dtype`` is the frozen weights' precision (fp32 or fp16); the adapter, its noise and the update stay
    fp32 (chapter 10, "fp16 in the program?")."""

    check_program_path(out)
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
              "provenance": provenance(time.perf_counter() - start, command)}
    write_result(meta_path(out), record)
    return record


def export_replay_program(size: int, q: int, out, backend: str = "xnnpack", seed: int | None = None,
                          command: str | None = None) -> dict:
    """Export the update-only step (:class:`prge_lib.deploy.program.ReplayStep`) for an adapter of ``size`` numbers
    and ``q`` queries to ``out`` (.pte), with its settings beside it (:func:`meta_path`): what a device runs to
    follow a run from its broadcasts without training (chapter 11). ``seed``: the run's, recorded only."""
    check_program_path(out)
    start = time.perf_counter()
    step = ReplayStep(size, q)
    inputs = (torch.zeros(size), torch.arange(q, dtype=torch.int64), torch.zeros(q))
    stats = export_program(step, inputs, out, backend)
    settings = {"program": "replay", "adapter_size": size, "q": q, "backend": backend, "seed": seed,
                "inputs": [f"adapter ({size},) float32", f"seeds ({q},) int64",
                           f"alphas ({q},) float32: -lr g_i / q"],
                "outputs": [f"adapter ({size},) float32 after the step's update"]}
    record = {"kind": "program", "seed": seed, "settings": settings, **stats,
              "provenance": provenance(time.perf_counter() - start, command)}
    write_result(meta_path(out), record)
    return record
