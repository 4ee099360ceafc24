"""Two-stage rows (every row of chapter 8's ``senszoq`` grid; Table 1's MeZO (Full) on the paper profile): a
*sweep* stage runs each row's seeds over its learning-rate grid; a *confirm* stage runs the row's
``confirm_seeds`` at the rate each (task, row) reached its best validation score in the sweep (Gao et al. §4.1's
selection, made once on the sweep so that the confirming seeds cannot move it). In a grid that mixes them, the
one-stage rows run every rate at every seed in the sweep stage, as a one-stage grid's do, and nothing of this
module (brackets, added rates, the confirm stage) touches them. A row's sweep stops early once its results bracket
its best rate (both neighbours in the grid ran and scored lower, :func:`~prge_lib.experiments.grids.bracket`): the
rates further out are left out, and its confirm seeds start. Both stages write into the grid's one folder: the
confirm cell of the sweep's seed at the chosen rate is the sweep's own cell, already done.

A row whose whole sweep stayed at zero-shot has no validation peak to bracket, so its training loss places the
rates it still needs (:func:`stability_rates`): where a profile runs every other rate of the paper's grid, the
paper's rates between the largest rate whose loss fell and the smallest whose loss rose join its sweep, the
largest stable step, where the row would train if any rate of the grid did.
"""
from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from types import SimpleNamespace
from typing import Iterable, NamedTuple

from prge_lib.common.paths import RESULTS
from prge_lib.experiments.cells import Cell, grid_cells, row_cells, select
from prge_lib.experiments.grids import GRIDS, STAGES, best_rate, lr_text, staged_rows
from prge_lib.experiments.results import read_result
from prge_lib.experiments.summaries import left_zero_shot, trained_bracket
from prge_lib.training.stopping import LOSS_WINDOW


class SweepNotDone(ValueError):
    """The confirm stage asked for before the sweep it reads has results: names the cells still missing."""

    def __init__(self, grid: str, profile: str, missing: list[Cell], total: int):
        self.missing, self.total = missing, total
        profile_option = "" if profile == "cpu" else f" --profile {profile}"
        super().__init__(f"the confirm stage of {grid!r} waits for its sweep: {len(missing)} of {total} sweep "
                         f"cells have no result yet (e.g. {missing[0].name}); run "
                         f"'prge reproduce {grid}{profile_option}' first")


class SweepLeftOut(ValueError):
    """The sweep stage asked for cells that a bracket has left out, and no others (:func:`stage_plan`)."""


