"""The chapter runner's bookkeeping (tools/run_chapters.py): times kept per mode without losing any, the
progress line, the table; one run on a one-cell notebook; the values of the `{eval}` roles written for
JupyterLab."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
runner = runpy.run_path(str(ROOT / "tools" / "run_chapters.py"))
PROV = {"command": "test"}


def test_record_keeps_the_other_mode_and_other_chapters(tmp_path):
    times = tmp_path / "book" / "chapter_times.json"
    runner["record"]("00_a", 12.34, "full", times, PROV)
    runner["record"]("01_b", 3.0, "fast", times, PROV)
    runner["record"]("00_a", 2.0, "fast", times, PROV)
    runner["record"]("00_a", 20.0, "full", times, PROV)          # a new time replaces that mode's entry only
    assert json.loads(times.read_text()) == {
        "full": {"00_a": {"seconds": 20.0, "provenance": PROV}},
        "fast": {"00_a": {"seconds": 2.0, "provenance": PROV}, "01_b": {"seconds": 3.0, "provenance": PROV}},
    }


def test_record_refuses_a_broken_file_and_leaves_it(tmp_path):
    times = tmp_path / "chapter_times.json"
    times.write_text("{not json")
    with pytest.raises(ValueError, match="chapter_times.json is not valid JSON"):
        runner["record"]("00_a", 1.0, "fast", times, PROV)
    assert times.read_text() == "{not json"
    with pytest.raises(ValueError, match="mode 'quick'"):
        runner["record"]("00_a", 1.0, "quick", tmp_path / "other.json", PROV)


def test_record_writes_provenance_by_default(tmp_path):
    times = runner["record"]("00_a", 1.5, "fast", tmp_path / "t.json")
    assert {"commit", "versions", "hardware", "wall_time_s"} <= set(times["fast"]["00_a"]["provenance"])


def test_progress_line_and_remaining_time():
    times = {"full": {"00_a": {"seconds": 3600}, "02_c": {"seconds": 125}}, "fast": {"01_b": {"seconds": 5}}}
    todo = ["00_a", "01_b", "02_c"]
    assert runner["progress"](1, todo, 0, times, "full") == (
        "chapter 1 of 3: 00_a, elapsed 0 s, recorded time of what remains (full mode): "
        "1 h 02 min (without 01_b: not recorded yet)")
    assert runner["progress"](3, todo, 3725, times, "full") == (
        "chapter 3 of 3: 02_c, elapsed 1 h 02 min, recorded time of what remains (full mode): 2 min 05 s")
    assert runner["remaining"](times, "fast", ["00_a", "02_c"]) == "not recorded yet"
    assert runner["remaining"]({}, "full", ["00_a"]) == "not recorded yet"


def test_table_and_paste(tmp_path):
    source = tmp_path / "book"
    source.mkdir()
    (source / "00_a.md").write_text("# 0. First\n")
    (source / "01_b.md").write_text("no heading\n")
    text = runner["table"]({"fast": {"00_a": {"seconds": 42}}, "full": {"00_a": {"seconds": 600.4}}}, source)
    assert text.splitlines()[2:] == ["| 0. First | 10 min 00 s | 42 s |",
                                     "| 01_b | not recorded yet | not recorded yet |",
                                     "| **all chapters** | 10 min 00 s (1 of 2 chapters) | 42 s (1 of 2 chapters) |"]
    prov = {"hardware": {"cpu": "X", "cpu_count": 2, "torch_threads": 1}, "commit": "abcdef123",
            "load_average": [1.5, 1.0, 1.0]}
    measured = runner["table"]({"full": {"00_a": {"seconds": 60, "provenance": prov},
                                         "01_b": {"seconds": 60, "provenance": {**prov, "load_average": [3.25, 1, 1]}}}},
                               source)
    assert measured.splitlines()[-1] == ("Measured full mode: X, 2 cores, 1 torch thread(s), commit abcdef1, "
                                         "load average up to 3.2 at a chapter's end.")
    page = tmp_path / "page.md"
    page.write_text(f"before\n{runner['BEGIN']}\nold table\n{runner['END']}\nafter\n")
    assert runner["paste"](text, page) and not runner["paste"](text, page)
    assert runner["pasted"](page) == text
    assert page.read_text().startswith("before\n") and page.read_text().endswith("\nafter\n")
    page.write_text("no markers\n")
    with pytest.raises(ValueError, match="page.md: expected one"):
        runner["paste"](text, page)


def test_run_executes_only_notebooks_without_outputs(tmp_path):
    """A one-cell notebook runs, gets its output and its time; a second run finds nothing to do."""
    pytest.importorskip("ipykernel")
    stage, times = tmp_path / "stage", tmp_path / "chapter_times.json"
    stage.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["execution"] = {"timeout": 120}
    nbformat.write(nb, stage / "00_one.ipynb")
    lines = []
    assert runner["run"](stage, times, "fast", lines.append) == ["00_one"]
    assert lines[0] == ("chapter 1 of 1: 00_one, elapsed 0 s, recorded time of what remains (fast mode): "
                        "not recorded yet")
    out = nbformat.read(stage / "00_one.ipynb", as_version=4).cells[0].outputs
    assert out[0]["text"] == "1\n"
    assert set(json.loads(times.read_text())) == {"fast"}
    assert "00_one.ipynb" in (stage / "_config.yml").read_text()   # the build will not execute it again
    assert runner["run"](stage, times, "fast", lines.append) == []


def test_run_chapters_writes_what_jupyterlab_myst_reads():
    """The `user_expressions` metadata of an executed notebook's Markdown cells: one reply per expression,
    in the shape of a kernel's reply; cells without roles carry none; an unresolved role stops the run."""
    show_numbers = runner["show_numbers"]
    glue = {"output_type": "display_data", "data": {"text/plain": "0.25"},
            "metadata": {"scrapbook": {"name": "share", "mime_prefix": ""}}}
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("", outputs=[glue]),
        nbformat.v4.new_markdown_cell('{eval}`f"{share:.0%}"` of {eval}`share`, again {eval}`share`'),
        nbformat.v4.new_markdown_cell("no roles", metadata={"user_expressions": [{"expression": "old"}]})])
    assert show_numbers(nb) == 2
    assert nb.cells[1].metadata["user_expressions"] == [
        {"expression": 'f"{share:.0%}"', "result": {"status": "ok", "data": {"text/plain": "'25%'"}, "metadata": {}}},
        {"expression": "share", "result": {"status": "ok", "data": {"text/plain": "0.25"}, "metadata": {}}}]
    assert "user_expressions" not in nb.cells[2].metadata
    nb.cells[2].source = "{eval}`missing`"
    with pytest.raises(ValueError, match="no value glued as 'missing'"):
        show_numbers(nb)


