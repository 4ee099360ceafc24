"""Length buckets: every batch left-padded to one of a few lengths, so that a step's shapes repeat (what a
captured CUDA graph, ``prge_lib.zo.graphs``, needs; chapter 5). The padding is masked, so a bucketed batch gives
the same losses as the unpadded one up to float rounding (tests/test_buckets.py)."""
from __future__ import annotations

from typing import Sequence

from prge_lib.models.objective import Batch, fit_width

# fine enough that short prompts pad little (SST-2's median prompt is 15 tokens), long enough for every task's
# longest prompt (RTE's reach 310 tokens): what a GPU run's CUDA graphs are recorded for (chapter 5)
FINE_BUCKETS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


def parse_buckets(text: str | Sequence[int] | None) -> tuple[int, ...] | None:
    """``"32,64,128"`` (or a sequence of ints) as sorted distinct lengths; None or "" for no buckets. A length
    below 1 or a word that is not an integer is refused, naming it."""
    if text is None or text == "":
        return None
    items = text.split(",") if isinstance(text, str) else list(text)
    lengths = []
    for item in items:
        try:
            value = int(str(item).strip())
        except ValueError:
            raise ValueError(f"buckets: {item!r} is not an integer; give lengths such as 32,64,128") from None
        if value < 1:
            raise ValueError(f"buckets: a length must be at least 1, got {value}")
        lengths.append(value)
    return tuple(sorted(set(lengths)))


def bucket_length(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``length`` tokens, or a ValueError naming both when none does."""
    for bucket in buckets:
        if bucket >= length:
            return bucket
    raise ValueError(f"a batch of {length} tokens is longer than the largest bucket {max(buckets)}; add a "
                     f"larger bucket or set max_length to at most {max(buckets)}")


def to_bucket(batch: Batch, buckets: Sequence[int] | None, pad_id: int) -> Batch:
    """``batch`` left-padded to its bucket's length (unchanged without buckets)."""
    if not buckets:
        return batch
    return fit_width(batch, bucket_length(batch.input_ids.shape[1], buckets), pad_id)
