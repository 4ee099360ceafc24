"""The training loss: cross-entropy over the whole vocabulary at the answer token(s) (Gao et al. §4.1).

An example becomes (input ids, target ids): the prompt followed by all target tokens but the last, so that
the last T positions predict the T target tokens. With left padding every row ends at the last position,
so the model only computes logits for the last max(T) positions (``logits_to_keep``) — with a 49k
vocabulary that is most of the saving. A batch built for n copies (P-RGE) is the same rows repeated n
times; :func:`copy_losses` returns one loss per copy.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from prge_lib.data.splits import left_pad
from prge_lib.data.tasks import Task

IGNORE = -100


@dataclass
class Batch:
    input_ids: torch.Tensor       # (b, L), left-padded
    attention_mask: torch.Tensor  # (b, L)
    targets: torch.Tensor         # (b, T), right-aligned, IGNORE where a row has fewer target tokens

    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device) -> "Batch":
        return Batch(self.input_ids.to(device), self.attention_mask.to(device), self.targets.to(device))

    def repeat(self, n: int) -> "Batch":
        """The batch stacked n times, copy-major: rows c·b … (c+1)·b − 1 are copy c."""
        return Batch(self.input_ids.repeat(n, 1), self.attention_mask.repeat(n, 1), self.targets.repeat(n, 1))


def encode_example(task: Task, tokenizer, example: dict, max_length: int | None = None) -> tuple[list, list]:
    """(input ids, target ids) of one training example. Long prompts lose their beginning, never the answer."""
    context, continuation = task.training_pair(example)
    prompt = tokenizer(context).input_ids
    target = tokenizer(continuation, add_special_tokens=False).input_ids
    if not target:
        raise ValueError(f"task {task.name!r}: empty target for example {example!r:.80}")
    ids = prompt + target[:-1]
    if max_length is not None and len(ids) > max_length:
        ids = ids[len(ids) - max_length:]
    return ids, target


def collate(items: list[tuple[list, list]], pad_id: int) -> Batch:
    ids, mask = left_pad([i for i, _ in items], pad_id)
    width = max(len(t) for _, t in items)
    targets = torch.full((len(items), width), IGNORE, dtype=torch.long)
    for row, (_, t) in enumerate(items):
        targets[row, width - len(t):] = torch.tensor(t, dtype=torch.long)
    return Batch(ids, mask, targets)


def synthetic_batch(rows: int, seq_len: int, vocab_size: int, seed: int = 0) -> Batch:
    """A full-length batch without padding and one target token per row: Gao et al.'s "standard
    benchmark" (§4.2), which isolates the optimizer from the data's lengths."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (rows, seq_len), generator=gen)
    targets = torch.randint(0, vocab_size, (rows, 1), generator=gen)
    return Batch(ids, torch.ones_like(ids), targets)


def last_positions(width: int, length: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``logits_to_keep`` for the last ``width`` of ``length`` positions, as positions rather than a count.

    A count makes the model slice its hidden states (a strided view); with frozen weights PyTorch's matmul
    then runs the vocabulary head as a batched product over the weight expanded per row, about 10× slower
    than one matrix product: 4% of a P-RGE step on SmolLM2 at L = 64 (chapter 5). Positions make the model
    gather them into a contiguous tensor, which goes to the single product."""
    if not 0 < width <= length:
        raise ValueError(f"cannot keep the last {width} of {length} positions")
    return torch.arange(length - width, length, device=device)     # made on the device: no copy from the host


def causal_padding_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The (rows, 1, L, L) additive mask of a left-padded batch, built on the mask's device: 0 where query i may
    attend to key j (j ≤ i and j is a real token, or j = i so that a padding row stays finite), the dtype's
    most negative value elsewhere. Real rows see the mask transformers builds; transformers' own construction
    for SDPA reads ``padding_mask.all()`` on the host to choose a kernel, a sync this mask avoids (chapter 5)."""
    length = attention_mask.shape[1]
    position = torch.arange(length, device=attention_mask.device)
    allowed = (position.view(1, length) <= position.view(length, 1)) & attention_mask.bool().view(-1, 1, 1, length)
    allowed = allowed | torch.eye(length, dtype=torch.bool, device=attention_mask.device)
    return torch.zeros(allowed.shape, dtype=dtype, device=attention_mask.device).masked_fill_(~allowed,
                                                                                               torch.finfo(dtype).min)


def tail_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, width: int,
                device_mask: bool | None = None) -> torch.Tensor:
    """The model's logits at the last ``width`` positions only: a (rows, width, vocab) tensor.

    ``device_mask`` (default: on a GPU) passes :func:`causal_padding_mask` instead of the 2-D mask, so the forward
    reads nothing on the host (the CPU keeps transformers' own mask, and the numbers it gave)."""
    keep = last_positions(width, input_ids.shape[1], input_ids.device)
    if device_mask is None:
        device_mask = input_ids.device.type == "cuda"
    if device_mask:
        dtype = next(model.parameters()).dtype
        dtype = dtype if dtype.is_floating_point else torch.float32
        mask = causal_padding_mask(attention_mask, dtype)
        return model(input_ids=input_ids, attention_mask=mask, logits_to_keep=keep, use_cache=False).logits
    return model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep).logits


