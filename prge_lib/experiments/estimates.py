"""How long a cell of chapter 7 takes on a 2-core CPU (what ``prge reproduce --list`` prints): the median step and
evaluation of the committed runs of its task, method and batch, or where none ran, measured seconds per SST-2 step
of its method scaled by the prompt lengths of the cell's task and batch, plus its evaluations; a
benchmark cell by a fit to the committed runtime cells; a cell trained in a pack (``--pack``) by its share of the
pack's step, measured where a packed result exists.
"""
from __future__ import annotations

import functools
import os
import random
import statistics
from pathlib import Path
from typing import NamedTuple

from prge_lib.common.paths import RESULTS
from prge_lib.common.provenance import cpu_name
from prge_lib.data.splits import DataUnavailableError, sample_task
from prge_lib.data.tasks import get_task
from prge_lib.experiments.bench.methods import configurations
from prge_lib.experiments.cells import Cell, grid_cells, grid_folder
from prge_lib.experiments.grids import GRIDS
from prge_lib.experiments.results import read_if_present
from prge_lib.experiments.summaries import processors_of
from prge_lib.methods import registry
from prge_lib.training.config import IDENTITY_LEGACY, TrainConfig

# A cell's steps and evaluations are priced from the committed runs of its own task, method and step shape where
# they exist (:func:`task_measure`). Otherwise seconds per step of its method come from the committed result files
# (:func:`measured_step_seconds`):
# SST-2 cells of the grids at the method's Table 1 batch (FO 8, MeZO 16, P-RGE q 4: 4 examples), on the CPU at
# 1 torch thread beside one other run, as the committed cells ran. A step pads every row to the longest prompt of
# its batch, so --list scales these by that length on the cell's task and batch (:func:`prompt_length_factor`):
# RTE's steps take 3-5x SST-2's. A method (or MeZO adapter) with no such cell is priced by this assumption,
# which --list names (:func:`step_basis`); it is no measurement:
ASSUMED_SECONDS_PER_STEP = 4.0
EVAL_SECONDS = 90.0          # SST-2: one validation (500) plus, at a new best, one test (1000); without a measure
# Benchmark cells (warm-up + timed step per configuration and round, then the same in a fresh process for the
# peak): seconds per step = a * (L / 64) ** b per weight format, fitted (least squares in log space) to the nine
# committed runtime cells (fp32 11.8 / 19.7 / 33.7 min at 64 / 128 / 256 tokens, INT8 7.9 / 14.5 / 31.1, NF4
# 7.3 / 10.9 / 19.6), plus a model load of about 4 s. fp32 and NF4 grow about linearly with the length, INT8
# faster than linearly (chapter 7: LLM.int8()'s fp16 columns grow with the rows of a call)
BENCH_STEP_SECONDS = {"none": (3.59, 0.96), "int8": (2.12, 1.35), "nf4": (1.79, 1.06)}
BENCH_LOAD_SECONDS = 4.0
# A cell trained in a pack of R (``prge reproduce --pack R``) costs its steps divided by R times how many solo steps
# one step of the pack costs. Measured where a packed result of that device exists (:func:`pack_step_share`);
# otherwise this assumption, which claims no gain:
PACK_ASSUMPTION = "no measured pack on this device: a pack of R priced as R solo steps"
PACK_BASES = ("measured", "eager", "optimised", "assumed")


class PackShare(NamedTuple):
    """What a packed cell's steps cost as a fraction of its solo CPU steps (:func:`pack_step_share`): ``share``;
    ``how``, a sentence saying where it comes from; ``basis``, which of :data:`PACK_BASES` priced it (packed
    results of the device, its engine benchmark against the eager or the optimised step, or the assumption)."""
    share: float
    how: str
    basis: str
