"""The ``prge`` command line: ``zeroshot`` evaluates a task without training (chapter 0), ``train`` fine-tunes
with any method and ``bench`` times the methods on synthetic batches (chapters 1–7). Each subcommand's run and
options live in a module of this package (``train``, ``bench``, ``device``, ``reproduce``); this one holds the
table of subcommands, the parser and the checks every command makes before any work."""
from __future__ import annotations

import argparse
import shlex
import sys

from prge_lib.cli import bench, device, federate, reproduce, train
from prge_lib.cli.common import EXIT_BAD_INPUT
from prge_lib.common.provenance import check_writable, start_commit
from prge_lib.common.settings import fast_mode
from prge_lib.training.checks import check_numbers


def _subcommands() -> dict:
    """Each subcommand: its help, its description (a function: built only for that subcommand) and the function
    that adds its options. Options are added only to the subcommand being run, so ``prge X --help`` imports
    only what X needs."""
    return {
        "zeroshot": ("evaluate a task without training and write a JSON result", None, train.zeroshot_options),
        "train": ("fine-tune a task with one method and write a JSON result", train.method_defaults, train.train_options),
        "export": ("export the P-RGE training step as an ExecuTorch program (chapter 10)", None, device.export_options),
        "device-train": ("train with an exported program in the ExecuTorch runtime", None, device.device_train_options),
        "replay": ("rebuild an adapter from a run's config and an upload of its steps' seeds and projected "
                   "gradients (chapter 11)", None, device.replay_options),
        "device-bench": ("a program's step in the runtime beside the same step eager: time, memory, and "
                         "(--profile) where the runtime spends it", None, device.device_bench_options),
        "federate": ("federated P-RGE rounds over simulated clients, each uploading seeds and projected gradients "
                     "(chapter 11)", None, federate.federate_options),
        "reproduce": ("run the cells of a paper table (resumable; chapter 7)",
                      "Runs every cell of a grid that has no result yet; an interrupted cell resumes from its "
                      "checkpoint, so rerunning continues where it stopped.", reproduce.reproduce_options),
        "bench": ("time and measure methods on synthetic full-length batches", None, bench.bench_options),
        "gpu-check": ("checks of the GPU engine: the counter noise against the CPU's, no host sync in the fused step, CUDA "
                      "graphs giving its numbers, an fp32 adapter over an fp16 base", None, bench.gpu_check_options),
        "footprint": ("memory held, step peak and step time of the training methods, each built as the trainer "
                      "builds it (chapter 9)", None, bench.footprint_options),
        "bundle": ("wheels, the embedded model and the shipped data for a machine without internet, in parts, "
                   "with a checking install script (README)", None, device.bundle_options),
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
_OUTPUTS = {"out": False, "baseline": False, "save_adapter": False, "upload": False, "checkpoint_dir": True,
            "results_dir": True, "mmap_dir": True, "checkpoint_root": True}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command if command in _subcommands() else None).parse_args(argv)
    args.argv = argv            # what a launcher hands on to the workers it starts (prge train --workers)
    # the command each result written by this call records (passed to provenance() by every writer)
    args.command_line = shlex.join(["prge", *argv])
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
