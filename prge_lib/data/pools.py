"""The task pools shipped with the book (``data/tasks``), so that it runs with no data setting (chapter 0).

A pool holds, for one split of one task, exactly the rows that the MeZO protocol (``prge_lib.data.splits``) draws
for seeds 0–4 at the protocol's sizes, at their original positions: a :class:`PooledSplit` reports the full
split's length and returns row ``i`` as the full split would. Sampling from a pool therefore gives the same
examples as sampling from the full data, for those seeds and for any smaller sizes. Asking for another row
(another seed, larger sizes) is an error that says how to get the full split.

The pools are written by ``tools/make_pools`` from a data folder or the hub, compressed with xz, and listed
with their checksums and licences in ``data/tasks/MANIFEST.json``. The C4 and WikiText-2 samples of the
sparse and backprop chapters sit beside them in ``data/text``.
"""
from __future__ import annotations

import hashlib
import json
import lzma
from collections.abc import Iterator, Sequence
from pathlib import Path

from prge_lib.common.settings import data_dir
from prge_lib.common.paths import POOL_DIR, TEXT_DIR
from prge_lib.common.provenance import atomic_file

POOL_SEEDS = (0, 1, 2, 3, 4)


class DataUnavailableError(RuntimeError):
    """A split that cannot be read here (no local file, no hub)."""


class PoolMissError(DataUnavailableError):
    """A row that the shipped pool does not hold."""


class DataFormatError(ValueError):
    """A data file or row that cannot be read as the task's data; the message names the file and line."""


def jsonl_records(lines, name) -> Iterator[tuple[int, dict]]:
    """(line number, object) of each non-blank line of JSON Lines given as bytes (a file opened in binary
    mode); a line that is not UTF-8, not JSON or not an object is a :class:`DataFormatError` naming ``name``
    and the line."""
    for number, raw in enumerate(lines, 1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise DataFormatError(f"{name}, line {number}: not UTF-8 text (byte {raw[err.start]:#04x} at "
                                  f"column {err.start + 1})") from None
        if not text.strip():
            continue
        try:
            item = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataFormatError(f"{name}, line {number}: not valid JSON ({err.msg} at column {err.colno})") \
                from None
        if not isinstance(item, dict):
            raise DataFormatError(f"{name}, line {number}: a JSON object expected, got {type(item).__name__}")
        yield number, item


class PooledSplit(Sequence):
    """A split of ``n_rows`` rows of which only some are present (the rows the protocol draws)."""

    def __init__(self, name: str, n_rows: int, rows: dict[int, dict], seeds: Sequence[int]):
        self.name, self.n_rows, self.rows, self.seeds = name, n_rows, rows, tuple(seeds)

    def __len__(self) -> int:
        return self.n_rows

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.n_rows))]
        if index < 0:
            index += self.n_rows
        if not 0 <= index < self.n_rows:
            raise IndexError(f"{self.name}: row {index} of {self.n_rows}")
        try:
            return self.rows[index]
        except KeyError:
            raise PoolMissError(
                f"{self.name}: row {index} is not in the pool shipped with the book, which holds the "
                f"{len(self.rows)} rows the MeZO protocol draws for seeds {list(self.seeds)} at sizes up to "
                f"1000/500/1000. For other seeds or sizes set PRGE_DATA_DIR to a data folder, or to 'hub' "
                f"to read the full split from the Hugging Face hub") from None


def pool_path(task_path: str, split: str, root: Path = POOL_DIR) -> Path:
    return Path(root) / task_path / f"{split}.jsonl.xz"


def read_pool(task_path: str, split: str, root: Path = POOL_DIR) -> PooledSplit | None:
    """The shipped pool of a split, or None when there is none."""
    path = pool_path(task_path, split, root)
    if not path.is_file():
        return None
    header, rows = None, {}
    with lzma.open(path, "rb") as f:
        for number, item in jsonl_records(f, path):
            if header is None:
                header = item
            elif not {"i", "row"} <= item.keys():
                raise DataFormatError(f"{path}, line {number}: a pool line holds 'i' and 'row', got "
                                      f"{sorted(item)}")
            else:
                rows[item["i"]] = item["row"]
    if header is None:
        raise DataFormatError(f"{path} is empty: a pool starts with a header line")
    return PooledSplit(f"{task_path}/{split}", header["n_rows"], rows, header["seeds"])


def write_pool(path: Path, n_rows: int, rows: dict[int, dict], seeds: Sequence[int], source: str) -> Path:
    """Write a pool: a header line, then one ``{"i": position, "row": …}`` line per row, by position."""

    with atomic_file(path) as tmp:
        with lzma.open(tmp, "wt", encoding="utf-8", preset=9) as f:
            f.write(json.dumps({"n_rows": n_rows, "seeds": list(seeds), "source": source}) + "\n")
            for i in sorted(rows):
                f.write(json.dumps({"i": i, "row": rows[i]}, ensure_ascii=False) + "\n")
    return Path(path)


class RecordingSplit(Sequence):
    """A full split that remembers which rows were read (to find what a pool must hold)."""

    def __init__(self, rows: Sequence[dict]):
        self.full, self.read = rows, set()

    def __len__(self) -> int:
        return len(self.full)

    def __getitem__(self, index):
        self.read.add(index)
        return self.full[index]


def open_text(name: str):
    """Open a text sample for reading: ``<PRGE_DATA_DIR>/text/<name>`` when a data folder is set, else the
    sample shipped in ``data/text/<name>.xz`` (``c4_sample.jsonl``, ``wikitext-2-raw-test.txt``)."""

    root = data_dir()
    path = root / "text" / name if root is not None else TEXT_DIR / f"{name}.xz"
    if not path.is_file():
        raise FileNotFoundError(f"no text sample {name!r}: looked for {path}")
    return open(path, encoding="utf-8") if root is not None else lzma.open(path, "rt", encoding="utf-8")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
