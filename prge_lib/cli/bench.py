"""``prge bench`` (the methods' step time and memory on synthetic batches) and ``prge footprint`` (each method built as the trainer builds it; chapter 9)."""
from __future__ import annotations

import sys
import time

from prge_lib.cli.common import add_model_options
from prge_lib.common.provenance import provenance, write_result
from prge_lib.models.options import EMBEDDED
from prge_lib.training.checks import check_numbers



def run_bench(args) -> int:
    from prge_lib.experiments.bench.methods import bench

    names = [n.strip() for n in args.method.split(",") if n.strip()]
    try:
        qs = tuple(int(v) for v in args.q_list.split(","))
    except ValueError:
        raise ValueError(f"--q takes integers separated by commas, got {args.q_list!r}") from None
    check_numbers({"q": qs}, options=True)
    start = time.perf_counter()
    spec = {"name": args.model, "dtype": args.dtype, "quant": args.quant, "device": args.device}
    result = bench(spec, names, E=args.E, qs=qs, seq_len=args.seq_len, repeats=args.repeats, warmup=args.warmup,
                   task=args.task, progress=lambda line: print(line, file=sys.stderr))
    result.update({"kind": "bench", "methods": names, "E": args.E, "q": list(qs), "seq_len": args.seq_len,
                   "batches": f"real {args.task} training batches (prompts cut to --seq-len)" if args.task
                   else "synthetic, full length, no padding",
                   "quant": args.quant, "dtype": args.dtype, "model": args.model or EMBEDDED,
                   "repeats": args.repeats, "warmup": args.warmup, "seed": 0,
                   "provenance": provenance(time.perf_counter() - start, args.command_line)})
    write_result(args.out, result)
    for key, value in result["ratios"].items():
        print(f"{key}: {value:.3f}")
    return 0


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

    be.add_argument("--method", required=True, help=f"comma-separated, from: {', '.join(CONFIGS)}")
    be.add_argument("--E", type=int, default=16, help="effective batch E = q·B")
    be.add_argument("--q", dest="q_list", default="4", help="queries for the prge configurations; several: 1,4,16")
    be.add_argument("--seq-len", type=int, default=64, help="synthetic length (with --task: the longest prompt)")
    be.add_argument("--task", default=None, help="time real training batches of this task instead")
    be.add_argument("--repeats", type=int, default=5)
    be.add_argument("--warmup", type=int, default=1)
    add_model_options(be)
    be.add_argument("--out", required=True, help="where to write the JSON result")
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
