"""Reading one result file (``data/results``, written by :func:`prge_lib.common.provenance.write_result`) as the
chapters quote it: a figure whose run has not been made yet is absent, not an error.
"""
from __future__ import annotations

import json
from pathlib import Path


def read_result(path: str | Path) -> dict | None:
    """The result at ``path`` (a JSON object), or None while the file has not been produced. A file that holds
    something else is a ValueError naming the file."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not a JSON result file ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a result file holds a JSON object, this one a {type(data).__name__}")
    return data
