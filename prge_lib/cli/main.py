"""The ``prge`` command line: ``zeroshot`` evaluates a task without training (chapter 0), ``train`` fine-tunes
with any method and ``bench`` times the methods on synthetic batches (chapters 1–7)."""
from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
import sys
import time
from pathlib import Path

from prge_lib.common.settings import fast_mode, seed_everything
from prge_lib.models.options import EMBEDDED
from prge_lib.zo.defaults import DEFAULT_TARGETS, LORA_ALPHA, LORA_R
from prge_lib.common.provenance import check_writable, provenance, record_command, start_commit, write_result
from prge_lib.data.tasks import TASKS
from prge_lib.training.checks import check_numbers


def _note(line: str) -> None:
    print(f"prge: note: {line}", file=sys.stderr)


def _zeroshot(args) -> int:
    from prge_lib.data.splits import sample_task
    from prge_lib.training.evaluate import zero_shot
    from prge_lib.models.loading import load_model
    from prge_lib.data.tasks import get_task

    task = get_task(args.task)
    seed_everything(args.seed)
    start = time.perf_counter()
    data = sample_task(task, seed=args.seed)
    examples = data.test if args.n is None else data.test[:args.n]
    model, tokenizer = load_model(args.model, dtype=args.dtype, quant=args.quant, device=args.device)
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


def _train(args) -> int:
    from prge_lib.zo.lora import save_adapter
    from prge_lib.methods import registry
    from prge_lib.training.checkpoints import CHECKPOINT_NAME, check_checkpoint_folder
    from prge_lib.training.config import TrainConfig
    from prge_lib.training.trainer import Trainer, TrainingDiverged

    config = TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
                            if hasattr(args, f.name)})
    config.resolved()      # refuse bad settings before loading anything
    if config.program:
        from prge_lib.deploy.export import check_program
        check_program(config.program, say=_note)
    for option in ("resume", "restart"):
        if getattr(args, option) and not args.checkpoint_dir:
            raise ValueError(f"--{option} needs --checkpoint-dir (the folder of the run to continue or discard)")
    if args.checkpoint_dir:     # an existing checkpoint is continued or discarded, never overwritten unasked
        check_checkpoint_folder(Path(args.checkpoint_dir) / CHECKPOINT_NAME, args.resume, args.restart)
    start = time.perf_counter()
    builder = None
    if config.program:      # every step in an exported program: the runtime host builds the method
        from prge_lib.deploy.runtime import build_program_method as builder
    trainer = Trainer(config, checkpoint_dir=args.checkpoint_dir, method_builder=builder)
    status, message = "finished", None
    try:
        result = trainer.run(resume=args.resume, restart=args.restart)
    except KeyboardInterrupt:
        saved = trainer.checkpoint_path()
        where = f"the last checkpoint ({saved}) is kept: rerun with --resume" if saved and saved.is_file() \
            else "no checkpoint was written (use --checkpoint-dir)"
        print(f"prge: interrupted during step {trainer.step + 1}; {where}", file=sys.stderr)
        return 130
    except TrainingDiverged as err:
        status, message = "diverged", str(err)
        result = {"kind": "train", "task": config.task, "method": config.method, "seed": config.seed,
                  "config": dataclasses.asdict(trainer.config), "steps": trainer.step, "losses": trainer.history["losses"],
                  "evals": trainer.history["evals"]}
    result.update({"status": status, "model": config.model or EMBEDDED,
                   "provenance": provenance(time.perf_counter() - start)})
    if message:
        result["error"] = message
    write_result(args.out, result)
    if message:
        print(f"prge: error: {message}; partial result -> {args.out}", file=sys.stderr)
        return 3
    if args.save_adapter:
        # the methods over prge_lib.zo.lora's LoRA-FA layers: those whose noise source can be chosen
        lorafa = registry.users("noise")
        if config.method not in lorafa:
            label = config.method if config.adapter == "none" else f"{config.method} --adapter {config.adapter}"
            print(f"prge: --save-adapter applies to {' and '.join(lorafa)} only; not saved for {label}",
                  file=sys.stderr)
        else:
            save_adapter(trainer.model, args.save_adapter, {"task": config.task, "method": config.method})
    best, final = result["best_val"], result["final"]
    print(f"{result['title']} {config.method}: {len(result['losses'])} steps, median "
          f"{result['step_time_s']['median']:.3f} s/step; test {100 * best['test']:.1f} at the best validation "
          f"step {best['step']} (val {100 * best['val']:.1f}), {100 * final['test']:.1f} at the end -> {args.out}")
    return 0


