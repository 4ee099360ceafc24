"""``prge reproduce --pack N`` (chapter 7): training cells trained in packs write the result files their solo runs
write, up to the float-rounding bound of tests/test_packing.py, each resumable on its own; --list prices them.

The bound is test_packing's (its module docstring derives it): for each cell, β_ℓ on every loss and β_g on every
projected gradient, computed from the cell's solo run on the tiny model (its largest logit, noise and adapter).
A packed cell and its solo twin see the same weights, noise and rows; only the reductions' blocking, the
padded length and the LoRA-FA products' grouping differ, which is what that bound covers.
"""
import json
import time

import pytest

from prge_lib.cli.main import main
from prge_lib.common.provenance import as_float32
from prge_lib.experiments import reproduce as rp
from prge_lib.experiments import runner
from prge_lib.training.trainer import TrainConfig, Trainer

from test_packing import bounds, max_logit

TINY = {"steps": 4, "n_train": 16, "n_val": 8, "n_test": 8, "eval_every": 2, "checkpoint_every": 1,
        "max_length": 32}                  # the bound of test_packing reads the longest length
QUIET = {"progress": False, "say": lambda _: None}


def _cells(tiny_folder, name: str, seeds=(0,)) -> list[rp.Cell]:
    return rp.grid_cells("table1", "cpu", seeds=seeds, only=name, model=str(tiny_folder), **TINY)


def _read(cell: rp.Cell, results) -> dict:
    return json.loads(cell.result_path(results).read_text())


@pytest.fixture(scope="module")
def grid(fixture_data, tiny_folder, tiny_factory, tokenizer, tmp_path_factory):
    """Four SST-2/RTE cells (P-RGE q 4 seeds 0 and 1 on SST-2, P-RGE q 4 on RTE, MeZO LoRA-FA seed 0 on SST-2)
    run with --pack 1 and --pack 3, and each cell's rounding bound from its solo run."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PRGE_DATA_DIR", str(fixture_data))
        cells = (_cells(tiny_folder, "sst2/prge-q4", (0, 1)) + _cells(tiny_folder, "rte/prge-q4")
                 + _cells(tiny_folder, "sst2/mezo-lorafa"))
        root = tmp_path_factory.mktemp("packed-grid")
        solo, packed = root / "solo", root / "packed"
        rp.run_grid(cells, results=solo, checkpoints=root / "ck1", pack=1, **QUIET)
        said = []
        rp.run_grid(cells, results=packed, checkpoints=root / "ck3", pack=3, progress=False, say=said.append)
        limits = {}
        for cell in cells[:3]:
            one = Trainer(TrainConfig(**cell.config()), tiny_factory(), tokenizer, progress=False)
            start = max_logit(one)
            result = one.run()
            assert result["losses"] == as_float32(_read(cell, solo)["losses"])     # what --pack 1 wrote
            limits[cell.name] = bounds(one, max(start, max_logit(one)), result["losses"])
        yield {"cells": cells, "solo": solo, "packed": packed, "said": said, "bounds": limits}


def _within_bound(result: dict, reference: dict, bound: dict) -> None:
    """``result`` is ``reference`` up to the rounding bound: losses within β_ℓ, projected gradients within β_g,
    the same evaluations and steps (the test also fails when nothing was trained: the losses must be there)."""
    assert len(result["losses"]) == len(reference["losses"]) == result["steps"]
    assert max(abs(a - b) for a, b in zip(result["losses"], reference["losses"])) <= bound["loss"]
    grads = [abs(a - b) for ga, gb in zip(result["projected_grad"], reference["projected_grad"]) for a, b in zip(ga, gb)]
    assert len(grads) == sum(map(len, reference["projected_grad"])) and max(grads) <= bound["grad"]
    for key in ("evals", "best_val", "final", "config", "seed", "cell", "status", "model"):
        assert result[key] == reference[key], key


def test_a_packed_grid_writes_the_solo_result_files(grid):
    cells, solo, packed = grid["cells"], grid["solo"], grid["packed"]
    # the three P-RGE q 4 cells share a pack (SST-2's, then RTE's); MeZO on LoRA-FA, of another step shape (q 1,
    # 16 rows per copy), is not packed with them and runs alone, as before
    assert grid["said"][1] == f"pack of 3: {', '.join(c.name for c in cells[:3])}"
    assert grid["said"][2] == f"cell {cells[3].name}"
    for cell in cells[:3]:
        result, reference = _read(cell, packed), _read(cell, solo)
        _within_bound(result, reference, grid["bounds"][cell.name])
        assert set(result) - set(reference) == {"packed"}                   # the fields run_cell writes, plus
        assert result["packed"]["runs"] == 3 and result["packed"]["name"] == cell.name
        assert result["provenance"]["command"] == reference["provenance"]["command"] == (
            f"prge reproduce table1 --profile cpu --only {cell.name} --steps 4 --model {cell.config()['model']}"
            + ("" if cell.seed in cell.row.seeds["cpu"] else f" --seeds {cell.seed}"))
    assert _read(cells[3], packed)["losses"] == _read(cells[3], solo)["losses"] and "packed" not in _read(cells[3], packed)
    # every file is accepted as its cell's by the summaries, and both folders make one table
    loaded = {r["_file"] for r in rp.load_results("table1", packed)}
    assert loaded == {f"{c.name}.json" for c in cells}
    assert [(r["row"], r["n"]) for r in rp.summarize("table1", packed)] == \
        [(r["row"], r["n"]) for r in rp.summarize("table1", solo)]
    assert not any(c.checkpoint_dir(packed.parent / "ck3").exists() for c in cells)   # removed with the result


def test_a_pack_in_width_groups_writes_the_same_cells(grid, tmp_path, monkeypatch, fixture_data):
    """--width-groups 2: each step of the pack of three in two forwards by batch width; every cell's result is
    its solo run's up to the rounding bound, as in one forward."""
    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    cells = grid["cells"][:3]
    said, forwards = [], []
    real_step = runner.PackedTrainer.__init__

    def spy(self, *args, **kwargs):                 # count the forwards of each pack step
        real_step(self, *args, **kwargs)
        step = self.pack._step_runs
        self.pack._step_runs = lambda order, work: forwards.append(len(order)) or step(order, work)

    monkeypatch.setattr(runner.PackedTrainer, "__init__", spy)
    rp.run_grid(cells, results=tmp_path / "res", checkpoints=tmp_path / "ck", pack=3, width_groups=2,
                progress=False, say=said.append)
    assert f"pack of 3: {', '.join(c.name for c in cells)}" in said
    for cell in cells:
        result = _read(cell, tmp_path / "res")
        _within_bound(result, _read(cell, grid["solo"]), grid["bounds"][cell.name])
        assert result["packed"]["runs"] == 3
    assert forwards[:2] == [2, 1] and len(forwards) == 2 * 4            # two forwards (2 + 1 cells) a step
    with pytest.raises(ValueError, match="--width-groups takes a whole number of groups ≥ 1, got 0"):
        rp.run_grid(cells, results=tmp_path / "res", pack=3, width_groups=0)


