"""Running chapter 7's cells, locally or on a Ray cluster (``backend="ray"``).

The runner skips a cell whose result exists (and refuses to go on when a result there was made with other
settings), resumes an interrupted cell from its checkpoint (removed once the result is written), and so continues
where it stopped when killed and rerun, also from a fresh clone on the same machine. A cell whose loss turns
non-finite is recorded as diverged (the steps it made) and the grid goes on. A deadline, or a Ctrl-C or kill while
``prge reproduce`` runs (:mod:`prge_lib.training.stopping`), stops a training cell at a checkpoint and keeps further
cells from starting. A cell whose checkpoint cannot be resumed here is said and left
with its checkpoint untouched, and the grid goes on. With a pack size above 1 the training cells that can share a
forward train in packs (:func:`run_pack`), each still under its own lock, checkpoint and result. A cell whose very
run another grid has made (:func:`~prge_lib.experiments.results.twin_result`) is not run again: that result is
adopted (:func:`adopt_twin`).
"""
from __future__ import annotations

import os
import shutil
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Callable

from prge_lib.common.paths import RESULTS
from prge_lib.common.provenance import provenance, write_result
from prge_lib.data.splits import sample_task
from prge_lib.data.tasks import get_task
from prge_lib.experiments.bench.lm_curves import lm_curves
from prge_lib.experiments.bench.methods import bench
from prge_lib.experiments.cells import Cell, checkpoint_root
from prge_lib.experiments.estimates import device_kind, estimate_seconds
from prge_lib.experiments.locks import CellBusy, cell_lock
from prge_lib.experiments.packs import check_pack_size, plan_packs
from prge_lib.experiments.results import (conflicting_results, read_result, result_differs, twin_result,
                                          validate_result)
from prge_lib.models.loading import load_model
from prge_lib.training.evaluate import zero_shot
from prge_lib.models.options import EMBEDDED
from prge_lib.training.checkpoints import CHECKPOINT_NAME, CheckpointError
from prge_lib.training.config import TrainConfig
from prge_lib.training.packed import PackedTrainer, PackStopped
from prge_lib.training import stopping
from prge_lib.zo.packing import check_width_groups
from prge_lib.training.records import diverged_record, finished_record, zero_shot_record, zero_shot_run
from prge_lib.training.trainer import Trainer, TrainingDiverged, TrainingStopped

EMBEDDED_MODEL = EMBEDDED       # what a result names when no --model was given
BACKENDS = ("local", "ray")


# ---------------------------------------------------------------- running one cell
def run_cell(cell: Cell, results: Path = RESULTS, checkpoints: Path | None = None,
             progress: bool = True, threads: int | None = None, deadline: float | None = None,
             restart: bool = False) -> Path:
    """Run one cell (resuming its checkpoint if one exists, discarding it with ``restart``) and write its result;
    return the result path.

    The cell runs under its lock (:func:`cell_lock`): a cell another process runs raises :class:`CellBusy`. An
    existing result made with other settings is an error, not something to overwrite silently. A training
    cell still running at ``deadline`` raises :class:`~prge_lib.training.trainer.TrainingStopped` after saving its
    checkpoint, and writes no result. A cell whose loss turns non-finite writes the steps it made, with
    ``status`` "diverged". Once the result is written the cell's checkpoint folder is removed."""

    path = cell.result_path(results)
    if _result_done(cell, results):
        return path
    with cell_lock(cell, checkpoints, results):
        if _result_done(cell, results):         # written by another process while this one waited
            return path
        twin = twin_result(cell, results)
        if twin is not None:
            return adopt_twin(cell, twin, results)
        if threads:
            import torch
            torch.set_num_threads(threads)
        return _run_held(cell, results, checkpoints, progress, deadline, restart)


def _run_held(cell: Cell, results: Path, checkpoints: Path | None, progress: bool, deadline: float | None,
              restart: bool) -> Path:
    """Run ``cell``, whose lock this process holds, and write its result."""
    start = time.perf_counter()
    if cell.kind == "zeroshot":
        result = _run_zeroshot(cell)
    elif cell.kind == "bench":
        result = _run_bench(cell)
    elif cell.kind == "lm":
        result = _run_lm(cell, cell.checkpoint_dir(checkpoints), progress, deadline, restart)
    else:
        result = _run_train(cell, cell.checkpoint_dir(checkpoints), progress, deadline, restart)
    return _write_cell_result(cell, result, results, checkpoints, time.perf_counter() - start)


