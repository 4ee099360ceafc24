"""Sensitive parameters: the diagonal Fisher of the linear weights and the static masks built from it
(Guo et al. §2.2, §3.1, §4.2; chapter 8). The model that trains a mask is in :mod:`prge_lib.methods.senszoq.sparse`.

The sensitivity of weight j is its diagonal empirical Fisher, Σ_i (∂f_i/∂w_j)², summed over examples i taken
one at a time: the causal-LM loss of C4 sequences (SensZOQ's transferable mask) or the answer-token loss of
the task's own training rows (its upper bound). A mask keeps the k = round(sparsity · d) highest-scoring
entries of each linear weight (``scope="layer"``) or of all of them together (``scope="global"``); the §4.2
baselines replace the score by |w| (largest), −|w| (smallest) or a seeded uniform draw (random).

A mask is a dict: module name (``model.layers.3.mlp.up_proj``) → sorted flat int64 indices into that
module's weight, read row-major (row = index // in_features).
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable, Mapping

import torch
from torch import nn
from tqdm.auto import tqdm

from prge_lib.common.settings import cache_dir
from prge_lib.zo.lora import DEFAULT_TARGETS
from prge_lib.models.objective import IGNORE, Batch, row_losses
from prge_lib.common.provenance import atomic_file
from prge_lib.zo.rge import mix_seed

MASK_KINDS = ("c4", "task", "random", "largest", "smallest")
SCOPES = ("layer", "global")
SCORED = ("c4", "task")     # kinds ranked by a Fisher score


class Scores(dict):
    """name → summed squared gradients (the diagonal Fisher) of that linear weight, plus how many
    sequences and tokens made them and how long it took (``sequences``, ``tokens``, ``seconds``)."""
    sequences: int = 0
    tokens: int = 0
    seconds: float = 0.0


def linear_weights(model: nn.Module, targets=DEFAULT_TARGETS) -> dict[str, nn.Linear]:
    """The decoder blocks' projections named in ``targets`` (Llama: q/k/v/o, gate/up/down), by module name."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no model.layers: SensZOQ expects a Llama-style decoder")
    found = {name: m for name, m in layers.named_modules(prefix="model.layers")
             if name.rsplit(".", 1)[-1] in targets}
    wrong = {name: type(m).__name__ for name, m in found.items() if type(m) is not nn.Linear}
    if wrong:
        name, kind = next(iter(wrong.items()))
        raise TypeError(f"{name} is a {kind}, not a plain nn.Linear: build masks on the fp32/fp16 model "
                        f"(load it with quant 'none'); SensZOQ quantizes the dense remainder itself")
    if not found:
        raise ValueError(f"no decoder projection named any of {list(targets)}")
    return found


@contextmanager
def _grad_only_for(params: Iterable[torch.Tensor], model: nn.Module):
    """Within the block autograd is on and only ``params`` require gradients (the flags are restored)."""
    saved = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in saved:
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    try:
        with torch.enable_grad():
            yield
    finally:
        for p, flag in saved:
            p.requires_grad_(flag)
            p.grad = None


def squared_gradients(model: nn.Module, items: Iterable, loss: Callable[[nn.Module, object], torch.Tensor],
                      tokens: Callable[[object], int], total: int | None = None, desc: str = "Fisher",
                      progress: bool = True, targets=DEFAULT_TARGETS) -> Scores:
    """Σ_i (∇_w loss(model, item_i))² over the linear weights, one item per backward (Guo et al. §2.2)."""
    weights = {name: m.weight for name, m in linear_weights(model, targets).items()}
    acc = {name: torch.zeros_like(w, dtype=torch.float32) for name, w in weights.items()}
    out, start = Scores(), time.perf_counter()
    bar = tqdm(items, total=total, desc=desc, disable=not progress)
    with _grad_only_for(weights.values(), model):
        for item in bar:
            value = loss(model, item)
            if not torch.isfinite(value):
                raise FloatingPointError(f"{desc}: non-finite loss {float(value)} on item {out.sequences}")
            value.backward()
            for name, w in weights.items():
                acc[name].add_(w.grad.float().square())
                w.grad = None
            out.sequences += 1
            out.tokens += tokens(item)
            bar.set_postfix(tokens=out.tokens)
    out.update(acc)
    out.seconds = time.perf_counter() - start
    return out


def c4_texts(n: int, start: int = 0) -> list[str]:
    """Rows ``start`` … ``start + n − 1`` of the C4 sample shipped in data/text (200 rows of web text)."""
    from prge_lib.data.pools import open_text

    with open_text("c4_sample.jsonl") as f:
        texts = [json.loads(line)["text"] for line in islice(f, start, start + n)]
    if len(texts) < n:
        raise ValueError(f"the C4 sample has {start + len(texts)} rows; asked for rows {start}–{start + n - 1}")
    return texts


