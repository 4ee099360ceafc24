"""One row of a grid's summary (chapter 7), declared as a type: what ``summaries.summarize`` returns per (task, row)
and ``summary.csv`` holds, column by column in this order (Gao et al. §4.1: lr chosen by mean validation score,
test at each run's best validation step over the seeds)."""
from typing import TypedDict


class SummaryRow(TypedDict):
    task: str
    row: str                    # the grid row's key
    label: str                  # the row as the paper's table names it
    lr: float | None            # the chosen learning rate (None: zero-shot)
    seeds: list[int]
    n: int                      # runs averaged
    steps: int                  # the steps the runs were set to
    val_mean: float             # percent, mean over the seeds
    test_mean: float
    test_sd: float | None       # None with one seed
    test_min: float
    test_max: float
    lrs_tried: list[float]
    train_min: float | None     # mean training minutes per run (None: zero-shot rows)
    device: str                 # "cpu", "cuda" or "cpu+cuda"
