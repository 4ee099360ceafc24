"""The reproduction runner (chapter 7): grids, resume after a kill, Ray = in-process, schema, summaries."""
import json
import statistics
import time
from pathlib import Path

import pytest

from prge_lib.experiments import reproduce as rp
from prge_lib.training.config import TrainConfig
from prge_lib.experiments import runner
from prge_lib.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
TINY = {"steps": 4, "n_train": 16, "n_val": 8, "n_test": 8, "eval_every": 2, "checkpoint_every": 1}


def test_grids_have_the_papers_rows_and_unique_names():
    cells = rp.grid_cells("table1", "cpu")
    names = [c.name for c in cells]
    assert len(names) == len(set(names))
    sst2 = [c for c in cells if c.task == "sst2"]
    assert {c.row.label for c in sst2} == {"Zero-shot", "FO-Adam (Full)", "FO-Adam (LoRA-FA)", "MeZO (Full)",
                                           "MeZO (LoRA-FA)", "P-RGE (q = 4)", "P-RGE (q = 16)"}
    # the three ZO LoRA-FA rows run over three seeds on the CPU profile, the others over one
    assert sorted(c.seed for c in sst2 if c.row.key == "prge-q4-E16") == [0, 1, 2]
    assert [c.seed for c in sst2 if c.row.key == "fo"] == [0]
    q16 = next(c for c in sst2 if c.row.key == "prge-q16-E16").config()
    assert (q16["q"], q16["E"], q16["lr"], q16["eps"], q16["steps"]) == (16, 16, 1e-3, 1e-2, 1000)
    paper = rp.grid_cells("table1", "paper", only="sst2/prge-q4")
    assert sorted({c.lr for c in paper}) == [5e-5, 1e-4, 5e-4, 1e-3] and paper[0].steps() == 20000
    assert rp.grid_cells("table1", "cpu", seeds=[7], only="rte/fo-lorafa")[0].name == "rte/fo-lorafa_lr3e-4_seed7"
    assert {c.name for c in rp.grid_cells("runtime")} >= {"synthetic/bench-nf4-L256_seed0"}
    # Table 7 on the cpu profile: LoRA-FA at Table 1's ZO rate, the other spaces with a second rate to choose from
    peft_lrs = {row: sorted(c.lr for c in rp.grid_cells("peft", "cpu") if c.row.key == row)
                for row in ("mezo-lora", "mezo-lora-fa", "mezo-dora", "mezo-vera")}
    assert peft_lrs == {"mezo-lora": [1e-4, 1e-3], "mezo-lora-fa": [1e-3], "mezo-dora": [1e-4, 1e-3],
                        "mezo-vera": [1e-3, 1e-2]}
    assert [rp.lr_text(v) for v in (1e-3, 3e-4, 1.5e-4, 1e-7)] == ["1e-3", "3e-4", "1.5e-4", "1e-7"]


def test_benchmark_cells_time_what_they_are_for_and_estimate_by_size(monkeypatch):
    # the memory grid's figures are peaks (fresh processes): it times one round, the runtime grid five
    memory, runtime = rp.grid_cells("memory"), rp.grid_cells("runtime")
    assert {c.config()["repeats"] for c in memory} == {1}
    assert {c.config()["repeats"] for c in runtime} == {5}
    # MeZO (Full) perturbs weights in place, which quantized weights refuse: only the fp32 cells time it
    assert {c.config()["quant"] for c in runtime if "mezo" in c.config()["methods"]} == {"none"}
    assert all("prge" in c.config()["methods"] for c in runtime)
    seen = {}
    monkeypatch.setattr(runner, "bench", lambda spec, methods, **kw: seen.update(kw) or {})
    runner._run_bench(memory[0])
    assert seen["repeats"] == 1 and seen["seq_len"] == 64
    # --list's estimate grows with the length, the configurations and the rounds, and prices the format's kernel
    est = {c.name: rp.estimate_seconds(c, 0) for c in memory + runtime}
    assert est["synthetic/bench-none-L256_seed0"] > est["synthetic/bench-none-L64_seed0"]
    assert est["synthetic/bench-int8-L256_seed0"] > est["synthetic/bench-int8-L64_seed0"]
    assert est["synthetic/bench-none-L64_seed0"] > est["synthetic/bench-memory-L64_seed0"]
    # and lands within a quarter of the committed cells' wall time where they exist
    for cell in runtime:
        path = cell.result_path()
        if path.is_file():
            wall = json.loads(path.read_text())["provenance"]["wall_time_s"]
            assert 0.75 < est[cell.name] / wall < 1.25, (cell.name, est[cell.name], wall)


@pytest.fixture()
def unmeasured_processor(monkeypatch):
    """This machine as a processor no committed cell ran on: steps are priced from every processor's runs, as on
    a machine that has not run a grid yet (one that has prices from its own, tested below)."""
    from prge_lib.experiments import estimates

    monkeypatch.setattr(estimates, "cpu_name", lambda: "a processor no committed cell ran on")


def test_training_estimates_follow_the_padded_prompt_length(tmp_path, unmeasured_processor):
    # every row of a step is padded to the longest prompt of its batch: RTE's premises make its steps several
    # times SST-2's (the committed FO LoRA-FA cells: 8.8 vs 1.6 s/step), and P-RGE q 16 (one example per
    # step) pads less than q 4 (four)
    cells = {c.name: c for c in rp.grid_cells("table1", only="seed0")}
    est = {name: rp.estimate_seconds(c, c.steps()) for name, c in cells.items()}
    assert 3 < rp.prompt_length_factor("rte", cells["rte/fo-lorafa_lr3e-4_seed0"].config()) < 10
    assert est["rte/prge-q4-E16_lr1e-3_seed0"] > 3 * est["sst2/prge-q4-E16_lr1e-3_seed0"]
    assert est["sst2/prge-q16-E16_lr1e-3_seed0"] < est["sst2/prge-q4-E16_lr1e-3_seed0"]
    # MeZO on a peft adapter is priced by its adapter, not as MeZO on every weight: VeRA's step is the slowest
    lora = rp.grid_cells("peft", only="mezo-lora_")[0]
    vera = rp.grid_cells("peft", only="mezo-vera_")[0]
    assert rp.estimate_seconds(lora, 1000) < est["sst2/mezo-E16_lr1e-6_seed0"] < rp.estimate_seconds(vera, 1000)
    *_, done, basis = rp.list_cells([lora], tmp_path, tmp_path).splitlines()        # not run there
    assert done.startswith("0/1 done; about ") and basis.startswith("seconds per step and evaluation of 1 cell from")
    # a cell with no run on its own task: the committed ZO-on-LoRA SST-2 cells, scaled
    rte_lora = rp.grid_cells("senszoq", "cpu", only="rte/mezo-lora-r8-nf4")[0]
    seconds, runs = rp.measured_step_seconds()["mezo:lora"]
    basis = rp.list_cells([rte_lora], tmp_path, tmp_path).splitlines()[-1]
    assert runs >= 2 and basis.endswith(f"mezo:lora {seconds:.1f} s ({runs})")