def fisher_diagonal(model: nn.Module, tokenizer, texts: Iterable[str], max_length: int = 256,
                    progress: bool = True, targets=DEFAULT_TARGETS) -> Scores:
    """Diagonal empirical Fisher of the causal-LM loss (mean next-token cross-entropy of each sequence,
    truncated to ``max_length`` tokens), one sequence per backward: SensZOQ's C4 sensitivity (§3.1)."""
    device = next(model.parameters()).device
    encoded = [tokenizer(t, truncation=True, max_length=max_length, return_tensors="pt").input_ids
               for t in texts]
    encoded = [ids.to(device) for ids in encoded if ids.shape[1] >= 2]
    return squared_gradients(model, encoded, lambda m, ids: m(input_ids=ids, labels=ids).loss,
                             lambda ids: ids.shape[1], len(encoded), "Fisher (text)", progress, targets)


def _rows(batches: Iterable[Batch]):
    """Each row of each batch as a one-row batch without its left padding."""
    for batch in batches:
        for i in range(batch.rows):
            first = int(batch.attention_mask[i].argmax())      # left padding: the first real token
            yield Batch(batch.input_ids[i:i + 1, first:], batch.attention_mask[i:i + 1, first:],
                        batch.targets[i:i + 1])


def task_fisher(model: nn.Module, batches: Iterable[Batch], progress: bool = True,
                targets=DEFAULT_TARGETS) -> Scores:
    """Diagonal empirical Fisher of the task's answer-token loss (``row_losses``), one training row per
    backward: the task-gradient mask of Guo et al. Fig. 3 / 6b. ``tokens`` counts answer tokens."""
    batches = list(batches)
    return squared_gradients(model, _rows(batches), lambda m, b: row_losses(m, b).sum(),
                             lambda b: int((b.targets != IGNORE).sum()), sum(b.rows for b in batches),
                             "Fisher (task)", progress, targets)


def check_mask_settings(kind: str, sparsity: float, scope: str) -> None:
    """One-line ValueErrors naming a bad mask kind, sparsity or scope and what is allowed."""
    if kind not in MASK_KINDS:
        raise ValueError(f"unknown mask kind {kind!r}; choose one of {list(MASK_KINDS)}")
    try:
        ok = not isinstance(sparsity, bool) and 0 < float(sparsity) < 1
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"sparsity must be a fraction in the open interval (0, 1), e.g. 1e-3; got {sparsity!r}")
    if scope not in SCOPES:
        raise ValueError(f"unknown mask scope {scope!r}; choose one of {list(SCOPES)}")


def _score(kind: str, name: str, index: int, weight: torch.Tensor, scores, seed: int) -> torch.Tensor:
    """The flat fp32 score whose top-k is the mask (higher = kept)."""
    if kind in SCORED:
        if name not in scores:
            raise ValueError(f"the scores have no entry for {name!r}; compute them on this model")
        s = scores[name].detach().float().reshape(-1)
        if s.numel() != weight.numel() or not bool(torch.isfinite(s).all()):
            raise ValueError(f"scores[{name!r}]: need {weight.numel()} finite values, got {s.numel()}")
        return s
    if kind == "random":
        gen = torch.Generator().manual_seed(mix_seed(seed, 0x5EA5, index))
        return torch.rand(weight.numel(), generator=gen).to(weight.device)
    magnitude = weight.detach().float().abs().reshape(-1)
    return magnitude if kind == "largest" else -magnitude


def _above(score: torch.Tensor, tau: torch.Tensor, ties: int) -> tuple[torch.Tensor, int]:
    """Indices with score > τ plus the first ``ties`` (in index order) equal to τ; returns the ties used."""
    above = (score > tau).nonzero().flatten()
    equal = (score == tau).nonzero().flatten()[:max(ties, 0)]
    return torch.cat([above, equal]).sort().values, equal.numel()


def _top_k(score: torch.Tensor, k: int) -> torch.Tensor:
    """The k highest entries' sorted indices; ties at the threshold go to the lowest indices."""
    tau = torch.topk(score, k, sorted=False).values.min()
    return _above(score, tau, k - int((score > tau).sum()))[0]