LORAFA_ZO = ("prge", "mezo-lorafa")      # the methods a pack trains, whose per-layer solo steps price it
# A cell on another device (``--device cuda``) costs its CPU price times what that device's training results
# measured: its steps by the median ratio of their step to the CPU step of the same method and task
# (:func:`device_shares`; a method with no result there takes the median over the methods that have one), its
# evaluations likewise. Without any result from the device, this assumption, which claims no gain:
DEVICE_ASSUMPTION = "no training result from this device: its steps and evaluations priced as this CPU's"


def _batch_examples(config: dict) -> int:
    """Examples per training step: FO's batch size, or E / q for the ZO methods (each query sees them all)."""
    if "batch_size" in config:
        return config["batch_size"]
    return max(1, config.get("E", 16) // config.get("q", 1))


def _data_setting() -> str:
    """What the data are read from (``PRGE_DATA_DIR``): part of the caches' keys below, so that a process that
    changes the setting does not price its tasks from the data read before."""
    return os.environ.get("PRGE_DATA_DIR", "")


def _prompt_lengths(task: str, seed: int = 0) -> tuple[tuple[int, ...], int]:
    """Lengths in characters of the texts a training step reads from ``task``'s training sample (prompt and
    answer), and how many examples one evaluation reads (validation + test)."""
    return _prompt_lengths_in(task, seed, _data_setting())


@functools.lru_cache(maxsize=None)
def _prompt_lengths_in(task: str, seed: int, data: str) -> tuple[tuple[int, ...], int]:
    t = get_task(task)
    data = sample_task(t, seed)
    lengths = [sum(map(len, t.training_pair(r))) for r in data.train]
    return tuple(lengths), len(data.val) + len(data.test)


def _longest_prompt(task: str, examples: int) -> float:
    """Mean over random batches of ``examples`` training examples of the longest prompt's length: a step pads
    every row to it, so step time follows it."""
    return _longest_prompt_in(task, examples, _data_setting())


@functools.lru_cache(maxsize=None)
def _longest_prompt_in(task: str, examples: int, data: str) -> float:
    lengths, _ = _prompt_lengths(task)
    rng = random.Random(0)
    return statistics.mean(max(rng.sample(lengths, min(examples, len(lengths)))) for _ in range(500))


def prompt_length_factor(task: str, config: dict) -> float:
    """How much longer a step of ``config`` on ``task`` pads its rows than the same method's SST-2 step at the
    batch :func:`step_rate` was measured at (1.0 where the task's data cannot be read)."""
    reference = _batch_examples(registry.get(config["method"]).defaults)     # step_rate's batch
    try:
        return _longest_prompt(task, _batch_examples(config)) / _longest_prompt("sst2", reference)
    except DataUnavailableError:
        return 1.0


def evaluation_factor(task: str) -> float:
    """How much longer one evaluation of ``task`` takes than SST-2's: mean prompt length times examples read."""
    try:
        (lengths, rows), (sst2, sst2_rows) = _prompt_lengths(task), _prompt_lengths("sst2")
    except DataUnavailableError:
        return 1.0
    return statistics.mean(lengths) * rows / (statistics.mean(sst2) * sst2_rows)


def rate_key(config: dict) -> str:
    """What a step is priced by: the method, or for MeZO over a peft adapter (the peft grid) ``mezo:<adapter>``
    (not MeZO on every weight: VeRA's rank-1024 projections make its step ~3x LoRA's)."""
    adapter = config.get("adapter") or "none"
    return f"mezo:{adapter}" if config["method"] == "mezo" and adapter != "none" else config["method"]


BATCH_SHAPE_KEYS = ("E", "q", "batch_size", "inner")      # what sets a step's work, besides the task's prompts


def batch_shape(config: dict) -> tuple:
    """What a step of ``config`` computes besides its prompts: E, q, the batch size and the inner loop, each as
    set or as its method's default (a cell's config names only what differs from the defaults, a result's all)."""
    defaults = registry.get(config["method"]).defaults
    full = {**defaults, **{k: v for k, v in config.items() if v is not None}}
    return tuple((k, full[k]) for k in BATCH_SHAPE_KEYS if k in defaults)


def weight_format(config: dict) -> str:
    """The base weights' format a run of ``config`` steps through ("none", "int8", "nf4"): as its config says, or
    as its method implies (SensZOQ's base is NF4 without saying so in a cell's config)."""
    if config.get("quant"):
        return config["quant"]
    try:
        return TrainConfig(**config).resolved().quant or "none"
    except (TypeError, ValueError):
        return "none"


def _at_reference_batch(config: dict) -> bool:
    """Whether a run's config has its method's Table 1 batch (the registry's defaults), where rates are measured."""
    return batch_shape(config) == batch_shape({"method": config["method"]})


LOCAL_MIN_RUNS = 3     # runs on this machine's processor that price a step without the other processors' runs


class PricedRun(NamedTuple):
    """A committed training run that prices CPU work (:func:`priced_runs`): its task, :func:`rate_key`,
    :func:`batch_shape`, :func:`weight_format`, the processors it computed on, its median seconds per step and its
    mean seconds per evaluation (None without evaluations)."""
    task: str
    key: str
    shape: tuple
    weights: str             # :func:`weight_format`
    reference: bool          # at its method's Table 1 batch (:func:`_at_reference_batch`)
    processors: tuple[str, ...]
    step: float
    evaluation: float | None


@functools.lru_cache(maxsize=None)
def priced_runs(results: Path = RESULTS) -> tuple[PricedRun, ...]:
    """The committed training runs in the grids' folders under ``results`` (cpu profile) that price a step: on the
    CPU at 1 torch thread, not packed, not in an exported program, with measured steps; a run one grid adopted from
    another (``same_run_as``) counts once."""
    runs = []
    for path in sorted(p for grid in GRIDS for p in (Path(results) / grid_folder(grid, "cpu")).rglob("*.json")):
        try:
            result = read_if_present(path)
            config, hardware = result["config"], result["provenance"]["hardware"]
            median = result["step_s"]["median"]
            if (device_kind(config) != "cpu" or "packed" in result or "same_run_as" in result
                    or config.get("program") or hardware.get("torch_threads") != 1 or not median
                    or config.get("method") not in registry.names()):
                continue
            evaluations, eval_s = len(result.get("evals") or ()), (result.get("elapsed_s") or {}).get("eval_s")
            evaluation = eval_s / evaluations if evaluations and eval_s else None   # a step time without it
            runs.append(PricedRun(result["task"], rate_key(config), batch_shape(config), weight_format(config),
                                  _at_reference_batch(config),
                                  tuple(processors_of(result)), median, evaluation))
        except (OSError, ValueError, KeyError, TypeError):       # not a training result with measured steps
            continue
    return tuple(runs)


def _reference_runs(results: Path) -> list[PricedRun]:
    """The runs of :func:`priced_runs` that price a method's step: on SST-2, at its method's Table 1 batch."""
    return [r for r in priced_runs(results) if r.task == "sst2" and r.reference]


def measured_step_seconds(results: Path = RESULTS, processor: str | None = None) -> dict[str, tuple[float, int]]:
    """{:func:`rate_key`: (median seconds per step, runs measured)} over the SST-2 runs of :func:`priced_runs` at
    their method's Table 1 batch (``step_s.median`` of each, the median over them). ``processor``: only the runs
    that computed on it alone, in every sitting (:func:`~prge_lib.experiments.summaries.processors_of`)."""
    steps: dict[str, list[float]] = {}
    for run in _reference_runs(results):
        if processor is None or run.processors == (processor,):
            steps.setdefault(run.key, []).append(run.step)
    return {key: (statistics.median(times), len(times)) for key, times in sorted(steps.items())}


def _local_or_all(runs: list, here: str | None) -> tuple[list, bool]:
    """This processor's runs where it has at least :data:`LOCAL_MIN_RUNS` (CPU models differ by 1.5x and more at
    one thread), else all of them; and whether the first. The one rule of :func:`step_measure` and
    :func:`task_measure`."""
    local = [r for r in runs if here and r.processors == (here,)]
    return (local, True) if len(local) >= LOCAL_MIN_RUNS else (runs, False)


def step_measure(key: str) -> tuple[float, int, bool] | None:
    """(median seconds per step, runs, whether they all ran on this machine's processor) of the SST-2 runs of
    :func:`rate_key` ``key`` at its method's Table 1 batch, as :func:`measured_step_seconds` counts them, chosen
    by :func:`_local_or_all`; None without a committed run."""
    runs = [r for r in _reference_runs(RESULTS) if r.key == key]
    chosen, here = _local_or_all(runs, cpu_name())
    return (statistics.median(r.step for r in chosen), len(chosen), here) if chosen else None


class TaskMeasure(NamedTuple):
    """What the committed runs of one task, method and step shape measured (:func:`task_measure`): median seconds
    per step, median seconds per evaluation (None without evaluations), runs, and whether all ran on this
    machine's processor."""
    step: float
    evaluation: float | None
    runs: int
    here: bool


def task_measure(task: str, config: dict) -> TaskMeasure | None:
    """The committed runs (:func:`priced_runs`) of ``config``'s :func:`rate_key`, :func:`batch_shape` and
    :func:`weight_format` on ``task`` itself (this processor's where it has :data:`LOCAL_MIN_RUNS`): a step there
    pads to that task's prompts, which a scaled SST-2 step prices only roughly (RTE's MeZO (LoRA-FA) step measured
    0.6x its scaled price); None where none ran."""
    key, shape, weights = rate_key(config), batch_shape(config), weight_format(config)
    runs = [r for r in priced_runs(RESULTS) if (r.task, r.key, r.shape, r.weights) == (task, key, shape, weights)]
    chosen, here = _local_or_all(runs, cpu_name())
    if not chosen:
        return None
    evaluations = [r.evaluation for r in chosen if r.evaluation]
    return TaskMeasure(statistics.median(r.step for r in chosen),
                       statistics.median(evaluations) if evaluations else None, len(chosen), here)


def step_rate(config: dict) -> float:
    """Seconds per SST-2 step of ``config``'s method at its Table 1 batch: measured (:func:`step_measure`) or,
    without a committed cell, :data:`ASSUMED_SECONDS_PER_STEP`."""
    found = step_measure(rate_key(config))
    return found[0] if found else ASSUMED_SECONDS_PER_STEP


def step_basis(configs: list[dict]) -> str:
    """Where the step times of ``configs`` come from, in one line (what --list prints): the cells priced from runs
    of their own task (:func:`task_measure`), then the SST-2 rates that price the others, scaled by prompt length."""
    own = [c for c in configs if "task" in c and task_measure(c["task"], c)]
    scaled = [c for c in configs if c not in own]
    keys = sorted({rate_key(c) for c in scaled})
    measured = {k: found for k in keys if (found := step_measure(k))}
    found = [f"{k} {s:.1f} s ({n}{' on this processor' if here else ''})" for k, (s, n, here) in measured.items()]
    assumed = [k for k in keys if k not in measured]
    where = f" (this processor: {cpu_name()})" if any(here for _, _, here in measured.values()) else ""
    parts = [f"measured in committed SST-2 cells (median s/step, cells), scaled by prompt length: "
             f"{', '.join(found)}{where}"] if found else []
    if assumed:
        parts.append(f"assumed {ASSUMED_SECONDS_PER_STEP} s (no committed cell to measure): {', '.join(assumed)}")
    if not own:
        return "seconds per step " + "; ".join(parts)
    own_text = (f"seconds per step and evaluation of {len(own)} cell{'s' if len(own) > 1 else ''} from committed "
                f"runs of their own task, method and batch (medians)")
    return own_text + ("; of the others: " + "; ".join(parts) if parts else "")


def step_seconds(task: str, config: dict) -> float:
    """Seconds of one training step of ``config`` on ``task`` run alone (on a 2-core CPU, as :func:`step_rate`):
    the median of the committed runs on that task with the same method and step shape (:func:`task_measure`),
    else the method's SST-2 step scaled by the padded prompt length (:func:`prompt_length_factor`)."""
    found = task_measure(task, config)
    return found.step if found else step_rate(config) * prompt_length_factor(task, config)


def evaluation_seconds(task: str, config: dict) -> float:
    """Seconds of one evaluation in a training run of ``config`` on ``task`` (validation, and the test split at a
    new best): measured in the runs that price its step (:func:`task_measure`), else :data:`EVAL_SECONDS` scaled
    by the task's prompts (:func:`evaluation_factor`)."""
    found = task_measure(task, config)
    return found.evaluation if found and found.evaluation else EVAL_SECONDS * evaluation_factor(task)


def device_kind(config: dict) -> str:
    """The kind of device a cell or result config trains on ("cpu", "cuda", …; "cuda:1" is "cuda")."""
    return str(config.get("device") or "cpu").split(":")[0]


def bench_pack_shares(device: str, runs: int | None = None, benches: Path = RESULTS,
                      reference: str = "optimised") -> list[float]:
    """A packed run's share of the ``reference`` configuration's step (``optimised``: one run of the fused engine;
    ``eager``: the per-layer fp32 step), from the engine benchmarks (``prge bench --configs``, kind
    "engine-bench") under ``benches`` made on a ``device`` of this kind: per task, from the newest benchmark of
    that task (an older one measured an older engine), the reference's run-steps per second over the pack's
    (packs of ``runs`` runs where measured, else every pack measured; one width group and the grids' own step,
    without -lowp or -compiled). Empty where no benchmark of that device has both."""
    newest: dict[str, tuple[str, list[float]]] = {}
    for path in sorted(Path(benches).rglob("*.json")):
        try:
            bench = read_if_present(path)
            if bench.get("kind") != "engine-bench":
                continue
            if ("cpu" if str(bench["device"]).startswith("cpu") else "cuda") != device:
                continue
            when = str(bench["provenance"]["finished_at"])
            for task, measured in bench["tasks"].items():
                records = measured["configs"]
                alone = records.get(reference, {}).get("run_steps_per_s")
                packs = {r["runs"]: r["run_steps_per_s"] for k, r in records.items()
                         if k.startswith("packed-") and r.get("width_groups", 1) == 1 and not r.get("lowp_lora")
                         and not r.get("compiled")
                         and "run_steps_per_s" in r}
                chosen = [packs[runs]] if runs in packs else list(packs.values())
                shares = [alone / rate for rate in chosen if alone and rate]
                if shares and (task not in newest or when > newest[task][0]):
                    newest[task] = (when, shares)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):   # not an engine benchmark
            continue
    return [share for _, shares in newest.values() for share in shares]