@pytest.mark.parametrize("call,message", [
    (lambda: rp.grid_cells("table9"), r"unknown grid 'table9'; choose one of \['table1'"),
    (lambda: rp.grid_cells("table1", "laptop"), r"unknown profile 'laptop'; choose one of \['cpu', 'paper'\]"),
    (lambda: rp.run_grid([], backend="slurm"), r"unknown backend 'slurm'"),
])
def test_bad_grid_settings_are_refused_by_name(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def _tiny_cells(tiny_folder, seeds=(0, 1)):
    return rp.grid_cells("table1", "cpu", seeds=seeds, only="sst2/prge-q4", model=str(tiny_folder), **TINY)


def _interrupted_grid(tiny_folder, tmp_path, monkeypatch, seed: int, t: int, act):
    """The tiny grid run whole under tmp_path/whole, then the cells with ``act()`` at the start of step t + 1 of
    the run of ``seed`` (PRGE.step patched; the returned ``restore()`` puts it back): (cells, whole, restore)."""
    from prge_lib.zo.prge import PRGE

    cells = _tiny_cells(tiny_folder)
    whole = tmp_path / "whole"
    rp.run_grid(cells, results=whole / "res", checkpoints=whole / "ck", progress=False, say=lambda _: None)
    real_step = PRGE.step

    def interrupted(self, batch, step):
        if step == t and self.seed == seed:
            act()
        return real_step(self, batch, step)

    monkeypatch.setattr(PRGE, "step", interrupted)
    return cells, whole, lambda: monkeypatch.setattr(PRGE, "step", real_step)


def _same_run(a: dict, b: dict) -> None:
    for key in ("losses", "evals", "best_val", "final", "projected_grad", "config", "seed", "cell"):
        assert a[key] == b[key], key


@pytest.fixture()
def tiny_env(fixture_data, monkeypatch):
    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))


def test_a_killed_cell_resumes_and_the_result_equals_an_uninterrupted_run(tiny_env, tiny_folder, tmp_path,
                                                                           monkeypatch):
    def kill():
        raise KeyboardInterrupt("simulated kill during step 3 of the second cell")

    cells, whole, restore = _interrupted_grid(tiny_folder, tmp_path, monkeypatch, seed=1, t=2, act=kill)
    res, ck = tmp_path / "res", tmp_path / "ck"
    with pytest.raises(KeyboardInterrupt):
        rp.run_grid(cells, results=res, checkpoints=ck, progress=False, say=lambda _: None)
    assert cells[0].result_path(res).is_file() and not cells[1].result_path(res).is_file()
    listing = rp.list_cells(cells, res, ck)
    assert "done" in listing and "partial 2/4" in listing and "1/2 done" in listing

    restore()
    # the checkpoint (step 2) cannot be resumed into a shorter run
    shorter = rp.grid_cells("table1", "cpu", seeds=[1], only="sst2/prge-q4", model=str(tiny_folder),
                            **{**TINY, "steps": 1})[0]
    with pytest.raises(ValueError, match="is at step 2, past this run's 1 steps: give at least --steps 2"):
        rp.run_cell(shorter, res, ck, progress=False)
    said = []
    rp.run_grid(cells, results=res, checkpoints=ck, progress=False, say=said.append)
    assert said[0] == "1 of 2 cells done; running 1"
    for cell in cells:
        _same_run(json.loads(cell.result_path(res).read_text()), json.loads(cell.result_path(whole / "res").read_text()))
        assert not cell.checkpoint_dir(ck).exists()            # removed once the result was written
    result = json.loads(cells[1].result_path(res).read_text())
    # the recorded command makes this very cell: the profile's defaults it overrides are in it
    assert result["provenance"]["command"] == ("prge reproduce table1 --profile cpu --only "
                                               f"sst2/prge-q4-E16_lr1e-3_seed1 --steps 4 --model {tiny_folder}")
    rp.validate_result(result)

    # a result file made with other settings is never taken for the cell's: not by one cell, not by a grid
    other = rp.grid_cells("table1", "cpu", seeds=[1], only="sst2/prge-q4", model=str(tiny_folder),
                          **{**TINY, "steps": 5})[0]
    with pytest.raises(ValueError, match=r"other settings \(\['steps'\]\)"):
        rp.run_cell(other, res, ck, progress=False)
    with pytest.raises(ValueError, match=r"1 cells have a result .* other settings: "
                                         r"sst2/prge-q4-E16_lr1e-3_seed1 \(steps\)\. Give these runs their own"):
        rp.run_grid([cells[0], other], results=res, checkpoints=ck, progress=False, say=lambda _: None)
    assert "other settings (steps)" in rp.list_cells([other], res, ck)
    elsewhere = rp.grid_cells("table1", "cpu", seeds=[1], only="sst2/prge-q4", **TINY)[0]     # another model
    assert rp.cell_matches(elsewhere, result) == ["model"]


def test_a_diverging_cell_is_recorded_and_the_grid_goes_on(tiny_env, tiny_folder, tmp_path, monkeypatch):
    from prge_lib.zo.prge import PRGE
    real_step = PRGE.step

    def nan_at_step_3(self, batch, t):
        if self.seed == 0 and t == 2:          # the first cell's loss turns non-finite; nothing is applied
            return {"loss": float("nan"), "finite": False}
        return real_step(self, batch, t)

    monkeypatch.setattr(PRGE, "step", nan_at_step_3)
    cells = _tiny_cells(tiny_folder)
    res, ck = tmp_path / "res", tmp_path / "ck"
    paths = rp.run_grid(cells, results=res, checkpoints=ck, progress=False, say=lambda _: None)
    assert paths == [c.result_path(res) for c in cells]                 # the second cell ran
    diverged, finished = (json.loads(p.read_text()) for p in paths)
    assert diverged["status"] == "diverged" and "step 3: the loss is nan" in diverged["diverged"]
    assert diverged["steps"] == len(diverged["losses"]) == 2 and diverged["final"]["step"] == 2
    assert finished["status"] == "finished" and finished["steps"] == 4
    assert not rp.cell_matches(cells[0], diverged) and not cells[0].checkpoint_dir(ck).exists()
    record, = rp.summarize("table1", res)
    assert record["steps"] == 4 and record["n"] == 2                     # the planned steps, both seeds
    assert record["diverged"] == ["seed 0 after step 2 of 4 (loss not finite)"]


def test_a_cell_whose_loss_rose_past_stop_rising_is_recorded_as_diverged_and_the_grid_goes_on(tiny_env, tiny_folder,
                                                                                               tmp_path, monkeypatch):
    """--stop-rising: the seed-0 cell's booked loss is 10 times the real one from step 3 on (a window of one step
    here), so it stops after step 3 as diverged, its state saved; the seed-1 cell finishes. The result is the
    cell's, with or without the option, and its command names it."""
    from prge_lib.training import stopping
    from prge_lib.zo.prge import PRGE
    real_step = PRGE.step

    def rising(self, batch, t):
        record = real_step(self, batch, t)
        if self.seed == 0 and t >= 2:
            record["loss"] *= 10
        return record

    monkeypatch.setattr(PRGE, "step", rising)
    monkeypatch.setattr(stopping, "LOSS_WINDOW", 1)
    cells = rp.grid_cells("table1", "cpu", seeds=(0, 1), only="sst2/prge-q4", model=str(tiny_folder), stop_rising=3,
                          **TINY)
    res, ck = tmp_path / "res", tmp_path / "ck"
    paths = rp.run_grid(cells, results=res, checkpoints=ck, progress=False, say=lambda _: None)
    assert paths == [c.result_path(res) for c in cells]
    rose, finished = (json.loads(p.read_text()) for p in paths)
    assert rose["status"] == "diverged" and rose["steps"] == len(rose["losses"]) == 3
    assert rose["diverged"].startswith("step 3: the mean training loss of steps 3-3 is ")
    assert "above the --stop-rising factor 3; training stopped; its state (after step 3) is in " in rose["diverged"]
    assert rose["config"]["stop_rising"] == 3 and rose["final"]["step"] == 3
    assert rose["provenance"]["command"].endswith(f"--model {tiny_folder} --stop-rising 3")
    assert finished["status"] == "finished" and finished["steps"] == 4
    plain = _tiny_cells(tiny_folder)                     # the same cells without the option: done, not other settings
    listing = rp.list_cells(plain, res, ck)
    assert not rp.cell_matches(plain[0], rose) and "2/2 done" in listing
    assert [line.split()[1:3] for line in listing.splitlines()[:2]] == [["done,", "diverged"], ["done"]]
    record, = rp.summarize("table1", res)
    assert record["diverged"] == ["seed 0 after step 3 of 4 (loss risen past --stop-rising 3)"]
    assert ("Runs stopped as diverged, their test score read at their best validation step before the stop: P-RGE "
            "(q = 4) on sst2: seed 0 after step 3 of 4 (loss risen past --stop-rising 3).") in \
        rp.summary_markdown([record])
    assert not cells[0].checkpoint_dir(ck).exists()


