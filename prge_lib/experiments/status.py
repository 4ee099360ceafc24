"""Where each cell of chapter 7 stands (done, running, partial at step k, missing, made with other settings,
unreadable) and the table ``prge reproduce --list`` prints, with the time left (a cell the runner would train in a
pack priced as packed, and marked so).
"""
from __future__ import annotations

import json
from pathlib import Path

from prge_lib.common.paths import REPO, RESULTS
from prge_lib.experiments.cells import Cell, checkpoint_root
from prge_lib.experiments.estimates import (device_kind, device_shares, device_step_share, estimate_seconds,
                                            lm_seconds, pack_step_share, step_basis)
from prge_lib.experiments.locks import cell_holder
from prge_lib.experiments.packs import plan_packs
from prge_lib.experiments.results import ResultFileError, cell_matches, read_result, twin_result
from prge_lib.training.checkpoints import CheckpointError, read_checkpoint


def cell_status(cell: Cell, results: Path = RESULTS, checkpoints: Path | None = None) -> dict:
    """{"state": "done" | "running" | "partial" | "missing" | "same run in <folder>" | "other settings (…)" |
    "unreadable: …", "step": steps done, "steps": steps of the cell}. "other settings": a result file made with other
    settings (:func:`cell_matches`); "running": another process holds the cell's lock (:func:`cell_lock`); "same run
    in …": no result or checkpoint of its own, but another grid's folder holds this very run (:func:`twin_result`),
    which running the grid adopts at once; "unreadable": a result file or checkpoint that cannot be read, with the
    reason. A done cell whose run was recorded as diverged also has ``"diverged": True``; a cell running in a process
    given another checkpoint root (it holds the lock beside the result file) has its step read there, and ``"root"``
    names that root."""
    steps = cell.steps()
    path = cell.result_path(results)
    if path.is_file():              # read once: whether it is this cell's result, and whether that run diverged
        try:
            result = read_result(path)
        except ResultFileError as err:
            return {"state": f"unreadable: {err.reason}", "step": 0, "steps": steps}
        differ = cell_matches(cell, result)
        if differ:
            return {"state": "other settings (" + ", ".join(differ) + ")", "step": steps, "steps": steps}
        diverged = result.get("status") == "diverged"
        return {"state": "done", "step": steps, "steps": steps, **({"diverged": True} if diverged else {})}
    running = cell_holder(cell, checkpoints, results) is not None
    ckpt = cell.checkpoint_dir(checkpoints) / "checkpoint.pt"
    root = None
    if running and not ckpt.is_file():      # run by a process given another checkpoint root: its steps are there
        root = next((r for r in other_checkpoint_roots(checkpoints)
                     if (cell.checkpoint_dir(r) / "checkpoint.pt").is_file()), None)
        ckpt = cell.checkpoint_dir(root) / "checkpoint.pt" if root is not None else ckpt
    step = 0
    if ckpt.is_file():
        try:
            step = read_checkpoint(ckpt, mmap=True)["step"]      # mapped: no tensor is read
        except CheckpointError as err:
            if not running:
                return {"state": f"unreadable: {err.reason}", "step": 0, "steps": steps}
    state = "running" if running else "partial" if ckpt.is_file() else "missing"
    if state == "missing" and (twin := twin_result(cell, results)) is not None:
        state, step = f"same run in {twin.relative_to(results).parts[0]}", steps
    return {"state": state, "step": step, "steps": steps, **({"root": root} if root is not None else {})}


