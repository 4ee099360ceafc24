"""A notebook test is run once more only when its kernel hung or died (pyproject.toml's only_rerun).

A hung kernel (idle, never given the next cell) makes nbmake wait for the cell's timeout; that is not a
fault of the chapter, and one fresh kernel settles it. A cell that fails, on the other hand, must fail at
once: rerunning it would hide a flaky chapter. Three small notebooks are run by pytest with this project's
own configuration: one that hangs every time, one that hangs only the first time, one that fails.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]

CELLS = {
    "hangs": "import time\ntime.sleep(60)",
    "hangs_once": ("import pathlib, time\nmark = pathlib.Path('hangs_once.ran')\nfirst = not mark.exists()\n"
                   "mark.touch()\ntime.sleep(60 if first else 0)"),
    "fails": "assert 1 + 1 == 3, 'a real failure'",
}


def _notebook(path: Path, source: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["execution"] = {"timeout": 4}
    nbformat.write(nb, path)


def test_only_a_hung_or_dead_kernel_is_rerun(tmp_path):
    pytest.importorskip("pytest_rerunfailures")
    pytest.importorskip("nbmake")
    for name, source in CELLS.items():
        _notebook(tmp_path / f"{name}.ipynb", source)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "--nbmake", "-p", "no:cacheprovider",
         "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    out = done.stdout + done.stderr
    outcome = {name: re.findall(rf"^{name}\.ipynb::{name}\.ipynb (PASSED|FAILED|RERUN)", out, re.M) for name in CELLS}
    assert outcome == {
        "hangs": ["RERUN", "FAILED"],          # timed out twice: one rerun, then the failure stands
        "hangs_once": ["RERUN", "PASSED"],     # a fresh kernel settles it
        "fails": ["FAILED"],                   # a failing cell is not rerun
    }, out[-4000:]
