"""Where each cell of chapter 7 stands (done, running, partial at step k, missing, made with other settings,
unreadable) and the table ``prge reproduce --list`` prints, with the time left.
"""
from __future__ import annotations

from pathlib import Path

from prge_lib.common.paths import RESULTS
from prge_lib.experiments.cells import Cell
from prge_lib.experiments.estimates import estimate_seconds
from prge_lib.experiments.locks import cell_holder
from prge_lib.experiments.results import ResultFileError, result_differs
from prge_lib.training.checkpoints import CheckpointError, read_checkpoint


def cell_status(cell: Cell, results: Path = RESULTS, checkpoints: Path | None = None) -> dict:
    """{"state": "done" | "running" | "partial" | "missing" | "other settings (…)" | "unreadable: …", "step": steps
    done, "steps": steps of the cell}. "other settings": a result file made with other settings
    (:func:`cell_matches`); "running": another process holds the cell's lock (:func:`cell_lock`); "unreadable": a
    result file or checkpoint that cannot be read, with the reason."""
    steps = cell.steps()
    try:
        differ = result_differs(cell, results)
    except ResultFileError as err:
        return {"state": f"unreadable: {err.reason}", "step": 0, "steps": steps}
    if differ is not None:
        state = "other settings (" + ", ".join(differ) + ")" if differ else "done"
        return {"state": state, "step": steps, "steps": steps}
    running = cell_holder(cell, checkpoints) is not None
    ckpt = cell.checkpoint_dir(checkpoints) / "checkpoint.pt"
    step = 0
    if ckpt.is_file():
        try:
            step = read_checkpoint(ckpt, mmap=True)["step"]      # mapped: no tensor is read
        except CheckpointError as err:
            if not running:
                return {"state": f"unreadable: {err.reason}", "step": 0, "steps": steps}
    state = "running" if running else "partial" if ckpt.is_file() else "missing"
    return {"state": state, "step": step, "steps": steps}


def list_cells(cells: list[Cell], results: Path = RESULTS, checkpoints: Path | None = None) -> str:
    """A plain-text table: each cell's state (done / running / partial at step k / missing / unreadable, see
    :func:`cell_status`) and its time left."""
    lines, left, done = [], 0.0, 0
    for cell in cells:
        st = cell_status(cell, results, checkpoints)
        done += st["state"] == "done"
        seconds = estimate_seconds(cell, max(0, st["steps"] - st["step"])) \
            if st["state"] in ("partial", "missing", "running") else 0.0
        left += seconds
        state = f"{st['state']} {st['step']}/{st['steps']}" if st["state"] in ("partial", "running") and st["steps"] \
            else st["state"]
        lines.append(f"{cell.name:<44} {state:<16} {'' if not seconds else _hours(seconds)}")
    basis = ("benchmark cells alone on an idle machine" if all(c.kind == "bench" for c in cells) else
             "training cells at 1 torch thread each; two side by side on a 2-core CPU take about half as long")
    lines.append(f"{done}/{len(cells)} done; about {_hours(left)} left ({basis})")
    return "\n".join(lines)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"
