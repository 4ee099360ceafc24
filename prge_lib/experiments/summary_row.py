"""One row of a grid's summary (chapter 7), declared as a type: what ``summaries.summarize`` returns per (task, row)
and ``summary.csv`` holds, column by column in this order (Gao et al. §4.1: lr chosen by mean validation score,
test at each run's best validation step over the seeds)."""
from typing import TypedDict


class SummaryRow(TypedDict):
    task: str
    row: str                    # the grid row's key
    label: str                  # the row as the paper's table names it
    method: str                 # the method its runs trained with ("zeroshot" for the zero-shot row)
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
    lrs_planned: list[float]    # the row's grid rates for its profile ([]: zero-shot, or a row no grid names)
    lrs_bracket: list[float]    # [lower, upper]: a two-stage row's sweep neighbours, both lower ([]: none)
    lrs_added: list[float]      # rates a two-stage sweep added to a row that never trained (stages.refined_cells)
    added_seeds: list[int]      # seeds run beyond the grid's plan, after a first look (summaries.added_seeds)
    lrs_trained: list[float] | None   # the rates at which some run left zero-shot (None: a run without a start)
    train_min: float | None     # mean training minutes per run (None: zero-shot rows)
    device: str                 # "cpu", "cuda" or "cpu+cuda"
    gpu_noise: str | None       # where the GPU runs' ZO noise came from ("torch", "counter"; None: no GPU run)
    trained: bool | None        # False: no seed left zero-shot (summaries.left_zero_shot); None: zero-shot row
    stayed: int | None          # seeds whose run did not leave zero-shot (None: zero-shot row, or a run without a start)
    best_at_end: int | None     # seeds at their best validation score at their last evaluation (summaries.best_at_end)
    diverged: list[str]         # the runs recorded as diverged, "seed 0 after step 707 of 1000" (summaries.diverged_at)
    majority: float | None      # percent: always giving the test sample's commonest answer (None: no classes)
    processors: str             # the processors the runs computed on, "+"-joined (summaries.processors_of)
    fo_gain_share: float | None         # (ZO - zero-shot) / (FO LoRA-FA - zero-shot) on this task
    paper_fo_gain_share: float | None   # the same ratio from the paper's table
