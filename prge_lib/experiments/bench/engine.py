"""The GPU engine's benchmark (chapter 5): run-steps per second and model FLOP utilisation of the P-RGE step
as the CPU runs it (``eager``), optimised, and packed, on real training batches, all in one process so the
ratios compare like with like.

    eager        the per-layer step in fp32 with torch's noise: the CPU's path (prge_lib.zo.prge.PRGE)
    eager-lK     the same step with each forward's rows in K chunks of similar length, each padded to its own
                 longest row (--length-groups K; prge_lib.models.objective.grouped_copy_losses)
    optimised    the fused step (prge_lib.zo.fused) in the given dtype, counter noise, batches padded to length
                 buckets, replayed as a CUDA graph per shape on a GPU (prge_lib.zo.graphs)
    packed-N     N runs (seeds 0 … N−1) sharing each forward, fused, bucketed (prge_lib.zo.packing)
    packed-max   the largest pack, doubling from 8 (1 on the CPU) up to ``max_pack``, whose step fits memory
    …-gK         (packed-N-gK, packed-max-gK) each step's runs in K forwards by batch width (Pack.width_groups)
    …-lowp       (after any pack) the low-rank product x A_rᵀ in the base's dtype instead of fp32 (Pack.lowp_lora):
                 with an fp16 base, no fp32 copies of the projections' inputs; a measurement, not what grids run
    …-compiled   (after any pack, and after -lowp) the decoder through torch.compile (Pack.compiled): casts and
                 elementwise work fused between the products; a measurement, not what grids run; a failure to
                 compile is recorded as the configuration's ``error`` and the others still run
    eval-N       the validation sets of N runs of a pack scored one run after another, then in shared forwards
                 (Pack.each_own): examples per second both ways and their ratio, and whether the predictions
                 agree (at a pack's evaluations, every run scores its validation set, and often its test set)

``run_steps_per_s`` counts the steps of one run per second (a pack of R makes R per step). ``mfu`` divides the
FLOPs of the real tokens (padding not counted; :func:`forward_flops`) by the device's dense fp16 peak
(:data:`PEAK_FP16_FLOPS`, by device name; None where unknown, e.g. a CPU). ``real_token_share`` is the share of
the forward's token positions that hold real tokens (:func:`forward_tokens`): what the padding leaves of the
work the GPU does.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from prge_lib.common.measure import release_memory, time_steps
from prge_lib.data.splits import sample_task
from prge_lib.data.tasks import get_task
from prge_lib.experiments.bench.methods import BatchSource
from prge_lib.experiments.bench.profile import profile_step
from prge_lib.experiments.bench.traffic import count_step
from prge_lib.models.buckets import bucket_length, to_bucket
from prge_lib.models.objective import IGNORE, Batch, length_chunks
from prge_lib.zo.defaults import DEFAULT_TARGETS, LORA_ALPHA, LORA_R
from prge_lib.zo.fused import FusedPRGE
from prge_lib.zo.graphs import GraphedPRGE
from prge_lib.zo.lora import inject_lorafa
from prge_lib.zo.packing import build_pack, group_by_width
from prge_lib.zo.prge import PRGE
from prge_lib.zo.prng import compiles_on
from prge_lib.training.evaluate import zero_shot, zero_shot_many
from prge_lib.training.records import step_times

# dense (no sparsity) fp16 tensor-core peaks from the vendors' data sheets, FLOP/s; first match of all words wins
PEAK_FP16_FLOPS = ((("H200",), 989e12), (("H100", "PCIe"), 756e12), (("H100",), 989e12), (("A100",), 312e12))
FIXED = ("eager", "optimised", "packed-max")


def peak_flops(device_name: str) -> float | None:
    """The dense fp16 peak of a device named ``device_name`` (torch.cuda.get_device_name), None if not listed."""
    for words, peak in PEAK_FP16_FLOPS:
        if all(word.lower() in device_name.lower() for word in words):
            return peak
    return None


PACK_OPTIONS = ("-lowp", "-compiled")      # after a pack's name, in this order: Pack(lowp_lora=…, compiled=…)


def pack_options(name: str) -> tuple[str, dict]:
    """A packed configuration's name without its options, and the options (``lowp_lora``, ``compiled``) it names:
    packed-256-lowp-compiled → (packed-256, both True)."""
    options = {}
    for suffix, option in zip(reversed(PACK_OPTIONS), ("compiled", "lowp_lora")):
        if name.endswith(suffix):
            name, options[option] = name.removesuffix(suffix), True
    return name, options


def pack_spec(name: str) -> tuple[int | None, int] | None:
    """(runs, width groups) of a packed configuration's name: packed-N → (N, 1), packed-N-gK → (N, K),
    packed-max → (None, 1), packed-max-gK → (None, K), any of them with -lowp and/or -compiled after it the same;
    None for a name that is not one (N, K ≥ 1)."""
    parts = pack_options(name)[0].split("-")
    if len(parts) not in (2, 3) or parts[0] != "packed":
        return None
    size, groups = parts[1], parts[2] if len(parts) == 3 else "g1"
    if not (size == "max" or (size.isdigit() and int(size) >= 1)):
        return None
    if not (groups.startswith("g") and groups[1:].isdigit() and int(groups[1:]) >= 1):
        return None
    return (None if size == "max" else int(size)), int(groups[1:])


def eager_groups(name: str) -> int | None:
    """The length groups of an eager configuration's name (eager → 1, eager-lK → K ≥ 1), None for another name."""
    if name == "eager":
        return 1
    kind, _, size = name.partition("-l")
    return int(size) if kind == "eager" and size.isdigit() and int(size) >= 1 else None


