"""Task data: read a split (a local folder of JSON Lines, the hub, or the pools shipped in data/tasks), sample the MeZO protocol splits, batch with
left padding, and measure how much of a batch is padding (Gao et al. §3.1, Fig. 2/8; chapters 0 and 5).

MeZO protocol (Malladi et al. 2023; Gao et al. §4.1): from the train split, a seeded sample of 1000 training
and 500 validation examples (disjoint); from the validation split, 1000 test examples. Where the local
copy lacks a train split (BoolQ, WinoGrande, SQuAD) all three are carved disjointly from the validation
split; where a split is too small, the sizes shrink in the protocol's proportions. Every such deviation is
written into ``TaskData.notes`` so results can carry it.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from prge_lib.common.settings import data_dir
from prge_lib.data.pools import DataFormatError, DataUnavailableError, jsonl_records, read_pool
from prge_lib.data.tasks import PROTOCOL, Task  # noqa: F401 (PROTOCOL re-exported)



def read_jsonl(path: Path, task: Task | None = None) -> list[dict]:
    """The rows of a JSON Lines file; with ``task``, each checked by :func:`check_row`. Every error names the
    file and the line."""
    rows = []
    with open(path, "rb") as f:
        for number, row in jsonl_records(f, path):
            if task is not None:
                check_row(task, row, f"{path}, line {number}")
            rows.append(row)
    return rows


def check_row(task: Task, row: dict, where: str) -> None:
    """Refuse a row ``task`` cannot use, naming ``where`` (file and line, or row): a field its prompt or answer
    reads is missing, a value is of the wrong kind, or the label is not one of the task's classes."""
    try:
        if task.render is not None:
            task.prompt(row)
        task.check_label(row)
    except KeyError as err:
        raise DataFormatError(f"{where}: no field {err.args[0]!r}, which task {task.name!r} reads") from None
    except (TypeError, ValueError, AttributeError, IndexError) as err:
        raise DataFormatError(f"{where}: {err}") from None


def load_split(task: Task, split: str, root: Path | None = None):
    """Rows of one split in the hub's schema, as a sequence (the rows of a data folder's file checked by
    :func:`check_row`).

    From ``<root>/<task.path>/<split>.jsonl`` (``root`` defaults to the folder ``PRGE_DATA_DIR`` names); with
    ``PRGE_DATA_DIR=hub`` from ``datasets.load_dataset``; unset, from the pool shipped with the book
    (``prge_lib.data.pools``: the rows the protocol draws for seeds 0–4), or the hub where no pool exists.
    """
    from prge_lib.common.settings import data_source

    root = data_dir() if root is None else Path(root)
    if root is not None:
        path = root / task.path / f"{split}.jsonl"
        if not path.is_file():
            raise DataUnavailableError(
                f"task {task.name!r}: looked for {path} and found no such file "
                f"(data folder {root}; expected layout <dataset>/<config>/<split>.jsonl)")
        rows = read_jsonl(path, task)
        if not rows:
            raise DataFormatError(f"{path} holds no rows")
        return rows
    if data_source() == "shipped":
        pool = read_pool(task.path, split)
        if pool is not None:
            return pool
    return _load_from_hub(task, split)


def _load_from_hub(task: Task, split: str) -> list[dict]:
    import datasets

    from prge_lib.common.hub import hub_reachable

    repo, config = task.hub
    if not hub_reachable():
        raise DataUnavailableError(
            f"task {task.name!r}: the Hugging Face hub is unreachable, so {repo} ({config}, split "
            f"{split!r}) cannot be read. Unset PRGE_DATA_DIR to use the pools shipped with the book, or "
            f"point it at a folder holding {task.path}/{split}.jsonl")
    return list(datasets.load_dataset(repo, config, split=split))


def _shrunk(sizes: dict[str, int], available: int) -> dict[str, int]:
    need = sum(sizes.values())
    if available >= need:
        return dict(sizes)
    return {k: v * available // need for k, v in sizes.items()}


@dataclass
class TaskData:
    task: str
    seed: int
    train: list[dict]
    val: list[dict]
    test: list[dict]
    notes: list[str] = field(default_factory=list)

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "val": len(self.val), "test": len(self.test)}