def _bench(args) -> int:
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
                   "provenance": provenance(time.perf_counter() - start)})
    write_result(args.out, result)
    for key, value in result["ratios"].items():
        print(f"{key}: {value:.3f}")
    return 0


def _footprint(args) -> int:
    from prge_lib.experiments.bench.footprint import footprint

    methods = [m.strip() for m in args.method.split(",") if m.strip()]
    start = time.perf_counter()
    rows = footprint(methods, seq_len=args.seq_len, rows=args.rows, steps=args.steps, warmup=args.warmup,
                     progress=lambda line: print(line, file=sys.stderr))
    result = {"kind": "footprint", "methods": methods, "seq_len": args.seq_len, "rows": args.rows,
              "steps": args.steps, "warmup": args.warmup, "model": EMBEDDED,
              "batches": "synthetic, full length, one answer token per row", "configs": rows,
              "seed": 0, "provenance": provenance(time.perf_counter() - start)}   # synthetic_batch's seed
    write_result(args.out, result)
    return 0


def _export(args) -> int:
    from prge_lib.deploy.export import export_training_program

    record = export_training_program(args.task, args.out, model=args.model, layers=args.layers, q=args.q,
                                     E=args.E, seq_len=args.seq_len, r=args.r, alpha=args.alpha,
                                     targets=tuple(args.targets.split(",")), seed=args.seed,
                                     backend=args.backend, dtype=args.dtype)
    s = record["settings"]
    print(f"exported the P-RGE step ({s['layers']} layers, q = {s['q']}, {s['rows']} rows of {s['seq_len']} "
          f"tokens, {s['backend']}, {s['dtype']}): export {record['export_s']:.0f} s, lowering {record['lower_s']:.0f} s, "
          f"{record['pte_bytes'] / 2**20:.0f} MiB -> {args.out} (settings in {Path(args.out).with_suffix('.json')})")
    return 0


def _device_train(args) -> int:
    from prge_lib.deploy.export import read_program_meta
    from prge_lib.deploy.device_train import train_in_runtime

    if read_program_meta(args.pte)["settings"]["task"] != args.task:
        print(f"prge: note: the program was exported for another task; training it on {args.task}",
              file=sys.stderr)
    sizes = {k: v for k, v in {"n_train": args.n_train, "n_val": args.n_val, "n_test": args.n_test}.items()
             if v is not None}
    start = time.perf_counter()
    result = train_in_runtime(args.pte, args.task, args.steps, lr=args.lr, eps=args.eps,
                              eval_every=args.eval_every, check_eager=args.check_eager,
                              checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                              resume=args.resume, restart=args.restart, save_adapter_to=args.save_adapter,
                              host=args.host, **sizes)
    result["provenance"] = provenance(time.perf_counter() - start)
    write_result(args.out, result)
    if args.check_eager:
        print(f"parity with eager P-RGE over {result['parity']['steps']} steps: largest relative loss "
              f"difference {result['parity']['max_rel_loss_diff']:.1e}", file=sys.stderr)
    best, host = result["best_val"], result["host"]
    print(f"{result['title']} in the runtime, {args.host} host ({host['machine']}"
          f"{', emulated' if host['emulated'] else ''}): {len(result['losses'])} steps, median "
          f"{result['step_time_s']['median']:.3f} s/step, peak resident {host['peak_resident_mib'] or float('nan'):.0f} MiB; "
          f"validation {100 * result['evals'][0]['val']:.1f} at "
          f"step {result['evals'][0]['step']} -> {100 * best['val']:.1f} at step {best['step']}; "
          f"test {100 * best['test']:.1f} -> {args.out}")
    return 0 if not args.check_eager or result["parity"]["within_1e-4"] else 4


def _device_bench(args) -> int:
    from prge_lib.deploy.export import check_program
    from prge_lib.experiments.bench.program import compare, profile

    start = time.perf_counter()
    settings = check_program(args.pte, say=_note)["settings"]
    result = {"kind": "device-bench", "program": Path(args.pte).name, "program_settings": settings,
              "repeats": args.repeats, "warmup": args.warmup, "seed": 0,
              "inputs": "one random batch of the program's shapes, no padding, fed to both sides",
              **compare(args.pte, args.repeats, args.warmup)}
    if args.profile:
        result["profile"] = profile(args.pte)
    result["provenance"] = provenance(time.perf_counter() - start)
    write_result(args.out, result)
    rt, eg = result["runtime"], result["eager"]
    print(f"step: runtime {rt['median_s']:.3f} s, eager {eg['median_s']:.3f} s "
          f"(eager/runtime {result['eager_over_runtime']:.2f}); resident after loading: runtime "
          f"{rt['resident_after_first_step_mib']:.0f} MiB, eager {eg['resident_after_first_step_mib']:.0f} MiB "
          f"-> {args.out}")
    return 0