def eval_spec(name: str) -> int | None:
    """The runs of an evaluation configuration's name (eval-N → N ≥ 1), None for a name that is not one."""
    kind, _, size = name.partition("-")
    return int(size) if kind == "eval" and size.isdigit() and int(size) >= 1 else None


def parse_configs(text: str) -> list[str]:
    """``eager,optimised,packed-8,packed-max,packed-256-g4,packed-256-lowp,eval-16`` as a list, each name checked
    (packed-N with N ≥ 1, an optional -gK with K ≥ 1 width groups, then optional -lowp and -compiled; eval-N with
    N ≥ 1)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if name in FIXED or pack_spec(name) is not None or eval_spec(name) is not None or eager_groups(name):
            continue
        raise ValueError(f"unknown engine configuration {name!r}; choose from {list(FIXED)}, eager-lK (K ≥ 1 length "
                         f"groups), packed-N (N ≥ 1), "
                         f"either pack with -gK (K ≥ 1 width groups, e.g. packed-256-g4), then -lowp and/or "
                         f"-compiled, or eval-N (N ≥ 1)")
    if not names:
        raise ValueError("--configs names no configuration")
    return names


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count reads of a Llama-style model's config."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    vocab: int

    @classmethod
    def of(cls, config) -> "ModelShape":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.hidden_size, config.intermediate_size, config.num_attention_heads,
                   config.num_key_value_heads, head_dim, config.num_hidden_layers, config.vocab_size)


def forward_flops(shape: ModelShape, tokens: int, targets: int, lora: Sequence[tuple[int, int]], r: int) -> int:
    """Multiply-add FLOPs (2 per multiply-add) of one row's forward over its ``tokens`` real tokens: the
    decoder's projections, causal attention over the n(n+1)/2 query-key pairs (scores and values), the LoRA-FA
    path of every adapted projection (``lora``: its (in, out); x Aᵀ then h Bᵀ), and the head at the ``targets``
    answer positions. Norms, rotary and softmax (elementwise) are left out."""
    s = shape
    q_width, kv_width = s.heads * s.head_dim, s.kv_heads * s.head_dim
    per_token = 2 * s.layers * (s.hidden * q_width + 2 * s.hidden * kv_width + q_width * s.hidden
                                + 3 * s.hidden * s.intermediate)
    attention = 2 * 2 * s.layers * q_width * tokens * (tokens + 1) // 2
    adapter = sum(2 * r * (fan_in + fan_out) for fan_in, fan_out in lora)
    return tokens * (per_token + adapter) + attention + targets * 2 * s.hidden * s.vocab


def step_flops(shape: ModelShape, batch: Batch, copies: int, lora: Sequence[tuple[int, int]], r: int) -> int:
    """FLOPs of a run's step: ``copies`` (2q) forwards of every row of ``batch``, real tokens only."""
    tokens = batch.attention_mask.sum(1).tolist()
    targets = (batch.targets != IGNORE).sum(1).tolist()
    return copies * sum(forward_flops(shape, n, t, lora, r) for n, t in zip(tokens, targets))


def forward_tokens(batches: Sequence[Batch], buckets: Sequence[int] | None) -> tuple[int, int]:
    """(real, computed) token positions of one forward over ``batches`` together (one run's, or a pack's runs'):
    every row is padded to the widest batch, rounded up to its bucket when ``buckets`` are given. A row's 2q
    copies scale both counts alike, so they are left out."""
    width = max(b.input_ids.shape[1] for b in batches)
    if buckets:
        width = bucket_length(width, buckets)
    rows = sum(b.input_ids.shape[0] for b in batches)
    return sum(int(b.attention_mask.sum()) for b in batches), rows * width


