"""MeBP: memory-efficient backpropagation for LoRA on a 4-bit base (Song & Tang, seed 004, Algorithm 1;
chapter 9), the first-order alternative to zeroth-order training.

Three things keep a backpropagation step near the memory of inference:

* **lazy 4-bit base** — every linear layer of a decoder block holds its weight in NF4 (:class:`NF4Weight`)
  and the block's weights are dequantized only while that block runs, forward or backward, then dropped;
* **per-block checkpoints in files** — the forward runs block by block without autograd and writes each
  block's input hidden states to a memory-mapped file; nothing else of the forward is kept;
* **per-block backward** — the head (final norm, lm_head, the loss of ``objective.row_losses``) runs with
  grad to give dL/dh_n; then, from the last block to the first, the block's input is read back from its
  file, the block is recomputed with grad and ``torch.autograd.backward(output, grad_output)`` gives the
  LoRA gradients and dL/d(input); the file is removed (Alg. 1: "Remove ckpts_i").

The gradients are those of plain backpropagation through the same model (the tests check it). What a
block needs besides its input is built once per step as ``LlamaModel.forward`` builds it: positions 0…L−1
for every row (left padding shifts a row by a constant, which RoPE's attention does not see), their
(cos, sin) from ``rotary_emb`` and the causal + padding mask of transformers' ``create_causal_mask``. The
embeddings, norms and lm_head are frozen and stay in fp32 (the tied embedding doubles as lm_head); seed 004
also compresses the embeddings. A batch runs as one piece (seed 004 accumulates single rows instead).
LoRA is written here rather than taken from peft: peft wraps nn.Linear or bitsandbytes layers, not a base
that a block dequantizes for itself (a phase timed on its own); init and scaling are peft's.
"""
from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from prge_lib.zo.defaults import LORA_ALPHA, LORA_R
from prge_lib.zo.lora import DEFAULT_TARGETS
from prge_lib.models.objective import Batch, target_losses
from prge_lib.models.quant import NF4Weight

QUANT = ("nf4", "none")
# the forward pass (forward, dequantize_forward, write), head, the backward pass (read, dequantize_backward,
# recompute_backward; "write" also counts removing the files) and the optimizer
PHASES = ("forward", "dequantize_forward", "write", "head", "read", "dequantize_backward", "recompute_backward",
          "optimizer")


class LazyLoRALinear(nn.Module):
    """A frozen base matrix W (NF4, or dense with ``quant="none"``) plus, when ``r`` > 0, a LoRA path:

        y = x Wᵀ + b + (α/r) (x Aᵀ) Bᵀ,   A: r × in ~ U(−1/√in, 1/√in),  B: out × r = 0,  both trained.

    W is the block's materialized copy while the block runs (:meth:`MeBP.materialized`), else it is
    dequantized for this one matmul (plain forwards, evaluation)."""

    def __init__(self, base: nn.Linear, quant: str, r: int, alpha: float, generator: torch.Generator):
        super().__init__()
        weight = base.weight.detach()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.nf4 = NF4Weight(weight) if quant == "nf4" else None
        self.register_buffer("dense", None if self.nf4 else weight)
        self.register_buffer("bias", None if base.bias is None else base.bias.detach())
        self.live: torch.Tensor | None = None
        self.r, self.scaling = r, (alpha / r if r else 0.0)
        if r:
            bound = 1 / math.sqrt(self.in_features)
            a = torch.empty(r, self.in_features).uniform_(-bound, bound, generator=generator)
            self.lora_A = nn.Parameter(a.to(device=weight.device, dtype=weight.dtype))
            self.lora_B = nn.Parameter(torch.zeros(self.out_features, r, device=weight.device, dtype=weight.dtype))

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, nf4={self.nf4 is not None}, r={self.r}"

    def weight(self) -> torch.Tensor:
        if self.live is not None:
            return self.live
        return self.dense if self.nf4 is None else self.nf4.dequantize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight(), self.bias)
        if self.r:
            y = y + self.scaling * F.linear(F.linear(x, self.lora_A), self.lora_B)
        return y