def test_a_checkpoint_this_machine_cannot_resume_is_kept_and_the_grid_goes_on(tiny_env, tiny_folder, tmp_path):
    """A cell whose checkpoint cannot be read here (damaged, or from a processor that replays otherwise) is said and
    left alone with its file as it was; the next cells run, and the cell runs once its checkpoint is resumable."""
    cells = _tiny_cells(tiny_folder)
    res, ck = tmp_path / "res", tmp_path / "ck"
    folder = cells[0].checkpoint_dir(ck)
    folder.mkdir(parents=True)
    (folder / "checkpoint.pt").write_bytes(b"")
    said = []
    paths = rp.run_grid(cells, results=res, checkpoints=ck, progress=False, say=said.append)
    assert paths == [cells[1].result_path(res)] and not cells[0].result_path(res).is_file()
    assert (folder / "checkpoint.pt").read_bytes() == b""
    unread, = [line for line in said if line.startswith(f"cell {cells[0].name}: ")]
    assert "the file is empty" in unread and "left as it is and the grid goes on with the next cells" in unread
    (folder / "checkpoint.pt").unlink()
    assert rp.run_grid(cells, results=res, checkpoints=ck, progress=False, say=lambda _: None) == \
        [cells[0].result_path(res)]


def test_only_a_whole_cell_name_selects_that_cell_and_other_profiles_keep_their_own_folder(tmp_path):
    name = "sst2/prge-q4-E16_lr1e-3_seed1"
    picked = rp.grid_cells("table1", "cpu", seeds=[1, 10], only=name)
    assert [c.name for c in picked] == [name]                           # not also …_seed10
    assert len(rp.grid_cells("table1", "cpu", seeds=[1, 10], only="sst2/prge-q4")) == 2
    ten, = rp.grid_cells("table1", "cpu", seeds=[10], only="sst2/prge-q4")
    assert ten.command() == f"prge reproduce table1 --profile cpu --only {ten.name} --seeds 10"
    paper = rp.grid_cells("table1", "paper", only="sst2/prge-q4-E16_lr1e-3_seed0")[0]
    assert paper.result_path(tmp_path) == tmp_path / "table1-paper" / "sst2" / "prge-q4-E16_lr1e-3_seed0.json"
    assert paper.checkpoint_dir(tmp_path).parent.parent == tmp_path / "table1-paper"
    assert "--steps" not in paper.command()                              # 20000 is the paper profile's own
    # alternatives: the ZO LoRA-FA rows of SST-2 without MeZO (Full), in the grid's order
    zo = rp.grid_cells("table1", "paper", only="sst2/zeroshot|sst2/mezo-lorafa|sst2/prge")
    methods = [c.name.split("/")[1].split("_")[0] for c in zo]
    assert methods[:3] == ["zeroshot"] * 3 and set(methods[3:]) == {"mezo-lorafa-E16", "prge-q4-E16", "prge-q16-E16"}
    assert len(zo) == 3 + 3 * 4 * 5 and all(c.task == "sst2" for c in zo)
    both = [c.name for c in rp.grid_cells("table1", "cpu", seeds=[1, 10], only=f"{name}|rte/zeroshot_seed10")]
    assert sorted(both) == sorted([name, "rte/zeroshot_seed10"])        # a whole name still selects it alone
    assert rp.grid_cells("table1", "cpu", only="sst2/prge|rte/prge,q16")[0].name.startswith("sst2/prge-q16")


def test_a_kill_stops_the_grid_after_a_step_with_a_checkpoint_that_the_same_command_resumes(tiny_env, tiny_folder,
                                                                                            tmp_path, monkeypatch):
    """`prge reproduce` under stop_on_signals: a SIGTERM during a step lets that step finish, saves a checkpoint
    there, starts no further cell; the rerun ends where an uninterrupted grid does."""
    import os
    import signal

    from prge_lib.training.stopping import stop_on_signals

    cells, whole, restore = _interrupted_grid(tiny_folder, tmp_path, monkeypatch, seed=0, t=1,
                                              act=lambda: os.kill(os.getpid(), signal.SIGTERM))
    res, ck, said = tmp_path / "res", tmp_path / "ck", []
    with stop_on_signals(say=said.append):
        assert rp.run_grid(cells, results=res, checkpoints=ck, progress=False, say=said.append) == []
    assert said[2].startswith("SIGTERM: stopping after the current step with a checkpoint"), said
    assert said[3].startswith(f"cell {cells[0].name}: stopped by SIGTERM after step 2 of 4; its checkpoint is ")
    assert said[3].endswith("; the same command resumes it") and len(said) == 4       # cells[1] never started
    assert "partial 2/4" in rp.list_cells(cells, res, ck) and not any(c.result_path(res).is_file() for c in cells)
    restore()
    rp.run_grid(cells, results=res, checkpoints=ck, progress=False, say=lambda _: None)    # the handler is gone
    for cell in cells:
        _same_run(json.loads(cell.result_path(res).read_text()), json.loads(cell.result_path(whole / "res").read_text()))


def test_a_time_limit_stops_a_cell_at_a_checkpoint_that_the_same_command_resumes(tiny_env, tiny_folder, tmp_path):
    import torch
    from prge_lib.training.trainer import TrainingStopped

    cells = _tiny_cells(tiny_folder, seeds=(0,))
    whole = tmp_path / "whole"
    rp.run_grid(cells, results=whole / "res", checkpoints=whole / "ck", progress=False, say=lambda _: None)
    res, ck = tmp_path / "res", tmp_path / "ck"
    with pytest.raises(TrainingStopped, match="after step 1 of 4") as stop:      # a deadline already passed
        rp.run_cell(cells[0], res, ck, progress=False, deadline=0.0)
    assert stop.value.checkpoint == cells[0].checkpoint_dir(ck) / "checkpoint.pt"
    assert not cells[0].result_path(res).is_file() and "partial 1/4" in rp.list_cells(cells, res, ck)
    said = []
    assert rp.run_grid(cells, results=res, checkpoints=ck, progress=False, say=said.append, deadline=0.0) == []
    assert said[-1] == "time limit reached: 1 cells not run; the same command continues"
    # with a minute left a training cell still starts (it stops at a checkpoint); a zero-shot cell, which cannot
    # stop halfway, starts only if its estimate fits
    zero_shot, = rp.grid_cells("table1", "cpu", only="sst2/zeroshot")
    soon = time.time() + 60
    assert runner._fits_before(cells[0], soon) and not runner._fits_before(zero_shot, soon)
    assert runner._fits_before(zero_shot, soon + rp.estimate_seconds(zero_shot, 0) + 60)
    # a benchmark cell priced from this CPU waits for its estimate; on a GPU, where that price says nothing, it starts
    bench_cpu = rp.grid_cells("runtime", "cpu", only="bench-none-L64")[0]
    bench_gpu = rp.grid_cells("runtime", "cpu", only="bench-none-L64", device="cuda", dtype="fp16")[0]
    assert bench_gpu.config()["device"] == "cuda" and rp.estimate_seconds(bench_cpu, 0) > 60
    assert not runner._fits_before(bench_cpu, soon) and runner._fits_before(bench_gpu, soon)

    # a checkpoint made on another device is refused, naming both
    payload = torch.load(stop.value.checkpoint, weights_only=False)
    assert payload["device"] == "cpu"
    elsewhere = tmp_path / "elsewhere"
    (cells[0].checkpoint_dir(elsewhere)).mkdir(parents=True)
    torch.save({**payload, "device": "cuda"}, cells[0].checkpoint_dir(elsewhere) / "checkpoint.pt")
    with pytest.raises(ValueError, match="made on cuda, this run is on cpu: resume it with --device cuda"):
        rp.run_cell(cells[0], res, elsewhere, progress=False)

    rp.run_grid(cells, results=res, checkpoints=ck, progress=False, say=lambda _: None)
    _same_run(json.loads(cells[0].result_path(res).read_text()),
              json.loads(cells[0].result_path(whole / "res").read_text()))


