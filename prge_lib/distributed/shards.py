"""Each federated client's own part of the training sample (chapter 11): an equal random split (``iid``) or a
label-skewed one (``label-skew``), the non-IID case where a client's data is mostly one class.

Both splits are disjoint and together cover the sample; client k holds n // K examples, plus one for the first
n mod K clients. The label-skew rule, with skew p: client k's *home* label is the k-th of the task's labels taken
in turn (k mod L); it first draws ⌊p · size_k⌋ of its examples at random from the examples of its home label not
yet dealt (fewer if that label runs out), then the examples left over, of any label, are dealt at random to fill
every shard to its size. A client's home-label share is therefore at least p wherever its label lasts; the
result records each client's label counts, so the share is read, not assumed.
"""
from __future__ import annotations

import random
from collections import Counter
from typing import Sequence

from prge_lib.zo.rge import mix_seed

SPLITS = ("iid", "label-skew")
_SHARD_TAG = 0x5A4D          # the shards' generator: mix_seed(run seed, tag, …), apart from the data order's


def shard_sizes(n: int, clients: int) -> list[int]:
    """n // K examples a client, one more for the first n mod K."""
    return [n // clients + (k < n % clients) for k in range(clients)]


def check_split(split: str, clients: int, n: int, skew: float | None = None) -> None:
    """Refuse a split this module cannot make, naming the value and what is allowed."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {list(SPLITS)}")
    if clients < 1 or clients > n:
        raise ValueError(f"--clients {clients}: needs 1 to {n} clients for {n} training examples")
    if split == "label-skew" and (skew is None or not 0.0 <= skew <= 1.0):
        raise ValueError(f"--skew {skew}: the label-skew split needs a share p with 0 <= p <= 1")
    if split == "iid" and skew is not None:
        raise ValueError(f"--skew {skew} applies to --split label-skew only, not {split!r}")


def iid_shards(n: int, clients: int, seed: int) -> list[list[int]]:
    """A random equal split of example indices 0 … n−1 over ``clients``."""
    check_split("iid", clients, n)
    order = random.Random(mix_seed(seed, _SHARD_TAG, 0)).sample(range(n), n)
    starts = [0]
    for size in shard_sizes(n, clients):
        starts.append(starts[-1] + size)
    return [sorted(order[a:b]) for a, b in zip(starts, starts[1:])]


def label_skew_shards(labels: Sequence, clients: int, skew: float, seed: int) -> list[list[int]]:
    """The label-skew split of the examples whose labels are ``labels`` (see the module docstring)."""
    n = len(labels)
    check_split("label-skew", clients, n, skew)
    rng = random.Random(mix_seed(seed, _SHARD_TAG, 1))
    kinds = sorted(set(labels), key=str)
    pools = {label: rng.sample([i for i, x in enumerate(labels) if x == label],
                               sum(x == label for x in labels)) for label in kinds}
    sizes = shard_sizes(n, clients)
    shards: list[list[int]] = []
    for k, size in enumerate(sizes):
        home = pools[kinds[k % len(kinds)]]
        take = min(int(skew * size), len(home))
        shards.append(home[:take])
        del home[:take]
    rest = rng.sample([i for pool in pools.values() for i in pool], sum(len(p) for p in pools.values()))
    for shard, size in zip(shards, sizes):
        need = size - len(shard)
        shard.extend(rest[:need])
        del rest[:need]
    return [sorted(s) for s in shards]


def make_shards(split: str, labels: Sequence, clients: int, seed: int, skew: float | None = None) -> list[list[int]]:
    """The shards of ``split`` for a training sample whose labels are ``labels``."""
    check_split(split, clients, len(labels), skew)
    if split == "iid":
        return iid_shards(len(labels), clients, seed)
    return label_skew_shards(labels, clients, skew, seed)


def label_counts(shards: Sequence[Sequence[int]], labels: Sequence) -> list[dict[str, int]]:
    """Each client's examples per label (labels as text, for a JSON result)."""
    return [dict(sorted(Counter(str(labels[i]) for i in shard).items())) for shard in shards]
