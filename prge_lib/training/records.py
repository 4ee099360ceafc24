"""The records the library writes as result files, declared once as types (chapters 0, 5, 7): a training run
(:class:`TrainRecord`: finished or diverged), a zero-shot evaluation (:class:`ZeroShotRecord`) and a benchmark
(:class:`BenchRecord`), a federated run (:class:`FederatedRecord`); a grid summary's row is ``prge_lib.experiments.summary_row.SummaryRow``. ``prge_lib.experiments.results`` validates result files against the JSON
schemas read off these types (:func:`prge_lib.common.schema.json_schema`), so the two cannot disagree.

The builders here are the only places these records are put together (:func:`diverged_record`,
:func:`zero_shot_record`, :func:`zero_shot_run`). A measured step time has one name in every record, ``step_s``
(:class:`StepTimes`: its median and the steps); files written before that name (schema version 1) are read
through :func:`upgrade_record`, which renames their fields in memory.
"""
import statistics   # no "from __future__ import annotations": TypedDict reads NotRequired off live annotations
from typing import Annotated, Any, Literal, NotRequired, TypedDict

SCHEMA_VERSION = 2      # 2: one name per step time (step_s), diverged runs name their error "diverged"

# A run of more than FULL_SERIES_STEPS steps keeps its per-step series in windows of SERIES_WINDOW steps
# (:class:`Series`): every result file travels with the repository, and a 20,000-step P-RGE run at q 16 would
# write 9.4 MB of per-step losses and projected gradients.
FULL_SERIES_STEPS = 2000
SERIES_WINDOW = 100

Unit = Annotated[float, {"minimum": 0, "maximum": 1}]      # a score: accuracy, F1 or exact match


class Point(TypedDict):
    """A run's scores at one step: validation and test (Gao et al. §4.1: test at the best validation step)."""
    step: int
    val: Unit
    test: Unit


class Evaluation(TypedDict):
    """One validation (and, at a new best, the test score) during training."""
    step: int
    val: float
    test: NotRequired[float]


class StepTimes(TypedDict):
    """Measured seconds per step: the median and every timed step."""
    median: float | None
    per_step: list[float]


class Series(TypedDict):
    """A long run's per-step series in windows of ``every`` steps (the last window may be shorter): each window's
    mean loss, root mean square of the projected gradients (ZO methods) and median step time."""
    every: Annotated[int, {"minimum": 1}]
    loss: list[float]
    grad_rms: NotRequired[list[float]]
    step_s: NotRequired[list[float]]


class Provenance(TypedDict):
    """What every result file records (``prge_lib.common.provenance.provenance``)."""
    command: str
    commit: str | None
    versions: dict[str, str | None]
    hardware: dict[str, Any]
    wall_time_s: float | None
    fast_mode: NotRequired[str]
    finished_at: NotRequired[str]
    load_average: NotRequired[list[float] | None]


class RunConfig(TypedDict):
    """The settings of a run (``TrainConfig`` as a dict; only the keys every record has are required)."""
    task: str
    seed: int


class Sitting(TypedDict):
    """A stretch of a run in one process: the step it began at and the processor it ran on
    (``prge_lib.common.provenance.processor``); a run resumed on another machine has one per machine."""
    step: Annotated[int, {"minimum": 0}]
    processor: str | None


class TrainRecord(TypedDict):
    """A training run (``Trainer.summary()`` plus status, model and provenance; chapter 5), or a zero-shot cell of
    a grid written as a run of 0 steps (:func:`zero_shot_run`)."""
    kind: Literal["train"]
    task: str
    method: str
    seed: int
    config: RunConfig
    steps: Annotated[int, {"minimum": 0}]
    best_val: Point
    final: Point
    evals: Annotated[list[Evaluation], {"minItems": 1}]
    provenance: Provenance
    losses: NotRequired[list[float]]    # every step's; a run of more than FULL_SERIES_STEPS has ``series`` instead
    series: NotRequired[Series]
    schema_version: NotRequired[int]
    status: NotRequired[Literal["finished", "diverged"]]
    diverged: NotRequired[str]          # why a diverged run stopped (its step and loss)
    title: NotRequired[str]
    metric: NotRequired[str]
    model: NotRequired[str]
    adapter: NotRequired[str]
    zero_shot_val: NotRequired[float | None]
    step_s: NotRequired[StepTimes]
    projected_grad: NotRequired[list[Any]]          # per step: one value, or one per query
    trainable_parameters: NotRequired[int]
    data_sizes: NotRequired[dict[str, int]]
    data_notes: NotRequired[list[str]]
    elapsed_s: NotRequired[dict[str, float]]
    cell: NotRequired[dict[str, Any]]
    same_run_as: NotRequired[str]       # a grid's cell adopted from another grid's same run: that file, under results
    packed: NotRequired[dict[str, Any]]
    cuda_peak_mib: NotRequired[float]   # a GPU run: torch.cuda.max_memory_allocated over the process, MiB
    resumed_at_steps: NotRequired[list[int]]
    sittings: NotRequired[list[Sitting]]    # files from before the field have none