def pack_step_share(device: str, results: Path = RESULTS, runs: int | None = None,
                    benches: Path = RESULTS, solo: dict | None = None) -> PackShare:
    """What a packed cell's steps cost, as a fraction of its solo steps, where that figure comes from and on which
    basis (:class:`PackShare`).

    Measured: a packed result records its pack's step (``step_s`` of a packed run is the whole pack's step)
    and the pack's size R, so one run's share of a step is the median step / R; divided by that run's solo step
    (:func:`step_seconds`), it is the fraction that carries over to another cell. The median over the packed
    results under ``results`` made on ``device`` is taken, whatever their pack size (a stated simplification:
    a run's share is taken not to depend on R). Without one, the engine benchmarks of that device
    (:func:`bench_pack_shares`, packs of ``runs`` where measured) give a packed run's share of a step the device's
    solo training results also took, which times their share of a CPU step (``solo``: :func:`device_shares` of
    ``device``, read here when not given) is the fraction of the CPU price. Like is set beside like: where solo
    results ran the per-layer step (``solo["layerwise"]``), the share of the benchmark's eager step, which is that
    step; else the share of its optimised run times the median solo share over every result (1 without any),
    which prices a pack too high wherever those results stepped slower than an optimised run. Without benchmarks
    either: :data:`PACK_ASSUMPTION`, a share of 1."""
    shares = []
    for path in sorted(Path(results).rglob("*.json")):
        try:
            result = read_if_present(path)
            packed, config, step = result["packed"], result["config"], result["step_s"]["median"]
            if device_kind(config) != device or not step or packed["runs"] < 1 or "same_run_as" in result:
                continue
            shares.append(step / packed["runs"] / step_seconds(result["task"], config))
        except (OSError, ValueError, KeyError, TypeError):     # not a packed training result: not a measure
            continue
    if not shares:
        solo = solo if solo is not None else device_shares(device, results)
        eager = bench_pack_shares(device, runs, benches, reference="eager") if solo.get("layerwise") else []
        if eager:
            share = statistics.median(eager)
            return PackShare(share * solo["layerwise"], (
                f"no packed result on {device}; its engine benchmarks (prge bench --configs, {len(eager)} pack and "
                f"task pairs) give a packed run {share:.2g} of the eager per-layer step's, the step its solo "
                f"per-layer results took: {solo['layerwise']:.2g} of the CPU's"), "eager")
        benched = bench_pack_shares(device, runs, benches)
        if not benched:
            return PackShare(1.0, PACK_ASSUMPTION, "assumed")
        share = statistics.median(benched)
        times = f"{solo['any']:.2g}, its solo steps' share of the CPU's" if solo["any"] else "1 (no solo result there)"
        return PackShare(share * (solo["any"] or 1.0), (
            f"no packed result on {device}; its engine benchmarks (prge bench --configs, {len(benched)} pack and "
            f"task pairs) give a packed run {share:.2g} of an optimised run's step, times {times}"), "optimised")
    share = statistics.median(shares)
    return PackShare(share, f"measured on {device} in {len(shares)} packed results: a cell's share of a pack step "
                            f"is {share:.2g} of its solo step", "measured")


