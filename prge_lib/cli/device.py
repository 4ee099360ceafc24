"""The device commands (chapter 10): ``prge export``, ``prge device-train``, ``prge device-bench``; ``prge replay`` (a device's upload rebuilt eagerly, chapter 11); and ``prge bundle`` (an offline GPU machine's wheels, model and data)."""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from prge_lib.cli.common import add_config_options, note
from prge_lib.common.provenance import atomic_file, check_writable, provenance, write_result
from prge_lib.zo.defaults import LORA_R



def run_export(args) -> int:
    from prge_lib.deploy.export import export_training_program

    record = export_training_program(args.task, args.out, model=args.model, layers=args.layers, q=args.q,
                                     E=args.E, seq_len=args.seq_len, r=args.r, alpha=args.alpha,
                                     targets=tuple(args.targets), seed=args.seed, backend=args.backend,
                                     dtype=args.dtype, command=args.command_line)
    s = record["settings"]
    print(f"exported the P-RGE step ({s['layers']} layers, q = {s['q']}, {s['rows']} rows of {s['seq_len']} "
          f"tokens, {s['backend']}, {s['dtype']}): export {record['export_s']:.0f} s, lowering {record['lower_s']:.0f} s, "
          f"{record['pte_bytes'] / 2**20:.0f} MiB -> {args.out} (settings in {Path(args.out).with_suffix('.json')})")
    return 0


def run_device_train(args) -> int:
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
    result["provenance"] = provenance(time.perf_counter() - start, args.command_line)
    write_result(args.out, result)
    if args.upload:
        from prge_lib.distributed.upload import upload_of_run

        upload = upload_of_run(result)
        with atomic_file(args.upload) as tmp:
            Path(tmp).write_text(upload.to_json())
        print(f"prge: the upload of {len(upload.steps)} steps ({Path(args.upload).stat().st_size} bytes) -> {args.upload}; "
              f"`prge replay --config {args.out} --message {args.upload}` rebuilds the adapter", file=sys.stderr)
    if args.check_eager:
        print(f"parity with eager P-RGE over {result['parity']['steps']} steps: largest relative loss "
              f"difference {result['parity']['max_rel_loss_diff']:.1e}", file=sys.stderr)
    best, host = result["best_val"], result["host"]
    print(f"{result['title']} in the runtime, {args.host} host ({host['machine']}"
          f"{', emulated' if host['emulated'] else ''}): {len(result['losses'])} steps, median "
          f"{result['step_s']['median']:.3f} s/step, peak resident {host['peak_resident_mib'] or float('nan'):.0f} MiB; "
          f"validation {100 * result['evals'][0]['val']:.1f} at "
          f"step {result['evals'][0]['step']} -> {100 * best['val']:.1f} at step {best['step']}; "
          f"test {100 * best['test']:.1f} -> {args.out}")
    return 0 if not args.check_eager or result["parity"]["within_1e-4"] else 4


def run_device_bench(args) -> int:
    from prge_lib.deploy.export import check_program
    from prge_lib.experiments.bench.program import compare, profile

    start = time.perf_counter()
    settings = check_program(args.pte, say=note)["settings"]
    result = {"kind": "device-bench", "program": Path(args.pte).name, "program_settings": settings,
              "repeats": args.repeats, "warmup": args.warmup, "seed": 0,
              "inputs": "one random batch of the program's shapes, no padding, fed to both sides",
              **compare(args.pte, args.repeats, args.warmup)}
    if args.profile:
        result["profile"] = profile(args.pte)
    result["provenance"] = provenance(time.perf_counter() - start, args.command_line)
    write_result(args.out, result)
    rt, eg = result["runtime"], result["eager"]
    print(f"step: runtime {rt['step_s']['median']:.3f} s, eager {eg['step_s']['median']:.3f} s "
          f"(eager/runtime {result['eager_over_runtime']:.2f}); resident after loading: runtime "
          f"{rt['resident_after_first_step_mib']:.0f} MiB, eager {eg['resident_after_first_step_mib']:.0f} MiB "
          f"-> {args.out}")
    return 0