def sample_task(task: Task, seed: int = 0, n_train: int = PROTOCOL["n_train"], n_val: int = PROTOCOL["n_val"],
                n_test: int = PROTOCOL["n_test"],
                root: Path | None = None, test_only: bool = False) -> TaskData:
    """Seeded, disjoint train / validation / test samples following the MeZO protocol (see module doc).
    ``test_only``: the same test examples, with empty train and validation samples, whose rows are then never
    read (the train split's length alone sets the draw): what a shipped pool gives for seeds beyond its own
    where the test sample is the whole validation split (SST-2's 872 sentences, RTE's 277), as a summary's
    commonest-answer rate needs."""
    evaluation = load_split(task, "validation", root)
    train_rows = load_split(task, "train", root) if "train" in task.splits else None
    return sample_rows(task, train_rows, evaluation, seed, n_train, n_val, n_test, test_only=test_only)


def sample_rows(task: Task, train_rows, evaluation, seed: int = 0, n_train: int = PROTOCOL["n_train"],
                n_val: int = PROTOCOL["n_val"], n_test: int = PROTOCOL["n_test"],
                test_only: bool = False) -> TaskData:
    """:func:`sample_task` on splits already read (``train_rows`` None: the task has no train split)."""
    rng = random.Random(seed)
    notes = []
    if (n_train, n_val, n_test) != tuple(PROTOCOL.values()):
        notes.append(f"sizes {n_train}/{n_val}/{n_test} requested instead of the protocol's "
                     f"{'/'.join(map(str, PROTOCOL.values()))}")
    if train_rows is not None:
        order = rng.sample(range(len(train_rows)), len(train_rows))
        size = _shrunk({"train": n_train, "val": n_val}, len(train_rows))
        if size != {"train": n_train, "val": n_val}:
            notes.append(f"the train split has {len(train_rows)} rows, fewer than {n_train + n_val}: "
                         f"train/val shrunk to {size['train']}/{size['val']}")
        train, val = ([], []) if test_only else (
            [train_rows[i] for i in order[:size["train"]]],
            [train_rows[i] for i in order[size["train"]:size["train"] + size["val"]]])
        test_order = rng.sample(range(len(evaluation)), len(evaluation))
        test = [evaluation[i] for i in test_order[:n_test]]
        if len(test) < n_test:
            notes.append(f"the validation split has {len(evaluation)} rows: all of them form the test set")
    else:
        order = rng.sample(range(len(evaluation)), len(evaluation))
        size = _shrunk({"test": n_test, "train": n_train, "val": n_val}, len(evaluation))
        notes.append(f"no train split available: train/val/test = {size['train']}/{size['val']}/{size['test']} "
                     f"carved disjointly from the {len(evaluation)}-row validation split (seed {seed})")
        test = [evaluation[i] for i in order[:size["test"]]]
        start = size["test"] + size["train"]
        train, val = ([], []) if test_only else (
            [evaluation[i] for i in order[size["test"]:start]],
            [evaluation[i] for i in order[start:start + size["val"]]])
    for name, rows in (("train", train), ("validation", val), ("test", test)):
        for k, row in enumerate(rows):     # rows from the hub or the shipped pools too, not only a data folder's
            check_row(task, row, f"task {task.name!r}, {name} example {k} of seed {seed}")
    return TaskData(task.name, seed, train, val, test, notes)


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack token-id lists into (input_ids, attention_mask), padding on the left so that every
    sequence ends at the last position, where the answer token is read (chapter 0)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq):] = 1
    return ids, mask


def padding_share(lengths: list[int], batch_size: int, seed: int = 0) -> float:
    """Share of padding tokens when examples of these lengths are shuffled (seeded) and batched:
    sum over batches of (B · max_len − Σ len) / sum of B · max_len (Gao et al. Fig. 2/8)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    order = random.Random(seed).sample(list(lengths), len(lengths))
    padded = real = 0
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        padded += max(batch) * len(batch)
        real += sum(batch)
    return 0.0 if padded == 0 else (padded - real) / padded
