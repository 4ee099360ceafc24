"""One process at a time runs a cell of chapter 7: the cell's lock file beside its checkpoint folder, and another
beside its result file, each with an owner record (pid, host, start time) that the others name. The second lock
holds where two processes were given different checkpoint roots (``--checkpoint-root``): their checkpoint locks
differ, the result file they would both write does not.
"""
from __future__ import annotations

import json
import os
import platform
import time
from contextlib import ExitStack, contextmanager
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


def _result_lock_files(cell: Cell, results: Path) -> tuple[Path, Path]:
    """The cell's lock file and owner record beside its result file: hidden, and named so that nothing reading the
    folder's ``*.json`` results takes them for one."""
    path = cell.result_path(results)
    return path.with_name(f".{path.name}.lock"), path.with_name(f".{path.name}.owner")


def _owner_text(owner: Path) -> str:
    try:
        o = json.loads(owner.read_text())
        return f"pid {o['pid']} on {o['host']}, since {o['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return f"its owner record {owner} is missing or unreadable"


@contextmanager
def _held(cell: Cell, lock_path: Path, owner: Path):
    """Hold one of the cell's locks for the block, its owner record written (:func:`cell_lock`)."""
    from filelock import FileLock, Timeout

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


@contextmanager
def cell_lock(cell: Cell, checkpoints: Path | None = None, results: Path | None = None):
    """Hold ``cell``'s locks for the block: one process at a time runs a cell, writes its checkpoints and its
    result, and removes its checkpoints. One lock (``filelock``) sits beside the checkpoint folder, and, given
    ``results``, one beside the result file (what a process under another checkpoint root also takes), each with an
    owner record (pid, host, start time) for the others to name; the operating system releases the locks of a
    process that dies, even by kill -9. Raises :class:`CellBusy`, naming the holder, when another process has
    either."""
    with ExitStack() as held:
        if results is not None:           # first, in one order for every process: no two wait on each other
            held.enter_context(_held(cell, *_result_lock_files(cell, results)))
        held.enter_context(_held(cell, *_lock_files(cell, checkpoints)))
        yield


def _holder(lock_path: Path, owner: Path) -> str | None:
    from filelock import FileLock, Timeout

    if not lock_path.is_file():
        return None
    lock = FileLock(lock_path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return _owner_text(owner)
    lock.release()
    return None


def cell_holder(cell: Cell, checkpoints: Path | None = None, results: Path | None = None) -> str | None:
    """Who runs ``cell`` now ("pid … on …, since …"), or None when no process holds its lock beside the checkpoint
    folder under ``checkpoints`` or, given ``results``, its lock beside the result file."""
    found = _holder(*_lock_files(cell, checkpoints))
    if found is None and results is not None:
        found = _holder(*_result_lock_files(cell, results))
    return found