def run_bundle_build(args) -> int:
    from prge_lib.deploy import bundle

    check_writable(args.bundle_out, True, "--out")
    if not (args.part_mib > 0 and math.isfinite(args.part_mib)):
        raise ValueError(f"--part-mib takes a size in MiB > 0, got {args.part_mib}")
    def names(text):
        return [n.strip() for n in (text or "").split(",") if n.strip()]

    settings = bundle.plan(args.profile, names(args.with_wheels), names(args.skip_installed_on_box), args.python,
                           args.platform, names(args.without))
    for name in settings["without"]:
        print(f"prge: {name} is left out (--without): what needs it will not run on the machine", file=sys.stderr)
    for item in settings.pop("skipped"):
        print(f"prge: {item} is left out: the machine has it (--skip-installed-on-box or the profile)",
              file=sys.stderr)
    if args.no_project_wheel:
        print("prge: the project's wheel is left out (--no-project-wheel): run the repository's clone on the machine",
              file=sys.stderr)
    manifest = bundle.build_bundle(args.bundle_out, **settings, part_bytes=bundle.part_bytes_of(args.part_mib),
                                   project=not args.no_project_wheel, cuda=args.cuda,
                                   say=lambda line: print(f"prge: {line}", file=sys.stderr))
    print("\n".join(bundle.listing(manifest)))
    print(f"-> {args.bundle_out}: copy every file in it to the machine, then run python3 install.py --check-only "
          f"there, and python3 install.py [--target DIR]")
    return 0


# the settings a program shares with a training run: declared once, in TrainConfig
EXPORT_SETTINGS = ("task", "model", "layers", "q", "E", "r", "alpha", "targets", "seed", "dtype")


def export_options(ex) -> None:
    from prge_lib.deploy.export import PROGRAM_DTYPES
    from prge_lib.methods import registry

    prge = registry.get("prge").defaults        # the program is P-RGE's step: its q and E
    add_config_options(ex, EXPORT_SETTINGS, defaults={"q": prge["q"], "E": prge["E"], "r": LORA_R},
                       choices={"dtype": PROGRAM_DTYPES})
    ex.add_argument("--seq-len", type=int, default=64, help="the program's fixed prompt length (default 64)")
    ex.add_argument("--backend", default="xnnpack", choices=["xnnpack", "portable"])
    ex.add_argument("--out", required=True, help="the .pte to write (its settings go to the .json beside it)")
    ex.set_defaults(run=run_export)


def device_train_options(dt) -> None:
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
    dt.add_argument("--upload", default=None,
                    help="also write the run's upload: each step's index and projected gradients, from which "
                         "`prge replay` rebuilds the adapter on another client (chapter 11)")
    dt.add_argument("--out", required=True, help="where to write the JSON result")
    dt.set_defaults(run=run_device_train)


# the methods whose step is the q seeds and q projected gradients an upload carries (prge_lib.zo.replay)
REPLAYABLE = ("prge", "mezo-lorafa")