def add_lazy_lora(model, quant: str = "nf4", r: int = LORA_R, alpha: float = LORA_ALPHA,
                  targets: Sequence[str] = DEFAULT_TARGETS, seed: int = 0) -> list[list[LazyLoRALinear]]:
    """Replace every linear layer of each decoder block (``model.model.layers``) by a
    :class:`LazyLoRALinear` (LoRA on the names in ``targets``); freeze the rest of the model. Returns the
    new layers, block by block. A is drawn from a generator seeded with ``seed`` (the global one is untouched)."""
    if quant not in QUANT:
        raise ValueError(f"unknown quant {quant!r} for MeBP; choose one of {list(QUANT)}")
    if r < 1:
        raise ValueError(f"LoRA rank r must be at least 1, got {r}")
    if not (alpha > 0 and math.isfinite(alpha)):
        raise ValueError(f"LoRA alpha must be a positive number, got {alpha}")
    blocks = getattr(getattr(model, "model", None), "layers", None)
    if blocks is None:
        raise ValueError(f"MeBP needs a decoder with model.model.layers (Llama-style); got {type(model).__name__}")
    names = {n.rsplit(".", 1)[-1] for n, m in blocks[0].named_modules() if isinstance(m, nn.Linear)}
    unknown = [t for t in targets if t not in names]
    if unknown or not targets:
        raise ValueError(f"LoRA targets {list(targets)} not among the block's linear layers {sorted(names)}")
    for param in model.parameters():
        param.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    layers = []
    for block in blocks:
        lazy = []
        for name, module in list(block.named_modules()):
            if isinstance(module, nn.Linear):
                parent, _, leaf = name.rpartition(".")
                new = LazyLoRALinear(module, quant, r if leaf in targets else 0, alpha, generator)
                setattr(block.get_submodule(parent) if parent else block, leaf, new)
                lazy.append(new)
        layers.append(lazy)
    return layers


def hidden(output):
    """A decoder layer's hidden states (transformers 5 returns the tensor; older layers a tuple)."""
    return output[0] if isinstance(output, tuple) else output


class MeBP:
    """LoRA fine-tuning by memory-efficient backpropagation (seed 004, Algorithm 1; chapter 9), Adam on A and B.

    ``quant``: "nf4" (4-bit base, dequantized per block) or "none" (fp32 base: exact-gradient tests).
    ``mmap_dir``: where the block inputs go (default: a temporary folder per step, removed after it);
    ``keep_checkpoints`` leaves the files of the last step there. ``times`` accumulates seconds per phase
    (:data:`PHASES`) over the steps, for the share spent dequantizing and reading (seed 004 Table 2).
    """

    def __init__(self, model, lr: float, r: int = LORA_R, alpha: float = LORA_ALPHA,
                 targets: Sequence[str] = DEFAULT_TARGETS, quant: str = "nf4",
                 mmap_dir: str | os.PathLike | None = None, seed: int = 0, keep_checkpoints: bool = False):
        if not (lr > 0 and math.isfinite(lr)):
            raise ValueError(f"lr must be a positive number, got {lr}")
        if keep_checkpoints and mmap_dir is None:
            raise ValueError("keep_checkpoints needs an mmap_dir to keep them in")
        self.mmap_dir = None if mmap_dir is None else Path(mmap_dir)
        if self.mmap_dir is not None:
            try:
                self.mmap_dir.mkdir(parents=True, exist_ok=True)
                with tempfile.TemporaryFile(dir=self.mmap_dir):
                    pass
            except OSError as err:
                raise ValueError(f"mmap_dir {str(self.mmap_dir)!r} cannot be written: {err.strerror or err}") from None
        types = getattr(model.config, "layer_types", None) or ()
        if any(kind != "full_attention" for kind in types):
            raise ValueError(f"MeBP handles full-attention decoders only; this model has layers {sorted(set(types))}")
        self.lazy = add_lazy_lora(model, quant, r, alpha, targets, seed)
        model.eval()      # no dropout: the forward the other methods use
        self.model, self.quant, self.keep = model, quant, keep_checkpoints
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.optimizer = torch.optim.Adam(list(self.params.values()), lr=lr)
        self.device = next(model.parameters()).device
        self.times = dict.fromkeys(PHASES, 0.0)
        self.start: dict = {}
        self.settings: dict = {}        # nothing built to record (prge_lib.methods.base.Method)
        self.folder: Path | None = None

    # --- bookkeeping -------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def timed(self, phase: str):
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            sync()
            self.times[phase] += time.perf_counter() - start

    @contextlib.contextmanager
    def materialized(self, i: int):
        """Block i's base weights dequantized for as long as the block runs (Alg. 1 LazyLoadAndDecompress)."""
        if self.quant == "nf4":
            with self.timed("dequantize_backward" if torch.is_grad_enabled() else "dequantize_forward"):
                for layer in self.lazy[i]:
                    layer.live = layer.nf4.dequantize()
        try:
            yield
        finally:
            for layer in self.lazy[i]:
                layer.live = None

    def path(self, i: int) -> Path:
        return self.folder / f"block-{i:03d}.bin"

    def write(self, i: int, h: torch.Tensor) -> None:
        """Block i's input into its file: raw values, row-major, through a shared memory map."""
        with self.timed("write"):
            self.path(i).unlink(missing_ok=True)
            stored = torch.from_file(str(self.path(i)), shared=True, size=h.numel(), dtype=h.dtype)
            stored.copy_(h.reshape(-1))
            del stored

    def read(self, i: int, like: torch.Tensor) -> torch.Tensor:
        """Block i's input mapped back from its file (a private map: the file is never written to)."""
        with self.timed("read"):
            stored = torch.from_file(str(self.path(i)), shared=False, size=like.numel(), dtype=like.dtype)
            return stored.view(like.shape).to(self.device)

    # --- Algorithm 1 -------------------------------------------------------------------------------------
    def backward(self, batch: Batch) -> float:
        """Algorithm 1's Backpropagation: the LoRA gradients of the mean row loss go into each parameter's
        ``.grad`` (added, as ``loss.backward()`` does); returns the loss. No gradient when it is not finite."""
        from transformers.masking_utils import create_causal_mask

        decoder, batch = self.model.model, batch.to(self.device)
        self.folder = self.mmap_dir or Path(tempfile.mkdtemp(prefix="mebp-"))
        written = []
        try:
            with torch.no_grad():
                with self.timed("forward"):   # what LlamaModel.forward builds once for all its layers
                    h = decoder.embed_tokens(batch.input_ids)
                    positions = torch.arange(h.shape[1], device=self.device).unsqueeze(0)
                    # no cache: passed by position, its keyword was renamed (past_key_values -> cache) in 5.24
                    mask = create_causal_mask(decoder.config, h, batch.attention_mask, None, position_ids=positions)
                    rope = decoder.rotary_emb(h, position_ids=positions)
                    context = {"attention_mask": mask, "position_ids": positions, "position_embeddings": rope}
                for i, block in enumerate(decoder.layers):
                    self.write(i, h)
                    written.append(i)
                    with self.materialized(i), self.timed("forward"):
                        h = hidden(block(h, **context))
                like = torch.empty_like(h, device="meta")     # every block input has the output's shape
            with self.timed("head"):
                h = h.detach().requires_grad_()
                width = batch.targets.shape[1]
                logits = self.model.lm_head(decoder.norm(h[:, -width:]))
                loss = target_losses(logits, batch.targets).mean()
                value = float(loss.detach())
                if not math.isfinite(value):
                    return value
                loss.backward()
                grad = h.grad
                del h, logits, loss
            for i in reversed(range(len(decoder.layers))):
                x = self.read(i, like).requires_grad_(i > 0)
                with self.materialized(i), self.timed("recompute_backward"):
                    torch.autograd.backward(hidden(decoder.layers[i](x, **context)), grad)
                grad = x.grad
                del x
                if not self.keep:
                    with self.timed("write"):
                        self.path(i).unlink()
                    written.remove(i)
            return value
        finally:
            if self.mmap_dir is None:
                shutil.rmtree(self.folder, ignore_errors=True)
            elif not self.keep:
                for i in written:
                    self.path(i).unlink(missing_ok=True)
            self.folder = None

    def step(self, batch: Batch, t: int) -> dict:
        value = self.backward(batch)
        if not math.isfinite(value):
            self.optimizer.zero_grad(set_to_none=True)
            return {"loss": value, "finite": False}
        with self.timed("optimizer"):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return {"loss": value, "finite": True}

    def trainable(self) -> dict[str, torch.Tensor]:
        return self.params