def price_cells(cells: list[Cell], results: Path = RESULTS, checkpoints: Path | None = None, pack: int = 1) -> dict:
    """What ``--list`` shows, as data: {"states": each cell's :func:`cell_status`, "seconds": each cell's time left,
    "packed": {cell name: (pack size, pack number)}, "pack_shares": {device: its
    :class:`~prge_lib.experiments.estimates.PackShare`} of the packed cells,
    "elsewhere": {device: :func:`~prge_lib.experiments.estimates.device_shares`} for the devices other than the
    CPU}. With ``pack`` > 1 the cells the runner would train in packs (:func:`~prge_lib.experiments.packs.
    plan_packs` of the partial and missing cells) are priced by their share of the pack's step
    (:func:`~prge_lib.experiments.estimates.pack_step_share`); a cell on another device by its device's results."""
    states = [cell_status(cell, results, checkpoints) for cell in cells]
    todo = [cell for cell, st in zip(cells, states) if st["state"] in ("partial", "missing")]
    units = [unit for unit in plan_packs(todo, pack) if len(unit) > 1]
    packed = {cell.name: (len(unit), k) for k, unit in enumerate(units, 1) for cell in unit}
    devices = dict.fromkeys(device_kind(cell.config()) for cell in todo if cell.name in packed)
    elsewhere = {device: device_shares(device, results)
                 for device in dict.fromkeys(device_kind(cell.config()) for cell in cells) if device != "cpu"}
    pack_shares = {device: pack_step_share(device, results, runs=pack, solo=elsewhere.get(device))
                   for device in devices}
    measured = measured_bench_seconds([cell for cell, st in zip(cells, states) if st["state"] == "missing"])
    seconds = []
    for cell, st in zip(cells, states):
        share, eval_share = _shares(cell, packed, pack_shares, elsewhere)
        seconds.append(measured.get(_settings(cell)) or
                       estimate_seconds(cell, max(0, st["steps"] - st["step"]), share, eval_share)
                       if st["state"] in ("partial", "missing", "running") else 0.0)
    return {"states": states, "seconds": seconds, "packed": packed, "pack_shares": pack_shares,
            "elsewhere": elsewhere, "bench_measured": measured}


def _settings(cell: Cell) -> tuple[str, str]:
    """A cell's name and settings, which together say which run it is (a name alone leaves out dtype and device)."""
    return cell.name, json.dumps(cell.config(), sort_keys=True)


def measured_bench_seconds(cells: list[Cell]) -> dict[tuple[str, str], float]:
    """{(cell name, settings): wall seconds} for the benchmark cells on a GPU among ``cells`` that a GPU sitting ran
    with the same settings (:func:`~prge_lib.experiments.gpu_results.sitting_results`, the latest sitting's
    file). Such a cell's only other price is this CPU's timing (estimates.BENCH_STEP_SECONDS): minutes where the
    GPU took about a minute (the runtime grid's cells on an NVIDIA H200, third sitting)."""
    from prge_lib.experiments import gpu_results

    wanted = [cell for cell in cells if cell.kind == "bench" and device_kind(cell.config()) != "cpu"]
    measured = {}
    for grid in dict.fromkeys(cell.grid for cell in wanted):
        ran = {(r["cell"]["name"], json.dumps(r["config"], sort_keys=True)): r["provenance"]["wall_time_s"]
               for r in gpu_results.sitting_results(grid)}
        for key in (_settings(c) for c in wanted if c.grid == grid):
            if ran.get(key):
                measured[key] = float(ran[key])
    return measured


