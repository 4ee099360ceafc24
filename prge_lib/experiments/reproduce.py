"""The reproduction runner behind chapter 7: the papers' tables as grids of independent cells.

A *grid* is a named list of *cells*; a cell is one run (model × task × method × hyperparameters × seed) that
writes one JSON result. The runner skips a cell whose result exists, resumes an interrupted one from its
checkpoint, and can dispatch the cells to a Ray cluster; the summaries choose each row's learning rate on
validation and report the test score over the seeds. This module gathers the names the book, the tests and
``prge reproduce`` use; each part lives in a module of its own:

- :mod:`~prge_lib.experiments.grids`: the grids, their rows, the profiles' steps (``GRIDS``, ``Row``, ``STEPS``);
- :mod:`~prge_lib.experiments.cells`: what a cell is, its name, paths and command (``Cell``, ``grid_cells``);
- :mod:`~prge_lib.experiments.estimates`: how long a cell takes (``estimate_seconds``, ``measured_step_seconds``);
- :mod:`~prge_lib.experiments.results`: reading and checking result files (``read_result``, ``validate_result``);
- :mod:`~prge_lib.experiments.locks`: one process per cell (``cell_lock``, ``CellBusy``);
- :mod:`~prge_lib.experiments.packs`: which training cells train together (``plan_packs``, ``pack_key``,
  ``step_shape``);
- :mod:`~prge_lib.experiments.stages`: two-stage grids, a sweep (stopping a row once its best rate is
  bracketed, widening a row that never trained where its training loss turns) then a confirmation at the best
  rates (``stage_plan``, ``sweep_cells``, ``best_rates``);
- :mod:`~prge_lib.experiments.status`: a cell's state and the ``--list`` table (``cell_status``, ``list_cells``);
- :mod:`~prge_lib.experiments.runner`: running cells locally or on Ray (``run_cell``, ``run_pack``, ``run_grid``);
- :mod:`~prge_lib.experiments.summaries`: the tables from the results (``summarize``, ``runs_of``, ``write_summary``);
- :mod:`~prge_lib.experiments.stats`: whether two rows differ over seeds (``compare_rows``, ``describe``), and how
  many seeds would find a gap (``seeds_needed``).
"""
from __future__ import annotations

from prge_lib.common.paths import RESULTS
from prge_lib.experiments.cells import Cell, checkpoint_root, grid_cells, grid_folder
from prge_lib.experiments.estimates import (ASSUMED_SECONDS_PER_STEP, BENCH_LOAD_SECONDS, BENCH_STEP_SECONDS,
                                            DEVICE_ASSUMPTION, EVAL_SECONDS, LOCAL_MIN_RUNS, PACK_ASSUMPTION,
                                            PACK_BASES, PackShare,
                                            bench_pack_shares, device_shares, estimate_seconds, evaluation_factor,
                                            evaluation_seconds, priced_runs, step_rate, task_measure,
                                            measured_step_seconds, pack_step_share, prompt_length_factor,
                                            step_basis, step_measure, step_seconds)
from prge_lib.experiments.grids import (ALTERNATIVE_ROWS, BENCH_ROWS, CONFIRM_SEEDS, EVAL_EVERY, GRIDS, LM_STEPS,
                                        PEFT_ROWS, PROFILES, SENSZOQ_ROWS, STAGES, STEPS, TABLE1_ROWS,
                                        TABLE2_LITE_ROWS, ZERO_SHOT, Bracket, Row, bracket, lr_text,
                                        staged_rows)
from prge_lib.experiments.locks import LOCK_WAIT_S, CellBusy, cell_holder, cell_lock
from prge_lib.experiments.packs import check_pack_size, pack_key, plan_packs, step_shape
from prge_lib.experiments.results import (ResultFileError, cell_matches, check_file_cell, conflicting_results,
                                          read_if_present, read_result, result_differs, twin_result,
                                          validate_result)
