"""``prge bench`` (the methods' step time and memory on synthetic batches) and ``prge footprint`` (each method built as the trainer builds it; chapter 9)."""
from __future__ import annotations

import json
import os
import sys
import time

from prge_lib.cli.common import add_config_options, add_model_options
from prge_lib.common.provenance import provenance, write_result
from prge_lib.data.tasks import get_task
from prge_lib.models.options import EMBEDDED
from prge_lib.training.checks import check_numbers



def _whole_numbers(text: str, option: str) -> list[int]:
    """A comma-separated list of whole numbers given to ``option``, or a ValueError naming it."""
    try:
        values = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        values = []
    if not values:
        raise ValueError(f"{option} takes whole numbers separated by commas, got {text!r}")
    return values


def bench_shapes(args) -> list[tuple[int, int, str]]:
    """``prge bench --method``'s shapes: (L, E, result file) for every --seq-len × --E (L outer), each shape's file
    named by --out with ``{seq_len}`` and ``{E}`` filled in. Several values of an option need its placeholder in
    --out, so that no shape's file overwrites another's; checked, with q, before anything runs."""
    lengths, batches = _whole_numbers(args.seq_len_list, "--seq-len"), _whole_numbers(args.E_list, "--E")
    check_numbers({"seq_len": lengths, "E": batches}, options=True)
    missing = [f"{{{key}}}" for key, values in (("seq_len", lengths), ("E", batches))
               if len(values) > 1 and f"{{{key}}}" not in args.out]
    if missing:
        raise ValueError(f"--out {args.out!r} names one file, but --seq-len and --E give "
                         f"{len(lengths) * len(batches)} shapes: put {' and '.join(missing)} in it, e.g. "
                         f"bench_L{{seq_len}}_E{{E}}.json")
    try:
        return [(L, E, args.out.format(seq_len=L, E=E)) for L in lengths for E in batches]
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(f"--out {args.out!r}: only {{seq_len}} and {{E}} may stand in braces ({err})") from None


SAME_BENCHMARK = ("kind", "device", "methods", "E", "q", "seq_len", "batches", "quant", "dtype", "model", "repeats",
                  "warmup", "peaks")


def this_machine() -> str:
    """The name ``prge bench --keep-done`` compares: this machine's GPU's, or its CPU's without one."""
    from prge_lib.common.provenance import hardware
    from prge_lib.experiments.gpu_results import device_name

    return device_name({"provenance": {"hardware": hardware()}})


def finished_shape(path: str, expected: dict, machine: str) -> bool:
    """Whether ``path`` already holds this shape's result (``prge bench --keep-done``): the same benchmark (every
    field of :data:`SAME_BENCHMARK`), made on ``machine`` (:func:`this_machine`) and in the same mode
    (``PRGE_FAST``). A file that is missing, unreadable or made otherwise is measured again."""
    from prge_lib.experiments.gpu_results import device_name
    from prge_lib.experiments.results import ResultFileError, read_if_present

    try:
        done = read_if_present(path)
    except (OSError, ResultFileError):                  # cut off mid-write, or not a result at all
        return False
    if done is None or any(done.get(key) != expected[key] for key in SAME_BENCHMARK):
        return False
    try:
        return device_name(done) == machine and \
            done["provenance"].get("fast_mode", "") == os.environ.get("PRGE_FAST", "")
    except (KeyError, TypeError, AttributeError):       # no provenance, or one of another shape
        return False


def run_bench(args) -> int:
    if args.configs:
        return run_engine_bench(args)
    if not args.method:
        raise ValueError("prge bench needs --method (the methods' step times) or --configs (the engine's "
                         "configurations: eager, optimised, packed-N, packed-max, packed-N-gK)")
    from prge_lib.experiments.bench.methods import bench
    from prge_lib.zo.rge import check_zo_settings

    names = [n.strip() for n in args.method.split(",") if n.strip()]
    try:
        qs = tuple(int(v) for v in args.q_list.split(","))
    except ValueError:
        raise ValueError(f"--q takes integers separated by commas, got {args.q_list!r}") from None
    check_numbers({"q": qs}, options=True)
    shapes = bench_shapes(args)
    for _, E, _ in shapes:
        for q in qs:
            check_zo_settings(q, E)
    spec = {"name": args.model, "dtype": args.dtype, "quant": args.quant, "device": args.device}
    machine = this_machine() if args.keep_done else None
    for L, E, out in shapes:        # one process for every shape: one start, one set of imports, one CUDA context
        start = time.perf_counter()
        fields = {"kind": "bench", "device": args.device, "methods": names, "E": E, "q": list(qs), "seq_len": L,
                  "batches": f"real {args.task} training batches (prompts cut to --seq-len)" if args.task
                  else "synthetic, full length, no padding",
                  "quant": args.quant, "dtype": args.dtype, "model": args.model or EMBEDDED,
                  "repeats": args.repeats, "warmup": args.warmup, "peaks": not args.no_peaks}
        if args.keep_done and finished_shape(out, fields, machine):
            print(f"shape L {L}, E {E}: kept {out} (the same benchmark on this machine)", file=sys.stderr)
            continue
        if len(shapes) > 1:
            print(f"shape L {L}, E {E} -> {out}", file=sys.stderr)
        result = bench(spec, names, E=E, qs=qs, seq_len=L, repeats=args.repeats, warmup=args.warmup,
                       task=args.task, peaks=not args.no_peaks, progress=lambda line: print(line, file=sys.stderr))
        result.update({**fields, "seed": 0, "provenance": provenance(time.perf_counter() - start, args.command_line)})
        write_result(out, result)
        for key, value in result["ratios"].items():
            print(f"{key}: {value:.3f}")
    return 0