def real_token_share(steps: Sequence[Sequence[Batch]], buckets: Sequence[int] | None, groups: int = 1) -> float:
    """The share of real tokens among the positions the forwards of ``steps`` compute (each step a list of its
    runs' batches, one forward, or ``groups`` forwards by batch width as ``Pack.width_groups`` makes them):
    :func:`forward_tokens` summed over the forwards."""
    forwards = []
    for batches in steps:
        widths = {r: b.input_ids.shape[1] for r, b in enumerate(batches)}
        forwards += [[batches[r] for r in group] for group in group_by_width(list(widths), widths, groups)]
    real, computed = map(sum, zip(*(forward_tokens(batches, buckets) for batches in forwards)))
    return real / computed


def step_batches(source: BatchSource, runs: int, rows: int, t: int, device="cpu") -> list[Batch]:
    """The batches of step ``t`` of a pack of ``runs`` runs of ``rows`` rows (run r reads draw t·runs + r;
    a run alone, draw t), on ``device``: by default the host, where a pack assembles them."""
    if runs == 1:
        return [source(rows, t, device=device)]
    return [source(rows, t * runs + r, device=device) for r in range(runs)]


class _Timed:
    """A step function that keeps each call's batches, so that their FLOPs are counted after the timing."""

    def __init__(self, step: Callable[[int], list[Batch]]):
        self.step, self.batches = step, []

    def __call__(self, t: int) -> None:
        self.batches.append(self.step(t))


def measure(name: str, make_model: Callable[[str], tuple], source_for: Callable, dtype: str, q: int, E: int,
            buckets: Sequence[int] | None, steps: int, warmup: int, runs: int = 1, graphs: bool = True,
            eps: float = 1e-2, lr: float = 1e-9, width_groups: int = 1, profile: bool = False,
            traffic: bool = False) -> dict:
    """Time one configuration on a fresh model from ``make_model(dtype)``; ``source_for(model, tokenizer)``
    gives its batch source (rows, t) → Batch. Returns its record (without ``mfu`` and ratios); with
    ``profile``, the first timed step run once more under the profiler (``profile``: where its time went,
    :func:`~prge_lib.experiments.bench.profile.profile_step`; its shapes are recorded already); with
    ``traffic``, once more with its operators' bytes counted (``traffic``:
    :func:`~prge_lib.experiments.bench.traffic.count_step`; a pack's step eagerly, as its CUDA graph records it)."""
    groups = eager_groups(name)                 # None: not the per-layer step
    eager = groups is not None
    model, tokenizer = make_model("fp32" if eager else dtype)
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    source, pad = source_for(model, tokenizer), tokenizer.pad_token_id
    rows = E // q
    shape = ModelShape.of(model.config)
    record = {"config": name, "dtype": "fp32" if eager else dtype, "runs": runs, "q": q, "E": E,
              "rows_per_run": rows, "buckets": None if eager else list(buckets or [])}
    if eager:
        layers = inject_lorafa(model, DEFAULT_TARGETS, LORA_R, LORA_ALPHA, seed=0, noise="torch")
        method = PRGE(model, layers, q, eps, lr, 0, length_groups=groups)
        record.update(engine="layerwise", noise="torch", length_groups=min(groups, rows))
    elif runs == 1 and not name.startswith("packed"):
        layers = inject_lorafa(model, DEFAULT_TARGETS, LORA_R, LORA_ALPHA, seed=0, noise="counter")
        method = (GraphedPRGE if cuda and graphs else FusedPRGE)(model, layers, q, eps, lr, 0)
        record.update(engine="fused", noise="counter", cuda_graphs=cuda and graphs)
    else:
        settings = [{"targets": DEFAULT_TARGETS, "r": LORA_R, "alpha": LORA_ALPHA, "noise": "counter", "q": q,
                     "eps": eps, "lr": lr, "seed": seed, "keep_noise": True} for seed in range(runs)]
        options = pack_options(name)[1]
        pack = build_pack(model, settings, pad, fused=True, buckets=buckets, graphs=cuda and graphs,
                          width_groups=width_groups, **options)
        layers = pack.runs[0].layers
        record.update(engine="fused", noise="counter", cuda_graphs=cuda and graphs, width_groups=width_groups,
                      **options)
    lora = [(layer.in_features, layer.out_features) for layer in layers]

    def flops(batches: list[Batch]) -> int:
        return sum(step_flops(shape, b, 2 * q, lora, LORA_R) for b in batches)

    def bucketed(b: Batch) -> Batch:
        return b if eager else to_bucket(b, buckets, pad).to(device)

    if runs == 1 and not name.startswith("packed"):
        def one(t: int) -> list[Batch]:
            batch = bucketed(step_batches(source, 1, rows, t, device)[0])
            method.step(batch, t)
            return [batch]
        timed = _Timed(one)
    else:
        def packed(t: int) -> list[Batch]:
            # each run its own batch, made on the host: the pack assembles them there and copies the result once
            batches = step_batches(source, runs, rows, t)
            pack.step({r: (b, t) for r, b in enumerate(batches)})
            return batches
        timed = _Timed(packed)
    times = time_steps(timed, steps, warmup, cuda)
    median = statistics.median(times)
    counted = [flops(batches) for batches in timed.batches[warmup:]]           # the timed steps' real tokens
    if groups and groups > 1:                 # each length chunk is a forward of its own width
        share = real_token_share([[chunk] for batches in timed.batches[warmup:] for b in batches
                                  for _, chunk in length_chunks(b, groups)], None)
    else:
        share = real_token_share(timed.batches[warmup:], None if eager else buckets, width_groups)
    if not eager:             # the fused draw is compiled on a GPU unless switched off or not compilable there
        record["noise_compiled"] = compiles_on(device.type)
    record.update(step_s=step_times(times), run_steps_per_s=runs / median,
                  flops_per_step=statistics.mean(counted), flops_s=sum(counted) / sum(times),
                  real_token_share=share)
    if profile:
        record["profile"] = profile_step(lambda: timed(warmup), cuda)
    if traffic:
        if name.startswith("packed") and pack.compiled:
            record["traffic"] = {"not_counted": "a compiled forward's kernels are not operators to count"}
        elif name.startswith("packed"):
            pack.graphs, graphed = False, pack.graphs      # a replay dispatches nothing: count the step it records
            try:
                record["traffic"] = count_step(lambda: timed(warmup))
            finally:
                pack.graphs = graphed
        elif not (cuda and graphs and not eager):
            record["traffic"] = count_step(lambda: timed(warmup))
        else:
            record["traffic"] = {"not_counted": "a CUDA graph's replay dispatches no operators (count it on the CPU)"}
    del timed
    release_memory()
    return record