def device_shares(device: str, results: Path = RESULTS) -> dict:
    """What training on ``device`` costs as a fraction of this CPU's price, from the solo (unpacked) training
    results made there: {"steps": {method: median of step / CPU step}, "any": that median over every method (None
    without results), "layerwise": the same over the P-RGE and MeZO (LoRA-FA) results that ran the per-layer fp32
    step (None without), "eval": median of evaluation seconds / their CPU price (None without), "count": results
    read, "how": where the figures come from}. On "cpu" every share is 1."""
    if device == "cpu":
        return {"steps": {}, "any": 1.0, "eval": 1.0, "count": 0, "layerwise": None,
                "how": "this CPU's measured steps"}
    steps, evals, layerwise = {}, [], []
    for path in sorted(Path(results).rglob("*.json")):
        try:
            result = read_if_present(path)
            config, step = result["config"], result["step_s"]["median"]
            if device_kind(config) != device or result.get("packed") or not step or "same_run_as" in result:
                continue
            steps.setdefault(config["method"], []).append(step / step_seconds(result["task"], config))
            if config["method"] in LORAFA_ZO and (config.get("engine") or IDENTITY_LEGACY["engine"]) == "layerwise" \
                    and config.get("dtype", "fp32") == "fp32":
                layerwise.append(steps[config["method"]][-1])
            price = len(result["evals"]) * evaluation_seconds(result["task"], config)
            evals.append(result["elapsed_s"]["eval_s"] / price)
        except (OSError, ValueError, KeyError, TypeError):     # not a training result: not a measure
            continue
    if not steps:
        return {"steps": {}, "any": None, "eval": None, "count": 0, "layerwise": None, "how": DEVICE_ASSUMPTION}
    every = [share for shares in steps.values() for share in shares]
    by_method = {method: statistics.median(shares) for method, shares in steps.items()}
    how = (f"{len(every)} solo training results on {device} ({', '.join(sorted(by_method))}): a step costs "
           + ", ".join(f"{by_method[m]:.2g}" for m in sorted(by_method)) + " of its CPU step, other methods the "
           f"median {statistics.median(every):.2g}; an evaluation {statistics.median(evals):.2g} of its CPU time")
    return {"steps": by_method, "any": statistics.median(every), "eval": statistics.median(evals),
            "count": len(every), "layerwise": statistics.median(layerwise) if layerwise else None, "how": how}


