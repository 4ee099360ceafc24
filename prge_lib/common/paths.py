"""Where the book's own files are: the shipped data, the committed results, the C++ trainer's source.

Declared once here; every module and chapter asks this module instead of counting ``parent`` steps from its own
``__file__``. In a clone (or an editable install) the repository is the folder above ``prge_lib``. A wheel
installed on its own carries the task pools and text samples inside the package (``prge_lib/shipped``) and
writes results under ``data/results`` of the folder it runs in. ``PRGE_REPO`` names a repository explicitly.
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]           # prge_lib/


def _repository() -> Path | None:
    """The repository this code belongs to, or None for a package installed without one."""
    value = os.environ.get("PRGE_REPO", "").strip()
    if value:
        path = Path(value).expanduser().resolve()
        if not (path / "data").is_dir():
            raise FileNotFoundError(f"PRGE_REPO={value!r} has no data/ folder (resolved to {path}); set it to "
                                    f"the book's repository or unset it")
        return path
    return PACKAGE.parent if (PACKAGE.parent / "data" / "tasks").is_dir() else None


REPO = _repository()                   # the repository root (a clone), or None (an installed wheel)
_SHIPPED = (REPO / "data") if REPO else (PACKAGE / "shipped")
RESULTS_PATH = "data/results"          # where result files live, relative to the repository
RESULTS = (REPO or Path.cwd()) / RESULTS_PATH
POOL_DIR = _SHIPPED / "tasks"          # the task pools shipped with the book (prge_lib.data.pools)
TEXT_DIR = _SHIPPED / "text"           # C4 and WikiText-2 samples
NATIVE_SOURCE = PACKAGE / "deploy" / "native"   # the C++ trainer of chapter 10