def lm_batches(tokenizer, seq_len: int, batch_size: int, n_batches: int | None = None,
               name: str = "wikitext-2-raw-test.txt") -> list[Batch]:
    """Language modelling on WikiText-2 (seed 004 §4.1, Fig. 1) as :class:`Batch` es of ``row_losses``.

    The text is tokenized line by line (no special tokens), concatenated and cut into consecutive windows
    of seq_len + 1 tokens; a window's first seq_len tokens are the input and its last seq_len the targets,
    so every next token is scored (target width = seq_len, nothing padded). ``n_batches`` of
    ``batch_size`` rows, or as many as the text holds."""
    from prge_lib.data.pools import open_text

    if seq_len < 1 or batch_size < 1:
        raise ValueError(f"seq_len and batch_size must be at least 1, got {seq_len} and {batch_size}")
    if n_batches is not None and n_batches < 1:
        raise ValueError(f"n_batches must be at least 1 (or None for all), got {n_batches}")
    window = seq_len + 1
    need = None if n_batches is None else n_batches * batch_size * window
    ids: list[int] = []
    with open_text(name) as f:
        lines = f.readlines()
    for start in range(0, len(lines), 512):
        for row in tokenizer(lines[start:start + 512], add_special_tokens=False).input_ids:
            ids.extend(row)
        if need is not None and len(ids) >= need:
            break
    rows = len(ids) // window // batch_size * batch_size
    if rows == 0 or (n_batches is not None and len(ids) < need):
        raise ValueError(f"{name} holds {len(ids)} tokens: too few for {n_batches or 1} batches of "
                         f"{batch_size} x {window} tokens")
    rows = rows if need is None else need // window
    tokens = torch.tensor(ids[:rows * window], dtype=torch.long).reshape(rows, window)
    return [Batch(chunk[:, :-1].contiguous(), torch.ones_like(chunk[:, :-1]), chunk[:, 1:].contiguous())
            for chunk in tokens.split(batch_size)]