def device_step_share(shares: dict, method: str) -> float:
    """A method's step share from :func:`device_shares` (its own where measured, else the median over methods,
    else 1: :data:`DEVICE_ASSUMPTION`)."""
    return shares["steps"].get(method, shares["any"] if shares["any"] is not None else 1.0)


# The WikiText-2 curves (grid fig1): each method's median step and evaluation in the committed cpu cell, a step
# scaled linearly by the window length; without that file, this assumption:
LM_ASSUMPTION = ("no committed WikiText-2 cell: a step priced as its method's SST-2 step (step_rate), an "
                 "evaluation at 2 s")


def lm_seconds(seq_len: int, results: Path = RESULTS) -> tuple[dict, float, str]:
    """({method: seconds per step at ``seq_len``}, seconds per evaluation, where they come from) for the
    WikiText-2 curves, on this CPU."""
    measured = next(iter(grid_cells("fig1", "cpu")), None)
    path = None if measured is None else measured.result_path(results)
    try:
        result = read_if_present(path)
        runs, length = result["runs"], result["config"]["seq_len"]
        steps = {m: statistics.median(run["seconds"]) * seq_len / length for m, run in runs.items()}
        evaluation = statistics.median(run["eval_s"] / len(run["evals"]) for run in runs.values())
        return steps, evaluation, f"the committed cpu cell's median steps ({Path(path).name})"
    except (OSError, AttributeError, ValueError, KeyError, TypeError, statistics.StatisticsError):
        return {m: step_rate({"method": m}) for m in ("mebp", "mezo", "prge")}, 2.0, LM_ASSUMPTION


