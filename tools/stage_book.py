"""Stage the book for building: book/ -> build/book/.

Chapters (book/NN_*.md, MyST notebooks) become notebooks without outputs; every other file
in book/ is copied as is. A staged notebook is only rewritten (without outputs, so that the
build or nbmake executes it again) when something its outputs depend on changed; otherwise
outputs written into it by `pytest --nbmake --overwrite` or tools/run_chapters.py survive a
second staging. What a chapter depends on is recorded in the notebook's `prge_stage` metadata:

- its cells, and the PRGE_* settings it is meant to run with (`settings`);
- `prge_lib`: the content of every library file the chapter's code imports, followed through
  the library's own imports to the end. The import graph is read from the source (`ast`), not
  by importing anything: every `import` and `from ... import` anywhere in a module (also inside
  functions), a string that names a library module (what `importlib.import_module` reads), and
  the packages above each module (their `__init__.py` runs on import). Files that are not
  Python inside a package's data folders (e.g. deploy/native, the C++ trainer) count with
  that package;
- `data/results`: the result folders the chapter reads. A chapter reads results when its code
  uses `RESULTS`, `rp`, `load_results`, `read_if_present`, `read_result` or a path with
  "data/results"; it then depends on each folder `data/results/<name>` whose name is a string
  literal of its code cells, or one part of a literal path ("bench" in
  "data/results/bench/x.json" or in `RESULTS / "bench"`), and on the whole tree when no such
  name appears. data/results/book (the chapters' recorded execution times) is no chapter's
  input and never counts.

Each dependency is kept as a SHA-256 over the relative paths and contents of its files, so a
change in one module rewrites exactly the chapters that import it, directly or not.

The staged _config.yml lists the notebooks that already carry outputs from such a run in
execute.exclude_patterns, so that `jupyter-book build` does not execute them again. (Its
"auto" mode alone is not enough: it re-executes any notebook in which one code cell has no
output, e.g. a cell that only imports.) Each staged notebook also gets the book's per-cell
timeout in its metadata, where nbmake reads it (nbmake's own default is 300 s). In fast mode that
timeout is at most FAST_CELL_TIMEOUT: no fast-mode cell takes more than a few minutes, so a cell that
runs for longer has hung, and tools/test reruns a notebook once after a timeout or a dead kernel.

Links between chapters are Markdown links to the chapter files (`[chapter 2](02_rge.md)`), which JupyterLab
opens; in the staged copies they point at the staged notebooks (`02_rge.ipynb`), which Sphinx resolves to the
page (a link to `02_rge.md` would name a file that is not in the staged book).

Usage: python tools/stage_book.py
"""

from __future__ import annotations

import ast
import filecmp
import hashlib
import os
import re
import shutil
from pathlib import Path
from typing import NamedTuple

import jupytext
import nbformat
import yaml

from prge_lib.common.settings import fast_mode

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "book"
STAGE = ROOT / "build" / "book"
CHAPTERS = "[0-9][0-9]_*.md"
SKIP = {"_build", ".ipynb_checkpoints", "__pycache__", "_config.yml"}
LIBRARY = ROOT / "prge_lib"
RESULTS = ROOT / "data" / "results"
# cell metadata that a run writes (run_chapters: the replies to the prose's {eval} roles), not the source
RUN_METADATA = {"execution", "user_expressions"}
NOT_INPUTS = {"book"}     # data/results/book: the chapters' execution times, written by the build itself
# names by which chapter code reads result files
READS_RESULTS = {"RESULTS", "rp", "load_results", "read_if_present", "read_result"}


# Seconds per cell in fast mode. The slowest fast-mode chapter takes about 140 s in all on a 2-core
# CPU (data/results/book/chapter_times.json), so a fast-mode cell past this has hung, not worked.
FAST_CELL_TIMEOUT = 900


def cell_timeout(source: Path = SOURCE) -> int | None:
    """Seconds per cell for the staged notebooks: the book's execute.timeout, capped at FAST_CELL_TIMEOUT
    in fast mode (PRGE_FAST), so that a hung kernel costs CI minutes, not the hour a full-mode cell may take."""
    timeout = (_config(source).get("execute") or {}).get("timeout")
    if fast_mode():
        timeout = min(timeout or FAST_CELL_TIMEOUT, FAST_CELL_TIMEOUT)
    return timeout


