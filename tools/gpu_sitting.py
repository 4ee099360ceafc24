"""One command for a GPU sitting: check the machine, then run the GPU measurements in priority order under a
time limit, each stage's results written under --out as soon as it finishes, stages done there skipped
(prge_lib/experiments/sitting.py; README, "A GPU sitting").

Usage (from the repository root, on the GPU machine):
    python tools/gpu_sitting.py --out data/results/gpu-sittings/2 --time-limit 8
    python tools/gpu_sitting.py --out data/results/gpu-sittings/2 --dry-run # the plan, with estimated minutes
    python tools/gpu_sitting.py --carry-plan build/gpu-payload               # which payload files each copy takes
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the repository first, then the payload installed beside it (its copy of prge_lib must not shadow the clone's:
# an installed prge_lib knows no repository, and the stages' subprocesses would lose the payload's path); the
# stages' subprocesses inherit the same order through PYTHONPATH
_PATHS = [str(p) for p in (ROOT, ROOT / "build" / "gpu-site") if p.is_dir()]
sys.path[:0] = [p for p in _PATHS if p not in sys.path]
os.environ["PYTHONPATH"] = os.pathsep.join(_PATHS + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                     if p and p not in _PATHS])

from prge_lib.experiments import sitting  # noqa: E402


def tree_mib() -> float:
    """The size of what travels with the repository: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    return sum((ROOT / name).stat().st_size for name in listed if name and (ROOT / name).is_file()) / 2**20


def carry_plan(bundle: Path, limit_mib: float) -> int:
    """Print the copies that bring the payload bundle ``bundle`` to the machine, each within ``limit_mib``."""
    if not (bundle / "MANIFEST.json").is_file():
        print(f"gpu_sitting: {bundle} is no payload bundle (no MANIFEST.json there); build one first with "
              f"'prge bundle build --out {bundle}' (README, \"A GPU sitting\")", file=sys.stderr)
        return 2
    manifest = json.loads((bundle / "MANIFEST.json").read_text())
    tree = tree_mib()
    calls = sitting.carry_calls(manifest, limit_mib, tree + 1)     # 1 MiB of room for what a copy adds
    where = bundle.resolve().relative_to(ROOT) if bundle.resolve().is_relative_to(ROOT) else bundle
    print(f"repository: {tree:.1f} MiB; {len(calls)} copies of at most {limit_mib:g} MiB:")
    for k, call in enumerate(calls, 1):
        print(f"copy {k}: " + " ".join(str(where / name) for name in call))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="the output folder (results and stage records)")
    parser.add_argument("--carry-plan", default=None, metavar="BUNDLE",
                        help="print which files of the payload bundle each copy to the machine takes, and stop")
    parser.add_argument("--copy-mib", type=float, default=64, help="--carry-plan: MiB one copy may carry")
    parser.add_argument("--time-limit", type=float, default=8.0, metavar="MINUTES",
                        help="stop starting work after this many minutes (default 8)")
    parser.add_argument("--dry-run", action="store_true", help="print the machine check and the plan only")
    parser.add_argument("--only", default=None, help="comma-separated stage names to consider")
    parser.add_argument("--paired-steps", type=int, default=1000, help="steps of each paired SST-2 run")
    parser.add_argument("--paired-seeds", default="0", help="seeds of the paired runs, comma-separated")
    parser.add_argument("--model", default=None, help="hub id or local folder (default: the embedded model)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--keep", default=None, metavar="DIR",
                        help="a folder that outlives the command (e.g. under /tmp on a machine whose repository copy "
                             "is made afresh for each command): its files restore --out's before the plan, and "
                             "--out's are copied back into it at the end, so stages done stay done")
    args = parser.parse_args(argv)
    if args.carry_plan:
        return carry_plan(Path(args.carry_plan), args.copy_mib)
    if not args.out:
        parser.error("--out is required (or --carry-plan)")
    if not args.time_limit > 0:
        print(f"gpu_sitting: --time-limit takes minutes > 0, got {args.time_limit}", file=sys.stderr)
        return 2
    try:
        seeds = [int(s) for s in args.paired_seeds.split(",")]
    except ValueError:
        print(f"gpu_sitting: --paired-seeds takes integers separated by commas, got {args.paired_seeds!r}",
              file=sys.stderr)
        return 2
    env = sitting.check_environment(device=args.device)
    stages = sitting.sitting_stages(Path(args.out), quantized=env["modules"]["bitsandbytes"],
                                    paired_steps=args.paired_steps, paired_seeds=seeds, device=args.device,
                                    model=args.model)
    if args.keep:
        restored = sitting.mirror_missing(Path(args.keep), Path(args.out))
        print(f"gpu_sitting: {len(restored)} files restored from {args.keep}")
    if args.only:
        wanted = [n.strip() for n in args.only.split(",")]
        every = [s.name for s in sitting.sitting_stages(Path(args.out), quantized=True)]
        unknown = [n for n in wanted if n not in every]
        if unknown:
            print(f"gpu_sitting: unknown stage {unknown[0]!r}; choose from {every}", file=sys.stderr)
            return 2
        # an INT8/NF4 stage asked for where bitsandbytes does not quantize: the others run, and the line says why
        for name in [n for n in wanted if n not in [s.name for s in stages]]:
            print(f"gpu_sitting: {name} is left out: bitsandbytes does not quantize on this machine", file=sys.stderr)
        stages = [s for s in stages if s.name in wanted]
    print(json.dumps({k: v for k, v in env.items() if k not in ("problems", "notes")}))
    for line in env["notes"] + env["problems"]:
        print(f"gpu_sitting: {line}", file=sys.stderr)
    print("\n".join(sitting.plan_lines(stages, Path(args.out), args.time_limit)))
    if args.dry_run:
        return 0
    if env["problems"]:
        return 2
    try:
        sitting.run_sitting(stages, Path(args.out), args.time_limit, env.get("device", args.device),
                            machine={k: env.get(k) for k in ("python", "torch", "cuda")})
    finally:
        if args.keep:
            sitting.keep_log(Path(args.out), Path(args.keep))
    left = [s.name for s in stages if not sitting.is_done(s, Path(args.out))]
    print(f"gpu_sitting: {len(stages) - len(left)} of {len(stages)} stages done"
          + (f"; still to run: {', '.join(left)} (the same command continues)" if left else ""))
    return 3 if left else 0


if __name__ == "__main__":
    sys.exit(main())
