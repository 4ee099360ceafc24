"""``prge reproduce``: the cells of a paper table, resumable (chapter 7)."""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from prge_lib.cli.common import EXIT_CELLS_LEFT
from prge_lib.models.options import EMBEDDED
from prge_lib.training.checks import check_numbers
from prge_lib.training.stopping import stop_on_signals

DEFAULT_GPU_PACK = 8        # --pack's default with --device cuda (and the local backend)


def run_reproduce(args) -> int:
    from prge_lib.experiments import reproduce as rp

    roots = {"results": Path(args.results_dir) if args.results_dir else rp.RESULTS,
             "checkpoints": rp.checkpoint_root(args.checkpoint_root)}
    if args.summary:                    # reads the result files only: no cell, device or time limit involved
        csv_path, md_path = rp.write_summary(args.grid, roots["results"], args.profile)
        print(md_path.read_text(), end="")
        print(f"-> {csv_path}, {md_path}", file=sys.stderr)
        return 0
    seeds = None
    if args.seeds:
        try:
            seeds = [int(v) for v in args.seeds.split(",")]
        except ValueError:
            raise ValueError(f"--seeds takes integers separated by commas, got {args.seeds!r}") from None
        check_numbers({"seed": seeds})
    overrides = {"steps": args.steps} if args.steps else {}
    if args.stop_rising is not None:
        if all(row.kind != "train" for row in rp.GRIDS[args.grid]["rows"]):
            raise ValueError(f"--stop-rising stops training cells, and grid {args.grid!r} has none (its cells are "
                             f"benchmarks or WikiText-2 curves)")
        overrides["stop_rising"] = args.stop_rising
    if args.length_groups != 1:
        check_numbers({"length_groups": args.length_groups}, options=True)
        if all(row.kind != "train" for row in rp.GRIDS[args.grid]["rows"]):
            raise ValueError(f"--length-groups cuts the batches of training cells, and grid {args.grid!r} has none")
        if args.device != "cpu" or (args.pack or 1) > 1:
            raise ValueError("--length-groups cuts one run's batch on the per-layer step the CPU runs; a GPU runs "
                             "the fused step, and a pack cuts its forwards with --width-groups instead (got "
                             f"--device {args.device}, --pack {args.pack})")
        overrides["length_groups"] = args.length_groups
    benchmarks = [g for g in rp.GRIDS if any(row.method == "bench" for row in rp.GRIDS[g]["rows"])]
    if args.dtype != "fp32":
        if args.grid not in benchmarks:
            raise ValueError(f"--dtype {args.dtype}: the dtype of the timed base applies to the benchmark grids "
                             f"{benchmarks} only; the {args.grid!r} cells keep their own")
        overrides["dtype"] = args.dtype
    if args.device != "cpu":
        if not (args.list or args.dry_run):     # pricing a GPU sitting ahead of it needs no GPU here
            from prge_lib.models.loading import check_device
            check_device(args.device)  # before any cell starts, naming what this torch can use
        overrides["device"] = args.device
    # --pack's default: DEFAULT_GPU_PACK on a GPU with the local backend, else 1 (no packs, as before --pack)
    pack = rp.check_pack_size(args.pack) if args.pack is not None else \
        DEFAULT_GPU_PACK if args.device != "cpu" and args.backend == "local" else 1
    rp.check_stage(args.grid, args.stage, args.profile)
    # the options a run would refuse, refused by a --list or --dry-run of it too
    if args.time_limit is not None and not (math.isfinite(args.time_limit) and args.time_limit > 0):
        raise ValueError(f"--time-limit takes minutes > 0, got {args.time_limit}")
    from prge_lib.zo.packing import check_width_groups
    check_width_groups(args.width_groups, "--width-groups")
    try:
        cells, waiting, beyond, added = rp.stage_plan(args.grid, args.profile, args.stage, seeds, args.only,
                                                      args.model, results=roots["results"],
                                                      **overrides)      # the sweep's results read once
    except rp.SweepNotDone as waiting:
        if not (args.list or args.dry_run):
            raise
        print(f"{waiting}\n{_confirm_totals(rp, args, pack, roots, overrides)}")
        return 0
    if not cells:
        raise ValueError(f"no cell of grid {args.grid!r} matches --only {args.only!r}; "
                         f"prge reproduce {args.grid} --list shows the names")
    if args.list or args.dry_run:
        print(rp.list_cells(cells, pack=pack, **roots))
        for line in _waiting_lines(waiting):
            print(line)
        for key, found in beyond.items():
            print(f"not needed: {rp.bracket_text(key, found)}")
        for key, found in added.items():
            print(f"added: {rp.refinement_text(key, found)}")
        if waiting:
            print(f"the whole confirm stage (a row still sweeping priced at a stand-in rate): "
                  f"{_confirm_totals(rp, args, pack, roots, overrides, step_note=False)}")
        if args.stage == "sweep" and rp.staged_rows(args.grid, args.profile):
            totals = _confirm_totals(rp, args, pack, roots, overrides, step_note=False)  # given just above
            print(f"then --stage confirm, which waits for this sweep: {totals}")
            runs = rp.sweep_runs([c for c in cells if c.row.staged(c.profile)], roots["results"])  # read once for both
            for edge in rp.sweep_edges(args.grid, args.profile, rp.best_rates(cells, runs=runs).rates,
                                       rp.stalled_rows(cells, runs=runs)):
                print(f"not bracketed: {edge}")
            for row in rp.untrained_rows(cells, runs=runs):
                print(f"did not train: {row}")
        if args.dry_run:
            for cell in cells:
                if not cell.result_path(roots["results"]).is_file():
                    print(f"would run: {cell.command()}")
        return 0
    for key, found in beyond.items():
        print(f"prge: not needed: {rp.bracket_text(key, found)}", file=sys.stderr)
    deadline = None
    if args.time_limit is not None:
        deadline = time.time() + 60 * args.time_limit
    needed = None
    if args.stage == "sweep" and rp.staged_rows(args.grid, args.profile):
        # a sweep with two-stage rows: their rates likeliest to bracket each row's best first, and a cell that a
        # bracket made unneeded meanwhile left out
        sweep, runs, _ = rp.read_sweep(args.grid, args.profile, args.model, roots["results"], **overrides)
        cells = rp.sweep_order(cells, runs)
        needed = rp.sweep_skip(sweep, roots["results"])
    with stop_on_signals():             # a first Ctrl-C or kill: the running cell stops after a step with a checkpoint
        rp.run_grid(cells, args.backend, args.address, progress=True, cpus_per_cell=args.cpus_per_cell,
                    say=lambda line: print(f"prge: {line}", file=sys.stderr), deadline=deadline,
                    restart=args.restart, pack=pack, width_groups=args.width_groups, needed=needed, **roots)
    if needed is not None:              # the plan again: the cells a bracket left out are not cells still to run
        try:
            cells = rp.stage_plan(args.grid, args.profile, args.stage, seeds, args.only, args.model,
                                  results=roots["results"], **overrides).cells
        except rp.SweepLeftOut:         # every cell selected has been left out meanwhile: none is left to run
            cells = []
    left = [c for c in cells if not c.result_path(roots["results"]).is_file()]
    if left:                            # the time limit stopped the grid, or a Ray task stopped
        print(f"prge: {len(left)} of {len(cells)} cells still to run; the same command continues "
              f"(exit status {EXIT_CELLS_LEFT})", file=sys.stderr)
        return EXIT_CELLS_LEFT
    if waiting:                         # the rows still sweeping get their confirm cells once their sweep is done
        for line in _waiting_lines(waiting):
            print(f"prge: {line}", file=sys.stderr)
        print(f"prge: the confirm cells of the rows ready are done; {len(waiting)} rows wait for their sweep "
              f"(exit status {EXIT_CELLS_LEFT})", file=sys.stderr)
        return EXIT_CELLS_LEFT
    return 0