def run_replay(args) -> int:
    import json

    from prge_lib.deploy.client import eager_client, replay_config
    from prge_lib.zo.replay import adapter_digest
    from prge_lib.distributed.upload import Upload, replay_upload
    from prge_lib.zo.lora import adapter_state, save_adapter

    texts = {}
    for option, path in (("--config", args.config), ("--message", args.message)):
        if not Path(path).is_file():
            raise FileNotFoundError(f"{option} {path}: no such file")
        texts[option] = Path(path).read_text()
    try:
        record = json.loads(texts["--config"])
    except json.JSONDecodeError as e:
        raise ValueError(f"--config {args.config} is not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(record, dict):
        raise ValueError(f"--config {args.config} holds a {type(record).__name__}; give a training result or its config")
    config = replay_config(record, f"--config {args.config}")
    if config.method not in REPLAYABLE:
        raise ValueError(f"--config {args.config} is a {config.method} run; an upload replays the methods "
                         f"{', '.join(REPLAYABLE)} (their steps are seeds and projected gradients)")
    upload = Upload.from_json(texts["--message"], f"--message {args.message}")
    if args.in_runtime:
        method = replay_in_runtime(eager_client(config), upload, args.in_runtime, args.backend, args.command_line)
    else:
        method = replay_upload(eager_client(config), upload)
    save_adapter(method.model, args.out, {"task": config.task, "method": config.method,
                                          "replayed_steps": f"{upload.steps[0][0]}-{upload.steps[-1][0]}"})
    print(f"replayed steps {upload.steps[0][0]} to {upload.steps[-1][0]} of the {config.task} run "
          f"(seed {config.seed}, q = {config.q}): adapter sha256 {adapter_digest(adapter_state(method.model))[:16]} "
          f"-> {args.out}")
    return 0


def replay_in_runtime(method, upload, pte, backend: str, command: str | None = None):
    """``upload`` applied to ``method``'s adapter by the update-only program ``pte`` in the ExecuTorch runtime (what a
    device that only follows the run does), exported first for this run's adapter and q when ``pte`` is absent."""
    from prge_lib.deploy.client import ProgramReplayer
    from prge_lib.deploy.export import check_program_path, export_replay_program
    from prge_lib.deploy.program import flat_adapter
    from prge_lib.distributed.upload import check_upload

    check_program_path(pte)
    check_upload(method, upload)
    if not Path(pte).exists():
        size = flat_adapter(method.layers).numel()
        export_replay_program(size, method.q, pte, backend, seed=method.seed, command=command)
        print(f"prge: exported the update-only program for an adapter of {size:,} numbers, q = {method.q} "
              f"({backend}) -> {pte}", file=sys.stderr)
    return ProgramReplayer(pte)(method, upload.steps, method.lr)


def replay_options(rp) -> None:
    rp.add_argument("--config", required=True,
                    help="the run's config: a result file of `prge train` or `prge device-train`, or its config")
    rp.add_argument("--message", required=True, help="an upload written by `prge device-train --upload`")
    rp.add_argument("--out", required=True, help="the rebuilt adapter (safetensors, loadable with load_adapter)")
    rp.add_argument("--in-runtime", default=None, metavar="REPLAY.pte",
                    help="apply the steps in the ExecuTorch runtime with this update-only program, as a device that "
                         "follows the run would (exported for the run's adapter and q when the file is absent); "
                         "the adapter then differs from the eager replay by the runtime's rounding (chapter 11)")
    rp.add_argument("--backend", default="xnnpack", choices=["xnnpack", "portable"],
                    help="--in-runtime: the kernels of a program exported here (default xnnpack)")
    rp.set_defaults(run=run_replay)


def device_bench_options(db) -> None:
    db.add_argument("--pte", required=True, help="a program written by `prge export`")
    db.add_argument("--repeats", type=int, default=5, help="timed steps per side (the median is reported)")
    db.add_argument("--warmup", type=int, default=1)
    db.add_argument("--profile", action="store_true", help="also trace the runtime's operators (ETDump)")
    db.add_argument("--out", required=True, help="where to write the JSON result")
    db.set_defaults(run=run_device_bench)


def bundle_options(bu) -> None:
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
    build.add_argument("--without", default=None, metavar="NAMES",
                       help="profile wheels to leave out although the machine lacks them, comma-separated (e.g. "
                            "bitsandbytes for a sitting with no INT8/NF4 run: one copy fewer)")
    build.add_argument("--cuda", default=None, metavar="X.Y",
                       help="the CUDA version of the machine's torch (torch.version.cuda): a wheel with GPU libraries "
                            "for many runtimes (bitsandbytes: 41 MiB) keeps only the one it loads there (3-4 MiB); "
                            "MAJOR alone keeps every build of it (default: keep all)")
    build.add_argument("--no-project-wheel", action="store_true",
                       help="leave out the project's own wheel (4 MiB with the shipped task pools), for a machine "
                            "that runs a clone of the repository, as a GPU sitting does")
    build.set_defaults(run=run_bundle_build)
