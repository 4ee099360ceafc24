"""Staging the book (tools/stage_book.py): a staged chapter keeps its outputs until something it depends on
changes (its cells, the library code it imports, the result folders it reads), and then only that chapter
loses them. Nothing is executed here."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import jupytext
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
stager = runpy.run_path(str(ROOT / "tools" / "stage_book.py"))

HEADER = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

# {title}

```{{code-cell}} ipython3
{code}
```
"""

FILES = {
    "prge_lib/__init__.py": '"""The library."""\n',
    "prge_lib/alpha.py": "A = 1\n",
    "prge_lib/beta.py": "from . import gamma\n",                 # beta -> gamma: chapter 01 needs gamma too
    "prge_lib/gamma.py": "G = 3\n",
    "prge_lib/sub/__init__.py": "",
    "prge_lib/sub/late.py": "import importlib\n\ndef f():\n    return importlib.import_module('prge_lib.gamma')\n",
    "prge_lib/sub/native/kernel.cpp": "int main() { return 0; }\n",
    "data/results/first/a.json": "{}\n",
    "data/results/second/b.json": "{}\n",
    "data/results/book/chapter_times.json": "{}\n",
    "book/_config.yml": "execute:\n  execute_notebooks: auto\n  timeout: 60\n  exclude_patterns: []\n",
    "book/00_one.md": HEADER.format(title="0. One", code='from prge_lib.alpha import A\n'
                                    'from prge_lib.common import RESULTS\n'
                                    'print(A, (RESULTS / "first" / "a.json").read_text())'),
    "book/01_two.md": HEADER.format(title="1. Two", code='import prge_lib.beta\n'
                                    'print(open("data/results/second/b.json").read())'),
}


@pytest.fixture
def repo(tmp_path) -> Path:
    """A small repository: a library of four modules, two result folders, two chapters."""
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def _stage(repo: Path) -> Path:
    return stager["stage"](repo / "book", repo / "build", library=repo / "prge_lib",
                           results=repo / "data" / "results")


def _mark_executed(stage: Path) -> None:
    """Give every staged chapter what tools/run_chapters.py's execution would have left: outputs, and the
    replies to `{eval}` roles in the Markdown cells' metadata."""
    for path in stage.glob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.execution_count = 1
                cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
            else:
                cell.metadata["user_expressions"] = [{"expression": "x", "result": {"status": "ok", "data": {}}}]
        nbformat.write(nb, path)


def _executed(stage: Path) -> dict[str, bool]:
    return {p.stem: stager["was_run"](nbformat.read(p, as_version=4)) for p in sorted(stage.glob("*.ipynb"))}


def test_unchanged_repository_keeps_every_output(repo):
    stage = _stage(repo)
    _mark_executed(stage)
    before = {p.name: p.read_bytes() for p in stage.glob("*.ipynb")}
    _stage(repo)
    assert {p.name: p.read_bytes() for p in stage.glob("*.ipynb")} == before
    assert stager["write_config"](stage, repo / "book") == ["00_one.ipynb", "01_two.ipynb"]


@pytest.mark.parametrize("changed, rerun", [
    ("prge_lib/alpha.py", "00_one"),                  # imported directly by chapter 0 only
    ("prge_lib/gamma.py", "01_two"),                  # imported by beta, which chapter 1 imports
    ("data/results/first/a.json", "00_one"),          # RESULTS / "first"
    ("data/results/second/b.json", "01_two"),         # "data/results/second/b.json"
    ("data/results/second/new.json", "01_two"),       # a new file in a folder chapter 1 reads
])
def test_a_change_reruns_only_the_chapter_that_depends_on_it(repo, changed, rerun):
    stage = _stage(repo)
    _mark_executed(stage)
    (repo / changed).write_text((repo / changed).read_text() + "# changed\n" if (repo / changed).exists() else "{}")
    _stage(repo)
    assert _executed(stage) == {"00_one": rerun != "00_one", "01_two": rerun != "01_two"}
    assert stager["write_config"](stage, repo / "book") == [f"{n}.ipynb" for n in ("00_one", "01_two") if n != rerun]


@pytest.mark.parametrize("changed", ["prge_lib/sub/late.py", "prge_lib/sub/native/kernel.cpp",
                                     "data/results/book/chapter_times.json"])
def test_what_no_chapter_reads_reruns_none(repo, changed):
    """Modules no chapter imports, their data files, and the recorded chapter times."""
    stage = _stage(repo)
    _mark_executed(stage)
    (repo / changed).write_text((repo / changed).read_text() + "\n")
    _stage(repo)
    assert _executed(stage) == {"00_one": True, "01_two": True}