def list_cells(cells: list[Cell], results: Path = RESULTS, checkpoints: Path | None = None, pack: int = 1,
               totals_only: bool = False, step_note: bool = True) -> str:
    """A plain-text table: each cell's state (done / running / partial at step k / missing / unreadable, see
    :func:`cell_status`) and its time left (:func:`price_cells`; a cell priced as packed is marked "packed ×R (pack
    k)"), then the totals and what the prices rest on (``totals_only``: those lines alone; ``step_note=False``
    leaves out the seconds-per-step line, for a listing that follows one which gave it)."""
    priced = price_cells(cells, results, checkpoints, pack)
    packed, elsewhere = priced["packed"], priced["elsewhere"]
    lines = []
    for cell, st, seconds in zip(cells, priced["states"], priced["seconds"]):
        state = f"{st['state']} {st['step']}/{st['steps']}" if st["state"] in ("partial", "running") and st["steps"] \
            else "done, diverged" if st.get("diverged") else st["state"]
        line = f"{cell.name:<44} {state:<16} {'' if not seconds else _hours(seconds)}"
        if st.get("root") is not None:
            line = f"{line:<70} checkpoint under {_shown(st['root'])}"
        if cell.name in packed:
            line = f"{line:<70} packed ×{packed[cell.name][0]} (pack {packed[cell.name][1]})"
        lines.append(line)
    basis = ("benchmark cells alone on an idle machine" if all(c.kind == "bench" for c in cells) else
             "training cells at 1 torch thread each; two side by side on a 2-core CPU take about half as long")
    if elsewhere and all(device_kind(c.config()) != "cpu" for c in cells):
        basis = f"cells on {', '.join(elsewhere)} one after another"
    if totals_only:
        lines = []
    done = sum(st["state"] == "done" for st in priced["states"])
    twins = sum(st["state"].startswith("same run in ") for st in priced["states"])
    lines.append(f"{done}/{len(cells)} done" + (f" and {twins} made by another grid (adopted when this one runs)"
                                                 if twins else "") + f"; about {_hours(sum(priced['seconds']))} left "
                 f"({basis})")
    by_row: dict[str, float] = {}          # where the time goes, largest first, where several rows are left
    for cell, seconds in zip(cells, priced["seconds"]):
        if seconds:
            by_row[cell.row.key] = by_row.get(cell.row.key, 0.0) + seconds
    if len(by_row) > 1:
        lines.append("left by row: " + ", ".join(f"{key} {_hours(seconds)}" for key, seconds in
                                                 sorted(by_row.items(), key=lambda item: -item[1])))
    training = [cell.config() for cell, st in zip(cells, priced["states"])
                if cell.kind == "train" and st["state"] in ("partial", "missing", "running")]
    if training and step_note:
        lines.append(step_basis(training))
    for device, priced_pack in priced["pack_shares"].items():
        count = sum(cell.name in packed and device_kind(cell.config()) == device for cell in cells)
        lines.append(f"{count} cells on {device} priced as packed (packs of up to {pack}; {priced_pack.how})")
    for device, measured in elsewhere.items():
        lines.append(f"cells on {device} priced from {measured['how']}")
    if priced["bench_measured"]:
        lines.append(f"{len(priced['bench_measured'])} benchmark cells priced from the wall time a GPU sitting "
                     f"measured for the same cell (data/results/gpu-sittings)")
    lm = next((cell for cell in cells if cell.kind == "lm"), None)
    if lm is not None:
        lines.append(f"WikiText-2 curves priced from {lm_seconds(lm.config()['seq_len'], results)[2]}")
    missing = [cell for cell, st in zip(cells, priced["states"]) if st["state"] == "missing"]
    lines += [f"{count} cell{' listed missing has' if count == 1 else 's listed missing have'} a checkpoint or a "
              f"running process under {_shown(root)}: --checkpoint-root {_shown(root)} lists "
              f"{'its step' if count == 1 else 'their steps'} (and resumes {'it' if count == 1 else 'them'})"
              for root, count in elsewhere_checkpoints(missing, checkpoints).items()]
    return "\n".join(lines)


def _shown(path: Path) -> str:
    """``path`` as a user would type it here: relative to the working folder where it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def other_checkpoint_roots(checkpoints: Path | None) -> list[Path]:
    """The checkpoint roots a reproduction may have used other than ``checkpoints`` (its default when None): the
    cache folder's (:func:`~prge_lib.experiments.cells.checkpoint_root`) and the clone's ``data/checkpoints``
    (README: where git carries them to another machine)."""
    here = checkpoint_root(checkpoints).resolve()
    roots = [checkpoint_root(None), *([REPO / "data" / "checkpoints"] if REPO else [])]
    return [root for root in roots if root.resolve() != here and root.is_dir()]


def elsewhere_checkpoints(cells: list[Cell], checkpoints: Path | None) -> dict[Path, int]:
    """{root: how many of ``cells``} with a checkpoint, or a process running them, under another of
    :func:`other_checkpoint_roots`: a cell ``--list`` calls missing that is in fact under way (or stopped) there,
    which running it with this root would start over beside."""
    found = {}
    for root in other_checkpoint_roots(checkpoints):
        count = 0
        for cell in cells:
            count += (cell.checkpoint_dir(root) / "checkpoint.pt").is_file() or cell_holder(cell, root) is not None
        if count:
            found[root] = count
    return found


def _shares(cell: Cell, packed: dict, pack_shares: dict, elsewhere: dict) -> tuple[float, float]:
    """(step share, evaluation share) of ``cell`` against its solo CPU price: a packed cell's measured pack share
    where its device has one, else its device's step share (1 on the CPU)."""
    device = device_kind(cell.config())
    measured = elsewhere.get(device)
    step = 1.0 if measured is None or cell.kind not in ("train", "lm") else \
        device_step_share(measured, cell.config().get("method", ""))
    evaluation = 1.0 if measured is None or measured["eval"] is None else measured["eval"]
    if cell.name in packed:
        priced_pack = pack_shares[device]
        return (step if priced_pack.basis == "assumed" else priced_pack.share), evaluation
    return step, evaluation


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"