def estimate_seconds(cell: Cell, remaining_steps: int, step_share: float = 1.0, eval_share: float = 1.0) -> float:
    """Rough time of the rest of ``cell`` on a 2-core CPU (what --list prints): a training cell at 1 torch
    thread beside one other cell, a benchmark cell alone on the idle machine. ``step_share``: what the cell's
    steps cost as a fraction of its solo CPU steps (a cell in a pack: :func:`pack_step_share`; on another device:
    :func:`device_shares`); ``eval_share``: the same for its evaluations."""
    if cell.kind == "zeroshot":
        return EVAL_SECONDS * evaluation_factor(cell.task) * eval_share
    if cell.kind == "lm":
        c = cell.config()
        steps, evaluation, _ = lm_seconds(c["seq_len"])
        evals = sum(n // c["eval_every"][m] + 2 for m, n in c["lm_steps"].items())
        whole = sum(n * steps.get(m, step_rate({"method": m})) for m, n in c["lm_steps"].items()) * step_share + \
            evals * evaluation * eval_share
        return whole * min(1.0, remaining_steps / max(cell.steps(), 1))    # a resumed cell: its share left
    if cell.kind == "bench":
        c = cell.config()
        configs = len(configurations(c["methods"], c["qs"]))
        steps = configs * (c["repeats"] + 1) * 2     # timing rounds, then the peak's process
        a, b = BENCH_STEP_SECONDS[c["quant"]]
        return steps * a * (c["seq_len"] / 64) ** b + (configs + 1) * c["repeats"] * BENCH_LOAD_SECONDS
    c = cell.config()
    evals = remaining_steps // max(1, c.get("eval_every") or remaining_steps) + 1
    step = step_seconds(cell.task, c) * step_share
    return remaining_steps * step + evals * evaluation_seconds(cell.task, c) * eval_share