def test_a_pack_stopped_by_the_deadline_resumes_each_cell(grid, tmp_path, monkeypatch):
    cells, whole = grid["cells"][:3], grid["packed"]
    res, ck = tmp_path / "res", tmp_path / "ck"
    monkeypatch.setattr(runner, "_fits_before", lambda cell, deadline: True)   # starts, and stops after a step
    said = []
    assert rp.run_grid(cells, results=res, checkpoints=ck, progress=False, say=said.append, deadline=0.0,
                       pack=3) == []
    assert "stopped by the time limit" in said[-1] and said[-1].endswith("the same command resumes it")
    listing = rp.list_cells(cells, res, ck, pack=3)
    assert listing.count("partial 1/4") == 3 and listing.count("packed ×3") == 3
    monkeypatch.undo()
    rp.run_grid(cells, results=res, checkpoints=ck, pack=3, **QUIET)         # the same command
    for cell in cells:
        result, reference = _read(cell, res), _read(cell, whole)
        for key in ("losses", "projected_grad", "evals", "best_val", "final"):
            assert result[key] == reference[key], key                        # the same pack: identical
        assert result["resumed_at_steps"] == [1] and not cell.checkpoint_dir(ck).exists()

    # checkpoints are per cell: two cells stopped in a pack of two resume in a pack with a new third cell
    res, ck = tmp_path / "res2", tmp_path / "ck2"
    monkeypatch.setattr(runner, "_fits_before", lambda cell, deadline: True)
    rp.run_grid(cells[:2], results=res, checkpoints=ck, deadline=0.0, pack=3, **QUIET)
    monkeypatch.undo()
    assert [rp.cell_status(c, res, ck)["state"] for c in cells] == ["partial", "partial", "missing"]
    rp.run_grid(cells, results=res, checkpoints=ck, pack=3, **QUIET)
    for cell in cells:
        result = _read(cell, res)
        assert result["packed"]["runs"] == 3
        assert result["resumed_at_steps"] == ([1] if cell in cells[:2] else [])
        _within_bound(result, _read(cell, grid["solo"]), grid["bounds"][cell.name])