def _one_number(text: str, option: str) -> int:
    values = _whole_numbers(text, option)
    if len(values) > 1:
        raise ValueError(f"{option} takes one value with --configs, got {text!r} (several shapes: --method)")
    return values[0]


def run_engine_bench(args) -> int:
    """``prge bench --configs …``: the GPU engine's configurations on real batches (experiments.bench.engine)."""
    from prge_lib.experiments.bench.engine import engine_bench, parse_configs
    from prge_lib.models.buckets import parse_buckets
    from prge_lib.models.loading import check_device, load_model
    from prge_lib.zo.rge import check_zo_settings

    configs = parse_configs(args.configs)
    tasks = [t.strip() for t in (args.task or "sst2,rte").split(",") if t.strip()]
    for task in tasks:
        get_task(task)
    try:
        q = int(args.q_list)
    except ValueError:
        raise ValueError(f"--q takes one integer with --configs, got {args.q_list!r}") from None
    E, seq_len = (_one_number(args.E_list, "--E"), _one_number(args.seq_len_list, "--seq-len"))
    check_zo_settings(q, E, dtype=args.dtype)
    check_numbers({"repeats": args.repeats, "max_pack": args.max_pack, "eval_examples": args.eval_examples},
                  options=True)
    buckets = parse_buckets(args.buckets)
    check_device(args.device)
    start = time.perf_counter()
    result = engine_bench(lambda dtype: load_model(args.model, dtype=dtype, device=args.device), configs, tasks,
                          q=q, E=E, seq_len=seq_len, buckets=buckets, dtype=args.dtype,
                          steps=args.repeats, warmup=args.warmup, max_pack=args.max_pack,
                          graphs=not args.no_graphs, progress=lambda line: print(line, file=sys.stderr),
                          profile=args.profile, eval_examples=args.eval_examples, traffic=args.traffic)
    result.update({"kind": "engine-bench", "configs": configs, "q": q, "E": E, "seq_len": seq_len,
                   **({"eval_examples": args.eval_examples} if any(c.startswith("eval-") for c in configs) else {}),
                   "buckets": list(buckets or []), "dtype": args.dtype, "model": args.model or EMBEDDED,
                   "batches": "real training batches (prompts cut to --seq-len)", "repeats": args.repeats,
                   "warmup": args.warmup, "seed": 0, "provenance": provenance(time.perf_counter() - start, args.command_line)})
    write_result(args.out, result)
    return 0


def run_gpu_check(args) -> int:
    """``prge gpu-check``: the GPU engine's checks (experiments.bench.gpu_checks), recorded with the device."""
    from prge_lib.experiments.bench.gpu_checks import CHECKS, gpu_checks
    from prge_lib.models.loading import check_device, load_model

    check_device(args.device)
    names = [n.strip() for n in args.checks.split(",") if n.strip()] if args.checks else list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown or not names:
        raise ValueError(f"--checks: unknown check(s) {unknown or [args.checks]}; choose from {list(CHECKS)}")
    start = time.perf_counter()
    checks = gpu_checks(lambda dtype: load_model(args.model, dtype=dtype, device=args.device)[0], names)
    failed = [name for name, check in checks.items() if check["passed"] is False]
    result = {"kind": "gpu-check", "device": args.device, "model": args.model or EMBEDDED, "checks": checks,
              "failed": failed, "seed": 0, "provenance": provenance(time.perf_counter() - start, args.command_line)}
    write_result(args.out, result)
    for name, check in checks.items():
        state = {True: "passed", False: "FAILED", None: "not run here"}[check["passed"]]
        print(f"{name}: {state} {json.dumps({k: v for k, v in check.items() if k != 'passed'})}")
    return 0


def gpu_check_options(gc) -> None:
    add_config_options(gc, ("model", "device"))
    gc.add_argument("--out", required=True, help="where to write the JSON result")
    gc.add_argument("--checks", default=None, help="comma-separated checks to run (default: all of them)")
    gc.set_defaults(run=run_gpu_check)


