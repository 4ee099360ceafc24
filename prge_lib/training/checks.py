"""Settings checked before any work starts: every numeric setting within its range, and a bound on the memory one
training step needs, refused when this machine cannot hold it. ``TrainConfig.resolved()`` and the ``prge``
command call these before a model loads, so a bad value costs no loading and no training (chapters 5–9).

The memory bound counts what a step keeps alive at its peak (chapter 9 measures the real footprints): the
weights, the trainable copies a method holds, the activations of the rows one forward runs (every layer's
for backpropagation, one layer's at a time for a zeroth-order forward) and the vocabulary logits at the
answer positions. The model's sizes come from its ``config.json``, read without loading any weight.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from prge_lib.data.tasks import get_task
from prge_lib.models.options import EMBEDDED_ALIASES

# the allowed range of every whole-number setting, shared by TrainConfig and the command's own options
# (largest None: no limit). A seed also seeds NumPy's generator, which takes 0 … 2**32 − 1.
WHOLE = {"steps": (1, None), "q": (1, None), "E": (1, None), "batch_size": (1, None), "eval_batch_size": (1, None),
         "n": (1, None), "n_train": (1, None), "n_val": (1, None), "n_test": (1, None), "layers": (1, None),
         "r": (1, None), "max_length": (1, None), "seq_len": (1, None), "rows": (1, None), "repeats": (1, None),
         "cpus_per_cell": (1, None), "warmup": (0, None), "eval_every": (0, None), "checkpoint_every": (0, None),
         "seed": (0, 2**32 - 1), "workers": (1, None), "ddp_steps": (0, None), "max_pack": (1, None),
         "eval_examples": (1, None), "length_groups": (1, None)}
# settings that must be positive, finite numbers
POSITIVE = ("lr", "eps", "alpha")
# factors that must exceed 1, finite (stop_rising: a loss that merely failed to fall has not diverged)
ABOVE_ONE = ("stop_rising",)

# SmolLM2-135M-Instruct's config.json (the embedded model): its sizes without converting or loading it
EMBEDDED_DIMS = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                 "vocab_size": 49152, "max_position_embeddings": 8192, "tie_word_embeddings": True}
BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
GIB = 2**30


def check_numbers(values: dict, options: bool = False) -> None:
    """Refuse any setting of ``values`` (name → value, or a list of values; None: unset; names not listed above
    are skipped) outside its range, naming the value and the range; with ``options`` it is named as the
    command's option."""
    for name, value in values.items():
        if isinstance(value, (list, tuple)):
            for item in value:
                check_numbers({name: item}, options)
            continue
        if value is None or (name not in WHOLE and name not in POSITIVE and name not in ABOVE_ONE):
            continue
        label = "--" + name.replace("_", "-") if options else name
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if name in ABOVE_ONE:
            if not (is_number and value > 1 and math.isfinite(value)):
                raise ValueError(f"{label} must be a number above 1 (how many times its start the loss must "
                                 f"rise to), got {value!r}")
            continue
        if name in POSITIVE:
            if not (is_number and value > 0 and math.isfinite(value)):
                raise ValueError(f"{label} must be a positive number, got {value!r}")
            continue
        low, high = WHOLE[name]
        if not (is_number and isinstance(value, int) and value >= low and (high is None or value <= high)):
            allowed = f"at least {low}" if high is None else f"from {low} to {high}"
            raise ValueError(f"{label} must be a whole number {allowed}, got {value!r}")


def model_dims(name: str | None) -> dict | None:
    """The sizes of model ``name`` from its config.json, without loading weights: the embedded model's known
    values, a local folder's file, or a hub model's file when the hub cache holds it; None where none is here."""
    if name is None or name.lower() in EMBEDDED_ALIASES:
        return dict(EMBEDDED_DIMS)
    path = Path(name) / "config.json"
    if not path.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache
            cached = try_to_load_from_cache(name, "config.json")
        except ValueError:          # not a hub id either: loading the model names the problem
            return None
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    config = json.loads(path.read_text())
    config = config.get("text_config", config)
    if not all(k in config for k in EMBEDDED_DIMS if k != "tie_word_embeddings"):
        return None
    return {k: config.get(k, False) for k in EMBEDDED_DIMS}