def test_a_cell_locked_by_another_holder_is_left_out_of_the_pack(grid, tmp_path):
    cells = grid["cells"][:3]
    res, ck = tmp_path / "res", tmp_path / "ck"
    said = []
    with rp.cell_lock(cells[1], ck):             # another holder of the middle cell
        rp.run_grid(cells, results=res, checkpoints=ck, progress=False, say=said.append, pack=3)
        assert rp.cell_status(cells[1], res, ck)["state"] == "running"
    assert any(f"cell {cells[1].name} is running in another process" in line and "out of the pack" in line
               for line in said)
    assert not cells[1].result_path(res).is_file()
    for cell in (cells[0], cells[2]):
        result = _read(cell, res)
        assert result["packed"]["runs"] == 2 and result["packed"]["with"] == [c.name for c in (cells[0], cells[2])
                                                                              if c is not cell]
        _within_bound(result, _read(cell, grid["solo"]), grid["bounds"][cell.name])


def test_a_diverging_cell_of_a_pack_is_written_as_diverged_and_the_others_finish(grid, tiny_folder, tmp_path):
    first = grid["cells"][0]
    # lr 1e33 (test_packing's divergence): B ~1e34 after step 1, the next losses are NaN
    bad, = rp.grid_cells("table1", "cpu", seeds=[1], only="sst2/prge-q4", model=str(tiny_folder),
                         **{**TINY, "lr": 1e33})
    res, ck = tmp_path / "res", tmp_path / "ck"
    paths = rp.run_grid([first, bad], results=res, checkpoints=ck, pack=3, **QUIET)
    assert paths == [first.result_path(res), bad.result_path(res)]
    diverged = _read(bad, res)
    assert diverged["status"] == "diverged" and "not finite" in diverged["diverged"] and diverged["steps"] == 1
    assert diverged["packed"]["runs"] == 2 and not bad.checkpoint_dir(ck).exists()
    _within_bound(_read(first, res), _read(first, grid["solo"]), grid["bounds"][first.name])