def _reproduce(args) -> int:
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
    if args.device != "cpu":
        benchmarks = [g for g in rp.GRIDS if any(row.method == "bench" for row in rp.GRIDS[g]["rows"])]
        if args.grid in benchmarks:
            raise ValueError(f"--device {args.device}: the {args.grid!r} grid times this machine's CPU, so it has "
                             f"no device option; --device applies to the other grids, not to {benchmarks}")
        from prge_lib.models.loading import check_device
        check_device(args.device)      # before any cell starts, naming what this torch can use
        overrides["device"] = args.device
    cells = rp.grid_cells(args.grid, args.profile, seeds, args.only, args.model, **overrides)
    if not cells:
        raise ValueError(f"no cell of grid {args.grid!r} matches --only {args.only!r}; "
                         f"prge reproduce {args.grid} --list shows the names")
    if args.list or args.dry_run:
        print(rp.list_cells(cells, **roots))
        if args.dry_run:
            for cell in cells:
                if not cell.result_path(roots["results"]).is_file():
                    print(f"would run: {cell.command()}")
        return 0
    deadline = None
    if args.time_limit is not None:
        if not (math.isfinite(args.time_limit) and args.time_limit > 0):
            raise ValueError(f"--time-limit takes minutes > 0, got {args.time_limit}")
        deadline = time.time() + 60 * args.time_limit
    rp.run_grid(cells, args.backend, args.address, progress=True, cpus_per_cell=args.cpus_per_cell,
                say=lambda line: print(f"prge: {line}", file=sys.stderr), deadline=deadline, restart=args.restart,
                **roots)
    left = [c for c in cells if not c.result_path(roots["results"]).is_file()]
    if left:                            # the time limit stopped the grid, or a Ray task stopped
        print(f"prge: {len(left)} of {len(cells)} cells still to run; the same command continues "
              f"(exit status {EXIT_CELLS_LEFT})", file=sys.stderr)
        return EXIT_CELLS_LEFT
    return 0


# `prge reproduce` stopped with cells left to run (a --time-limit): distinct from success (0) and bad input (2)
EXIT_CELLS_LEFT = 3
# a setting, file or data row refused (argparse exits with 2 for its own errors too)
EXIT_BAD_INPUT = 2


def _bundle_build(args) -> int:
    from prge_lib.deploy import bundle

    check_writable(args.bundle_out, True, "--out")
    if not (args.part_mib > 0 and math.isfinite(args.part_mib)):
        raise ValueError(f"--part-mib takes a size in MiB > 0, got {args.part_mib}")
    def names(text):
        return [n.strip() for n in (text or "").split(",") if n.strip()]

    settings = bundle.plan(args.profile, names(args.with_wheels), names(args.skip_installed_on_box), args.python,
                           args.platform)
    for item in settings.pop("skipped"):
        print(f"prge: {item} is left out: the machine has it (--skip-installed-on-box or the profile)",
              file=sys.stderr)
    manifest = bundle.build_bundle(args.bundle_out, **settings, part_bytes=max(1, int(args.part_mib * 2**20)),
                                   say=lambda line: print(f"prge: {line}", file=sys.stderr))
    print("\n".join(bundle.listing(manifest)))
    print(f"-> {args.bundle_out}: copy every file in it to the machine, then run python3 install.py --check-only "
          f"there, and python3 install.py [--target DIR]")
    return 0