def run_footprint(args) -> int:
    from prge_lib.experiments.bench.footprint import footprint

    methods = [m.strip() for m in args.method.split(",") if m.strip()]
    start = time.perf_counter()
    rows = footprint(methods, seq_len=args.seq_len, rows=args.rows, steps=args.steps, warmup=args.warmup,
                     progress=lambda line: print(line, file=sys.stderr))
    result = {"kind": "footprint", "methods": methods, "seq_len": args.seq_len, "rows": args.rows,
              "steps": args.steps, "warmup": args.warmup, "model": EMBEDDED,
              "batches": "synthetic, full length, one answer token per row", "configs": rows,
              "seed": 0, "provenance": provenance(time.perf_counter() - start, args.command_line)}   # synthetic_batch's seed
    write_result(args.out, result)
    return 0


def bench_options(be) -> None:
    from prge_lib.experiments.bench.methods import CONFIGS

    be.add_argument("--method", default=None, help=f"comma-separated, from: {', '.join(CONFIGS)}")
    be.add_argument("--configs", default=None,
                    help="instead of --method: the engine's configurations, eager (the per-layer fp32 step), "
                         "eager-lK (that step with its rows in K forwards by length, --length-groups K), "
                         "optimised (fused, --dtype, buckets, CUDA graphs on a GPU), packed-N, packed-max, and "
                         "either pack with -gK (its runs in K forwards by batch width, e.g. packed-256-g4); on real "
                         "batches of --task (comma-separated, default sst2,rte): run-steps per second, MFU, ratios "
                         "to eager; eval-N: N runs' validation sets scored one run after another and in shared "
                         "forwards (examples per second both ways)")
    be.add_argument("--buckets", default="64,128,256", help="--configs: the length buckets of the optimised steps")
    be.add_argument("--max-pack", type=int, default=256, help="--configs: the largest pack packed-max tries")
    be.add_argument("--eval-examples", type=int, default=256,
                    help="--configs eval-N: validation examples each run scores")
    be.add_argument("--no-graphs", action="store_true", help="--configs: the optimised step without CUDA graphs")
    be.add_argument("--profile", action="store_true",
                    help="--configs: run one step of each configuration again under torch.profiler and record "
                         "where its time went (GPU kernels on a GPU, operators on the CPU; by kind and the top 15)")
    be.add_argument("--traffic", action="store_true",
                    help="--configs: run one step of each configuration again with the bytes its operators write and "
                         "read counted, by kind (matmul, attention, copy, noise, other) and the top 15: a count, the "
                         "same on any machine, not a timing (a pack's step eagerly, as its CUDA graph records it)")
    be.add_argument("--E", dest="E_list", default="16", help="effective batch E = q·B; several (--method): 1,8,16, each its own "
                                             "file (put {E} in --out)")
    be.add_argument("--q", dest="q_list", default="4", help="queries for the prge configurations; several: 1,4,16")
    be.add_argument("--seq-len", dest="seq_len_list", default="64", help="synthetic length (with --task: the longest prompt); several "
                                                   "(--method): 64,128,256, each its own file (put {seq_len} in --out)")
    be.add_argument("--task", default=None, help="time real training batches of this task instead (with "
                                                 "--configs: tasks, comma-separated)")
    be.add_argument("--repeats", type=int, default=5)
    be.add_argument("--warmup", type=int, default=1)
    be.add_argument("--no-peaks", action="store_true",
                    help="--method: step times only, without the peak memory of each configuration (on a CPU "
                         "metered in a fresh process per configuration, the slower part of a short benchmark)")
    be.add_argument("--keep-done", action="store_true",
                    help="--method: skip a shape whose --out file already holds the same benchmark made on this "
                         "machine (a benchmark cut short measures only the shapes it had not finished)")
    add_model_options(be)
    be.add_argument("--out", required=True, help="where to write the JSON result (several shapes: a pattern with "
                                                  "{seq_len} and {E}, e.g. b_L{seq_len}_E{E}.json)")
    be.set_defaults(run=run_bench)


def footprint_options(fp) -> None:
    from prge_lib.experiments.bench.footprint import COMPARED
    from prge_lib.methods import registry

    fp.add_argument("--method", default=",".join(COMPARED),
                    help=f"comma-separated, from: {', '.join(registry.names())} (default: {','.join(COMPARED)}); "
                         f"method:quant for another base, e.g. fo-lorafa:nf4")
    fp.add_argument("--seq-len", type=int, default=64, help="tokens per synthetic row")
    fp.add_argument("--rows", type=int, default=16, help="rows per step (E for ZO methods, the batch for FO)")
    fp.add_argument("--steps", type=int, default=3, help="timed steps per method")
    fp.add_argument("--warmup", type=int, default=1)
    fp.add_argument("--out", required=True, help="where to write the JSON result")
    fp.set_defaults(run=run_footprint)