def available_bytes(device: str) -> int | None:
    """Memory a run can still take here: the GPU's free memory for cuda, else the kernel's MemAvailable
    (Linux); None where neither can be read."""
    if device.split(":")[0] == "cuda":
        import torch     # only for a GPU: reading the checks loads no numeric library

        return torch.cuda.mem_get_info(torch.device(device))[0] if torch.cuda.is_available() else None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def step_bytes(config, dims: dict) -> tuple[int, str]:
    """A bound on the bytes a step of the resolved ``config`` holds at its peak, weights included, and how it
    was reckoned. Prompts are ``max_length`` tokens; with max_length unset, one token (the shortest a prompt
    can be), so that the bound then refuses only what cannot fit whatever the data."""
    c = config
    h, m, n_layers = dims["hidden_size"], dims["intermediate_size"], dims["num_hidden_layers"]
    if c.layers is not None:
        n_layers = min(n_layers, c.layers)
    heads, vocab = dims["num_attention_heads"], dims["vocab_size"]
    length = c.max_length or 1
    answer = 1 if get_task(c.task).kind == "cls" else length     # answer positions whose logits are computed
    size = BYTES[c.dtype]
    weights = n_layers * (4 * h * h + 3 * h * m) + vocab * h * (1 if dims["tie_word_embeddings"] else 2)
    backprop = c.method in ("fo", "fo-lorafa", "mebp")
    if backprop:
        rows = c.batch_size
    else:   # the copies one forward holds: q queries side by side (outer loop), ±ε side by side (inner loop)
        rows = c.batch_size * (c.q if c.outer and c.method != "mezo" else 1) * (2 if c.inner else 1)
    # one decoder layer's tensors: residual, norm, q, k, v, attention output, projection (h each); gate, up
    # and their product (m each); attention scores and their softmax (heads × L per position)
    layer = rows * length * (7 * h + 3 * m + 2 * heads * length)
    activations = n_layers * layer if c.method in ("fo", "fo-lorafa") else 2 * layer
    logits = 3 * rows * answer * vocab * 4          # the logits, their fp32 copy, the log-softmax
    lora = n_layers * c.r * sum(m if t in ("gate_proj", "up_proj") else h for t in c.targets)
    if c.method == "fo":
        trained = 3 * weights                       # gradients and Adam's two moments of every weight
    elif backprop:
        trained = 4 * 2 * lora                      # LoRA's A and B, their gradients and Adam's moments
    elif c.method in ("prge", "mezo-lorafa"):
        trained = (2 * c.q + 2) * lora              # A, B and the per-copy B of every query and sign
    else:
        trained = 0                                 # MeZO and SensZOQ perturb in place
    total = weights * size + (activations + trained) * max(size, 4) + logits
    how = (f"{rows} rows per forward of {length} token{'s' * (length > 1)}"
           f"{'' if c.max_length else ' (max_length unset: the shortest prompt)'}, {n_layers} layers of width "
           f"{h}, vocabulary {vocab}, {c.dtype}")
    return total, how


def check_step_memory(config) -> None:
    """Refuse a resolved ``config`` whose step cannot fit this machine (:func:`step_bytes` above the available
    memory), and a ``max_length`` or ``layers`` beyond the model's; a model whose config.json is not here
    (a hub id not yet downloaded) is checked when it loads."""
    dims = model_dims(config.model)
    if dims is None:
        return
    positions, depth = dims["max_position_embeddings"], dims["num_hidden_layers"]
    if config.max_length is not None and config.max_length > positions:
        raise ValueError(f"max_length {config.max_length} is beyond the model's {positions} positions "
                         f"(allowed: 1 to {positions})")
    if config.layers is not None and config.layers > depth:
        raise ValueError(f"layers {config.layers}: the model has {depth} decoder layers (allowed: 1 to {depth})")
    need, how = step_bytes(config, dims)
    free = available_bytes(config.device)
    if free is not None and need > free:
        shape = f"batch {config.batch_size}" if config.q is None else f"q = {config.q}, E = {config.E}"
        where = "free on the GPU" if config.device.split(":")[0] == "cuda" else "of memory available"
        raise ValueError(f"a {config.method} step with {shape} needs about {need / GIB:.1f} GiB ({how}), more "
                         f"than the {free / GIB:.1f} GiB {where} here: lower "
                         f"{'the batch' if config.q is None else 'q or E'} or max_length")