def _write_cell_result(cell: Cell, result: dict, results: Path, checkpoints: Path | None,
                       wall_time_s: float) -> Path:
    """Write ``result`` as ``cell``'s (its cell block, seed and provenance with the command that makes the cell
    alone added), then remove the cell's checkpoint folder."""
    result["cell"] = _cell_block(cell)
    result.setdefault("seed", cell.seed)
    result["provenance"] = provenance(wall_time_s, command=cell.command())
    validate_result(result)
    written = write_result(cell.result_path(results), result)
    # the result holds everything the checkpoint did that a table needs; a full-model checkpoint is ~1 GB
    shutil.rmtree(cell.checkpoint_dir(checkpoints), ignore_errors=True)
    return written


def _cell_block(cell: Cell) -> dict:
    return {"grid": cell.grid, "profile": cell.profile, "name": cell.name, "row": cell.row.key,
            "label": cell.row.label, "lr": cell.lr}


def adopt_twin(cell: Cell, twin: Path, results: Path = RESULTS) -> Path:
    """Write the result file ``twin`` (:func:`~prge_lib.experiments.results.twin_result`: the same run, made as
    another grid's cell) as ``cell``'s: the same record with this grid's cell block and ``same_run_as`` naming the
    file the run first went to (a copy's own ``same_run_as``, else ``twin``; none where that is this cell's own
    file, restored from a copy). Its provenance stays the run's own (the command, commit and machine that made it)."""
    result = read_result(twin)
    result["cell"] = _cell_block(cell)
    root = Path(results).resolve()
    result.setdefault("same_run_as", Path(twin).resolve().relative_to(root).as_posix())
    if result["same_run_as"] == cell.result_path(root).relative_to(root).as_posix():
        del result["same_run_as"]
    validate_result(result)
    return write_result(cell.result_path(results), result)


def _result_done(cell: Cell, results: Path) -> bool:
    """Whether ``cell``'s result exists; an error if the file there holds a run with other settings."""
    differ = result_differs(cell, results)
    if differ:
        raise ValueError(f"{cell.result_path(results)} holds a result made with other settings ({differ}); "
                         f"move it away to rerun cell {cell.name}")
    return differ is not None


def _run_train(cell: Cell, checkpoint_dir: Path, progress: bool, deadline: float | None = None,
               restart: bool = False) -> dict:

    config = TrainConfig(**cell.config())
    trainer = Trainer(config, checkpoint_dir=checkpoint_dir, progress=progress)
    resume = trainer.checkpoint_path().is_file() and not restart
    model = config.model or EMBEDDED_MODEL
    try:
        result = finished_record(trainer.run(resume=resume, deadline=deadline, restart=restart), model)
    except CheckpointError as err:      # a cell resumes by the same command, not by --resume
        raise CheckpointError(err.path, err.reason, resume="the same command") from None
    except TrainingDiverged as diverged:
        # the same seeds would diverge at the same step on every rerun: record the run as far as it went (its
        # evaluations, and one at the last good state), so the grid goes on and the table can say so
        result = diverged_record(trainer.summary(), diverged, model)
    return result