def test_library_imports_follow_relative_and_named_modules(repo):
    library = stager["read_library"](repo / "prge_lib")
    assert library.imports["prge_lib.beta"] == {"prge_lib", "prge_lib.gamma"}
    assert library.imports["prge_lib.sub.late"] == {"prge_lib", "prge_lib.gamma"}   # importlib.import_module("...")
    assert [p.name for p in library.data["prge_lib.sub"]] == ["kernel.cpp"]
    two = jupytext.read(repo / "book" / "01_two.md")
    assert stager["modules_used"](two, library) == {"prge_lib", "prge_lib.beta", "prge_lib.gamma"}


def test_result_folders_rule(repo):
    results = repo / "data" / "results"
    chapters = {p.stem: stager["_code"](jupytext.read(p))[0] for p in sorted((repo / "book").glob("*.md"))}
    assert stager["result_folders"](chapters["00_one"], results) == ["first"]
    assert stager["result_folders"](chapters["01_two"], results) == ["second"]
    code = stager["_code"](nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from prge_lib.experiments import reproduce as rp\nrp.summarize(grid)")]))[0]
    assert stager["result_folders"](code, results) is None              # reads results, no folder named: all
    none = stager["_code"](nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('x = "first"')]))[0]
    assert stager["result_folders"](none, results) == []                 # reads no result at all


def test_real_chapters_depend_on_the_modules_they_import():
    """Chapter 2 follows prge_lib.zo.rge and the packages above it, not the ExecuTorch export of chapter 10;
    chapter 10 counts the C++ trainer's sources."""
    library = stager["read_library"]()
    rge = stager["modules_used"](jupytext.read(ROOT / "book" / "02_rge.md"), library)
    assert {"prge_lib", "prge_lib.zo", "prge_lib.zo.rge"} <= rge
    assert "prge_lib.deploy.export" not in rge
    device = stager["modules_used"](jupytext.read(ROOT / "book" / "10_on_device.md"), library)
    assert "prge_lib.deploy" in device and any(p.name == "trainer.cpp" for p in library.data["prge_lib.deploy"])


def test_links_between_chapters_point_at_the_staged_notebooks(repo):
    """A Markdown link to a chapter's source (what JupyterLab opens) becomes a link to its staged notebook (what
    Sphinx resolves), in chapters and in the other pages; other links and the sources are left as they were."""
    link = "See [chapter 1](01_two.md), [its part](01_two.md#part), [a file](notes.md) and [x](https://e.org/a.md).\n"
    (repo / "book" / "00_one.md").write_text((repo / "book" / "00_one.md").read_text() + "\n" + link)
    (repo / "book" / "intro.md").write_text("# Intro\n\n" + link)
    stage = _stage(repo)
    staged = "See [chapter 1](01_two.ipynb), [its part](01_two.ipynb#part), [a file](notes.md) and [x](https://e.org/a.md).\n"
    chapter = nbformat.read(stage / "00_one.ipynb", as_version=4)
    assert chapter.cells[-1].source.strip() == staged.strip()
    assert (stage / "intro.md").read_text() == "# Intro\n\n" + staged
    assert (repo / "book" / "intro.md").read_text() == "# Intro\n\n" + link


def test_book_links_chapters_with_markdown_links_not_doc_roles():
    """Chapters and the intro link chapters with Markdown links to existing chapter files, which JupyterLab
    follows; a {doc} role renders there as a link to a file without its extension, which opens nothing."""
    pages = sorted((ROOT / "book").glob("*.md"))
    stems = {p.stem for p in pages}
    for page in pages:
        text = page.read_text()
        assert "{doc}`" not in text, f"{page.name}: a {{doc}} role; link the chapter as [text](NN_name.md)"
        for target in re.findall(r"\]\(([^)\s#]+)\.md(?:#[^)]*)?\)", text):
            assert target in stems, f"{page.name}: a link to {target}.md, which is not a page of the book"


@pytest.mark.parametrize("fast, configured, expected", [
    ("0", 3600, 3600),      # full mode: the book's own timeout
    ("1", 3600, 900),       # fast mode: capped, so that a hung kernel costs minutes, not an hour
    ("1", 60, 60),          # a book timeout below the cap stays
])
def test_staged_cell_timeout_is_capped_in_fast_mode(repo, monkeypatch, fast, configured, expected):
    monkeypatch.setenv("PRGE_FAST", fast)
    config = repo / "book" / "_config.yml"
    config.write_text(config.read_text().replace("timeout: 60", f"timeout: {configured}"))
    stage = _stage(repo)
    for path in stage.glob("*.ipynb"):
        assert nbformat.read(path, as_version=4).metadata["execution"]["timeout"] == expected, path.name
    assert stager["FAST_CELL_TIMEOUT"] == 900