class ZeroShotRecord(TypedDict):
    """A task scored without training (``prge zeroshot``; chapter 0), from one evaluation
    (``prge_lib.training.evaluate.zero_shot``) on ``split``."""
    kind: Literal["zeroshot"]
    task: str
    title: str
    model: str
    seed: int
    split: str
    metric: str
    value: Unit
    n: int
    diagnostics: dict[str, Any]
    template_example: str
    label_words: list[str]
    data_notes: list[str]
    predictions: list[Any]
    provenance: Provenance
    schema_version: NotRequired[int]
    dtype: NotRequired[str]
    quant: NotRequired[str]


class BenchRecord(TypedDict):
    """A benchmark (``prge_lib.experiments.bench.methods.bench``, a grid's cell or ``prge bench``; chapter 7): the floor, each
    configuration's step times (``step_s``) and peak, the ratios the claims are stated in."""
    kind: Literal["bench"]
    configs: dict[str, Any]
    floor: dict[str, Any]
    ratios: dict[str, float]
    provenance: Provenance
    config: NotRequired[dict[str, Any]]     # a grid's cell: its settings (``prge bench`` writes them at top level)
    schema_version: NotRequired[int]


class LMCurve(TypedDict):
    """One method's curve on WikiText-2: rows per step, per-step losses and seconds, held-out evaluations."""
    rows: int
    losses: list[float]
    seconds: list[float]
    evals: Annotated[list[Any], {"minItems": 1}]


class LMRecord(TypedDict):
    """The language-modelling curves of chapter 9 (``prge_lib.experiments.bench.lm_curves``; Song and Tang Fig. 1):
    per method its losses, step seconds and held-out evaluations."""
    kind: Literal["lm"]
    runs: Annotated[dict[str, LMCurve], {"minProperties": 1}]
    config: dict[str, Any]
    seed: int
    provenance: Provenance
    schema_version: NotRequired[int]


class Score(TypedDict):
    """A test score (the metric on the run's test examples); ``taken_from``: where a score measured before was read."""
    test: Unit
    taken_from: NotRequired[str]


class FederatedRecord(TypedDict):
    """A federated P-RGE run, or its centralised baseline over the same batches (``mode``; chapter 11,
    ``prge_lib.distributed.federated``): the test score before and after, per-round and per-step losses, the
    clients' shards and label counts, and (federated) the bytes each client uploads and downloads a round."""
    kind: Literal["federated"]
    mode: Literal["federated", "centralised"]
    task: str
    seed: int
    config: dict[str, Any]
    federation: dict[str, Any]
    steps: Annotated[int, {"minimum": 1}]
    examples: int
    n_test: int
    zero_shot: Score
    final: Score
    round_losses: Annotated[list[float], {"minItems": 1}]
    losses: list[float]
    communication: dict[str, Any] | None
    step_s: StepTimes
    adapter_sha256: str
    provenance: Provenance
    schema_version: NotRequired[int]
    title: NotRequired[str]
    metric: NotRequired[str]
    model: NotRequired[str]
    elapsed_s: NotRequired[dict[str, float]]
    resumed_at_rounds: NotRequired[list[int]]
    trainable_parameters: NotRequired[int]
    data_sizes: NotRequired[dict[str, int]]
    data_notes: NotRequired[list[str]]
    uploads: NotRequired[list[Any]]                 # federated: per round its clients and bytes
    projected_grad: NotRequired[list[Any]]          # centralised: per step [seed index, its q values]


RECORD_TYPES = {"train": TrainRecord, "zeroshot": ZeroShotRecord, "bench": BenchRecord, "lm": LMRecord,
                "federated": FederatedRecord}


# ---------------------------------------------------------------- builders
def step_times(per_step: list[float], digits: int | None = None, middle=statistics.median) -> StepTimes:
    """:class:`StepTimes` of the timed steps ``per_step`` (rounded to ``digits`` where given); ``middle``: which
    median (a run's is ``statistics.median_high``, one of its steps)."""
    steps = [round(t, digits) for t in per_step] if digits is not None else list(per_step)
    median = middle(per_step) if per_step else None
    return {"median": median if median is None or digits is None else round(median, digits), "per_step": steps}


def windowed(losses: list[float], grads: list[list[float]], step_s: list[float],
             every: int | None = None) -> Series:
    """The :class:`Series` of a run's per-step ``losses``, projected gradients (``grads``: one list per step; may be
    empty) and step times, in windows of ``every`` steps (default :data:`SERIES_WINDOW`)."""
    every = every or SERIES_WINDOW
    cuts = range(0, len(losses), every)
    series: Series = {"every": every, "loss": [statistics.fmean(losses[i:i + every]) for i in cuts]}
    if grads:
        series["grad_rms"] = [statistics.fmean(g * g for step in grads[i:i + every] for g in step) ** 0.5
                              for i in cuts]
    if step_s:
        series["step_s"] = [statistics.median(step_s[i:i + every]) for i in cuts]
    return series