def run_pack(cells: list[Cell], results: Path = RESULTS, checkpoints: Path | None = None, progress: bool = True,
             deadline: float | None = None, restart: bool = False,
             say: Callable[[str], None] = print, width_groups: int = 1) -> list[Path]:
    """Train the training cells ``cells`` (one :func:`~prge_lib.experiments.packs.pack_key`) in one pack
    (:class:`~prge_lib.training.packed.PackedTrainer`) and write each cell's result as :func:`run_cell` would,
    plus ``packed`` (the pack it ran in; its wall time is the pack's); return the result paths written.

    Each cell holds its lock while the pack runs: a cell another process holds is left out (and said), as is one
    whose result exists; a cell left alone runs as :func:`run_cell` runs it. Each cell resumes its own checkpoint
    where it has one (``restart``: discards it), so a pack may join resumed and new cells. A run whose loss turns
    non-finite is written as diverged and the others go on. At ``deadline`` the pack stops with every unfinished
    cell's checkpoint saved and the results of the cells already through written, and raises
    :class:`~prge_lib.training.packed.PackStopped`. ``width_groups``: each step's cells in that many forwards by
    batch width (:class:`~prge_lib.zo.packing.Pack`)."""
    with ExitStack() as locks:
        members = []
        for cell in cells:
            if cell.kind != "train":
                raise ValueError(f"cell {cell.name} is a {cell.kind} cell; a pack trains training cells only")
            if _result_done(cell, results):
                continue
            try:
                locks.enter_context(cell_lock(cell, checkpoints, results))
            except CellBusy as busy:
                say(f"{busy} (out of the pack)")
                continue
            if not _result_done(cell, results):     # not written by another process meanwhile
                members.append(cell)
        if len(members) < 2:
            return [_run_held(cell, results, checkpoints, progress, deadline, restart) for cell in members]
        start = time.perf_counter()
        trainer = PackedTrainer([TrainConfig(**cell.config()) for cell in members],
                                checkpoint_dirs=[cell.checkpoint_dir(checkpoints) for cell in members],
                                names=[cell.name for cell in members], progress=progress,
                                width_groups=width_groups)
        resume = [t.checkpoint_path().is_file() and not restart for t in trainer.trainers]
        try:
            outcomes = trainer.run(resume=resume, deadline=deadline, restart=restart)
        except CheckpointError as err:      # a cell resumes by the same command, not by --resume
            raise CheckpointError(err.path, err.reason, resume="the same command") from None
        except PackStopped as stop:
            # the cells that reached their steps (or diverged) before the deadline are done: keep their results
            for r, cell in enumerate(members):
                if cell.name not in stop.runs:
                    _write_cell_result(cell, trainer.result(r), results, checkpoints, time.perf_counter() - start)
            raise
        wall = time.perf_counter() - start
        return [_write_cell_result(cell, outcome, results, checkpoints, wall)
                for cell, outcome in zip(members, outcomes)]


def _run_zeroshot(cell: Cell) -> dict:

    c = cell.config()
    task = get_task(c["task"])
    sizes = {k: c[k] for k in ("n_train", "n_val", "n_test") if k in c}
    data = sample_task(task, c["seed"], **sizes)
    model, tokenizer = load_model(c.get("model"), device=c.get("device", "cpu"))
    val = zero_shot(task, model, tokenizer, data.val)["value"]
    record = zero_shot_record(task, data.test, zero_shot(task, model, tokenizer, data.test),
                              model=c.get("model") or EMBEDDED_MODEL, seed=c["seed"], data_notes=data.notes)
    return zero_shot_run(record, val, c, data.sizes())


def _run_bench(cell: Cell) -> dict:

    c = cell.config()
    spec = {"name": c["model"], "dtype": c.get("dtype", "fp32"), "quant": c["quant"], "device": c.get("device", "cpu")}
    result = bench(spec, c["methods"], E=c["E"], qs=tuple(c["qs"]), seq_len=c["seq_len"],
                   repeats=c["repeats"])
    result.update(kind="bench", config=c, seed=cell.seed)
    return result


def _run_lm(cell: Cell, checkpoint_dir: Path, progress: bool, deadline: float | None = None,
            restart: bool = False) -> dict:
    """The WikiText-2 curves' cell: resumed from its checkpoint when there is one (discarded with ``restart``),
    stopped at ``deadline`` with a checkpoint (:class:`TrainingStopped`), as a training cell is."""
    c = cell.config()
    checkpoint = checkpoint_dir / CHECKPOINT_NAME
    if restart:
        checkpoint.unlink(missing_ok=True)
    try:
        result = lm_curves(c["seq_len"], c["lm_steps"], c["eval_every"], c["n_held"], c.get("model"),
                           c.get("device", "cpu"), cell.seed, say=print if progress else lambda _: None,
                           checkpoint=checkpoint, deadline=deadline, resume=checkpoint.is_file())
    except CheckpointError as err:      # a cell resumes by the same command, not by --resume
        raise CheckpointError(err.path, err.reason, resume="the same command") from None
    result.update(kind="lm", task=cell.task, config=c, seed=cell.seed, model=c.get("model") or EMBEDDED_MODEL)
    return result


