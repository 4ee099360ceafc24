"""The training config (chapters 5 and 7): every setting of a run, its default, its check, and the method's
defaults filled from the registry (``prge_lib.methods.registry``). Each field is also a ``prge train`` option.

Importing this module loads no numeric library: the command line builds its options from these fields, and
the choices that live beside heavy code (methods, adapters, optimizers, masks) are read when the options are
built; ``resolved()`` imports the checks it runs.
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field

from prge_lib.data.tasks import PROTOCOL
from prge_lib.models.options import DTYPE_NAMES, QUANT_MODES
from prge_lib.zo.defaults import DEFAULT_TARGETS, ENGINES, KEEP_NOISE_BUDGET_MIB, LORA_ALPHA, LORA_R, NOISE_SOURCES

# settings that change the trajectory: a checkpoint only resumes a run that agrees on all of them
_IDENTITY = ("task", "method", "adapter", "lr", "eps", "q", "E", "batch_size", "outer", "inner", "optimizer",
             "r", "alpha", "targets", "seed", "n_train", "max_length", "model", "dtype", "quant", "noise",
             "layers", "sparsity", "mask", "mask_scope", "engine", "buckets")
# length_groups is not among them: it changes how the step's forwards are cut (float rounding), not the run; each
# sitting records it (Trainer.begin), as it records the processor
# identity keys added later, with the value that checkpoints written before them implied
IDENTITY_LEGACY = {"adapter": "none", "noise": "torch", "layers": None, "sparsity": None, "mask": None,
                    "mask_scope": None, "engine": "layerwise", "buckets": None}



def _read(module: str, name: str):
    """``module.name``, imported when called: a choice list that lives beside heavy code."""
    return lambda: tuple(getattr(importlib.import_module(module), name))


def _method_names():
    from prge_lib.methods import registry

    return registry.names()


def _option(default, help, **argparse_settings):
    """A TrainConfig field that is also a ``prge train`` option (the CLI builds its options from these). ``help``
    or ``choices`` may be a function: called when the command line is built, so it lists the methods
    registered then (prge_lib.methods.registry)."""
    return field(default=default, metadata={"help": help, **argparse_settings})


def _quant_help() -> str:
    from prge_lib.methods import registry

    own = " and ".join(n for n in registry.names() if registry.get(n).self_quantizing)
    return f"quantized base weights (default none; nf4 for {own}, which quantize their base themselves)"


@dataclass
class TrainConfig:
    task: str = field(metadata={"help": "the task (prge_lib.data.tasks.TASKS)", "required": True})
    method: str = _option("prge", "the training method", choices=_method_names)
    adapter: str = _option("none", "mezo only: the parameter space, built with peft (none: every weight; lora-fa "
                                   "freezes LoRA's A; chapter 4)", choices=_read("prge_lib.methods.adapters", "ADAPTERS"))
    steps: int = _option(1000, "training steps")
    lr: float | None = _option(None, "learning rate (default: the method's)")
    eps: float | None = _option(None, "ZO perturbation scale ε (default: the method's)")
    q: int | None = _option(None, "ZO queries per step")
    E: int | None = _option(None, "ZO effective batch E = q·B (B rows per query)")
    batch_size: int | None = _option(None, "FO rows per step")
    outer: bool = _option(True, "P-RGE: the q queries in one forward")
    inner: bool | None = _option(None, "P-RGE: +ε and −ε in one forward (default on for prge, off for mezo-lorafa)")
    keep_noise: bool | None = _option(None, "P-RGE: keep each z of the forward for the update instead of redrawing "
                                            "it (same numbers, faster, q·d floats of memory; default: when they "
                                            f"fit {KEEP_NOISE_BUDGET_MIB} MiB)")
    noise: str | None = _option(None, "P-RGE: where z comes from: torch's generator (the default on the CPU) or "
                                      "counter, the generator an exported program runs (the default on a GPU: "
                                      "the same counters on every device, z equal up to each device's log/cos/sin rounding)",
                                      choices=NOISE_SOURCES)
    engine: str | None = _option(None, "P-RGE: layerwise (z per layer and seed; the default on the CPU) or fused "
                                       "(all noise in one call, one update, no host sync; needs counter noise; "
                                       "the default on a GPU)", choices=ENGINES)
    buckets: str | None = _option(None, "pad every batch to the smallest of these lengths that holds it, e.g. "
                                        "32,64,128 (shapes repeat: what --cuda-graphs needs)")
    length_groups: int = _option(1, "ZO: forward each step's rows in this many chunks of similar length, each "
                                    "padded to its own longest row (the same loss up to float rounding over fewer "
                                    "padded tokens; at most one per row of a query's batch; 1: one padded batch; "
                                    "layerwise engine, no buckets)")
    cuda_graphs: bool = _option(False, "P-RGE on a GPU: replay the fused step as a CUDA graph per batch shape "
                                       "(needs --engine fused and --buckets)")
    layers: int | None = _option(None, "keep only the first N decoder layers (small exported programs)")
    program: str | None = _option(None, "P-RGE: run each step in this ExecuTorch program (prge export); needs "
                                        "--noise counter and --max-length")
    optimizer: str = _option("adam", "FO optimizer (ZO methods are ZO-SGD)", choices=_read("prge_lib.methods.fo", "OPTIMIZERS"))
    r: int | None = _option(None, f"adapter rank (default {LORA_R}; VeRA 1024)")
    alpha: float = _option(LORA_ALPHA, "LoRA alpha")
    targets: tuple[str, ...] = _option(DEFAULT_TARGETS, "comma-separated projection names")
    seed: int = _option(0, "data sample, adapter initialisation and noise")
    eval_every: int = _option(100, "validation every N steps (0: at the end)")
    n_train: int = _option(PROTOCOL["n_train"], "training examples")
    n_val: int = _option(PROTOCOL["n_val"], "validation examples")
    n_test: int = _option(PROTOCOL["n_test"], "test examples")
    max_length: int | None = _option(None, "truncate prompts to this many tokens")
    eval_batch_size: int = _option(16, "rows per evaluation forward")
    checkpoint_every: int = _option(100, "steps between checkpoints")
    stop_rising: float | None = _option(None, "stop the run, recorded as diverged, once the mean of its last 50 "
                                              "training losses exceeds this many times the mean of its first 50 "
                                              "(e.g. 2, for learning-rate sweeps; default: never)")
    model: str | None = _option(None, "hub id or local folder (default: the embedded SmolLM2-135M)")
    dtype: str = _option("fp32", "precision of the weights", choices=DTYPE_NAMES)
    quant: str | None = _option(None, _quant_help, choices=QUANT_MODES)
    sparsity: float | None = _option(None, "senszoq: the share of the decoder's projection weights trained "
                                           "(default 1e-3)")
    mask: str | None = _option(None, "senszoq: which weights are trained: c4 (sensitivity on C4 text, the "
                                     "default), task (on the task's own data), random, largest or smallest "
                                     "magnitude", choices=_read("prge_lib.methods.senszoq.sensitivity", "MASK_KINDS"))
    mask_scope: str | None = _option(None, "senszoq: top-k per projection (layer, default) or over all of them "
                                           "(global)", choices=_read("prge_lib.methods.senszoq.sensitivity", "SCOPES"))
    mmap_dir: str | None = _option(None, "mebp: folder for the memory-mapped block inputs (default: a "
                                         "temporary folder)")
    device: str = _option("cpu", "cpu or cuda")
    notes: list[str] = field(default_factory=list)

    def resolved(self) -> "TrainConfig":
        """Fill the method's defaults and check every setting, naming the bad value and what is allowed. The
        method's spec (prge_lib.methods.registry) gives its defaults and the method-scoped settings it uses:
        the others are dropped (None) or, set away from their default, refused; then its own checks run."""
        from prge_lib.methods import registry
        from prge_lib.methods.adapters import DEFAULT_R, check_adapter
        from prge_lib.methods.fo import OPTIMIZERS
        from prge_lib.training.checks import check_numbers, check_step_memory
        from prge_lib.zo.rge import check_zo_settings

        spec = registry.get(self.method)
        check_adapter(self.adapter)
        if self.adapter != "none" and "adapter" not in spec.uses:
            raise ValueError(f"--adapter {self.adapter} applies to --method {' or '.join(registry.users('adapter'))} "
                             f"only; {self.method} trains "
                             f"{'LoRA-FA layers of its own' if spec.family == 'zo' else 'its own space'} "
                             f"(use --adapter none)")
        values = dataclasses.asdict(self)
        defaults = dict(spec.defaults)
        if self.adapter != "none":
            defaults.update(spec.adapter_defaults)
        defaults["r"] = DEFAULT_R[self.adapter]
        for key, default in defaults.items():
            if values[key] is None:
                values[key] = default
        if values["quant"] is None:
            values["quant"] = "nf4" if spec.self_quantizing else "none"
        c = TrainConfig(**values)
        c.targets = tuple(c.targets)
        check_numbers(dataclasses.asdict(c))
        if spec.family == "zo":
            c.batch_size = check_zo_settings(c.q, c.E, c.eps, c.dtype)
            c.length_groups = min(c.length_groups, c.batch_size)     # a chunk holds at least one row
        else:
            if c.optimizer not in OPTIMIZERS:
                raise ValueError(f"unknown optimizer {c.optimizer!r}; choose one of {list(OPTIMIZERS)}")
        for name in registry.NULLED:
            if name not in spec.uses:
                setattr(c, name, None)
        if spec.self_quantizing and c.quant not in ("nf4", "none"):
            raise ValueError(f"{c.method} dequantizes an NF4 base itself; quant {c.quant!r} is not supported "
                             f"(choose nf4 or none)")
        unset = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
        for name in registry.REFUSED:
            if name not in spec.uses and getattr(c, name) != unset[name]:
                users = registry.users(name)
                raise ValueError(f"{name} applies to method{'s' if len(users) > 1 else ''} {' and '.join(users)} "
                                 f"only, not {c.method} (got {getattr(c, name)!r})")
        _resolve_engine(c, "noise" in spec.uses)
        if spec.check is not None:
            spec.check(c)
        check_step_memory(c)
        return c

    def identity(self) -> dict:
        values = dataclasses.asdict(self)
        return {k: (list(values[k]) if isinstance(values[k], tuple) else values[k]) for k in _IDENTITY}


def _resolve_engine(c: TrainConfig, lorafa: bool) -> None:
    """Fill the noise source and the engine by device (a GPU: counter noise, so a GPU run and a CPU run of one
    seed draw the same z up to the rounding of each device's log/cos/sin, and the fused step; the CPU: torch noise, the per-layer step) and check the buckets
    and CUDA graphs; ``lorafa``: whether the method trains prge_lib.zo.lora's layers."""
    from prge_lib.models.buckets import parse_buckets
    from prge_lib.zo.lora import check_noise_source

    gpu = c.device.split(":")[0] == "cuda"
    if c.noise is None:
        c.noise = "counter" if gpu and lorafa and c.program is None else "torch"
    check_noise_source(c.noise)
    if c.engine is None:
        c.engine = "fused" if lorafa and gpu and c.noise == "counter" and c.program is None else "layerwise"
    if c.engine not in ENGINES:
        raise ValueError(f"unknown engine {c.engine!r}; choose one of {list(ENGINES)}")
    if c.engine == "fused" and c.noise != "counter":
        raise ValueError("engine 'fused' draws all noise in one counter-generator call: it needs noise 'counter' "
                         f"(got {c.noise!r})")
    if c.engine == "fused" and c.program is not None:
        raise ValueError("a program runs its own step in the runtime: leave engine unset or 'layerwise'")
    buckets = parse_buckets(c.buckets)
    c.buckets = None if buckets is None else ",".join(map(str, buckets))
    if c.length_groups != 1 and (c.engine == "fused" or c.program is not None or buckets):
        raise ValueError(f"length_groups {c.length_groups} cuts each batch to its rows' own lengths: it runs with "
                         f"the layerwise engine, without a program or buckets (got engine {c.engine!r}, program "
                         f"{c.program!r}, buckets {c.buckets!r})")
    if c.cuda_graphs and not (gpu and c.engine == "fused" and buckets):
        raise ValueError(f"cuda_graphs replays the fused step on a GPU for fixed shapes: it needs device cuda, "
                         f"engine 'fused' and buckets (got device {c.device!r}, engine {c.engine!r}, "
                         f"buckets {c.buckets!r})")