def build_mask(kind: str, model: nn.Module, sparsity: float, scope: str = "layer", seed: int = 0,
               scores: Mapping[str, torch.Tensor] | None = None, targets=DEFAULT_TARGETS) -> dict:
    """The static mask of Guo et al. §4.2: top-k of the Fisher ``scores`` (c4, task), of |w| (largest),
    of −|w| (smallest) or of a draw seeded by ``seed`` (random). Per layer k = max(1, round(sparsity · d_layer));
    global k = max(1, round(sparsity · Σ d_layer)) over all the linear weights together. Deterministic."""
    check_mask_settings(kind, sparsity, scope)
    if kind in SCORED and scores is None:
        raise ValueError(f"a {kind!r} mask ranks Fisher scores: pass scores= (fisher_diagonal on "
                         f"{'c4_texts' if kind == 'c4' else 'task batches, task_fisher'})")
    weights = {name: m.weight for name, m in linear_weights(model, targets).items()}
    score = {name: _score(kind, name, i, w, scores, seed) for i, (name, w) in enumerate(weights.items())}
    if scope == "layer":
        return {name: _top_k(s, max(1, round(sparsity * s.numel()))).cpu() for name, s in score.items()}
    k = max(1, round(sparsity * sum(s.numel() for s in score.values())))
    # the global top-k lies within the union of each layer's top-k: find its threshold there
    tau = torch.topk(torch.cat([torch.topk(s, min(k, s.numel()), sorted=False).values.cpu()
                                for s in score.values()]), k, sorted=False).values.min()
    ties, mask = k - sum(int((s > tau.to(s.device)).sum()) for s in score.values()), {}
    for name, s in score.items():                 # ties at τ go to the earliest layers, lowest indices
        mask[name], used = _above(s, tau.to(s.device), ties)
        mask[name], ties = mask[name].cpu(), ties - used
    return mask


def mask_size(mask: Mapping[str, torch.Tensor]) -> int:
    return sum(idx.numel() for idx in mask.values())


def coverage(mask: Mapping[str, torch.Tensor], scores: Mapping[str, torch.Tensor]) -> dict:
    """Share of the squared gradient norm Σ scores that the mask's entries hold, overall and per layer
    (the c of Lemma 1; Guo et al. Fig. 3, 9)."""
    held, total, per_layer = 0.0, 0.0, {}
    for name, s in scores.items():
        s = s.detach().double().reshape(-1)
        kept = float(s[mask[name].to(s.device)].sum()) if name in mask else 0.0
        layer_total = float(s.sum())
        per_layer[name] = kept / layer_total if layer_total > 0 else math.nan
        held, total = held + kept, total + layer_total
    return {"overall": held / total if total > 0 else math.nan, "per_layer": per_layer}


def save_mask(path: str | Path, mask: Mapping[str, torch.Tensor], settings: dict) -> Path:
    """Write the mask as safetensors (atomically), ``settings`` as JSON in the metadata."""
    from safetensors.torch import save_file

    tensors = {name: idx.to("cpu", torch.int64).contiguous() for name, idx in mask.items()}
    with atomic_file(path) as tmp:
        save_file(tensors, str(tmp), metadata={"settings": json.dumps(settings, sort_keys=True)})
    return Path(path)


def load_mask(path: str | Path) -> tuple[dict, dict]:
    """(mask, settings) as written by :func:`save_mask`."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        settings = json.loads((f.metadata() or {}).get("settings", "{}"))
        return {name: f.get_tensor(name) for name in f.keys()}, settings


def model_fingerprint(model: nn.Module, targets=DEFAULT_TARGETS) -> str:
    """A short hash of the model's name, its linear weights' shapes and a sample of their values."""
    digest = hashlib.sha256(str(getattr(model, "name_or_path", "")).encode())
    for name, m in linear_weights(model, targets).items():
        flat = m.weight.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 64)][:64].float().cpu()
        digest.update(f"{name}{tuple(m.weight.shape)}".encode() + sample.numpy().tobytes())
    return digest.hexdigest()[:16]


def mask_path(settings: dict) -> Path:
    """Where the mask made with ``settings`` (which name the model's fingerprint) is cached."""
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "masks" / f"{settings['kind']}-{settings['scope']}-{settings['sparsity']:g}-{key}.safetensors"


def c4_mask(model: nn.Module, tokenizer, sparsity: float, scope: str = "layer", n: int = 64,
            max_length: int = 256, cache: bool = True, progress: bool = True) -> tuple[dict, dict]:
    """SensZOQ's transferable mask: top-k of the Fisher of ``n`` C4 sequences. Computed once per (model,
    settings) and reused from the cache folder. Returns (mask, settings incl. sequences/tokens/seconds)."""
    check_mask_settings("c4", sparsity, scope)
    settings = {"kind": "c4", "sparsity": sparsity, "scope": scope, "n": n, "max_length": max_length,
                "model": model_fingerprint(model)}
    path = mask_path(settings)
    if cache and path.is_file():
        return load_mask(path)
    scores = fisher_diagonal(model, tokenizer, c4_texts(n), max_length, progress)
    mask = build_mask("c4", model, sparsity, scope, scores=scores)
    settings.update(sequences=scores.sequences, tokens=scores.tokens, seconds=round(scores.seconds, 2))
    if cache:
        save_mask(path, mask, settings)
    return mask, settings