def _options_bundle(bu) -> None:
    from prge_lib.deploy.bundle import DEFAULT_PART_MIB, PROFILES

    build = bu.add_subparsers(dest="bundle_command", required=True).add_parser(
        "build", help="download and split the bundle into --out",
        description="Profiles: " + "; ".join(f"{name}: {', '.join(p.wheels)} and the project's wheel, for "
                                              f"{p.note}" for name, p in PROFILES.items())
        + ". Add wheels with --with (e.g. --with datasets,executorch: each at the version pyproject requires, "
          "or name==version); leave out what the machine has with --skip-installed-on-box. Wheels come "
          "without their dependencies (pip download --no-deps): name those the machine lacks too.")
    build.add_argument("--out", dest="bundle_out", required=True, metavar="DIR", help="the bundle folder (new, empty, or an "
                                                                       "earlier bundle to replace)")
    build.add_argument("--profile", default="gpu-box", choices=list(PROFILES), help="the kind of machine "
                       "(default gpu-box: the project's GPU machine)")
    build.add_argument("--python", default=None, metavar="3.N", help="the machine's Python as 3.N (default: the profile's)")
    build.add_argument("--platform", action="append", default=None, metavar="TAG",
                       help="the machine's wheel platform tag (repeatable; default: the profile's); "
                            "manylinux_2_N_ARCH also takes wheels for older glibc")
    build.add_argument("--part-mib", type=float, default=DEFAULT_PART_MIB, metavar="MIB",
                       help=f"split files larger than this into parts (default {DEFAULT_PART_MIB}: the machine "
                            f"receives at most 64 MiB per copy)")
    build.add_argument("--with", dest="with_wheels", default=None, metavar="NAMES",
                       help="more wheels, comma-separated (names or requirements)")
    build.add_argument("--skip-installed-on-box", default=None, metavar="NAMES",
                       help="packages the machine has, comma-separated (besides the profile's): not downloaded")
    build.set_defaults(run=_bundle_build)


MODEL_OPTIONS = ("model", "dtype", "quant", "device")


def _add_model_options(p) -> None:
    _add_config_options(p, MODEL_OPTIONS)


def _add_config_options(p, names=None) -> None:
    """Options built from TrainConfig's fields (all of them, or ``names``): each setting is declared once,
    with its default, help and choices, in ``prge_lib.training.trainer.TrainConfig``."""
    from prge_lib.training.config import TrainConfig

    for f in dataclasses.fields(TrainConfig):
        if "help" not in f.metadata or (names is not None and f.name not in names):
            continue
        settings = {k: v() if callable(v) else v     # a function: what is registered now (method names)
                    for k, v in f.metadata.items() if k in ("help", "choices", "required")}
        flag = "--" + f.name.replace("_", "-")
        kind = str(f.type)
        if f.name == "task":
            settings["help"] = f"one of: {', '.join(TASKS)}"
        elif kind.startswith("bool"):
            settings["action"] = "store_true" if f.default is False else argparse.BooleanOptionalAction
            settings["default"] = f.default
        elif kind.startswith("tuple"):
            settings.update(type=lambda text: tuple(text.split(",")), default=f.default)
        else:
            settings.update(type=int if kind.startswith("int") else float if kind.startswith("float") else str,
                            default=f.default)
        p.add_argument(flag, **settings)


def _method_defaults() -> str:
    """``prge train``'s description: each registered method's defaults, and those over a peft adapter."""
    from prge_lib.methods import registry

    def listed(values) -> str:
        return ", ".join(f"{k}={v}" for k, v in values.items())

    specs = [registry.get(m) for m in registry.names()]
    return ("Defaults per method (each with its source in prge_lib.methods.registry): "
            + "; ".join(f"{s.name}: {listed(s.defaults)}" for s in specs)
            + "".join(f"; {s.name} with an adapter: {listed(s.adapter_defaults)}" for s in specs if s.adapter_defaults))


def _options_zeroshot(zs) -> None:
    zs.add_argument("--task", required=True, help=f"one of: {', '.join(TASKS)}")
    zs.add_argument("--n", type=int, default=None, help="evaluate the first N test examples (default: all)")
    zs.add_argument("--seed", type=int, default=0, help="data sampling seed (default 0)")
    zs.add_argument("--batch-size", type=int, default=16)
    _add_model_options(zs)
    zs.add_argument("--out", required=True, help="where to write the JSON result")
    zs.set_defaults(run=_zeroshot)


def _options_train(tr) -> None:
    _add_config_options(tr)
    tr.add_argument("--checkpoint-dir", default=None, help="folder for the checkpoint (written atomically)")
    tr.add_argument("--resume", action="store_true", help="continue the run saved in --checkpoint-dir")
    tr.add_argument("--restart", action="store_true",
                    help="discard the checkpoint in --checkpoint-dir and start the run again (without --resume or "
                         "--restart, an existing checkpoint is refused)")
    tr.add_argument("--save-adapter", default=None, help="write the trained LoRA-FA adapter (safetensors)")
    tr.add_argument("--out", required=True, help="where to write the JSON result")
    tr.set_defaults(run=_train)


