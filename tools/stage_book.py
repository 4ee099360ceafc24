"""Stage the book for building: book/ -> build/book/.

Chapters (book/NN_*.md, MyST notebooks) become notebooks without outputs; every other file
in book/ is copied as is. A staged notebook is only rewritten when its source changed, or
when the PRGE_* settings it is meant to run with changed, so that outputs written into it
by `pytest --nbmake --overwrite` survive a second staging.

The staged _config.yml lists the notebooks that already carry outputs from such a run in
execute.exclude_patterns, so that `jupyter-book build` does not execute them again. (Its
"auto" mode alone is not enough: it re-executes any notebook in which one code cell has no
output, e.g. a cell that only imports.) Each staged notebook also gets the book's per-cell
timeout in its metadata, where nbmake reads it (nbmake's own default is 300 s).

Usage: python tools/stage_book.py
"""

from __future__ import annotations

import filecmp
import os
import shutil
from pathlib import Path

import jupytext
import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "book"
STAGE = ROOT / "build" / "book"
CHAPTERS = "[0-9][0-9]_*.md"
SKIP = {"_build", ".ipynb_checkpoints", "__pycache__", "_config.yml"}


def settings() -> dict:
    """The PRGE_* environment variables a staged notebook is meant to run with."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("PRGE_")}


def _signature(nb) -> list:
    """What decides whether a staged notebook is still current: cells and settings."""
    cells = [
        (c.cell_type, c.source, {k: v for k, v in c.metadata.items() if k != "execution"})
        for c in nb.cells
    ]
    meta = {k: nb.metadata.get(k) for k in ("prge_stage", "execution", "kernelspec")}
    return [cells, meta]


def was_run(nb) -> bool:
    """True if the notebook was executed in place (staging writes no execution counts)."""
    return any(c.get("execution_count") is not None for c in nb.cells if c.cell_type == "code")


def stage_chapter(src: Path, dst: Path, timeout: int | None = None) -> bool:
    """Convert one MyST chapter to an output-free notebook; return True if rewritten.

    timeout (seconds per cell) goes to the notebook's execution metadata, where nbmake
    reads it, unless the chapter sets its own.
    """
    nb = jupytext.read(src)
    nb.metadata["prge_stage"] = settings()
    if timeout:
        nb.metadata.setdefault("execution", {}).setdefault("timeout", timeout)
    if dst.exists() and _signature(nbformat.read(dst, as_version=4)) == _signature(nb):
        return False
    jupytext.write(nb, dst, fmt="ipynb")
    return True


def _copy(src: Path, dst: Path) -> None:
    """Copy a file or folder, leaving files that are already identical untouched."""
    if src.is_dir():
        for child in src.iterdir():
            if child.name not in SKIP and not child.name.startswith("."):
                _copy(child, dst / child.name)
    elif not (dst.exists() and filecmp.cmp(src, dst, shallow=False)):
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def _config(source: Path) -> dict:
    return yaml.safe_load((source / "_config.yml").read_text())


def write_config(dest: Path = STAGE, source: Path = SOURCE) -> list[str]:
    """Write the staged _config.yml, excluding already-run notebooks from execution."""
    config = _config(source)
    done = sorted(p.name for p in dest.glob("*.ipynb") if was_run(nbformat.read(p, 4)))
    execute = config.setdefault("execute", {})
    execute["exclude_patterns"] = list(execute.get("exclude_patterns") or []) + done
    text = yaml.safe_dump(config, sort_keys=False, allow_unicode=True)
    target = dest / "_config.yml"
    if not target.exists() or target.read_text() != text:
        target.write_text(text)
    return done


def stage(source: Path = SOURCE, dest: Path = STAGE, verbose: bool = False) -> Path:
    """Stage book/ into build/book/ and return the staged folder."""
    dest.mkdir(parents=True, exist_ok=True)
    timeout = (_config(source).get("execute") or {}).get("timeout")
    chapters = sorted(source.glob(CHAPTERS))
    names = {p.with_suffix(".ipynb").name for p in chapters}
    for old in dest.glob(CHAPTERS.replace(".md", ".ipynb")):
        if old.name not in names:
            old.unlink()  # its chapter is gone
    for src in chapters:
        if stage_chapter(src, dest / f"{src.stem}.ipynb", timeout) and verbose:
            print(f"staged {src.name}")
    for entry in source.iterdir():
        if entry.name in SKIP or entry.name.startswith(".") or entry.suffix == ".ipynb":
            continue
        if not entry.match(CHAPTERS):
            _copy(entry, dest / entry.name)
    done = write_config(dest, source)
    if verbose and done:
        print("already executed, not run again by the build: " + ", ".join(done))
    return dest


if __name__ == "__main__":
    print(f"book staged in {stage(verbose=True)}")