# ---------------------------------------------------------------- running a grid
def run_grid(cells: list[Cell], backend: str = "local", address: str | None = None,
             results: Path = RESULTS, checkpoints: Path | None = None, progress: bool = True,
             cpus_per_cell: int = 1, say: Callable[[str], None] = print,
             deadline: float | None = None, restart: bool = False, pack: int = 1,
             width_groups: int = 1, needed: Callable[[Cell], str | None] | None = None) -> list[Path]:
    """Run the cells that have no result yet, in order (``local``) or as Ray tasks (``ray``); return the
    result paths written. ``deadline`` (a ``time.time()`` value, e.g. a GPU session's end): no cell starts
    after it, and a training cell running past it stops at a checkpoint, to resume on the next run. A cell
    another process runs is left to it (:class:`CellBusy`); ``restart`` discards the checkpoints of the cells
    this call runs. ``pack`` > 1 (local only): the training cells that can share a forward train in packs of
    up to ``pack`` (:func:`~prge_lib.experiments.packs.plan_packs`, :func:`run_pack`), each step of a pack in
    ``width_groups`` forwards by batch width. ``needed`` (local only), asked before each cell or pack starts,
    says why a cell is no longer needed (a two-stage sweep's row bracketed meanwhile,
    :func:`~prge_lib.experiments.stages.sweep_skip`), or None: such a cell is left out, the reason said."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {list(BACKENDS)}")
    check_pack_size(pack)
    check_width_groups(width_groups, "--width-groups")
    if backend == "ray" and pack > 1:
        raise ValueError(f"--pack {pack}: packs train in this process; with --backend ray each task runs one "
                         f"cell, so give --pack 1")
    conflicts = conflicting_results(cells, results)
    if conflicts:
        named = "; ".join(f"{name} ({', '.join(keys)})" for name, keys in list(conflicts.items())[:5])
        raise ValueError(f"{len(conflicts)} cells have a result under {Path(results)} made with other settings: "
                         f"{named}{' …' if len(conflicts) > 5 else ''}. Give these runs their own --results-dir, "
                         "or move those files away to rerun the cells")
    todo = [c for c in cells if not c.result_path(results).is_file()]
    checkpoints = checkpoint_root(checkpoints)
    paths = []
    for cell in todo:
        twin = twin_result(cell, results)
        if twin is None:
            continue
        try:
            paths.append(run_cell(cell, results, checkpoints, progress=False))     # adopts the twin's result
            say(f"cell {cell.name}: the same run as {twin.relative_to(results).as_posix()}: its result adopted")
        except CellBusy as busy:
            say(str(busy))
    todo = [c for c in todo if not c.result_path(results).is_file()]
    say(f"{len(cells) - len(todo)} of {len(cells)} cells done; running {len(todo)}")
    if backend == "ray":
        return paths + _run_on_ray(todo, address, results, checkpoints, cpus_per_cell, say, deadline, restart)
    from tqdm.auto import tqdm
    units = plan_packs(todo, pack)
    for i, unit in enumerate(tqdm(units, desc="cells", disable=not progress or len(units) < 2)):
        if needed is not None:             # asked once per cell, as it comes up: earlier cells' results count
            reasons = [(c, needed(c)) for c in unit]
            for c, why in reasons:
                if why is not None:
                    say(f"cell {c.name}: {why}")
            unit = [c for c, why in reasons if why is None]
            if not unit:
                continue
        cell = unit[0]
        if not _fits_before(cell, deadline):
            signal_name = stopping.asked()
            say(f"{'stop asked by ' + signal_name if signal_name else 'time limit reached'}: "
                f"{sum(map(len, units[i:]))} cells not run; the same command continues")
            break
        if len(unit) > 1:
            say(f"pack of {len(unit)}: {', '.join(c.name for c in unit)}")
            try:
                paths += run_pack(unit, results, checkpoints, progress, deadline, restart, say, width_groups)
            except (PackStopped, TrainingStopped) as stop:
                say(f"pack of {len(unit)}: {stop}; the same command resumes it")
                break
            except CheckpointError as unread:
                say(f"pack of {len(unit)}: {unread}; {_KEPT}")
            continue
        say(f"cell {cell.name}")
        try:
            paths.append(run_cell(cell, results, checkpoints, progress, deadline=deadline, restart=restart))
        except CellBusy as busy:
            say(str(busy))
        except CheckpointError as unread:
            say(f"cell {cell.name}: {unread}; {_KEPT}")
        except TrainingStopped as stop:
            say(f"cell {cell.name}: {stop}; the same command resumes it")
            break
    return paths


# a checkpoint this machine cannot resume (one from another processor that replays otherwise, a damaged file) is
# hours of someone's steps: it stays as it is, and the cells after it run
_KEPT = "its checkpoint is left as it is and the grid goes on with the next cells"


def _fits_before(cell: Cell, deadline: float | None) -> bool:
    """Whether ``cell`` may start: a training or WikiText-2 curves cell until the deadline (it stops at a checkpoint
    when the deadline comes), a zero-shot or benchmark cell, which cannot stop halfway, only if its estimate ends
    before it. A benchmark cell on a GPU also starts until the deadline: its only price is this CPU's timing
    (estimates.BENCH_STEP_SECONDS), minutes where the GPU takes seconds, so no GPU sitting would ever start one.
    None starts once a signal has asked the runs to stop (:mod:`prge_lib.training.stopping`)."""
    if stopping.asked():
        return False
    if deadline is None:
        return True
    unpriced = cell.kind == "bench" and device_kind(cell.config()) != "cpu"
    needs = 0.0 if cell.kind in ("train", "lm") or unpriced else estimate_seconds(cell, cell.steps())
    return time.time() + needs < deadline


def connect_ray(ray, address: str | None) -> None:
    """``ray.init``: the cluster at ``address``, secured by its operators (chapter 7); with no address, a Ray
    started on this machine with no dashboard (its web and job APIs run code for whoever reaches them) and
    with token authentication (RAY_AUTH_MODE=token unless set otherwise; Ray 2.52 and later), so that its APIs
    and the connections between its processes need the token Ray keeps in ~/.ray/auth_token. Where it listens
    stays Ray's choice: Ray rewrites a loopback ``_node_ip_address`` to this machine's reachable address
    (``ray._private.services.resolve_ip_for_localhost``, Ray 2.60), so that setting cannot confine it."""
    found = tuple(int(part) for part in ray.__version__.split(".")[:2])
    if found < (2, 52):
        raise RuntimeError(f"--backend ray needs Ray 2.52 or later (token authentication); found {ray.__version__}: "
                           f"pip install -e '.[cluster]'")
    if address is not None:
        ray.init(address=address, log_to_driver=False)
        return
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    ray.init(include_dashboard=False, log_to_driver=False)


def _run_on_ray(cells, address, results, checkpoints, cpus_per_cell, say, deadline=None,
                restart=False) -> list[Path]:
    try:
        import ray
    except ImportError:
        raise RuntimeError("--backend ray needs Ray: pip install -e '.[cluster]' (or pip install ray)") from None
    if not ray.is_initialized():
        connect_ray(ray, address)
    task = ray.remote(num_cpus=cpus_per_cell)(_ray_cell)
    env = {"PRGE_DATA_DIR": os.environ.get("PRGE_DATA_DIR", ""), "PRGE_FAST": os.environ.get("PRGE_FAST", "")}
    pending = {task.remote(cell, str(results), str(checkpoints), cpus_per_cell, env, deadline, restart): cell
               for cell in cells}
    paths = []
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        cell = pending.pop(done[0])
        path, stopped = ray.get(done[0])
        if path is None:
            say(f"cell {cell.name}: {stopped}; the same command resumes it")
            continue
        paths.append(Path(path))
        say(f"cell {cell.name} done ({len(cells) - len(pending)}/{len(cells)})")
    return paths


def _ray_cell(cell: Cell, results: str, checkpoints: str, threads: int, env: dict,
              deadline: float | None = None, restart: bool = False) -> tuple[str | None, str | None]:
    """(result path, None), or (None, why) for a cell the deadline stopped or kept from starting, or that another
    process runs."""
    os.environ.update({k: v for k, v in env.items() if v})
    if not _fits_before(cell, deadline):
        return None, "not started: time limit reached"
    try:
        return str(run_cell(cell, Path(results), Path(checkpoints), progress=False, threads=threads,
                            deadline=deadline, restart=restart)), None
    except (TrainingStopped, CellBusy) as stop:
        return None, str(stop)