def measure_evaluation(name: str, make_model: Callable[[str], tuple], task: str, dtype: str, runs: int,
                       examples: int, batch_size: int = 16) -> dict:
    """Configuration eval-N: a pack of ``runs`` runs (seeds 0 … N−1) on a fresh model scores ``examples``
    validation examples of ``task`` per run, first one run after another (``Pack.solo``), then every run's in
    shared forwards (``Pack.each_own``), each way once after a warm-up evaluation."""
    model, tokenizer = make_model(dtype)
    device = next(model.parameters()).device
    settings = [{"targets": DEFAULT_TARGETS, "r": LORA_R, "alpha": LORA_ALPHA, "noise": "counter", "q": 1,
                 "eps": 1e-2, "lr": 1e-9, "seed": seed, "keep_noise": True} for seed in range(runs)]
    pack = build_pack(model, settings, tokenizer.pad_token_id, fused=True)
    spec = get_task(task)
    val = sample_task(spec, 0).val[:examples]

    def alone() -> list[dict]:
        results = []
        for r in range(runs):
            with pack.solo(r):
                results.append(zero_shot(spec, model, tokenizer, val, batch_size))
        return results

    def together() -> list[dict]:
        return zero_shot_many([(spec, val)] * runs, model, tokenizer, batch_size, rows=pack.each_own)

    seconds, predictions = {}, {}
    for way, evaluate in (("alone", alone), ("together", together)):
        def timed(t: int, way=way, evaluate=evaluate) -> None:
            predictions[way] = [result["predictions"] for result in evaluate()]
        seconds[way], = time_steps(timed, 1, 1, device.type == "cuda")      # after a warm-up evaluation
    scored = runs * len(val)
    record = {"config": name, "dtype": dtype, "runs": runs, "examples_per_run": len(val), "batch_size": batch_size,
              "alone_s": seconds["alone"], "together_s": seconds["together"],
              "examples_per_s_alone": scored / seconds["alone"],
              "examples_per_s_together": scored / seconds["together"],
              "together_over_alone": seconds["alone"] / seconds["together"],
              "same_predictions": predictions["alone"] == predictions["together"]}
    del pack, model
    release_memory()
    return record