def test_list_marks_the_cells_priced_as_packed(fixture_data, tiny_folder, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    roots = ["--results-dir", str(tmp_path / "res"), "--checkpoint-root", str(tmp_path / "ck")]
    args = ["reproduce", "table1", "--only", "sst2/prge-q4", "--seeds", "0,1,2", "--list", *roots]
    assert main(args) == 0
    alone = capsys.readouterr().out
    assert "packed" not in alone
    assert main([*args, "--pack", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("packed ×3") == 3
    assert out.splitlines()[-1] == f"3 cells on cpu priced as packed (packs of up to 3; {rp.PACK_ASSUMPTION})"
    # with no measure, a pack of R is priced as R solo steps: the same time left as alone
    assert out.splitlines()[-2] == alone.splitlines()[-1]

    # a packed result on this device is a measure: its pack's step / R against its own solo step
    cells = rp.grid_cells("table1", "cpu", seeds=[0, 1, 2], only="sst2/prge-q4")
    done = cells[0]
    solo_step = rp.step_seconds(done.task, done.config())
    point = {"step": 4, "val": 0.5, "test": 0.5}
    measured = {"kind": "train", "task": "sst2", "method": "prge", "seed": 0, "config": dict(done.config()),
                "steps": 4, "best_val": point, "final": point, "evals": [point], "losses": [1.0] * 4,
                "step_s": {"median": 1.5 * solo_step, "per_step": [1.5 * solo_step] * 4},
                "packed": {"runs": 3, "index": 0, "name": done.name, "with": []},
                "provenance": {"command": "x", "commit": None, "versions": {}, "hardware": {}, "wall_time_s": 1.0}}
    done.result_path(tmp_path / "res").parent.mkdir(parents=True)
    done.result_path(tmp_path / "res").write_text(json.dumps(measured))
    assert rp.pack_step_share("cpu", tmp_path / "res")[0] == pytest.approx(0.5)
    # another device, without packed results or engine benchmarks of its own
    assert rp.pack_step_share("cpu", tmp_path / "res").basis == "measured"
    assert rp.pack_step_share("cuda", tmp_path / "res", benches=tmp_path / "res") == \
        (1.0, rp.PACK_ASSUMPTION, "assumed")
    listing = rp.list_cells(cells, tmp_path / "res", tmp_path / "ck", pack=3)
    assert "measured on cpu in 1 packed results" in listing.splitlines()[-1]
    assert listing.count("packed ×2") == 2                                  # the two cells left share a pack
    cell = cells[1]
    steps_alone = rp.estimate_seconds(cell, 4) - rp.estimate_seconds(cell, 4, 0.0)
    assert rp.estimate_seconds(cell, 4, 0.5) == pytest.approx(rp.estimate_seconds(cell, 4) - steps_alone / 2)


def test_pack_options_are_checked(tmp_path, capsys):
    roots = ["--results-dir", str(tmp_path / "res"), "--checkpoint-root", str(tmp_path / "ck")]
    assert main(["reproduce", "table1", "--only", "sst2/prge-q4", "--pack", "0", "--list", *roots]) == 2
    assert "--pack takes a number of cells per pack >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--pack 3: packs train in this process; with --backend ray"):
        rp.run_grid(rp.grid_cells("table1", only="sst2/prge-q4"), backend="ray", pack=3, results=tmp_path)
    # zero-shot, FO and MeZO (Full) cells train alone; the others pack by model, then step shape (q, E), then task
    cells = rp.grid_cells("table1", "cpu", only="seed0")
    plan = rp.plan_packs(cells, 4)
    assert all(len(unit) == 1 for unit in plan if unit[0].row.method in ("zeroshot", "fo", "fo-lorafa", "mezo"))
    packed = [unit for unit in plan if len(unit) > 1]
    assert [len(unit) for unit in packed] == [4, 2] * 3 and packed[0][0].task == "sst2"     # 6 tasks per shape
    assert all(len({rp.step_shape(c) for c in unit}) == 1 for unit in plan)      # no pack mixes shapes
    shapes = list(dict.fromkeys(rp.step_shape(c) for unit in packed for c in unit))
    assert len(shapes) == 3                                     # MeZO on LoRA-FA, P-RGE q 4, P-RGE q 16
    for shape in shapes:
        order = [c.task for unit in packed for c in unit if rp.step_shape(c) == shape]
        assert order == sorted(order, key=list(rp.GRIDS["table1"]["tasks"]).index)   # by task within a shape
    # the paper profile's SST-2 ZO rows (4 rates × 5 seeds each) in packs of 8: 8, 8 and 4 per shape, none mixed
    paper = rp.plan_packs(rp.grid_cells("table1", "paper", only="sst2/mezo-lorafa|sst2/prge", device="cuda"), 8)
    assert [len(unit) for unit in paper] == [8, 8, 4] * 3
    assert sorted(c.name for unit in plan for c in unit) == sorted(c.name for c in cells)
    assert rp.plan_packs(cells, 1) == [[c] for c in cells]
    gpu = rp.grid_cells("table1", "cpu", only="sst2/prge-q4-E16_lr1e-3_seed0", device="cuda")
    assert rp.pack_key(gpu[0]) != rp.pack_key(cells[[c.name for c in cells].index(gpu[0].name)])


def test_without_a_packed_result_a_gpu_pack_is_priced_from_the_engine_benchmark(tmp_path):
    """The engine benchmark measures an optimised run and packs in one process: a packed run's share of a step
    is the optimised run-steps/s over the pack's, for packs of the size asked where measured, from the newest
    benchmark of each task; width-grouped packs, packs with the fp16 low-rank product (a measurement option) and
    CPU benchmarks do not price a GPU pack."""
    def bench(device, finished, tasks):
        return {"kind": "engine-bench", "device": device, "provenance": {"finished_at": finished},
                "tasks": {task: {"configs": configs} for task, configs in tasks.items()}}

    def rate(runs, per_s, groups=1):
        return {"runs": runs, "run_steps_per_s": per_s, "width_groups": groups}

    old = bench("NVIDIA H200", "2026-11-26T20:40:00+0000",
                {"sst2": {"optimised": rate(1, 60.0), "packed-8": rate(8, 30.0)}})
    new = bench("NVIDIA H200", "2026-11-27T03:05:00+0000",
                {"sst2": {"optimised": rate(1, 70.0), "packed-8": rate(8, 140.0), "packed-32": rate(32, 175.0),
                          "packed-8-g4": rate(8, 700.0, 4), "packed-8-lowp": {**rate(8, 900.0), "lowp_lora": True}},
                 "rte": {"optimised": rate(1, 40.0), "packed-8": rate(8, 50.0)}})
    cpu = bench("cpu (2 threads)", "2026-11-27T04:00:00+0000", {"sst2": {"optimised": rate(1, 1.0),
                                                                         "packed-8": rate(8, 4.0)}})
    for name, data in (("one/engine_bench_sst2.json", old), ("two/engine_bench.json", new), ("cpu.json", cpu)):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(json.dumps(data))
    assert sorted(rp.bench_pack_shares("cuda", 8, tmp_path)) == pytest.approx([0.5, 0.8])   # newest SST-2: 70/140
    assert sorted(rp.bench_pack_shares("cuda", 16, tmp_path)) == pytest.approx([0.4, 0.5, 0.8])  # no 16: every pack
    assert rp.bench_pack_shares("cpu", 8, tmp_path) == pytest.approx([0.25])
    share, how, basis = rp.pack_step_share("cuda", tmp_path / "no-results", runs=8, benches=tmp_path)
    assert share == pytest.approx(0.65) and "engine benchmarks" in how and "0.65" in how and basis == "optimised"
    assert rp.pack_step_share("mps", tmp_path / "no-results", runs=8, benches=tmp_path).basis == "assumed"