def _glued_notebook(run: bool):
    glue = nbformat.v4.new_output("display_data", data={"text/plain": "7"},
                                  metadata={"scrapbook": {"name": "n", "mime_prefix": ""}})
    code = nbformat.v4.new_code_cell("", outputs=[glue] if run else [], execution_count=1 if run else None)
    return nbformat.v4.new_notebook(cells=[code, nbformat.v4.new_markdown_cell("n is {eval}`n`")])


def test_executed_chapters_without_the_values_get_them_once(tmp_path):
    """A staged chapter executed by nbmake (outputs, no `user_expressions`) gets them; one not executed and
    one already current are left as they are."""
    nbformat.write(_glued_notebook(run=True), tmp_path / "00_run.ipynb")
    nbformat.write(_glued_notebook(run=False), tmp_path / "01_staged.ipynb")
    assert runner["show_numbers_in"](tmp_path) == ["00_run"]
    cell = nbformat.read(tmp_path / "00_run.ipynb", as_version=4).cells[1]
    assert cell.metadata["user_expressions"][0]["result"]["data"] == {"text/plain": "7"}
    assert "user_expressions" not in nbformat.read(tmp_path / "01_staged.ipynb", as_version=4).cells[1].metadata
    assert runner["show_numbers_in"](tmp_path) == []