def settings() -> dict:
    """The PRGE_* environment variables a staged notebook is meant to run with."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("PRGE_")}


class Library(NamedTuple):
    """The library's files and its import graph, read once per staging."""

    root: Path                      # the package folder (prge_lib/)
    files: dict[str, Path]          # module -> its file (a package: its __init__.py)
    imports: dict[str, set[str]]    # module -> the library modules it imports
    data: dict[str, list[Path]]     # package -> its files that are not Python


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _imported(tree: ast.AST, name: str, is_package: bool, modules) -> set[str]:
    """The library modules that code imports: `name` is its module ("" for chapter code). A module
    comes with the packages above it, whose __init__.py runs when it is imported."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                if not name:
                    continue                # a relative import outside the library names none of it
                package = name.split(".")[: None if is_package else -1]
                base = ".".join(package[: len(package) - node.level + 1] + [base] * bool(base))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in modules:
            found.add(node.value)          # importlib.import_module("prge_lib....")
    parts = [dotted.split(".") for dotted in found]
    return {".".join(p[:i]) for p in parts for i in range(1, len(p) + 1)} & set(modules)


def read_library(root: Path = LIBRARY) -> Library:
    """Read the package at `root`: its modules, what each imports, and its other files."""
    if not (root / "__init__.py").is_file():
        raise FileNotFoundError(f"{root} is not a Python package (no __init__.py); pass the library's folder")
    files, data = {}, {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts or path.name.startswith("."):
            continue
        if path.suffix == ".py":
            files[_module_name(path, root)] = path
        elif path.suffix != ".pyc":
            package = next(d for d in path.parents if (d / "__init__.py").is_file() or d == root)
            data.setdefault(_module_name(package / "__init__.py", root), []).append(path)
    imports = {name: _imported(ast.parse(path.read_bytes(), str(path)), name, path.name == "__init__.py", files)
               for name, path in files.items()}
    return Library(root, files, imports, data)


def _code(nb) -> tuple[list[ast.AST], bool]:
    """The parsed code cells (IPython's % and ! lines left out), and whether some cell did not parse."""
    trees, unparsed = [], False
    for cell in nb.cells:
        if cell.cell_type == "code":
            lines = ["" if ln.lstrip().startswith(("%", "!")) else ln for ln in cell.source.splitlines()]
            try:
                trees.append(ast.parse("\n".join(lines)))
            except SyntaxError:
                unparsed = True
    return trees, unparsed


def result_folders(trees: list[ast.AST], results: Path = RESULTS) -> list[str] | None:
    """The folders of `results` that chapter code reads ([] if it reads no result; None: the whole tree),
    by the rule of the module docstring."""
    names, strings = set(), []
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.append(node.value)
    if not (names & READS_RESULTS or any("data/results" in s for s in strings)):
        return []
    parts = {part for s in strings for part in re.split(r"[/\\\s]+", s)}
    folders = {p.name for p in results.iterdir() if p.is_dir()} if results.is_dir() else set()
    return sorted((folders - NOT_INPUTS) & parts) or None


def _digest(files: list[Path], base: Path) -> str:
    """SHA-256 over the files' paths relative to `base` and their contents."""
    total = hashlib.sha256()
    for path in sorted(files):
        total.update(path.relative_to(base).as_posix().encode() + b"\0")
        total.update(hashlib.sha256(path.read_bytes()).digest())
    return total.hexdigest()


def _files_under(folder: Path, skip: set[str] = frozenset()) -> list[Path]:
    if not folder.is_dir():
        return []
    return [p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")
            and p.relative_to(folder).parts[0] not in skip]


def modules_used(nb, library: Library) -> set[str]:
    """The library modules a notebook's code imports, directly or through other modules (all of them
    if a code cell does not parse)."""
    trees, unparsed = _code(nb)
    if unparsed:
        return set(library.files)
    used, todo = set(), list(set().union(*(_imported(t, "", False, library.files) for t in trees)))
    while todo:
        module = todo.pop()
        if module not in used:
            used.add(module)
            todo.extend(library.imports[module])
    return used


def dependencies(nb, library: Library, results: Path = RESULTS) -> dict:
    """The fingerprint of what a chapter's outputs depend on besides its cells (module docstring)."""
    trees, unparsed = _code(nb)
    used = modules_used(nb, library)
    code = [library.files[m] for m in used] + [f for m in used for f in library.data.get(m, ())]
    folders = None if unparsed else result_folders(trees, results)
    if folders is None:
        read = _files_under(results, NOT_INPUTS)
    else:
        read = [f for name in folders for f in _files_under(results / name)]
    return {
        library.root.name: {"files": len(code), "sha256": _digest(code, library.root.parent)},
        "data/results": {"folders": "all" if folders is None else folders, "files": len(read),
                         "sha256": _digest(read, results)},
    }


def _signature(nb) -> dict:
    """What decides whether a staged notebook is still current: cells, settings, dependencies."""
    cells = [
        (c.cell_type, c.source, {k: v for k, v in c.metadata.items() if k not in RUN_METADATA})
        for c in nb.cells
    ]
    stage = nb.metadata.get("prge_stage") or {}
    return {"cells": cells, "settings": stage.get("settings"), **(stage.get("depends") or {}),
            **{k: nb.metadata.get(k) for k in ("execution", "kernelspec")}}


def was_run(nb) -> bool:
    """True if the notebook was executed in place (staging writes no execution counts)."""
    return any(c.get("execution_count") is not None for c in nb.cells if c.cell_type == "code")


def _chapter_link(chapters: set[str]) -> re.Pattern:
    names = "|".join(re.escape(name) for name in sorted(chapters))
    return re.compile(rf"\]\(({names})\.md(#[^)\s]*)?\)")


def link_staged(text: str, chapters: set[str]) -> str:
    """`text` with its Markdown links to chapter sources (`](02_rge.md)`, `](02_rge.md#part)`) pointing at the
    staged notebooks (`](02_rge.ipynb)`, …). `chapters`: the chapters' file stems."""
    if not chapters:
        return text
    return _chapter_link(chapters).sub(lambda m: f"]({m.group(1)}.ipynb{m.group(2) or ''})", text)


def stage_chapter(src: Path, dst: Path, timeout: int | None = None, library: Library | None = None,
                  results: Path = RESULTS) -> str | None:
    """Convert one MyST chapter to an output-free notebook, unless `dst` is still current.

    Returns what changed ("new", or the parts of the signature: "cells", "settings", "prge_lib",
    "data/results", ...), None if `dst` was left as it was. timeout (seconds per cell) goes to
    the notebook's execution metadata, where nbmake reads it, unless the chapter sets its own.
    """
    nb = jupytext.read(src)
    chapters = {p.stem for p in src.parent.glob(CHAPTERS)}
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = link_staged(cell.source, chapters)
    nb.metadata["prge_stage"] = {"settings": settings(),
                                 "depends": dependencies(nb, library or read_library(), results)}
    if timeout:
        nb.metadata.setdefault("execution", {}).setdefault("timeout", timeout)
    new = _signature(nb)
    if dst.exists():
        old = _signature(nbformat.read(dst, as_version=4))
        changed = [k for k in {**old, **new} if old.get(k) != new.get(k)]
        if not changed:
            return None
    else:
        changed = ["new"]
    jupytext.write(nb, dst, fmt="ipynb")
    return ", ".join(changed)


def _copy(src: Path, dst: Path, chapters: set[str] = frozenset()) -> None:
    """Copy a file or folder, leaving files that are already identical untouched; a Markdown page has its
    links to chapter sources pointed at the staged notebooks (:func:`link_staged`)."""
    if src.is_dir():
        for child in src.iterdir():
            if child.name not in SKIP and not child.name.startswith("."):
                _copy(child, dst / child.name, chapters)
    elif src.suffix == ".md":
        text = link_staged(src.read_text(), chapters)
        if not (dst.exists() and dst.read_text() == text):
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(text)
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


def stage(source: Path = SOURCE, dest: Path = STAGE, verbose: bool = False, library: Path = LIBRARY,
          results: Path = RESULTS) -> Path:
    """Stage book/ into build/book/ and return the staged folder. library: the package the chapters
    import; results: the result files they read (both only for the dependency fingerprints)."""
    dest.mkdir(parents=True, exist_ok=True)
    code = read_library(library)
    timeout = cell_timeout(source)
    chapters = sorted(source.glob(CHAPTERS))
    names = {p.with_suffix(".ipynb").name for p in chapters}
    for old in dest.glob(CHAPTERS.replace(".md", ".ipynb")):
        if old.name not in names:
            old.unlink()  # its chapter is gone
    for src in chapters:
        changed = stage_chapter(src, dest / f"{src.stem}.ipynb", timeout, code, results)
        if changed and verbose:
            print(f"staged {src.name} ({changed}): to be executed")
    for entry in source.iterdir():
        if entry.name in SKIP or entry.name.startswith(".") or entry.suffix == ".ipynb":
            continue
        if not entry.match(CHAPTERS):
            _copy(entry, dest / entry.name, {p.stem for p in chapters})
    done = write_config(dest, source)
    if verbose and done:
        print("already executed, not run again by the build: " + ", ".join(done))
    return dest


if __name__ == "__main__":
    print(f"book staged in {stage(verbose=True)}")