def largest_pack(try_pack: Callable[[int], dict], start: int, cap: int) -> tuple[int, dict | None, list]:
    """Double the pack size from ``start`` while ``try_pack(R)`` (a measurement) runs without running out of
    memory, up to ``cap``; returns the largest R that ran, its record and what stopped each failed size."""
    size, best, stops = start, (0, None), []
    while size <= cap:
        try:
            best = (size, try_pack(size))
        except torch.OutOfMemoryError as err:
            stops.append({"runs": size, "error": str(err).splitlines()[0]})
            release_memory()
            break
        size *= 2
    return best[0], best[1], stops


def engine_bench(make_model: Callable[[str], tuple], configs: Sequence[str], tasks: Sequence[str],
                 q: int = 4, E: int = 16, seq_len: int = 256,
                 buckets: Sequence[int] | None = (64, 128, 256), dtype: str = "fp16", steps: int = 5,
                 warmup: int = 2, max_pack: int = 256, graphs: bool = True,
                 progress: Callable[[str], None] = print, profile: bool = False, eval_examples: int = 256,
                 traffic: bool = False) -> dict:
    """Measure ``configs`` on real training batches of each of ``tasks`` (prompts cut to ``seq_len``) and
    return, per task, each configuration's record with its ``mfu`` and its ratios to ``eager`` (when
    measured), plus the device's name and peak (with ``profile`` or ``traffic``, each record's ``profile`` or
    ``traffic``: :func:`measure`;
    eval-N: :func:`measure_evaluation` over ``eval_examples`` validation examples per run). ``make_model(dtype)``
    returns (model, tokenizer) on the device to measure."""
    configs = list(configs)
    probe, _ = make_model("fp32")
    device = next(probe.parameters()).device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    del probe
    peak = peak_flops(name) if device.type == "cuda" else None
    out = {"device": name, "peak_fp16_flops": peak, "tasks": {}}
    for task in tasks:
        def source_for(model, tokenizer, task=task):
            return BatchSource(model.config.vocab_size, seq_len, task, tokenizer, device=next(model.parameters()).device)

        def run(config: str, runs: int = 1, groups: int = 1) -> dict:
            return measure(config, make_model, source_for, dtype, q, E, buckets, steps, warmup, runs, graphs,
                           width_groups=groups, profile=profile, traffic=traffic)

        records = {}
        for config in configs:
            if eval_spec(config) is not None:
                record = records[config] = measure_evaluation(config, make_model, task, dtype, eval_spec(config),
                                                              eval_examples)
                progress(f"{task} {config}: {record['examples_per_s_together']:.1f} examples/s together, "
                         f"{record['together_over_alone']:.2f}× one run after another")
                continue
            spec = pack_spec(config)
            if spec is not None and spec[0] is None:                 # packed-max(-gK)
                size, record, stops = largest_pack(lambda r: run(config, r, spec[1]),
                                                   8 if device.type == "cuda" else 1, max_pack)
                if record is None:
                    records[config] = {"config": config, "error": "no pack fit", "stops": stops}
                    continue
                record["stops"] = stops
            elif spec is not None and pack_options(config)[1].get("compiled"):
                try:              # a compiler that fails here (no Triton, a capture it breaks): said, the rest run
                    record = run(config, *spec)
                except torch.OutOfMemoryError:
                    raise
                except Exception as err:
                    release_memory()
                    records[config] = {"config": config, "error": error_line(err)}
                    progress(f"{task} {config}: failed ({records[config]['error']})")
                    continue
            elif spec is not None:
                record = run(config, *spec)
            elif config == "optimised" and graphs and device.type == "cuda":
                try:
                    record = run(config)
                except torch.OutOfMemoryError:
                    raise
                except Exception as err:          # a capture that fails: measured without graphs, and said so
                    release_memory()
                    record = measure(config, make_model, source_for, dtype, q, E, buckets, steps, warmup, 1, False)
                    record["graphs_error"] = error_line(err)
            else:
                record = run(config)
            record["mfu"] = None if peak is None else record["flops_s"] / peak
            records[config] = record
            progress(f"{task} {config}: {record['run_steps_per_s']:.2f} run-steps/s"
                     + ("" if record["mfu"] is None else f", MFU {100 * record['mfu']:.2f}%"))
        out["tasks"][task] = {"configs": records, "ratios": engine_ratios(records)}
    return out


def error_line(err: Exception) -> str:
    """An exception as its type and the first line of its message, for a record."""
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def engine_ratios(records: dict) -> dict:
    """Each configuration's run-steps per second over eager's (both from ``records``, one run)."""
    eager = records.get("eager", {}).get("run_steps_per_s")
    if not eager:
        return {}
    return {f"{name}_over_eager": r["run_steps_per_s"] / eager for name, r in records.items()
            if name != "eager" and "run_steps_per_s" in r}