def check_stage(grid: str, stage: str, profile: str | None = None) -> str:
    """``stage`` if ``grid`` has it (under ``profile``, where given): every grid has "sweep" (its cells), a grid
    with two-stage rows (:meth:`~prge_lib.experiments.grids.Row.staged`) also "confirm"; else a ValueError naming
    what is allowed."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; choose one of {list(STAGES)}")
    if stage == "confirm" and not staged_rows(grid, profile):
        if staged_rows(grid):
            profiles = sorted({p for row in staged_rows(grid) for p in row.confirm_seeds})
            raise ValueError(f"--stage confirm: grid {grid!r} has two-stage rows only under the profile "
                             f"{' and '.join(profiles)}, not {profile!r}")
        staged = [g for g in GRIDS if staged_rows(g)]
        raise ValueError(f"--stage confirm: grid {grid!r} has one stage; the grids with two-stage rows are {staged}")
    return stage


def sweep_runs(sweep: Iterable[Cell], results: Path = RESULTS) -> dict[tuple, list[tuple[Cell, dict | None]]]:
    """{(task, row key): [(sweep cell, its result read and checked, or None while it has none)]}: the sweep read
    once, for :func:`best_rates` and :func:`untrained_rows` alike."""
    runs: dict[tuple, list[tuple[Cell, dict | None]]] = {}
    for cell in sweep:
        path = cell.result_path(results)
        runs.setdefault((cell.task, cell.row.key), []).append((cell, read_result(path) if path.is_file() else None))
    return runs


class SweepChoice(NamedTuple):
    """What the sweep of a grid's two-stage rows has chosen so far (:func:`best_rates`): ``rates``, {(task, row
    key): its best rate}; ``missing``, the sweep cells without a result of the rows not chosen yet; ``beyond``,
    {(task, row key): (its :class:`~prge_lib.experiments.grids.Bracket`, the sweep cells it no longer needs)} for
    each row chosen before its whole grid ran."""
    rates: dict
    missing: list[Cell]
    beyond: dict


def _mean_vals(row: Iterable[tuple[Cell, dict | None]]) -> dict[float, float]:
    """{rate: the mean best validation score of its runs with a result} of one row of :func:`sweep_runs`."""
    vals: dict[float, list[float]] = {}
    for cell, record in row:
        if record is not None:
            vals.setdefault(cell.lr, []).append(record["best_val"]["val"])
    return {lr: sum(v) / len(v) for lr, v in vals.items()}


def best_rates(sweep: Iterable[Cell], results: Path = RESULTS,
               runs: dict[tuple, list[tuple[Cell, dict | None]]] | None = None) -> SweepChoice:
    """Each (task, row)'s best sweep rate by mean validation score (ties to the smaller rate), from ``runs``
    (:func:`sweep_runs`) where the caller has read them already.

    A row with all its sweep results gets its best rate. A row with some missing gets one only where its results
    so far bracket it (:func:`~prge_lib.experiments.grids.bracket`: both neighbours in the grid ran and scored
    lower) and its runs there left zero-shot: the rates beyond cannot win, so its missing cells go to ``beyond``,
    not run. Any other row waits (its cells in ``missing``): its choice would change when they came in."""
    rates, missing, beyond = {}, [], {}
    for key, row in (sweep_runs(sweep, results) if runs is None else runs).items():
        absent = [cell for cell, record in row if record is None]
        by_lr: dict[float, list[dict | None]] = {}
        for cell, record in row:
            by_lr.setdefault(cell.lr, []).append(record)
        if not absent:
            rates[key] = best_rate(_mean_vals(row))
            continue
        complete = {lr: records for lr, records in by_lr.items() if None not in records}
        found = trained_bracket(complete, row[0][0].row.lrs[row[0][0].profile])
        if found is not None:
            rates[key], beyond[key] = found.best, (found, absent)
        else:
            missing += absent
    return SweepChoice(rates, missing, beyond)


def sweep_order(cells: Iterable[Cell], runs: dict[tuple, list[tuple[Cell, dict | None]]]) -> list[Cell]:
    """``cells`` of a two-stage sweep in the order that brackets each row's best rate soonest: row by row (in
    their first appearance), each row's rates nearest its likeliest best first, the smaller of two as near: the
    best-scored rate of its results so far (``runs``, :func:`sweep_runs` of the whole sweep), else the rate the
    same row chose on another task where it trained there (a row that stalled, :func:`stalled_rows`, chose its
    validation noise), else its grid's middle rate. The runner then leaves out the cells that a bracket makes
    unneeded as the results come in (:func:`sweep_skip`)."""
    cells = list(cells)
    stalled = stalled_rows((), runs=runs)
    chosen = {key: lr for key, lr in best_rates((), runs=runs).rates.items() if key not in stalled}
    rows = list(dict.fromkeys((c.task, c.row.key) for c in cells))
    grids = {(c.task, c.row.key): sorted(c.row.lrs[c.profile]) for c in cells}
    centres = {}
    for task, key in rows:
        scores = _mean_vals(runs.get((task, key), ()))
        elsewhere = [lr for (other, k), lr in chosen.items() if k == key and other != task]
        grid = grids[task, key]
        centre = best_rate(scores) if scores else elsewhere[0] if elsewhere else grid[len(grid) // 2]
        centres[task, key] = grid.index(centre) if centre in grid else len(grid) // 2

    position = {cell.name: i for i, cell in enumerate(cells)}

    def place(cell: Cell) -> tuple:
        key = (cell.task, cell.row.key)
        if not cell.row.staged(cell.profile):         # a one-stage row runs its cells in the grid's order
            return rows.index(key), 0, position[cell.name], cell.seed
        here = grids[key].index(cell.lr) if cell.lr in grids[key] else len(grids[key])
        return rows.index(key), abs(here - centres[key]), here, cell.seed

    return sorted(cells, key=place)


def sweep_skip(sweep: Iterable[Cell], results: Path = RESULTS):
    """For the runner (``run_grid``'s ``needed``): a function that says, from the results on disk at that moment,
    why a cell of ``sweep`` (the whole sweep) is no longer needed (:func:`bracket_text`: its two-stage row's best
    rate has been bracketed since the grid started), or None where it still is (every cell of a one-stage row)."""
    by_row: dict[tuple, list[Cell]] = {}
    for cell in sweep:
        if cell.row.staged(cell.profile):
            by_row.setdefault((cell.task, cell.row.key), []).append(cell)

    def why_not(cell: Cell) -> str | None:
        key = (cell.task, cell.row.key)
        found = best_rates(by_row.get(key, ()), results).beyond.get(key)
        if found is None or cell.name not in {c.name for c in found[1]}:
            return None
        return f"not needed: {bracket_text(key, found)}"

    return why_not


def sweep_edges(grid: str, profile: str, rates: dict, stalled: Iterable[tuple] = ()) -> list[str]:
    """The (task, row) whose chosen rate is the largest or smallest of its grid: a best rate at an edge may lie
    beyond it, so the grid did not bracket it (said by ``--list``). Rows in ``stalled`` (:func:`stalled_rows`) are
    left out: a row that never trained has no best rate to bracket."""
    rows = {row.key: row for row in GRIDS[grid]["rows"]}
    edges, stalled = [], set(stalled)
    for (task, key), lr in rates.items():
        if (task, key) in stalled:
            continue
        grid_lrs = rows[key].lrs[profile]
        if len(grid_lrs) > 1 and lr in (min(grid_lrs), max(grid_lrs)):
            side = "largest" if lr == max(grid_lrs) else "smallest"
            edges.append(f"{task}/{key}: best at the grid's {side} rate {lr_text(lr)}")
    return edges


def untrained_rows(sweep: Iterable[Cell], results: Path = RESULTS,
                   runs: dict[tuple, list[tuple[Cell, dict | None]]] | None = None) -> list[str]:
    """The (task, row) of ``sweep`` with results whose runs all stayed at zero-shot
    (:func:`~prge_lib.experiments.summaries.left_zero_shot`): their "best" rate is the largest validation score's
    noise, so seeds confirming it there test only whether the row trains at all (chapter 8's verdicts read them so
    for a blind mask, whose not training is Guo et al.'s claim); said by ``--list``, with the rates tried so far.
    A row whose sweep has cells still to run says how many instead: its confirm stage waits for them.
    ``runs`` (:func:`sweep_runs`) where the caller has read them already."""
    runs = sweep_runs(sweep, results) if runs is None else runs
    lines = []
    for (task, key), rates in stalled_rows(sweep, results, runs).items():
        left = sum(record is None for _, record in runs[task, key])
        tried = ", ".join(map(lr_text, rates))
        lines.append(f"{task}/{key}: no run so far, at {tried}, left zero-shot ({left} of its sweep cells still to "
                     "run)" if left else
                     f"{task}/{key}: no run at {tried} left zero-shot: its best validation score is noise, so its "
                     "confirm seeds test whether the row trains at all, not its rate")
    return lines


def stalled_rows(sweep: Iterable[Cell], results: Path = RESULTS,
                 runs: dict[tuple, list[tuple[Cell, dict | None]]] | None = None) -> dict[tuple, list[float]]:
    """{(task, row key): the rates tried, ascending} for each row of ``sweep`` with results whose runs all stayed
    at zero-shot (:func:`untrained_rows` says them; :func:`sweep_edges` leaves them out)."""
    stalled = {}
    for key, row in (sweep_runs(sweep, results) if runs is None else runs).items():
        done = [(cell.lr, left_zero_shot(record)) for cell, record in row if record is not None]
        if done and all(moved is False for _, moved in done):
            stalled[key] = sorted({lr for lr, _ in done})
    return stalled


class Refinement(NamedTuple):
    """The rates a stalled row's sweep adds (:func:`stability_rates`): ``lrs``, the finer grid's rates between
    ``rose``, the smallest rate tried whose training loss rose, and ``fell``, the largest tried below it, whose loss
    fell."""
    lrs: tuple
    fell: float
    rose: float


def stability_rates(row: Iterable[tuple[Cell, dict | None]], finer: Iterable[float]) -> Refinement | None:
    """The rates of ``finer`` (the row's paper grid) that one row of :func:`sweep_runs` still needs where its whole
    sweep ran and stayed at zero-shot (:func:`left_zero_shot`): a rate's training loss fell where the mean of its
    runs' last ``LOSS_WINDOW`` losses lies below the start, the mean of the first ``LOSS_WINDOW`` losses at the
    smallest rate tried (whose steps are too small to move it); the finer rates between the smallest rate whose loss
    rose and the largest below it whose loss fell are the largest stable step, which a coarse grid skipped. The rule
    reads the training loss, never validation, so it cannot fit a validation score's noise. None where a run is
    missing, a run trained (or cannot tell), no rate's loss fell below one that rose, or no finer rate lies between.
    """
    by_lr: dict[float, list[dict]] = {}
    for cell, record in row:
        if record is None:
            return None
        by_lr.setdefault(cell.lr, []).append(record)
    records = [r for runs in by_lr.values() for r in runs]
    if not records or any(left_zero_shot(r) is not False or not r.get("losses") for r in records):
        return None
    tried = sorted(by_lr)
    start = statistics.fmean(statistics.fmean(r["losses"][:LOSS_WINDOW]) for r in by_lr[tried[0]])
    fell = {lr: statistics.fmean(statistics.fmean(r["losses"][-LOSS_WINDOW:]) for r in by_lr[lr]) < start
            for lr in tried}
    rose = [lr for lr in tried if not fell[lr]]
    below = [lr for lr in tried if fell[lr] and lr < rose[0]] if rose else []
    if not below:
        return None
    between = tuple(lr for lr in sorted(finer) if below[-1] < lr < rose[0])
    return Refinement(between, below[-1], rose[0]) if between else None


def _variant(cell: Cell, **changes) -> Cell:
    """``cell`` with ``changes`` (its ``lr``, ``seed``) in its fields and settings alike, its other settings (the
    model and overrides it was made with) kept."""
    return dataclasses.replace(cell, **changes, settings=tuple((k, changes.get(k, v)) for k, v in cell.settings))


def refined_cells(sweep: Iterable[Cell], results: Path = RESULTS,
                  runs: dict[tuple, list[tuple[Cell, dict | None]]] | None = None) -> dict[tuple, tuple]:
    """{(task, row key): (its last :class:`Refinement`, [(added cell, its result or None)])} for each row of a
    two-stage ``sweep`` (its grid's cells; ``runs``, their :func:`sweep_runs`, where read already) that
    :func:`stability_rates` widens: the added rates at the seeds of the row's smallest rate, their results read
    from ``results``; refined again once those have run, while a finer rate lies between."""
    added = {}
    for key, row in (sweep_runs(sweep, results) if runs is None else runs).items():
        if any(cell.lr is None for cell, _ in row):         # a row without a learning rate (zero-shot)
            continue
        template = min(row, key=lambda run: run[0].lr)[0]
        seeds = sorted({cell.seed for cell, _ in row if cell.lr == template.lr})
        finer = template.row.lrs.get("paper", ())
        extra, found = [], stability_rates(row, finer)
        while found is not None:
            extra += sweep_runs([_variant(template, lr=lr, seed=seed) for lr in found.lrs for seed in seeds],
                                results)[key]
            added[key] = (found, list(extra))
            found = stability_rates(row + extra, finer)
    return added


def refinement_text(key: tuple, found: tuple) -> str:
    """A line for a row of :func:`refined_cells`: "sst2/senszoq-random-s1e-3: no rate trained; lr 3e-2 added
    where its training loss turned from falling to rising (last between 1e-2, whose loss fell, and 1e-1, whose
    rose)"."""
    (task, row), (last, extra) = key, found
    rates = ", ".join(lr_text(lr) for lr in sorted({cell.lr for cell, _ in extra}))
    return (f"{task}/{row}: no rate trained; lr {rates} added where its training loss turned from falling to "
            f"rising (last between {lr_text(last.fell)}, whose loss fell, and {lr_text(last.rose)}, whose rose)")


class Sweep(NamedTuple):
    """A grid's whole sweep (:func:`read_sweep`): its ``cells``, their ``runs`` (:func:`sweep_runs`) and
    ``added``, the rows that :func:`refined_cells` widened."""
    cells: list[Cell]
    runs: dict[tuple, list[tuple[Cell, dict | None]]]
    added: dict[tuple, tuple]


def read_sweep(grid: str, profile: str = "cpu", model: str | None = None, results: Path = RESULTS,
               **overrides) -> Sweep:
    """The whole sweep of ``grid``, each result of its two-stage rows under ``results`` read once: the grid's cells
    (:func:`~prge_lib.experiments.cells.grid_cells`) and after them the cells :func:`refined_cells` adds to its
    stalled rows. ``runs`` holds the two-stage rows only: the one-stage rows' cells are all run, whatever their
    results."""
    cells = grid_cells(grid, profile, None, None, model, **overrides)
    runs = sweep_runs([cell for cell in cells if cell.row.staged(profile)], results)
    added = refined_cells(cells, results, runs)
    for key, (_, extra) in added.items():
        cells += [cell for cell, _ in extra]
        runs[key] = runs[key] + extra
    return Sweep(cells, runs, added)


def sweep_cells(grid: str, profile: str = "cpu", seeds: Iterable[int] | None = None, only: str | None = None,
                model: str | None = None, results: Path = RESULTS, **overrides) -> list[Cell]:
    """The sweep of ``grid`` (``seeds`` replacing every row's seeds), selected by ``only`` as
    :func:`~prge_lib.experiments.cells.grid_cells` selects: where it has two-stage rows, with the rates
    :func:`refined_cells` adds to those that stalled, from the results under ``results`` (:func:`read_sweep`)."""
    if not staged_rows(grid, profile):
        return grid_cells(grid, profile, seeds, only, model, **overrides)
    return _selected(read_sweep(grid, profile, model, results, **overrides), grid, profile, seeds, only, model,
                     overrides)


def _selected(sweep: Sweep, grid: str, profile: str, seeds, only, model, overrides) -> list[Cell]:
    """The cells of the read ``sweep`` that ``only`` selects; with ``seeds``, the grid's cells at those seeds
    (:func:`~prge_lib.experiments.cells.grid_cells`) and each added rate at each of them."""
    if seeds is None:
        return select(sweep.cells, only)
    added = {(c.task, c.row.key, c.lr, s): _variant(c, seed=s)
             for _, extra in sweep.added.values() for c, _ in extra for s in seeds}
    return select(grid_cells(grid, profile, seeds, None, model, **overrides) + list(added.values()), only)


class StagePlan(NamedTuple):
    """What a stage runs: its ``cells``; ``waiting``, {(task, row key): its sweep cells without a result} for each
    confirm row that ``only`` selects whose sweep has not chosen its rate (empty for the sweep stage); and
    ``beyond``, the sweep rows that ``only`` selects chosen before their whole grid ran
    (:attr:`SweepChoice.beyond`), whose cells left out the sweep stage no longer runs (empty for the confirm
    stage); ``added``, the sweep rows that ``only`` selects which :func:`refined_cells` widened (:attr:`Sweep.added`;
    empty for the confirm stage)."""
    cells: list[Cell]
    waiting: dict[tuple, list[Cell]]
    beyond: dict
    added: dict


def stage_plan(grid: str, profile: str = "cpu", stage: str = "sweep", seeds: Iterable[int] | None = None,
               only: str | None = None, model: str | None = None, results: Path = RESULTS,
               **overrides) -> StagePlan:
    """The cells of ``grid``'s ``stage`` and the rows still waiting or bracketed, from one reading of the sweep's
    results. The sweep is :func:`sweep_cells` (the grid's cells, and the rates a stalled row's training loss adds,
    whose rows ``added`` names), less the cells of two-stage rows whose best rate is bracketed already
    (:func:`best_rates`), which ``beyond`` names; the confirm stage is, per two-stage (task, row) whose sweep has
    chosen its rate, its confirm seeds (or ``seeds``) at that rate; a row still sweeping has none yet and is named
    in ``waiting``. :class:`SweepNotDone` when no row that ``only`` selects is ready; :class:`SweepLeftOut` when
    every sweep cell that ``only`` selects lies beyond a bracket."""
    check_stage(grid, stage, profile)
    if stage == "sweep":
        if not staged_rows(grid, profile):
            return StagePlan(grid_cells(grid, profile, seeds, only, model, **overrides), {}, {}, {})
        sweep = read_sweep(grid, profile, model, results, **overrides)
        wanted = _selected(sweep, grid, profile, seeds, only, model, overrides)
        choice = best_rates(sweep.cells, runs=sweep.runs)
        skipped = {cell.name for _, cells in choice.beyond.values() for cell in cells}
        selected = {(cell.task, cell.row.key) for cell in wanted}
        beyond = {key: found for key, found in choice.beyond.items() if key in selected}
        added = {key: found for key, found in sweep.added.items() if key in selected}
        cells = [cell for cell in wanted if cell.name not in skipped]
        if wanted and not cells:
            raise SweepLeftOut(f"every sweep cell that --only {only!r} selects is no longer needed: "
                             + "; ".join(bracket_text(key, found) for key, found in beyond.items()))
        return StagePlan(cells, {}, beyond, added)
    cells, waiting, total = _confirm_rows(grid, profile, seeds, only, model, results, overrides)
    if waiting and not cells:
        raise SweepNotDone(grid, profile, [c for row in waiting.values() for c in row], total)
    return StagePlan(cells, waiting, {}, {})


def bracket_text(key: tuple, found: tuple) -> str:
    """A line for a row of :attr:`SweepChoice.beyond`: "sst2/senszoq-c4-s1e-2: lr 1e-5 is bracketed by 1e-6 and
    1e-4, both lower on validation, so its sweep leaves out 1e-7, 1e-3"."""
    (task, row), (edges, cells) = key, found
    left = ", ".join(lr_text(lr) for lr in sorted({cell.lr for cell in cells}))
    return (f"{task}/{row}: lr {lr_text(edges.best)} is bracketed by {lr_text(edges.lower)} and "
            f"{lr_text(edges.upper)}, both lower on validation, so its sweep leaves out {left}")


def stage_cells(grid: str, profile: str = "cpu", stage: str = "sweep", seeds: Iterable[int] | None = None,
                only: str | None = None, model: str | None = None, results: Path = RESULTS,
                **overrides) -> list[Cell]:
    """The cells of :func:`stage_plan` (for a caller that does not need the rows still waiting)."""
    return stage_plan(grid, profile, stage, seeds, only, model, results, **overrides).cells


def confirm_waiting(grid: str, profile: str = "cpu", only: str | None = None, model: str | None = None,
                    results: Path = RESULTS, **overrides) -> dict[tuple, list[Cell]]:
    """{(task, row key): its sweep cells without a result} for each row of the confirm stage that ``only`` selects
    and whose sweep has not chosen its rate: the rows :func:`stage_plan` gives no confirm cells yet (its
    ``waiting``)."""
    return _confirm_rows(grid, profile, None, only, model, results, overrides)[1]


def _confirm_rows(grid, profile, seeds, only, model, results, overrides) -> tuple[list[Cell], dict, int]:
    """(the confirm cells that ``only`` selects of the rows whose sweep has chosen its rate, {(task, row key): the sweep
    cells without a result} of the selected rows still sweeping, the number of the sweep's cells of two-stage rows)."""
    sweep, runs, _ = read_sweep(grid, profile, model, results, **overrides)
    choice = best_rates(sweep, runs=runs)
    rates, missing = choice.rates, choice.missing
    cells, waiting = [], {}
    for task in GRIDS[grid]["tasks"]:
        for row in staged_rows(grid, profile):
            confirm = tuple(row.confirm_seeds[profile]) if seeds is None else tuple(seeds)
            if (task, row.key) in rates:
                cells += row_cells(grid, profile, task, row, (rates[task, row.key],), confirm, model, "confirm",
                                   **overrides)
            else:       # the rate is not known yet: a stand-in rate says whether --only selects this row
                stand_in = row_cells(grid, profile, task, row, row.lrs[profile][:1], confirm, model, "confirm",
                                     **overrides)
                unnamed = [SimpleNamespace(name=c.name.replace(f"_lr{lr_text(c.lr)}", "")) for c in stand_in]
                if select(unnamed, only):
                    waiting[task, row.key] = [c for c in missing if (c.task, c.row.key) == (task, row.key)]
    return select(cells, only), waiting, sum(len(row) for row in runs.values())


def confirm_estimate_cells(grid: str, profile: str = "cpu", model: str | None = None, results: Path = RESULTS,
                           **overrides) -> list[Cell]:
    """The confirm stage's cells beyond the sweep's own (its seeds less the sweep's, whose cells at the chosen rate
    the sweep has run), for pricing and counting before the whole sweep is done: a row whose sweep has chosen
    its rate (from the results under ``results``) at that rate, so that its done cells count as done; any other
    row at its grid's first rate, a stand-in (a cell's time does not depend on its rate)."""
    rates = best_rates((), runs=read_sweep(grid, profile, model, results, **overrides).runs).rates
    return [cell for task in GRIDS[grid]["tasks"] for row in staged_rows(grid, profile)
            for cell in row_cells(grid, profile, task, row,
                                  (rates[task, row.key],) if (task, row.key) in rates else row.lrs[profile][:1],
                                  [s for s in row.confirm_seeds[profile] if s not in row.seeds_for(profile, task)],
                                  model, "confirm", **overrides)]