def _waiting_lines(waiting: dict) -> list[str]:
    """A line per confirm row still sweeping (:func:`prge_lib.experiments.stages.confirm_waiting`): how many of its
    sweep cells have no result, and one of them."""
    return [f"waits for its sweep: {task}/{key} ({len(missing)} sweep cells without a result, e.g. "
            f"{missing[0].name}); its confirm cells follow the rate that sweep chooses"
            for (task, key), missing in waiting.items()]


def _confirm_totals(rp, args, pack: int, roots: dict, overrides: dict, step_note: bool = True) -> str:
    """The confirm stage's cells and time: a row at the rate its finished sweep chose, with its done cells; a row
    whose sweep is still running at a stand-in rate (a cell's time does not depend on its rate)."""
    cells = rp.confirm_estimate_cells(args.grid, args.profile, args.model, roots["results"], **overrides)
    return (f"{len(cells)} cells beyond the sweep's own (each row's confirm seeds at its best rate); "
            + rp.list_cells(cells, pack=pack, totals_only=True, step_note=step_note, **roots))


def reproduce_options(rp) -> None:
    from prge_lib.experiments.reproduce import BACKENDS, GRIDS, PROFILES, STAGES

    rp.add_argument("grid", choices=list(GRIDS), help="the table to reproduce")
    rp.add_argument("--profile", default="cpu", choices=PROFILES,
                    help="cpu: a budget for a 2-core CPU; paper: Gao et al. App. C (default cpu)")
    rp.add_argument("--stage", default="sweep", choices=STAGES,
                    help="two-stage rows (senszoq's; table1's MeZO (Full) on the paper profile): sweep runs each "
                    "row over its learning-rate grid, confirm runs the confirm seeds at each row's best sweep rate, "
                    "for the rows whose sweep has chosen it (all its results, or its best rate bracketed by two "
                    "lower neighbours, which stops that row's sweep) (the others are named; refused when no row "
                    "selected is ready) (default sweep: also every cell of the one-stage rows)")
    rp.add_argument("--only", default=None,
                    help="run the cells whose name contains this text (comma-separated: all must match; "
                         "a|b: either, e.g. 'sst2/prge|sst2/mezo-lorafa')")
    rp.add_argument("--seeds", default=None, help="comma-separated seeds instead of the profile's")
    rp.add_argument("--list", action="store_true", help="show each cell as done (or 'done, diverged') / running / "
                                                         "partial / missing / unreadable, with the time left, and exit")
    rp.add_argument("--restart", action="store_true",
                    help="discard the checkpoints of the cells it runs and start them again (instead of resuming)")
    rp.add_argument("--dry-run", action="store_true", help="--list, plus the command of every cell to run")
    rp.add_argument("--summary", action="store_true",
                    help="write summary.csv and summary.md from the grid's result files (and run nothing)")
    rp.add_argument("--backend", default="local", choices=BACKENDS,
                    help="local: one cell after another in this process; ray: cells as Ray tasks")
    rp.add_argument("--address", default=None, help="Ray cluster address (default: start a local Ray)")
    rp.add_argument("--cpus-per-cell", type=int, default=1, help="Ray: CPUs (and torch threads) per cell")
    rp.add_argument("--steps", type=int, default=None, help="override every training cell's steps")
    rp.add_argument("--model", default=None, help=f"hub id or local folder (default: the embedded {EMBEDDED})")
    rp.add_argument("--time-limit", type=float, default=None, metavar="MINUTES",
                    help="stop after this long (a GPU or notebook session's end): no cell starts later, and a "
                    "running training cell stops at a checkpoint that the same command resumes (as it does at a first "
                    "Ctrl-C or kill; a second stops at once)")
    rp.add_argument("--stop-rising", type=float, default=None, metavar="FACTOR",
                    help="stop a training cell once the mean of its last 50 training losses exceeds FACTOR times the "
                    "mean of its first 50, and record it as diverged (its result is the cell's, done: a sweep's rate "
                    "past the method's edge then costs a few hundred steps, not all of them; default: never)")
    rp.add_argument("--device", default="cpu", help="cpu or cuda: where training and zero-shot cells run (the "
                    "result records it; on cuda P-RGE draws counter noise with the fused step, and the runtime and "
                    "memory grids time the GPU)")
    rp.add_argument("--pack", type=int, default=None, metavar="N",
                    help="train up to N training cells in one pack, one forward per step for all of them "
                    "(prge_lib.training.packed): the cells still to run of a packable method (prge, mezo-lorafa) "
                    "that share model, dtype, quant, device, layers and targets are grouped by step shape (q and E: a "
                    "pack never mixes them, so its step stays one batched product and one CUDA graph), then by task, "
                    "then cut into packs of up to N (a task's last pack filled with the next task's cells of that "
                    "shape); the other cells "
                    "run alone. Each cell keeps its own lock, checkpoint and result file (which records the pack). "
                    f"Default {DEFAULT_GPU_PACK} with --device cuda and the local backend, else 1 (no packs); "
                    "--list prices packed cells")
    rp.add_argument("--width-groups", type=int, default=1, metavar="K",
                    help="each step of a pack in K forwards of cells of similar batch width, each padded to its "
                         "own widest batch (prge_lib.zo.packing.Pack; default 1: one forward)")
    rp.add_argument("--length-groups", type=int, default=1, metavar="K",
                    help="the ZO training cells on the CPU: each step's rows in K forwards of rows of similar length, "
                         "each padded to its own longest row (the same losses up to float rounding, fewer padded "
                         "tokens; each result's sittings record it; default 1: one padded batch)")
    rp.add_argument("--dtype", default="fp32", choices=("fp32", "fp16"),
                    help="the benchmark grids (runtime, memory): the base weights' precision in the timed steps")
    rp.add_argument("--results-dir", default=None, help="where result files go (default data/results)")
    rp.add_argument("--checkpoint-root", default=None, help="where checkpoints go (default: reproduce/ in PRGE_CACHE_DIR, ~/.cache/prge)")
    rp.set_defaults(run=run_reproduce)
