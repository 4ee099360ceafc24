"""Result files: one of chapter 7's cells read and checked against its schema (:func:`read_result`,
:class:`ResultFileError` naming the file and the failing field), and whether a file is the result of the cell whose
place it has (:func:`cell_matches`, :func:`check_file_cell`); any result file as a chapter quotes it
(:func:`read_if_present`); the same run made as another grid's cell (:func:`twin_result`).
"""
from __future__ import annotations

import functools
import json
import math
import os
import re
from pathlib import Path

from prge_lib.common.paths import RESULTS
from prge_lib.common.schema import json_schema
from prge_lib.experiments.cells import Cell, grid_folder
from prge_lib.experiments.grids import GRIDS
from prge_lib.training.records import RECORD_TYPES, upgrade_record


def cell_matches(cell: Cell, result: dict) -> list[str]:
    """The settings in which an existing result differs from the cell (empty: it is this cell's result).

    The device is not a setting of the cell: a cell run on a GPU is the same cell (its result records the
    device and the hardware; its ZO noise comes from the counter generator, the CPU run's z with --noise counter, or,
    in results made before that default, from torch's CUDA generator: other draws of the same law). Nor is how
    the steps run (:data:`HOW_IT_RUNS`: length buckets, length groups and CUDA graphs change the rounding, not the
    run), nor whether a diverging run was stopped early (``stop_rising``: the same run, cut short once it diverged; its
    result's ``diverged`` says where)."""
    if cell.kind == "bench":
        return [] if result.get("kind") == "bench" else ["kind"]
    saved = result.get("config", {})
    return [k for k, v in cell.config().items()
            if k not in HOW_IT_RUNS + WHEN_IT_STOPS and saved.get(k) != (list(v) if isinstance(v, tuple) else v)]


# where and how a cell's steps run, not which run it is
HOW_IT_RUNS = ("device", "buckets", "cuda_graphs", "length_groups")
WHEN_IT_STOPS = ("stop_rising",)                     # when a diverging run is cut short, not which run it is


def result_differs(cell: Cell, results: Path = RESULTS) -> list[str] | None:
    """None where ``cell`` has no result file, else the settings in which that file differs (:func:`cell_matches`).
    A file that cannot be read as a result raises :class:`ResultFileError`."""
    path = cell.result_path(results)
    return cell_matches(cell, read_result(path)) if path.is_file() else None


def twin_result(cell: Cell, results: Path = RESULTS) -> Path | None:
    """The result file of this very run made as another grid's cell: the cell of the same name and profile in
    another grid's folder, whose result has this cell's settings (:func:`cell_matches`: task, method, rate, seed,
    steps, protocol). Chapter 8's ``senszoq`` sweep, for one, holds at the rate the ``alternatives`` grid gives
    every mask the runs that grid made. None where no other grid holds it, or for a benchmark or curves cell."""
    if cell.kind not in ("train", "zeroshot"):
        return None
    for grid in GRIDS:
        path = Path(results) / grid_folder(grid, cell.profile) / f"{cell.name}.json"
        if grid == cell.grid or not path.is_file():
            continue
        try:
            result = read_result(path)
        except ResultFileError:         # that grid's own listing names the file; it is no twin
            continue
        if result.get("kind") == "train" and not cell_matches(cell, result):
            return path
    return None


class ResultFileError(ValueError):
    """A result file that cannot be read as one, or that holds another cell's run: names the file and why."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path, self.reason = Path(path), reason
        super().__init__(f"{path}: {reason}")


def _short(value) -> str:
    """A JSON value in at most 40 characters."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:39] + "…"


def _schema_failure(err) -> str:
    """A jsonschema error in a few words: the failing field and what is wrong with it (never the whole file)."""
    where = ".".join(map(str, err.absolute_path))
    if err.validator == "required":
        missing = re.match(r"'(.+)' is a required property", err.message)
        name = missing.group(1) if missing else str(err.validator_value)
        return f"field {where + '.' if where else ''}{name} is missing"
    if not isinstance(err.validator, str):        # a check of validate_result's own
        return f"field {where or '(top level)'}: {err.message}"
    return (f"field {where or '(top level)'} is {_short(err.instance)}, which fails "
            f"{err.validator} {_short(err.validator_value)}")