def row_losses(model, batch: Batch, device_mask: bool | None = None) -> torch.Tensor:
    """Mean cross-entropy over each row's target tokens: a (rows,) tensor (at least fp32)."""
    logits = tail_logits(model, batch.input_ids, batch.attention_mask, batch.targets.shape[1], device_mask)
    return target_losses(logits, batch.targets)


def target_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each row's target tokens given the logits of the last T positions (rows, T,
    vocab): the loss of :func:`row_losses`, shared with methods that run the head themselves (MeBP)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))   # fp16 → fp32, fp64 stays
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                         ignore_index=IGNORE, reduction="none").reshape(targets.shape)
    counts = (targets != IGNORE).sum(1)
    return ce.sum(1) / counts


def copy_losses(model, batch: Batch, n: int, device_mask: bool | None = None) -> torch.Tensor:
    """Loss of each of the n copies in a batch made by ``Batch.repeat(n)``: a (n,) tensor."""
    return row_losses(model, batch, device_mask).reshape(n, -1).mean(1)


def length_chunks(batch: Batch, groups: int) -> list[tuple[torch.Tensor, Batch]]:
    """The rows of ``batch`` sorted by their real length (stable) and cut into ``groups`` chunks of near-equal
    size (at most one per row), each as (its row indices, its rows cut to the chunk's longest prompt and target):
    the padding of one batch shrinks to that of a few shorter ones (chapter 5, the padding share)."""
    if not (isinstance(groups, int) and groups >= 1):
        raise ValueError(f"length groups: a whole number >= 1, got {groups!r}")
    lengths = batch.attention_mask.sum(1)
    order = torch.argsort(lengths, stable=True)
    chunks = []
    for rows in torch.tensor_split(order, min(groups, batch.rows)):
        width = int(lengths[rows].max())
        target_width = int((batch.targets[rows] != IGNORE).sum(1).max())
        chunks.append((rows, Batch(batch.input_ids[rows, -width:], batch.attention_mask[rows, -width:],
                                   batch.targets[rows, -target_width:])))
    return chunks


def grouped_copy_losses(model, batch: Batch, n: int, groups: int = 1, device_mask: bool | None = None) -> torch.Tensor:
    """:func:`copy_losses` of ``batch.repeat(n)`` (a (n,) tensor), forwarded in :func:`length_chunks`: each chunk
    of rows repeated n times, copy-major as the perturbed layers read them. The same losses up to float rounding,
    over fewer padded tokens; ``groups`` 1 is :func:`copy_losses` itself (the same numbers bit for bit)."""
    if groups == 1:
        return copy_losses(model, batch.repeat(n), n, device_mask)
    total = None
    for _, rows in length_chunks(batch, groups):
        sums = row_losses(model, rows.repeat(n), device_mask).reshape(n, -1).sum(1)
        total = sums if total is None else total + sums
    return total / batch.rows


def mean_loss(model, batch: Batch, groups: int = 1) -> torch.Tensor:
    """The step's loss, the mean of :func:`row_losses` over the batch (MeZO, SensZOQ), in ``groups`` length
    chunks (:func:`grouped_copy_losses`); ``groups`` 1 is the plain mean (bit for bit)."""
    if groups == 1:
        return row_losses(model, batch).mean()
    return grouped_copy_losses(model, batch, 1, groups)[0]


def fit_width(batch: Batch, width: int, pad_id: int, target_width: int | None = None) -> Batch:
    """Left-pad (or cut from the left) every row to exactly ``width`` tokens, and the targets to
    ``target_width`` columns: a program has fixed shapes. The answer sits at the right end, so cutting from
    the left never loses it."""
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