from prge_lib.experiments.runner import (BACKENDS, EMBEDDED_MODEL, adopt_twin, connect_ray, run_cell, run_grid,
                                         run_pack)
from prge_lib.experiments.stages import (LOSS_WINDOW, Refinement, StagePlan, Sweep, SweepChoice, SweepLeftOut,
                                         SweepNotDone, best_rates, bracket_text, check_stage, confirm_estimate_cells,
                                         confirm_waiting, read_sweep, refined_cells, refinement_text,
                                         stability_rates, stage_cells, stage_plan, stalled_rows, sweep_cells,
                                         sweep_edges, sweep_order, sweep_runs, sweep_skip, untrained_rows)
from prge_lib.experiments.status import cell_status, list_cells, price_cells
from prge_lib.experiments.stats import compare_rows, compare_scores, describe, seeds_needed, seeds_words
from prge_lib.experiments.summaries import (PAUSE_FACTOR, best_at_end, device_of, format_score, left_zero_shot,
                                            load_results, lr_note, majority_rate, memory_beyond, paper_memory_beyond,
                                            processors_of, runs_of, runtime_answers, summarize, summary_markdown,
                                            table_of, training_seconds, write_summary)

__all__ = [
    "RESULTS",
    "Cell", "checkpoint_root", "grid_cells", "grid_folder",
    "ASSUMED_SECONDS_PER_STEP", "BENCH_LOAD_SECONDS", "BENCH_STEP_SECONDS", "EVAL_SECONDS",
    "DEVICE_ASSUMPTION", "PACK_ASSUMPTION", "PACK_BASES", "PackShare", "device_shares", "estimate_seconds",
    "evaluation_factor", "evaluation_seconds", "priced_runs", "step_rate", "task_measure",
    "LOCAL_MIN_RUNS", "measured_step_seconds", "pack_step_share", "bench_pack_shares", "prompt_length_factor",
    "step_basis", "step_measure",
    "step_seconds",
    "ALTERNATIVE_ROWS", "BENCH_ROWS", "CONFIRM_SEEDS", "EVAL_EVERY", "GRIDS", "LM_STEPS", "PEFT_ROWS", "PROFILES",
    "SENSZOQ_ROWS", "STAGES", "STEPS", "TABLE1_ROWS", "TABLE2_LITE_ROWS", "ZERO_SHOT", "Bracket", "Row", "bracket",
    "lr_text", "staged_rows",
    "LOSS_WINDOW", "Refinement", "StagePlan", "Sweep", "SweepChoice", "SweepLeftOut", "SweepNotDone", "best_rates",
    "bracket_text", "check_stage", "confirm_estimate_cells", "confirm_waiting", "read_sweep", "refined_cells",
    "refinement_text", "stability_rates", "stage_cells", "stage_plan", "stalled_rows", "sweep_cells", "sweep_edges",
    "sweep_order", "sweep_runs", "sweep_skip", "untrained_rows",
    "LOCK_WAIT_S", "CellBusy", "cell_holder", "cell_lock",
    "check_pack_size", "pack_key", "plan_packs", "step_shape",
    "ResultFileError", "cell_matches", "check_file_cell", "conflicting_results", "read_if_present", "read_result",
    "result_differs",
    "twin_result", "validate_result",
    "BACKENDS", "EMBEDDED_MODEL", "adopt_twin", "connect_ray", "run_cell", "run_grid", "run_pack",
    "cell_status", "list_cells", "price_cells",
    "compare_rows", "compare_scores", "describe", "seeds_needed", "seeds_words",
    "PAUSE_FACTOR", "best_at_end", "device_of", "format_score", "left_zero_shot", "load_results", "lr_note",
    "majority_rate",
    "memory_beyond", "paper_memory_beyond", "processors_of", "runs_of", "runtime_answers", "summarize",
    "summary_markdown", "table_of", "training_seconds", "write_summary",
]
