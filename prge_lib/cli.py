"""The ``prge`` command line. ``prge zeroshot`` evaluates a task without training (chapter 0)."""
from __future__ import annotations

import argparse
import sys
import time

from .config import fast_mode, seed_everything
from .tasks import TASKS


def _zeroshot(args) -> int:
    from .data import sample_task
    from .evaluate import zero_shot
    from .models import load_model
    from .provenance import provenance, write_result
    from .tasks import get_task

    task = get_task(args.task)
    seed_everything(args.seed)
    start = time.perf_counter()
    data = sample_task(task, seed=args.seed)
    examples = data.test if args.n is None else data.test[:args.n]
    model, tokenizer = load_model(args.model, dtype=args.dtype, quant=args.quant)
    result = zero_shot(task, model, tokenizer, examples, batch_size=args.batch_size)
    wall = time.perf_counter() - start
    template = task.prompt(examples[0]) if task.kind != "mch" else " | ".join(
        c + x for c, x in task.options(examples[0]))
    output = {
        "kind": "zeroshot", "task": task.name, "title": task.title, "model": model.name_or_path,
        "dtype": args.dtype, "quant": args.quant, "split": "test", "seed": args.seed,
        "metric": result["metric"], "value": result["value"], "n": result["n"],
        "diagnostics": {k: result[k] for k in ("prediction_share", "auc", "exact_match") if k in result},
        "template_example": template, "label_words": list(task.label_words),
        "data_notes": data.notes + ([f"first {args.n} of the {len(data.test)} test examples"] if args.n else []),
        "predictions": result["predictions"],
        "provenance": provenance(wall),
    }
    write_result(args.out, output)
    print(f"{task.title}: {result['metric']} = {100 * result['value']:.1f}% on n = {result['n']} "
          f"({model.name_or_path}, {wall:.0f} s) -> {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prge", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    zs = sub.add_parser("zeroshot", help="evaluate a task without training and write a JSON result")
    zs.add_argument("--task", required=True, help=f"one of: {', '.join(TASKS)}")
    zs.add_argument("--model", default=None, help="hub id or local folder (default: the embedded SmolLM2-135M)")
    zs.add_argument("--n", type=int, default=None, help="evaluate the first N test examples (default: all)")
    zs.add_argument("--seed", type=int, default=0, help="data sampling seed (default 0)")
    zs.add_argument("--batch-size", type=int, default=16)
    zs.add_argument("--dtype", default="fp32", choices=["fp32", "fp16", "bf16"])
    zs.add_argument("--quant", default="none", choices=["none", "int8", "nf4"])
    zs.add_argument("--out", required=True, help="where to write the JSON result")
    zs.set_defaults(run=_zeroshot)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "n", None) is not None and args.n < 1:
        raise SystemExit(f"prge: --n must be at least 1, got {args.n}")
    if fast_mode():
        print("prge: fast mode (PRGE_FAST) is on", file=sys.stderr)
    try:
        return args.run(args)
    except (KeyError, ValueError, FileNotFoundError, RuntimeError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"prge: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
