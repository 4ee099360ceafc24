"""Where each cell of chapter 7 stands (done, running, partial at step k, missing, made with other settings,
unreadable) and the table ``prge reproduce --list`` prints, with the time left (a cell the runner would train in a
pack priced as packed, and marked so).
"""
from __future__ import annotations

from pathlib import Path

from prge_lib.common.paths import RESULTS
from prge_lib.experiments.cells import Cell
from prge_lib.experiments.estimates import device_kind, estimate_seconds, pack_step_share, step_basis
from prge_lib.experiments.locks import cell_holder
from prge_lib.experiments.packs import plan_packs
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


def list_cells(cells: list[Cell], results: Path = RESULTS, checkpoints: Path | None = None, pack: int = 1) -> str:
    """A plain-text table: each cell's state (done / running / partial at step k / missing / unreadable, see
    :func:`cell_status`) and its time left. With ``pack`` > 1 the cells the runner would train in packs
    (:func:`~prge_lib.experiments.packs.plan_packs` of the partial and missing cells) are priced by their share
    of the pack's step (:func:`~prge_lib.experiments.estimates.pack_step_share`) and marked "packed ×R"."""
    states = [cell_status(cell, results, checkpoints) for cell in cells]
    todo = [cell for cell, st in zip(cells, states) if st["state"] in ("partial", "missing")]
    packed = {cell.name: len(unit) for unit in plan_packs(todo, pack) if len(unit) > 1 for cell in unit}
    devices = dict.fromkeys(device_kind(cell.config()) for cell in todo if cell.name in packed)
    shares = {device: pack_step_share(device, results) for device in devices}
    lines, left, done = [], 0.0, 0
    for cell, st in zip(cells, states):
        done += st["state"] == "done"
        share = shares[device_kind(cell.config())][0] if cell.name in packed else 1.0
        seconds = estimate_seconds(cell, max(0, st["steps"] - st["step"]), share) \
            if st["state"] in ("partial", "missing", "running") else 0.0
        left += seconds
        state = f"{st['state']} {st['step']}/{st['steps']}" if st["state"] in ("partial", "running") and st["steps"] \
            else st["state"]
        line = f"{cell.name:<44} {state:<16} {'' if not seconds else _hours(seconds)}"
        lines.append(f"{line:<70} packed ×{packed[cell.name]}" if cell.name in packed else line)
    basis = ("benchmark cells alone on an idle machine" if all(c.kind == "bench" for c in cells) else
             "training cells at 1 torch thread each; two side by side on a 2-core CPU take about half as long")
    lines.append(f"{done}/{len(cells)} done; about {_hours(left)} left ({basis})")
    training = [cell.config() for cell in todo if cell.kind == "train"]
    if training:
        lines.append(step_basis(training))
    for device, (_, how) in shares.items():
        count = sum(cell.name in packed and device_kind(cell.config()) == device for cell in todo)
        lines.append(f"{count} cells on {device} priced as packed (packs of up to {pack}; {how})")
    return "\n".join(lines)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"