def _options_export(ex) -> None:
    ex.add_argument("--task", required=True, help=f"one of: {', '.join(TASKS)} (sets the answer width)")
    ex.add_argument("--model", default=None, help=f"hub id or local folder (default: the embedded {EMBEDDED})")
    ex.add_argument("--layers", type=int, default=None, help="keep only the first N decoder layers")
    ex.add_argument("--q", type=int, default=4, help="queries per step")
    ex.add_argument("--E", type=int, default=16, help="effective batch E = q·B")
    ex.add_argument("--seq-len", type=int, default=64, help="the program's fixed prompt length")
    ex.add_argument("--r", type=int, default=LORA_R, help=f"LoRA-FA rank (default {LORA_R})")
    ex.add_argument("--alpha", type=float, default=LORA_ALPHA, help=f"LoRA alpha (default {LORA_ALPHA})")
    ex.add_argument("--targets", default=",".join(DEFAULT_TARGETS), help="comma-separated projection names")
    ex.add_argument("--seed", type=int, default=0, help="LoRA-A initialisation and the run's noise seeds")
    ex.add_argument("--backend", default="xnnpack", choices=["xnnpack", "portable"])
    ex.add_argument("--dtype", default="fp32", choices=["fp32", "fp16"],
                    help="precision of the frozen weights (the adapter and its update stay fp32)")
    ex.add_argument("--out", required=True, help="the .pte to write (its settings go to the .json beside it)")
    ex.set_defaults(run=_export)


def _options_device_train(dt) -> None:
    dt.add_argument("--pte", required=True, help="a program written by `prge export`")
    dt.add_argument("--task", required=True)
    dt.add_argument("--steps", type=int, default=100)
    dt.add_argument("--lr", type=float, default=None)
    dt.add_argument("--eps", type=float, default=None)
    dt.add_argument("--eval-every", type=int, default=0)
    dt.add_argument("--n-train", type=int, default=None)
    dt.add_argument("--n-val", type=int, default=None)
    dt.add_argument("--n-test", type=int, default=None)
    dt.add_argument("--check-eager", action="store_true",
                    help="also run eager P-RGE with the same seeds and compare the per-step losses")
    dt.add_argument("--checkpoint-dir", default=None,
                    help="folder for the runtime run's checkpoint (the eager twin's goes to its eager/ subfolder)")
    dt.add_argument("--checkpoint-every", type=int, default=100)
    dt.add_argument("--resume", action="store_true",
                    help="continue the run saved in --checkpoint-dir with a freshly loaded program")
    dt.add_argument("--restart", action="store_true",
                    help="discard the run saved in --checkpoint-dir and start again (without --resume or --restart, "
                         "an existing one is refused)")
    dt.add_argument("--save-adapter", default=None,
                    help="write the adapter trained in the runtime (safetensors, loadable with load_adapter)")
    from prge_lib.deploy.device_train import HOSTS
    dt.add_argument("--host", default="python", choices=HOSTS,
                    help="what drives the program: this Python process (default), the C++ trainer built for this "
                         "machine (native), or built for aarch64 and run under qemu (native-aarch64); chapter 10")
    dt.add_argument("--out", required=True, help="where to write the JSON result")
    dt.set_defaults(run=_device_train)


def _options_device_bench(db) -> None:
    db.add_argument("--pte", required=True, help="a program written by `prge export`")
    db.add_argument("--repeats", type=int, default=5, help="timed steps per side (the median is reported)")
    db.add_argument("--warmup", type=int, default=1)
    db.add_argument("--profile", action="store_true", help="also trace the runtime's operators (ETDump)")
    db.add_argument("--out", required=True, help="where to write the JSON result")
    db.set_defaults(run=_device_bench)


def _options_reproduce(rp) -> None:
    from prge_lib.experiments.reproduce import BACKENDS, GRIDS, PROFILES

    rp.add_argument("grid", choices=list(GRIDS), help="the table to reproduce")
    rp.add_argument("--profile", default="cpu", choices=PROFILES,
                    help="cpu: a budget for a 2-core CPU; paper: Gao et al. App. C (default cpu)")
    rp.add_argument("--only", default=None,
                    help="run the cells whose name contains this text (comma-separated: all must match)")
    rp.add_argument("--seeds", default=None, help="comma-separated seeds instead of the profile's")
    rp.add_argument("--list", action="store_true", help="show each cell as done / running / partial / missing / "
                                                         "unreadable, with the time left, and exit")
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
                    "running training cell stops at a checkpoint that the same command resumes")
    rp.add_argument("--device", default="cpu", help="cpu or cuda: where training and zero-shot cells run (the "
                    "result records it; on cuda the ZO noise comes from torch's CUDA generator)")
    rp.add_argument("--results-dir", default=None, help="where result files go (default data/results)")
    rp.add_argument("--checkpoint-root", default=None, help="where checkpoints go (default: reproduce/ in PRGE_CACHE_DIR, ~/.cache/prge)")
    rp.set_defaults(run=_reproduce)


