"""One process at a time runs a cell of chapter 7: the cell's lock file beside its checkpoint folder, with an owner
record (pid, host, start time) that the others name.
"""
from __future__ import annotations

import json
import os
import platform
import time
from contextlib import contextmanager
from pathlib import Path

from prge_lib.common.provenance import atomic_file
from prge_lib.experiments.cells import Cell


class CellBusy(RuntimeError):
    """Another process runs the cell (it holds the cell's lock): this one leaves it alone."""


LOCK_WAIT_S = 0.5      # how long a cell waits for its lock (a --list looking at the lock holds it for microseconds)


def _lock_files(cell: Cell, checkpoints: Path | None) -> tuple[Path, Path]:
    """The cell's lock file and its owner record, beside the cell's checkpoint folder."""
    folder = cell.checkpoint_dir(checkpoints)
    return folder.with_name(folder.name + ".lock"), folder.with_name(folder.name + ".owner.json")


def _owner_text(owner: Path) -> str:
    try:
        o = json.loads(owner.read_text())
        return f"pid {o['pid']} on {o['host']}, since {o['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return f"its owner record {owner} is missing or unreadable"


@contextmanager
def cell_lock(cell: Cell, checkpoints: Path | None = None):
    """Hold ``cell``'s lock for the block: one process at a time runs a cell, writes its checkpoints and removes
    them. The lock (``filelock``) sits beside the checkpoint folder with an owner record (pid, host, start
    time) for the others to name; the operating system releases the lock of a process that dies, even by
    kill -9. Raises :class:`CellBusy`, naming the holder, when another process has it."""
    from filelock import FileLock, Timeout

    lock_path, owner = _lock_files(cell, checkpoints)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(lock_path)
    try:
        lock.acquire(timeout=LOCK_WAIT_S)
    except Timeout:
        raise CellBusy(f"cell {cell.name} is running in another process ({_owner_text(owner)}); "
                       f"left to it") from None
    try:
        with atomic_file(owner) as tmp:
            tmp.write_text(json.dumps({"pid": os.getpid(), "host": platform.node(),
                                       "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
        yield
    finally:
        owner.unlink(missing_ok=True)
        lock.release()


def cell_holder(cell: Cell, checkpoints: Path | None = None) -> str | None:
    """Who runs ``cell`` now ("pid … on …, since …"), or None when no process holds its lock."""
    from filelock import FileLock, Timeout

    lock_path, owner = _lock_files(cell, checkpoints)
    if not lock_path.is_file():
        return None
    lock = FileLock(lock_path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return _owner_text(owner)
    lock.release()
    return None