def test_ray_runs_the_same_cells_as_the_process(tiny_env, tiny_folder, tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is the optional 'cluster' extra: pip install -e '.[cluster]'")
    cells = _tiny_cells(tiny_folder)
    rp.run_grid(cells, results=tmp_path / "local", checkpoints=tmp_path / "ck1", progress=False, say=lambda _: None)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        paths = rp.run_grid(cells, backend="ray", results=tmp_path / "ray", checkpoints=tmp_path / "ck2",
                            say=lambda _: None)
    finally:
        ray.shutdown()
    assert sorted(paths) == sorted(c.result_path(tmp_path / "ray") for c in cells)
    for cell in cells:
        _same_run(json.loads(cell.result_path(tmp_path / "ray").read_text()),
                  json.loads(cell.result_path(tmp_path / "local").read_text()))


def test_summary_chooses_lr_on_validation_and_reports_mean_and_spread(tmp_path):
    def result(row, lr, seed, val, test):
        point = {"step": 10, "val": val, "test": test}
        return {"kind": "train", "task": "sst2", "method": "prge", "seed": seed, "steps": 2,
                "config": {"task": "sst2", "seed": seed, "lr": lr}, "best_val": point, "final": point,
                "evals": [point], "losses": [1.0, 0.5], "step_s": {"median": 60.0, "per_step": [60.0, 60.0]},
                "cell": {"row": row, "lr": lr}, "provenance": {"command": "x", "commit": None, "versions": {},
                                                              "hardware": {}, "wall_time_s": 1.0}}
    folder = tmp_path / "table1" / "sst2"
    folder.mkdir(parents=True)
    runs = [("prge-q4-E16", 1e-3, 0, 0.70, 0.72), ("prge-q4-E16", 1e-3, 1, 0.74, 0.78),
            ("prge-q4-E16", 1e-3, 2, 0.72, 0.75), ("prge-q4-E16", 1e-4, 0, 0.80, 0.50),
            ("prge-q4-E16", 1e-4, 1, 0.60, 0.50), ("mezo-lorafa-E16", 1e-3, 0, 0.6, 0.61)]
    for row, lr, seed, val, test in runs:
        (folder / f"{row}_lr{rp.lr_text(lr)}_seed{seed}.json").write_text(json.dumps(result(row, lr, seed, val, test)))
    records = {r["row"]: r for r in rp.summarize("table1", tmp_path)}
    prge = records["prge-q4-E16"]
    assert prge["lr"] == 1e-3 and prge["lrs_tried"] == [1e-4, 1e-3]     # mean val 0.72 beats 0.70
    planned = next(r for r in rp.GRIDS["table1"]["rows"] if r.key == "prge-q4-E16").lrs["cpu"]
    assert prge["lrs_planned"] == sorted(planned)
    assert prge["test_mean"] == 75.0 and prge["test_sd"] == round(statistics.stdev([72, 78, 75]), 2)
    assert (prge["test_min"], prge["test_max"], prge["n"]) == (72.0, 78.0, 3)
    assert records["mezo-lorafa-E16"]["test_sd"] is None
    assert prge["train_min"] == 2.0                                       # two steps of a minute each
    assert list(records) == ["mezo-lorafa-E16", "prge-q4-E16"]           # the paper's row order
    # one seed on one side: no test is made, whatever the gap
    one = rp.compare_rows(prge, rp.runs_of("table1", "sst2", "prge-q4-E16", 1e-3, tmp_path),
                          records["mezo-lorafa-E16"], rp.runs_of("table1", "sst2", "mezo-lorafa-E16", 1e-3, tmp_path))
    assert one["verdict"] == "one seed: untested" and one["difference"] == pytest.approx(14.0)
    # every run's best validation step is step 10 and none records a step-0 score: whether it trained is unknown
    assert prge["trained"] is None and prge["majority"] == 50.92          # SST-2's 872 test sentences: 444 positive
    assert prge["fo_gain_share"] is None                                  # no zero-shot or FO row in this folder
    assert rp.lr_note(prge) == ("lr 1e-3 chosen on validation from {1e-4, 1e-3}"
                                " (at an edge of the rates tried, so a better one may lie beyond it)")
    assert rp.lr_note(records["mezo-lorafa-E16"]) == "lr 1e-3 (one rate tried)"
    behind = rp.runs_of("table1", prge["task"], prge["row"], prge["lr"], tmp_path)   # the files of the record
    assert [r["seed"] for r in behind] == prge["seeds"] == [0, 1, 2]
    assert [100 * r["best_val"]["test"] for r in behind] == [72.0, 78.0, 75.0]
    assert len(rp.runs_of("table1", "sst2", "prge-q4-E16", results=tmp_path)) == 5    # every lr
    assert rp.runs_of("table1", "rte", "prge-q4-E16", results=tmp_path) == []
    csv_path, md_path = rp.write_summary("table1", tmp_path)
    assert "| P-RGE (q = 4) | 75.0 ± 3.0 (3) |" in md_path.read_text() and "GPU" not in md_path.read_text()
    assert csv_path.read_text().splitlines()[0].startswith("task,row,label,method,lr,seeds")
    assert "| *always the commonest answer* | 50.9 |" in md_path.read_text()
    assert "- P-RGE (q = 4): lr 1e-3 chosen on validation from {1e-4, 1e-3} (at an edge" in md_path.read_text()
    assert prge["device"] == "cpu"
    # a run on a GPU is marked wherever its row is shown, and a row mixing devices says so
    gpu = result("mezo-lorafa-E16", 1e-3, 1, 0.62, 0.65)
    gpu["config"]["device"] = "cuda:0"
    (folder / "mezo-lorafa-E16_lr1e-3_seed1.json").write_text(json.dumps(gpu))
    mixed = {r["row"]: r for r in rp.summarize("table1", tmp_path)}["mezo-lorafa-E16"]
    assert mixed["device"] == "cpu+cuda" and rp.format_score(mixed) == "63.0 ± 2.8 (2, CPU and GPU)"
    assert rp.format_score(dict(mixed, device="cuda", n=1)) == "63.0 (1, GPU)"
    _, md_path = rp.write_summary("table1", tmp_path)
    assert "GPU: the runs trained on a GPU" in md_path.read_text()
    assert mixed["processors"] == "unknown" and "Processors:" not in md_path.read_text()   # none named, one kind
    # the processors the runs computed on: each sitting's, or the provenance's for a file from before sittings
    gpu["provenance"]["hardware"] = {"cpu": "CPU A", "cuda": "GPU B"}
    (folder / "mezo-lorafa-E16_lr1e-3_seed1.json").write_text(json.dumps(gpu))
    assert rp.processors_of(gpu) == ["GPU B"]
    resumed = result("prge-q4-E16", 1e-3, 2, 0.72, 0.75)
    resumed["sittings"] = [{"step": 0, "processor": "CPU A"}, {"step": 1, "processor": "CPU C"}]
    (folder / "prge-q4-E16_lr1e-3_seed2.json").write_text(json.dumps(resumed))
    assert rp.processors_of(resumed) == ["CPU A", "CPU C"]
    rows = {r["row"]: r for r in rp.summarize("table1", tmp_path)}
    assert rows["prge-q4-E16"]["processors"] == "CPU A+CPU C+unknown"
    assert rows["mezo-lorafa-E16"]["processors"] == "GPU B+unknown"
    _, md_path = rp.write_summary("table1", tmp_path)
    assert "Processors: the runs ran on CPU A, CPU C, GPU B and unknown (each row's in summary.csv" in \
        md_path.read_text()


def test_a_row_that_never_left_zero_shot_prints_did_not_train_and_gain_shares_follow_table1(tmp_path):
    def result(row, method, lr, seed, start, best, test, steps=2):
        first, point = {"step": 0, "val": start, "test": test}, {"step": 2, "val": best, "test": test}
        return {"kind": "train", "task": "sst2", "method": method, "seed": seed, "steps": steps,
                "config": {"task": "sst2", "seed": seed, "lr": lr, "steps": steps}, "best_val": point,
                "final": point, "evals": [first, point], "losses": [1.0] * steps, "cell": {"row": row, "lr": lr},
                "data_sizes": {"train": 1000, "val": 500, "test": 872},
                "provenance": {"command": "x", "commit": None, "versions": {}, "hardware": {}, "wall_time_s": 1.0}}
    folder = tmp_path / "table1" / "sst2"
    folder.mkdir(parents=True)
    # start 0.5 on 500 validation examples: standard error sqrt(0.25 / 500) = 0.02236
    runs = [("zeroshot", "zeroshot", None, 0, 0.5, 0.5, 0.50, 0), ("fo-lorafa", "fo-lorafa", 3e-4, 0, 0.5, 0.9, 0.90),
            ("mezo-E16", "mezo", 1e-6, 0, 0.5, 0.522, 0.52),            # +0.022: inside one standard error
            ("prge-q4-E16", "prge", 1e-3, 0, 0.5, 0.52, 0.70), ("prge-q4-E16", "prge", 1e-3, 1, 0.5, 0.523, 0.80)]
    for row, method, lr, seed, start, best, test, *steps in runs:
        name = f"{row}_seed{seed}" if lr is None else f"{row}_lr{rp.lr_text(lr)}_seed{seed}"
        (folder / f"{name}.json").write_text(json.dumps(result(row, method, lr, seed, start, best, test, *steps)))
    records = {r["row"]: r for r in rp.summarize("table1", tmp_path)}
    assert records["mezo-E16"]["trained"] is False and records["zeroshot"]["trained"] is None
    assert records["prge-q4-E16"]["trained"] is True                    # seed 1 rose 0.023 > 0.02236
    # seed 0 did not (0.020): the row trained, and its mean holds one seed that stayed at zero-shot
    assert [records[k]["stayed"] for k in ("prge-q4-E16", "mezo-E16", "zeroshot")] == [1, 1, None]
    assert rp.format_score(records["mezo-E16"]) == "did not train (1)"
    # (75 - 50) / (90 - 50) = 0.625 -> 0.62; the paper's SST-2: (89.1 - 55.3) / (94.2 - 55.3) = 0.8689
    assert records["prge-q4-E16"]["fo_gain_share"] == 0.62 and records["prge-q4-E16"]["paper_fo_gain_share"] == 0.87
    assert records["fo-lorafa"]["fo_gain_share"] is None                 # FO rows have no share
    _, md_path = rp.write_summary("table1", tmp_path)
    text = md_path.read_text()
    assert "| MeZO (Full) | did not train (1) |" in text and "| P-RGE (q = 4) | 0.62 (paper 0.87) |" in text
    assert "- MeZO (Full): lr 1e-6 (one rate tried)" in text
    # a row that did not train at all is not listed again among rows with a seed that stayed
    assert ("in a row whose other seeds did, counted in the row's mean at their best validation step: P-RGE (q = 4) on "
            "sst2 (1 of 2 seeds).") in text
    # every run here was at its best at its last evaluation (step 2): the budget may have stopped it
    assert (records["prge-q4-E16"]["best_at_end"], records["zeroshot"]["best_at_end"]) == (2, None)
    assert ("more steps might have raised it: FO-Adam (LoRA-FA) on sst2 (1 of 1 seed); MeZO (Full) on sst2 (1 of 1 "
            "seed); P-RGE (q = 4) on sst2 (2 of 2 seeds).") in text
    # where FO LoRA-FA itself never left zero-shot there is no gain to share: no ratio, no share table
    (folder / "fo-lorafa_lr3e-4_seed0.json").write_text(json.dumps(result("fo-lorafa", "fo-lorafa", 3e-4, 0, 0.5,
                                                                          0.51, 0.40)))
    records = {r["row"]: r for r in rp.summarize("table1", tmp_path)}
    assert records["fo-lorafa"]["trained"] is False and records["prge-q4-E16"]["fo_gain_share"] is None
    _, md_path = rp.write_summary("table1", tmp_path)
    assert "Share of first-order LoRA-FA's gain" not in md_path.read_text()
    # a second rate for MeZO (Full) that stays at zero-shot too, and one for P-RGE that does: the lr note says where
    # no rate of a row trained (its choice is noise), and only there
    for row, method, lr, best in (("mezo-E16", "mezo", 1e-7, 0.51), ("prge-q4-E16", "prge", 1e-4, 0.51)):
        (folder / f"{row}_lr{rp.lr_text(lr)}_seed0.json").write_text(json.dumps(result(row, method, lr, 0, 0.5,
                                                                                       best, 0.5)))
    records = {r["row"]: r for r in rp.summarize("table1", tmp_path)}
    assert records["mezo-E16"]["lrs_trained"] == [] and records["prge-q4-E16"]["lrs_trained"] == [1e-3]
    assert records["zeroshot"]["lrs_trained"] == [] and records["zeroshot"]["lrs_planned"] == []
    assert rp.lr_note(records["mezo-E16"]) == ("lr 1e-6 chosen on validation from {1e-7, 1e-6}, where no rate "
                                               "trained: the choice is the noise of a validation score")
    assert rp.lr_note(records["prge-q4-E16"]) == ("lr 1e-3 chosen on validation from {1e-4, 1e-3}"
                                                  " (at an edge of the rates tried, so a better one may lie beyond it)")


def test_best_at_end_asks_whether_the_last_evaluation_holds_the_best_score():
    run = lambda vals: {"evals": [{"step": 100 * k, "val": v} for k, v in enumerate(vals)],  # noqa: E731
                        "best_val": {"step": 100 * vals.index(max(vals)), "val": max(vals)}}
    assert rp.best_at_end(run([0.5, 0.6, 0.7])) is True
    assert rp.best_at_end(run([0.5, 0.7, 0.7])) is True          # a tie with an earlier step still counts
    assert rp.best_at_end(run([0.5, 0.7, 0.6])) is False
    assert rp.best_at_end(run([0.8, 0.6, 0.7])) is False         # best at step 0: it fell and never came back
    assert rp.best_at_end(run([0.5])) is None                    # no evaluation after step 0


def test_the_lr_note_says_an_edge_and_the_rates_still_to_run():
    """A rate chosen inside the rates tried says nothing more; at their edge it says a better one may lie beyond;
    the grid's rates not yet run are named, with one rate tried as with several; a row where no rate trained has
    no edge to speak of (its choice is noise)."""
    note = lambda lr, tried, planned=(), trained=None: rp.lr_note(  # noqa: E731
        {"lr": lr, "lrs_tried": tried, "lrs_planned": list(planned), "lrs_trained": trained})
    assert note(1e-4, [1e-5, 1e-4, 1e-3], [1e-5, 1e-4, 1e-3]) == "lr 1e-4 chosen on validation from {1e-5, 1e-4, 1e-3}"
    assert note(1e-5, [1e-5, 1e-4], [1e-7, 1e-6, 1e-5, 1e-4, 1e-3], [1e-5, 1e-4]) == (
        "lr 1e-5 chosen on validation from {1e-5, 1e-4} (at an edge of the rates tried, so a better one may lie beyond it; {1e-7, 1e-6, 1e-3} of its grid "
        "still to run)")
    assert note(1e-3, [1e-3], [1e-4, 1e-3]) == "lr 1e-3 (one rate tried; {1e-4} of its grid still to run)"
    assert note(1e-3, [1e-3], [1e-3]) == "lr 1e-3 (one rate tried)"
    assert note(1e-1, [1e-2, 1e-1], [1e-2, 1e-1], []) == (
        "lr 1e-1 chosen on validation from {1e-2, 1e-1}, where no rate trained: the choice is the noise of a "
        "validation score")
    assert note(None, []) == "no training"


def test_device_runs_the_same_cell():
    """--device cuda changes where a cell trains, not which cell it is: its result stands for the CPU cell."""
    cpu, = rp.grid_cells("table1", "cpu", only="rte/prge-q4-E16_lr1e-3_seed0")
    gpu, = rp.grid_cells("table1", "cpu", only="rte/prge-q4-E16_lr1e-3_seed0", device="cuda")
    zs, = rp.grid_cells("table1", "cpu", only="rte/zeroshot", device="cuda")
    assert gpu.name == cpu.name and gpu.config()["device"] == "cuda" and "device" not in cpu.config()
    assert zs.config()["device"] == "cuda"                           # zero-shot cells move too
    assert gpu.command().endswith("--device cuda") and "--device" not in cpu.command()
    saved = {"config": dict(gpu.config())}
    assert rp.cell_matches(cpu, saved) == [] and rp.cell_matches(gpu, {"config": dict(cpu.config())}) == []
    assert rp.cell_matches(cpu, {"config": dict(gpu.config(), lr=1e-4)}) == ["lr"]


def test_a_gpu_runs_the_papers_budget_with_the_optimised_engine():
    """At the paper profile a GPU's ZO LoRA-FA cells replay their steps as CUDA graphs over fine length buckets
    (chapter 5); the CPU's cells and the other methods are as they were, and the cell stays the same cell."""
    gpu = {c.name: c for c in rp.grid_cells("table1", "paper", device="cuda") if c.kind == "train"}
    cpu = {c.name: c for c in rp.grid_cells("table1", "paper") if c.kind == "train"}
    assert gpu.keys() == cpu.keys()
    engine = {"buckets": "16,24,32,48,64,96,128,192,256,384,512,768,1024", "cuda_graphs": True}
    for name, cell in gpu.items():
        config = cell.config()
        if config["method"] in ("prge", "mezo-lorafa"):
            assert {k: config.get(k) for k in engine} == engine, name
            resolved = TrainConfig(**config).resolved()
            assert (resolved.engine, resolved.noise, resolved.cuda_graphs) == ("fused", "counter", True)
        else:
            assert "buckets" not in config and "cuda_graphs" not in config, name
        assert "buckets" not in cpu[name].config() and "cuda_graphs" not in cpu[name].config()
        assert rp.cell_matches(cpu[name], {"config": dict(config)}) == []         # the GPU's result is the cell's
        assert rp.cell_matches(cell, {"config": dict(cpu[name].config())}) == []
    with_graphs, = rp.grid_cells("table1", "cpu", only="rte/prge-q4-E16_lr1e-3_seed0", device="cuda")
    assert "cuda_graphs" not in with_graphs.config()          # the cpu profile on a GPU runs as it did


def test_a_malformed_result_is_refused_by_the_schema():
    import jsonschema

    point = {"step": 2, "val": 0.7, "test": 0.7}
    good = {"kind": "train", "task": "sst2", "method": "prge", "seed": 0, "steps": 2,
            "config": {"task": "sst2", "seed": 0}, "best_val": point, "final": point, "evals": [point],
            "losses": [1.0, 0.5], "provenance": {"command": "x", "commit": None, "versions": {}, "hardware": {},
                                                 "wall_time_s": 1.0}}
    rp.validate_result(good)
    for broken in ({**good, "best_val": {**point, "val": 70.0}},       # a percentage where a fraction belongs
                   {k: v for k, v in good.items() if k != "provenance"},
                   {**good, "losses": [1.0]},                          # two steps, one loss
                   {**good, "evals": []}):
        with pytest.raises(jsonschema.ValidationError):
            rp.validate_result(broken)
    with pytest.raises(jsonschema.ValidationError):
        rp.validate_result({"kind": "bench", "configs": {}})            # the benchmark schema applies to benchmarks


def test_checkpoints_default_to_the_cache_folder_outside_the_clone(monkeypatch, tmp_path):
    monkeypatch.setenv("PRGE_CACHE_DIR", str(tmp_path / "cache"))
    cell = rp.grid_cells("table1", "cpu", only="sst2/prge-q4-E16_lr1e-3_seed0")[0]
    assert cell.checkpoint_dir() == tmp_path / "cache" / "reproduce" / "table1" / cell.name
    assert cell.checkpoint_dir(tmp_path / "ck") == tmp_path / "ck" / "table1" / cell.name
    assert rp.cell_status(cell, results=tmp_path / "none")["state"] == "missing"


def test_training_seconds_takes_out_a_pause():
    steady = {"step_s": {"per_step": [2.0, 3.0, 2.5, 2.5]}}
    paused = {"step_s": {"per_step": [2.0, 3.0, 900.0, 2.5, 2.5]}}     # stopped for 15 min inside step 2
    assert rp.training_seconds(steady) == 10.0
    assert rp.training_seconds(paused) == 12.5                               # the paused step counts as the median
    assert rp.training_seconds({"method": "zeroshot"}) is None


def _copy_results(paths, folder: Path) -> None:
    """Committed result files copied under ``folder`` at their places below the results folder."""
    for path in paths:
        copy = folder / path.relative_to(rp.RESULTS)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(path.read_text())


def test_committed_results_are_valid_and_their_summaries_recompute(tmp_path):
    """Every committed grid result passes the schema and is a cell of its grid (of a two-stage grid, its sweep
    with the rates a stalled row's training loss added), and a committed summary equals the one recomputed from
    the JSON files (the tables chapter 7 reads cannot drift from their runs)."""
    checked = 0
    for grid in rp.GRIDS:
        folder = rp.RESULTS / grid
        if not folder.is_dir():
            continue
        results = rp.load_results(grid)       # validates every file
        checked += len(results)
        cells = {}                            # (profile, seed): the grid's cells, each sweep read once
        for r in results:
            cell_name = r["_file"][:-len(".json")]
            key = (r.get("cell", {}).get("profile", "cpu"), r["seed"])
            if key not in cells:
                cells[key] = rp.sweep_cells(grid, key[0], seeds=[key[1]])
            match = [c for c in cells[key] if c.name == cell_name]
            assert match, f"{grid}/{r['_file']} is not a cell of grid {grid}"
            assert not rp.cell_matches(match[0], r), f"{grid}/{r['_file']}: {rp.cell_matches(match[0], r)}"
        if (folder / "summary.csv").is_file():
            _copy_results((folder / r["_file"] for r in results), tmp_path)
            csv_path, md_path = rp.write_summary(grid, tmp_path)
            assert csv_path.read_text() == (folder / "summary.csv").read_text(), grid
            assert md_path.read_text() == (folder / "summary.md").read_text(), grid
    if not checked:
        pytest.skip("no grid results committed yet")


def test_cli_lists_runs_and_refuses_bad_input(tiny_env, tiny_folder, tmp_path, capsys):
    roots = ["--results-dir", str(tmp_path / "res"), "--checkpoint-root", str(tmp_path / "ck")]
    assert main(["reproduce", "table1", "--only", "sst2/prge-q4", "--list", *roots]) == 0
    out = capsys.readouterr().out
    assert "sst2/prge-q4-E16_lr1e-3_seed2" in out and "0/3 done" in out
    assert main(["reproduce", "table1", "--only", "sst2/zeroshot", "--dry-run", *roots]) == 0
    assert "would run: prge reproduce table1 --profile cpu --only sst2/zeroshot_seed0" in capsys.readouterr().out
    assert main(["reproduce", "table1", "--only", "nothing", *roots]) == 2
    assert "no cell of grid 'table1' matches --only 'nothing'" in capsys.readouterr().err
    assert main(["reproduce", "table1", "--seeds", "a,b", *roots]) == 2
    assert "--seeds takes integers" in capsys.readouterr().err
    assert main(["reproduce", "table1", "--summary", *roots]) == 2
    assert "has no training results" in capsys.readouterr().err
    for bad in ("0", "nan"):
        for look in ([], ["--dry-run"], ["--list"]):        # what a run refuses, its dry run and listing refuse
            assert main(["reproduce", "table1", "--only", "sst2/zeroshot", "--time-limit", bad, *look, *roots]) == 2
            assert f"--time-limit takes minutes > 0, got {float(bad)}" in capsys.readouterr().err
    assert main(["reproduce", "table1", "--only", "sst2/prge-q4", "--width-groups", "0", "--dry-run", *roots]) == 2
    assert "--width-groups takes a whole number of groups ≥ 1, got 0" in capsys.readouterr().err
    assert main(["reproduce", "table1", "--only", "sst2/zeroshot", "--time-limit", "1e-9", *roots]) == 3
    assert "1 of 1 cells still to run; the same command continues (exit status 3)" in capsys.readouterr().err
    assert main(["reproduce", "runtime", "--device", "cuda", *roots]) == 2
    assert "no CUDA device is available" in capsys.readouterr().err
    assert main(["reproduce", "table1", "--dtype", "fp16", *roots]) == 2
    assert "applies to the benchmark grids" in capsys.readouterr().err
    assert main(["reproduce", "table1", "--only", "sst2/zeroshot", "--device", "tpu", *roots]) == 2
    assert "device 'tpu': choose cpu or cuda" in capsys.readouterr().err
    # a tiny real run through the command line: the zero-shot cell of one seed
    assert main(["reproduce", "table1", "--only", "sst2/zeroshot", "--model", str(tiny_folder), *roots]) == 0
    result = json.loads((tmp_path / "res" / "table1" / "sst2" / "zeroshot_seed0.json").read_text())
    assert result["method"] == "zeroshot" and result["best_val"]["step"] == 0 and result["steps"] == 0


def test_list_prices_steps_from_the_committed_result_files(monkeypatch, tmp_path, unmeasured_processor):
    """--list's seconds per step are medians of the committed SST-2 cells' measured steps, a run that does not price
    a CPU step alone is left out, and a method without one is priced by the stated assumption, which the listing
    names."""
    from prge_lib.experiments import estimates

    made = sorted(rp.RESULTS.glob("table1/sst2/prge-q4-E16_*.json")) + \
        sorted(rp.RESULTS.glob("senszoq/sst2/prge-q4-E16-nf4_*.json"))
    assert len(made) >= 4                                  # the committed P-RGE SST-2 cells, three seeds and more
    medians = [rp.read_result(p)["step_s"]["median"] for p in made]
    _copy_results(made, tmp_path)                           # the same runs, copied where a grid keeps them
    run = json.loads(made[0].read_text())
    decoys = {"rte/prge-q4-E16_lr1e-3_seed7.json": {"task": "rte"},                 # another task
              "sst2/prge-q4-E16_lr1e-3_seed8.json": {"same_run_as": "alternatives/sst2/x.json"},   # counted once
              "sst2/prge-q4-E16_lr1e-3_seed9.json": {"packed": {"runs": 8}}}         # a pack's share of a step
    for name, change in decoys.items():
        (tmp_path / "table1" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "table1" / name).write_text(json.dumps({**run, **change}))
    threads = json.loads(json.dumps(run))
    threads["provenance"]["hardware"]["torch_threads"] = 2                            # not one thread
    (tmp_path / "table1" / "sst2" / "prge-q4-E16_lr1e-3_seed10.json").write_text(json.dumps(threads))
    assert rp.measured_step_seconds(tmp_path)["prge"] == (statistics.median(medians), len(made))
    found = rp.measured_step_seconds()["prge"]
    assert found[1] >= len(made)
    assert estimates.step_rate({"method": "mezo", "adapter": "vera"}) > estimates.step_rate({"method": "mezo",
                                                                                              "adapter": "lora"})
    listing = rp.list_cells(rp.grid_cells("table1", "cpu", only="wnli/prge-q4"), rp.RESULTS)      # not run yet
    assert "seconds per step measured in committed SST-2 cells" in listing and \
        f"prge {found[0]:.1f} s ({found[1]})" in listing
    monkeypatch.setattr(estimates, "priced_runs", lambda results=rp.RESULTS: ())          # no committed run
    assert estimates.step_rate({"method": "prge"}) == rp.ASSUMED_SECONDS_PER_STEP
    assert rp.step_basis([{"method": "prge"}]) == (f"seconds per step assumed {rp.ASSUMED_SECONDS_PER_STEP} s "
                                                   "(no committed cell to measure): prge")


def test_a_step_is_priced_from_this_processors_runs_where_it_has_enough(tmp_path, monkeypatch):
    """Runs that computed on one processor alone price a step for that processor; a machine with at least
    LOCAL_MIN_RUNS of them for a method prices from those only, and --list says so; another machine from all."""
    from prge_lib.experiments import estimates

    made = [p for p in sorted(rp.RESULTS.glob("senszoq/sst2/senszoq-*.json"))
            if "same_run_as" not in rp.read_result(p)]             # an adopted run is priced in its own grid
    for i, path in enumerate(made[:4]):         # four runs, the first three on processor "A", the last on A and B
        run = json.loads(path.read_text())
        run["sittings"] = [{"step": 0, "processor": "A"}] + ([{"step": 5, "processor": "B"}] if i == 3 else [])
        copy = tmp_path / path.relative_to(rp.RESULTS)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(json.dumps(run))
    medians = [rp.read_result(p)["step_s"]["median"] for p in made[:4]]
    assert rp.measured_step_seconds(tmp_path, "A")["senszoq"] == (statistics.median(medians[:3]), 3)
    assert "senszoq" not in rp.measured_step_seconds(tmp_path, "B")        # B computed only part of a run
    assert rp.measured_step_seconds(tmp_path)["senszoq"] == (statistics.median(medians), 4)
    # the committed runs: the processor with the most SensZOQ runs prices from its own; an unknown one from all
    names = [estimates.processors_of(rp.read_result(p)) for p in made]
    busiest = max({n[0] for n in names if len(n) == 1}, key=lambda n: names.count([n]))
    assert names.count([busiest]) >= estimates.LOCAL_MIN_RUNS
    monkeypatch.setattr(estimates, "cpu_name", lambda: busiest)
    assert estimates.step_measure("senszoq") == (*rp.measured_step_seconds(rp.RESULTS, busiest)["senszoq"], True)
    assert f"(this processor: {busiest})" in rp.step_basis([{"method": "senszoq"}])
    monkeypatch.setattr(estimates, "cpu_name", lambda: "a processor no run used")
    assert estimates.step_measure("senszoq") == (*rp.measured_step_seconds()["senszoq"], False)
    assert "this processor" not in rp.step_basis([{"method": "senszoq"}])


def test_a_cell_is_priced_from_runs_of_its_own_task_method_batch_and_weights(tmp_path, monkeypatch,
                                                                               unmeasured_processor):
    """Where committed runs of a cell's task, method, batch and weight format exist, its steps and evaluations are
    priced at their medians, not as SST-2's steps scaled by prompt length (which priced RTE's MeZO (LoRA-FA) step
    at 1.6x what it measured); a run at another batch, on NF4 weights, at two threads or in a pack does not count,
    and a cell without such a run is priced by scaling, as --list says."""
    from prge_lib.experiments import estimates

    source = next(p for p in sorted(rp.RESULTS.glob("table1/rte/mezo-lorafa-E16_*.json"))
                  if rp.device_of(rp.read_result(p)) == "cpu")
    run = json.loads(source.read_text())
    evaluations = len(run["evals"])
    folder = tmp_path / "table1" / "rte"
    folder.mkdir(parents=True)

    def write(seed, step, evaluation, **change):
        made = json.loads(json.dumps(run))
        made["step_s"]["median"], made["elapsed_s"]["eval_s"] = step, evaluation * evaluations
        for key, value in change.items():
            target = made["config"] if key in made["config"] else made
            target[key] = value
        (folder / f"mezo-lorafa-E16_lr1e-3_seed{seed}.json").write_text(json.dumps(made))

    for seed, step, evaluation in ((10, 10.0, 100.0), (11, 12.0, 140.0), (12, 14.0, 120.0)):
        write(seed, step, evaluation)
    write(13, 90.0, 900.0, E=8, batch_size=8)              # another batch
    write(14, 90.0, 900.0, quant="nf4")                    # other weights
    write(15, 90.0, 900.0, packed={"runs": 4})             # a pack's step
    threads = json.loads(json.dumps(run))
    threads["provenance"]["hardware"]["torch_threads"] = 2
    (folder / "mezo-lorafa-E16_lr1e-3_seed16.json").write_text(json.dumps(threads))
    _copy_results(rp.RESULTS.glob("table1/sst2/prge-q4-E16_*.json"), tmp_path)   # what prices the others' steps
    monkeypatch.setattr(estimates, "RESULTS", tmp_path)

    cell = rp.grid_cells("table1", "cpu", only="rte/mezo-lorafa")[0]
    assert rp.task_measure("rte", cell.config()) == estimates.TaskMeasure(12.0, 120.0, 3, False)
    assert rp.step_seconds("rte", cell.config()) == 12.0 and rp.evaluation_seconds("rte", cell.config()) == 120.0
    assert rp.estimate_seconds(cell, 1000) == pytest.approx(1000 * 12.0 + 11 * 120.0)
    other = rp.grid_cells("table1", "cpu", only="rte/prge-q4")[0]              # no run of its own here
    assert rp.task_measure("rte", other.config()) is None
    assert rp.step_seconds("rte", other.config()) == \
        estimates.step_rate(other.config()) * rp.prompt_length_factor("rte", other.config())
    basis = rp.list_cells([cell, other], tmp_path, tmp_path).splitlines()[-1]
    assert basis.startswith("seconds per step and evaluation of 1 cell from committed runs of their own task, "
                            "method and batch") and \
        "; of the others: measured in committed SST-2 cells" in basis and "prge " in basis
    # the weight format a cell implies: SensZOQ trains over NF4 weights without its cell's config saying so
    assert estimates.weight_format(rp.grid_cells("senszoq", "cpu")[0].config()) == "nf4"
    assert estimates.weight_format(cell.config()) == "none"


def test_a_cell_another_grid_has_run_is_adopted_not_run_again(tmp_path, monkeypatch):
    # the senszoq sweep's cells at the alternatives grid's rate are that grid's runs: same settings, seed and steps
    made = Path("data/results/alternatives/sst2/senszoq-random-s1e-3_lr1e-4_seed0.json")
    (tmp_path / "alternatives" / "sst2").mkdir(parents=True)
    twin = tmp_path / "alternatives" / "sst2" / made.name
    twin.write_text(made.read_text())
    sweep = {c.name: c for c in rp.grid_cells("senszoq") if c.task == "sst2"}
    cell = sweep["sst2/senszoq-random-s1e-3_lr1e-4_seed0"]
    other_rate = sweep["sst2/senszoq-random-s1e-3_lr1e-3_seed0"]
    assert rp.twin_result(cell, tmp_path) == twin and rp.twin_result(other_rate, tmp_path) is None
    assert rp.twin_result(next(c for c in rp.grid_cells("alternatives") if c.name == cell.name), tmp_path) is None
    assert rp.cell_status(cell, tmp_path, tmp_path)["state"] == "same run in alternatives"
    listing = rp.list_cells([cell, other_rate], tmp_path, tmp_path)
    assert "0/2 done and 1 made by another grid" in listing
    assert rp.price_cells([cell], tmp_path, tmp_path)["seconds"] == [0.0]

    monkeypatch.setattr(runner, "_run_held", lambda *a, **k: pytest.fail("an adopted cell must not train"))
    said = []
    assert rp.run_grid([cell], results=tmp_path, checkpoints=tmp_path / "ck", progress=False,
                       say=said.append) == [cell.result_path(tmp_path)]
    assert any("the same run as alternatives/sst2/" in s and "adopted" in s for s in said)
    original, adopted = rp.read_result(made), json.loads(cell.result_path(tmp_path).read_text())   # as read: upgraded
    assert adopted["same_run_as"] == "alternatives/sst2/senszoq-random-s1e-3_lr1e-4_seed0.json"
    assert adopted["cell"]["grid"] == "senszoq" and adopted["provenance"] == original["provenance"]
    assert {k: v for k, v in adopted.items() if k not in ("cell", "same_run_as")} == \
        {k: v for k, v in original.items() if k != "cell"}
    assert rp.cell_status(cell, tmp_path, tmp_path)["state"] == "done"
    assert [r["seed"] for r in rp.runs_of("senszoq", "sst2", "senszoq-random-s1e-3", 1e-4, tmp_path)] == [0]
    assert [n for _, n in rp.measured_step_seconds(tmp_path).values()] == [1]     # one run, priced once

    # a copy names the file the run first went to: the alternatives cell, its file gone, takes it back from the copy
    # and is its own again
    twin.unlink()
    alt_cell = next(c for c in rp.grid_cells("alternatives") if c.name == cell.name)
    rp.run_grid([alt_cell], results=tmp_path, checkpoints=tmp_path / "ck", progress=False, say=said.append)
    restored = json.loads(twin.read_text())
    assert "same_run_as" not in restored and restored["cell"]["grid"] == "alternatives"

    # a file there made with other settings is no twin: the cell stays to run
    changed = dict(json.loads(made.read_text()), config={**original["config"], "eps": 1e-2})
    twin.write_text(json.dumps(changed))
    cell.result_path(tmp_path).unlink()
    assert rp.twin_result(cell, tmp_path) is None and rp.cell_status(cell, tmp_path, tmp_path)["state"] == "missing"