def _json_object(path: Path) -> dict:
    """The JSON object in ``path``; :class:`ResultFileError` naming the file for anything else."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ResultFileError(path, f"not valid JSON ({err.msg}: line {err.lineno} column {err.colno})") from None
    except UnicodeDecodeError:
        raise ResultFileError(path, "not a text file") from None
    if not isinstance(data, dict):
        raise ResultFileError(path, f"holds a JSON {type(data).__name__}, not a result object")
    return data


def read_if_present(path: str | os.PathLike) -> dict | None:
    """A result file of any kind as the chapters quote it: None while it has not been produced (a figure whose
    run was not made yet is absent, not an error), its JSON object otherwise, older files upgraded to this
    version's names (:func:`~prge_lib.training.records.upgrade_record`; no schema: benchmark and device results
    have their own shapes); :class:`ResultFileError` naming a file that holds something else."""
    path = Path(path)
    return upgrade_record(_json_object(path)) if path.is_file() else None


def read_result(path: str | os.PathLike) -> dict:
    """A result file, read, upgraded to this version's names (:func:`~prge_lib.training.records.upgrade_record`)
    and validated (:func:`validate_result`); :class:`ResultFileError` naming the file and the failing field
    otherwise."""
    import jsonschema

    path = Path(path)
    data = upgrade_record(_json_object(path))
    try:
        validate_result(data)
    except jsonschema.ValidationError as err:
        raise ResultFileError(path, _schema_failure(err)) from None
    return data


def conflicting_results(cells: list[Cell], results: Path = RESULTS) -> dict[str, list[str]]:
    """{cell name: settings that differ} for the cells whose result file was made with other settings."""
    return {cell.name: differ for cell in cells if (differ := result_differs(cell, results))}


# ---------------------------------------------------------------- result schema
def result_schema(kind: str) -> dict:
    """The JSON schema a cell result of ``kind`` ("train", "bench" or "lm") is checked against: read off its type in
    ``prge_lib.training.records``, so the record and its check are one declaration."""
    if kind not in ("train", "bench", "lm"):
        raise ValueError(f"no cell result schema for kind {kind!r}; choose train, bench or lm")
    return json_schema(RECORD_TYPES[kind])


@functools.cache
def _validator(kind: str):
    """A jsonschema validator for ``kind``'s schema, checked and built once (``jsonschema.validate`` re-checks the
    schema on every call, which was most of the time of reading a grid's results)."""
    import jsonschema

    schema = result_schema(kind)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def validate_result(result: dict) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``result`` is a well-formed cell result."""
    import jsonschema

    _validator(result.get("kind") if result.get("kind") in ("bench", "lm") else "train").validate(result)
    if result.get("kind") == "train":
        if "series" in result:          # a long run: one window of ``every`` steps per entry
            series, steps = result["series"], result["steps"]
            windows = -(-steps // series["every"])
            for name in ("loss", "grad_rms", "step_s"):
                if name in series and len(series[name]) != windows:
                    raise jsonschema.ValidationError(f"steps = {steps} make {windows} windows of {series['every']} "
                                                     f"but series.{name} has {len(series[name])}",
                                                     path=("series", name))
        elif "losses" not in result:
            raise jsonschema.ValidationError("a training result needs losses (every step's) or series (windows)",
                                             path=("losses",))
        elif result["steps"] != len(result["losses"]):
            raise jsonschema.ValidationError(f"steps = {result['steps']} but {len(result['losses'])} losses",
                                             path=("losses",))


_CELL_FILE = re.compile(r"(?P<row>.+?)(?:-L(?P<seq_len>\d+))?(?:_lr(?P<lr>[^_]+))?_seed(?P<seed>\d+)")


def check_file_cell(grid: str, result: dict, path: Path) -> None:
    """Refuse (:class:`ResultFileError`) a training result whose task, row, learning rate or seed, or a fixed
    setting of its row, differs from the cell its place gives (``<task>/<row>[_lr<lr>]_seed<seed>.json``)."""
    if result.get("kind") != "train":
        return
    file = Path(result["_file"])
    m = _CELL_FILE.fullmatch(file.stem)
    if m is None:
        raise ResultFileError(path, "its name is not a cell's (<task>/<row>[_lr<lr>]_seed<seed>.json), so its "
                                    "row is unknown; rename it or move it away")
    config, cell = result["config"], result.get("cell", {})
    lr = None if result["method"] == "zeroshot" else config.get("lr")
    try:
        named_lr = None if m["lr"] is None else float(m["lr"])
    except ValueError:
        named_lr = math.nan
    differ = []
    if len(file.parts) > 1 and result["task"] != file.parts[0]:
        differ.append(f"task {result['task']} (the folder says {file.parts[0]})")
    if result["seed"] != int(m["seed"]):
        differ.append(f"seed {result['seed']} (the name says {m['seed']})")
    same_lr = lr is None and named_lr is None or (isinstance(lr, (int, float)) and named_lr is not None
                                                  and math.isclose(lr, named_lr, rel_tol=1e-9))
    if not same_lr:
        differ.append(f"lr {lr} (the name says {m['lr']})")
    if "row" in cell and cell["row"] != m["row"]:
        differ.append(f"row {cell['row']} (the name says {m['row']})")
    row = next((r for r in GRIDS.get(grid, {}).get("rows", ()) if r.key == m["row"]), None)
    fixed = {} if row is None else {**row.settings, **({"method": row.method} if row.method != "zeroshot" else {})}
    differ += [f"{k} {config[k]} (row {row.key} has {v})" for k, v in fixed.items() if k in config and config[k] != v]
    if differ:
        raise ResultFileError(path, f"its settings are not those of cell {file.with_suffix('')}: "
                                    f"{'; '.join(differ)}; move it to its own cell's name or away")
