"""Which of chapter 7's training cells train together (``prge reproduce --pack N``): the cells of a packable
method whose runs share one model (:func:`~prge_lib.training.packed.check_packable`'s rule), in packs of up to N
that each train with one forward per step (:class:`~prge_lib.training.packed.PackedTrainer`).
"""
from __future__ import annotations

from typing import Iterable

from prge_lib.experiments.cells import Cell
from prge_lib.training.config import TrainConfig
from prge_lib.training.packed import PACKABLE, SHARED


def check_pack_size(size: int) -> int:
    """``size`` if it is a pack size (an integer >= 1), else a ValueError naming it."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"--pack takes a number of cells per pack >= 1, got {size!r}")
    return size


def pack_key(cell: Cell) -> tuple | None:
    """What a cell shares with the cells it may pack with (its resolved ``SHARED`` settings: model, dtype,
    quant, device, layers, targets), or None for a cell that trains alone (zero-shot, benchmark, or a method
    outside ``PACKABLE``)."""
    if cell.kind != "train" or cell.config().get("method") not in PACKABLE:
        return None
    config = TrainConfig(**cell.config()).resolved()
    if config.program is not None:
        return None
    return tuple(getattr(config, key) for key in SHARED)


def step_shape(cell: Cell) -> tuple[int, int]:
    """(q, E) of a packable cell: runs of one shape step together as one uniform batched product, which a GPU
    replays as one CUDA graph (``prge_lib.zo.packing.Pack``); runs of several shapes in one pack step through a
    slower path, without graphs."""
    config = TrainConfig(**cell.config()).resolved()
    return config.q or 1, config.E


def plan_packs(cells: Iterable[Cell], size: int) -> list[list[Cell]]:
    """``cells`` as the runner trains them: lists of one cell (trained alone) or of up to ``size`` cells with
    one :func:`pack_key`. The cells of one key are grouped by :func:`step_shape` first (a pack never mixes
    shapes: its step stays one batched product, one CUDA graph on a GPU), then by task (tasks in their order of
    appearance), so that a pack pads its rows to one task's lengths, then cut into packs of ``size`` within a
    shape; the last pack of a task is filled with the next task's cells of that shape. A key's packs take the
    place of its first cell in the order; a pack of one cell is a cell trained alone."""
    check_pack_size(size)
    order, groups = [], {}
    for cell in cells:
        key = pack_key(cell) if size > 1 else None
        if key is None:
            order.append([cell])
        elif key in groups:
            groups[key].append(cell)
        else:
            groups[key] = [cell]
            order.append(key)
    plan = []
    for entry in order:
        if isinstance(entry, list):
            plan.append(entry)
            continue
        by_shape: dict[tuple[int, int], list[Cell]] = {}
        for cell in groups[entry]:
            by_shape.setdefault(step_shape(cell), []).append(cell)
        for group in by_shape.values():
            tasks = list(dict.fromkeys(c.task for c in group))
            group = sorted(group, key=lambda c: tasks.index(c.task))      # stable: the grid's order within a task
            plan.extend(group[i:i + size] for i in range(0, len(group), size))
    return plan