def step_series(losses: list[float], grads: list[list[float]], step_s: list[float]) -> dict:
    """The per-step fields of a training record: ``losses``, ``projected_grad`` and every step's time for a run
    of at most :data:`FULL_SERIES_STEPS` steps, else ``series`` (:func:`windowed`) with the median step time."""
    times = step_times(step_s, middle=statistics.median_high)
    if len(losses) <= FULL_SERIES_STEPS:
        return {"losses": losses, "projected_grad": grads, "step_s": times}
    return {"series": windowed(losses, grads, step_s), "step_s": {"median": times["median"], "per_step": []}}


def finished_record(summary: dict, model: str) -> dict:
    """A run that reached its steps: ``Trainer.summary()`` with its status and model."""
    return {**summary, "schema_version": SCHEMA_VERSION, "status": "finished", "model": model}


def diverged_record(summary: dict, error: BaseException | str, model: str) -> dict:
    """A run whose loss turned non-finite: ``Trainer.summary()`` as far as it went (its evaluations, and one at
    the last good state), ``status`` "diverged" and why in ``diverged``. Every writer (``prge train``, a grid's
    cell, a packed run) builds it here."""
    return {**summary, "schema_version": SCHEMA_VERSION, "status": "diverged", "diverged": str(error),
            "model": model}


def zero_shot_record(task, examples: list, evaluation: dict, *, model: str, seed: int, data_notes: list[str],
                     split: str = "test", dtype: str = "fp32", quant: str = "none") -> dict:
    """A :class:`ZeroShotRecord` (without provenance) of ``evaluation``, the result of
    ``prge_lib.training.evaluate.zero_shot(task, …, examples)``."""
    template = task.prompt(examples[0]) if task.kind != "mch" else " | ".join(
        c + x for c, x in task.options(examples[0]))
    return {"kind": "zeroshot", "schema_version": SCHEMA_VERSION, "task": task.name, "title": task.title,
            "model": model, "dtype": dtype, "quant": quant, "split": split, "seed": seed,
            "metric": evaluation["metric"], "value": evaluation["value"], "n": evaluation["n"],
            "diagnostics": {k: evaluation[k] for k in ("prediction_share", "auc", "exact_match") if k in evaluation},
            "template_example": template, "label_words": list(task.label_words), "data_notes": list(data_notes),
            "predictions": evaluation["predictions"]}


def zero_shot_run(record: dict, val: float, config: dict, data_sizes: dict) -> dict:
    """A grid's zero-shot cell: the :func:`zero_shot_record` of its test split, written as a run of 0 steps
    (a :class:`TrainRecord` whose one evaluation is the record's ``value`` and the validation score ``val``), so
    the tables read it beside the trained rows."""
    point = {"step": 0, "val": val, "test": record["value"]}
    run = {k: v for k, v in record.items() if k != "kind"}
    return {**run, "kind": "train", "method": "zeroshot", "config": {**config, "method": "zeroshot", "steps": 0},
            "steps": 0, "data_sizes": data_sizes, "zero_shot_val": val, "best_val": point, "final": point,
            "evals": [point], "losses": [], "status": "finished"}


# ---------------------------------------------------------------- older files
def _upgrade_times(row: dict) -> None:
    """One measured row's step times under ``step_s``: from ``median_s`` with ``times_s`` or a list ``step_s``
    (benchmarks, device benchmarks), from a bare median ``step_s`` with ``times_s`` (footprints)."""
    if isinstance(row.get("step_s"), dict):
        return
    steps = row.pop("times_s", None)
    if isinstance(row.get("step_s"), list):
        steps = row.pop("step_s")
    median = row.pop("median_s", row.pop("step_s", None))
    if median is None and steps is None:
        return
    row["step_s"] = {"median": median, "per_step": list(steps or [])}


def upgrade_record(record: dict) -> dict:
    """A result of any kind as this version writes it (in place, and returned): a file of schema version 1
    gets ``step_s`` for ``step_time_s`` (runs), for ``median_s``/``times_s`` (benchmark configurations and
    device-benchmark sides) and for a bare ``step_s`` median (footprint rows), and ``diverged`` for a diverged
    run's ``error``. The committed files are read through this, never rewritten."""
    if record.get("schema_version", 1) >= SCHEMA_VERSION:
        return record
    for run in (record, record.get("eager")):      # a device run carries its eager twin
        if isinstance(run, dict) and "step_time_s" in run:
            run["step_s"] = run.pop("step_time_s")
    if "error" in record and record.get("status") == "diverged":
        record["diverged"] = record.pop("error")
    configs = record.get("configs")
    rows = configs.values() if isinstance(configs, dict) else configs if isinstance(configs, list) else ()
    for row in [*rows, *(record.get(side) for side in ("runtime", "eager") if record.get("kind") == "device-bench")]:
        if isinstance(row, dict):
            _upgrade_times(row)
    return record
