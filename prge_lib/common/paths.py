"""Where the repository's own files are: the shipped data, the committed results, the C++ trainer's source.

Declared once here; every module and chapter asks this module instead of counting ``parent`` steps from its own
``__file__``. ``PRGE_REPO`` names the repository explicitly (a non-editable install run from another folder).
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]           # prge_lib/


def _repository() -> Path:
    value = os.environ.get("PRGE_REPO", "").strip()
    if value:
        path = Path(value).expanduser().resolve()
        if not (path / "data").is_dir():
            raise FileNotFoundError(f"PRGE_REPO={value!r} has no data/ folder (resolved to {path}); set it to "
                                    f"the book's repository or unset it")
        return path
    return PACKAGE.parent


REPO = _repository()                   # the repository root (a clone, or an editable install's source)
RESULTS_PATH = "data/results"          # where result files live, relative to the repository
RESULTS = REPO / RESULTS_PATH
POOL_DIR = REPO / "data" / "tasks"     # the task pools shipped with the book (prge_lib.data.pools)
TEXT_DIR = REPO / "data" / "text"      # C4 and WikiText-2 samples
NATIVE_SOURCE = PACKAGE / "deploy" / "native"   # the C++ trainer of chapter 10