def _options_bench(be) -> None:
    from prge_lib.experiments.bench.methods import CONFIGS

    be.add_argument("--method", required=True, help=f"comma-separated, from: {', '.join(CONFIGS)}")
    be.add_argument("--E", type=int, default=16, help="effective batch E = q·B")
    be.add_argument("--q", dest="q_list", default="4", help="queries for the prge configurations; several: 1,4,16")
    be.add_argument("--seq-len", type=int, default=64, help="synthetic length (with --task: the longest prompt)")
    be.add_argument("--task", default=None, help="time real training batches of this task instead")
    be.add_argument("--repeats", type=int, default=5)
    be.add_argument("--warmup", type=int, default=1)
    _add_model_options(be)
    be.add_argument("--out", required=True, help="where to write the JSON result")
    be.set_defaults(run=_bench)


def _options_footprint(fp) -> None:
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
    fp.set_defaults(run=_footprint)


def _subcommands() -> dict:
    """Each subcommand: its help, its description (a function: built only for that subcommand) and the function
    that adds its options. Options are added only to the subcommand being run, so ``prge X --help`` imports
    only what X needs."""
    return {
        "zeroshot": ("evaluate a task without training and write a JSON result", None, _options_zeroshot),
        "train": ("fine-tune a task with one method and write a JSON result", _method_defaults, _options_train),
        "export": ("export the P-RGE training step as an ExecuTorch program (chapter 10)", None, _options_export),
        "device-train": ("train with an exported program in the ExecuTorch runtime", None, _options_device_train),
        "device-bench": ("a program's step in the runtime beside the same step eager: time, memory, and "
                         "(--profile) where the runtime spends it", None, _options_device_bench),
        "reproduce": ("run the cells of a paper table (resumable; chapter 7)",
                      "Runs every cell of a grid that has no result yet; an interrupted cell resumes from its "
                      "checkpoint, so rerunning continues where it stopped.", _options_reproduce),
        "bench": ("time and measure methods on synthetic full-length batches", None, _options_bench),
        "footprint": ("memory held, step peak and step time of the training methods, each built as the trainer "
                      "builds it (chapter 9)", None, _options_footprint),
        "bundle": ("wheels, the embedded model and the shipped data for a machine without internet, in parts, "
                   "with a checking install script (README)", None, _options_bundle),
    }


def build_parser(command: str | None = "*") -> argparse.ArgumentParser:
    """The ``prge`` parser. ``command``: the subcommand whose options are built ("*": every one, None: none);
    the others are listed with their help but get no options, so the modules they need are not imported."""
    parser = argparse.ArgumentParser(prog="prge", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help, description, add_options) in _subcommands().items():
        if command not in ("*", name):
            sub.add_parser(name, help=help)
            continue
        p = sub.add_parser(name, help=help, description=description() if callable(description) else description)
        add_options(p)
    return parser


# options that name something the command writes: False a file, True a folder
_OUTPUTS = {"out": False, "save_adapter": False, "checkpoint_dir": True, "results_dir": True, "mmap_dir": True,
            "checkpoint_root": True}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command if command in _subcommands() else None).parse_args(argv)
    record_command(shlex.join(["prge", *argv]))
    start_commit()      # the code this command runs, read before any long work begins
    try:    # every output location and every number is checked before any work starts
        for name, folder in _OUTPUTS.items():
            if getattr(args, name, None):
                check_writable(getattr(args, name), folder, f"--{name.replace('_', '-')}")
        check_numbers(vars(args), options=True)
    except ValueError as err:
        print(f"prge: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.command != "train" and hasattr(args, "quant"):
        args.quant = args.quant or "none"     # only training methods choose their own default
    if fast_mode():
        print("prge: fast mode (PRGE_FAST) is on", file=sys.stderr)
    try:
        return args.run(args)
    except (KeyError, ValueError, FileNotFoundError, RuntimeError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"prge: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
