"""Nothing lost: concurrent writers and cells, checkpoints read as data only, an existing checkpoint never
overwritten unasked, and result files that cannot be read named with the reason (chapters 5 and 7)."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from prge_lib.cli.main import main
from prge_lib.common.provenance import atomic_file
from prge_lib.experiments import reproduce as rp
from prge_lib.experiments import runner, status
from prge_lib.training.checkpoints import CheckpointError, read_checkpoint

from fixtures import small_trainer

ROOT = Path(__file__).resolve().parents[1]
TINY = {"steps": 4, "n_train": 16, "n_val": 8, "n_test": 8, "eval_every": 2, "checkpoint_every": 1}


class _RunsCode:
    """Unpickling this would touch ``marker``: what a hostile checkpoint could do with any code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def _point(val=0.6, test=0.55):
    return {"step": 0, "val": val, "test": test}


def _train_result(cell: rp.Cell, **changes) -> dict:
    """A well-formed result of ``cell`` (one step), as a training cell would write it."""
    result = {"kind": "train", "task": cell.task, "method": cell.row.method, "seed": cell.seed,
              "config": dict(cell.config()), "steps": 1, "best_val": _point(), "final": _point(),
              "evals": [_point()], "losses": [1.0], "step_s": {"median": 1.0, "per_step": [1.0]},
              "cell": {"row": cell.row.key, "lr": cell.lr},
              "provenance": {"command": "x", "commit": None, "versions": {}, "hardware": {}, "wall_time_s": 1.0}}
    result.update(changes)
    return result


def _cell(name="sst2/prge-q4-E16_lr1e-3_seed0", **overrides):
    return rp.grid_cells("table1", "cpu", seeds=[int(name[-1])], only=name, **{**TINY, **overrides})[0]


# ------------------------------------------------------------ 1. concurrent writers and cells
def test_two_writers_of_one_file_each_get_their_own_temporary_file(tmp_path):
    target = tmp_path / "checkpoint.pt"
    with atomic_file(target) as first:
        with atomic_file(target) as second:       # a second process writing the same file meanwhile
            assert first != second
            first.write_text("first")
            second.write_text("second")
    assert target.read_text() == "first"           # the last to finish wins, whole; neither crashes
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_file(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("disk full")
    assert target.read_text() == "first" and os.listdir(tmp_path) == ["checkpoint.pt"]   # no temporary left


def test_a_cell_runs_in_one_process_at_a_time(tmp_path, monkeypatch):
    """A second runner of a running cell names the holder and leaves the cell, its checkpoint and its result
    alone; --list shows the cell as running; the holder finishes it."""
    cell = _cell()
    res, ck = tmp_path / "res", tmp_path / "ck"
    started, release = threading.Event(), threading.Event()
    runs = []

    def fake_train(cell_, folder, progress, deadline=None, restart=False):
        runs.append(cell_.name)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "state.bin").write_bytes(b"partial work")
        started.set()
        release.wait(120)        # set once the checks below are done: the bound only keeps a broken test from hanging
        return _train_result(cell_)

    monkeypatch.setattr(runner, "_run_train", fake_train)
    first = threading.Thread(target=rp.run_cell, args=(cell, res, ck), kwargs={"progress": False})
    first.start()
    try:
        assert started.wait(10)
        with pytest.raises(rp.CellBusy, match=rf"{cell.name} is running in another process \(pid {os.getpid()} on "):
            rp.run_cell(cell, res, ck, progress=False)
        said = []
        assert rp.run_grid([cell], results=res, checkpoints=ck, progress=False, say=said.append) == []
        assert "is running in another process" in said[-1]
        assert rp.cell_status(cell, res, ck)["state"] == "running"
        assert " running " in rp.list_cells([cell], res, ck)
        assert (cell.checkpoint_dir(ck) / "state.bin").read_bytes() == b"partial work"   # not removed by them
    finally:
        release.set()
        first.join(120)
    assert runs == [cell.name]                       # trained once
    rp.read_result(cell.result_path(res))            # whole and valid
    assert not cell.checkpoint_dir(ck).exists()      # removed by the holder, once its result was written
    assert rp.cell_status(cell, res, ck)["state"] == "done"
    assert rp.run_cell(cell, res, ck, progress=False) == cell.result_path(res)    # done: nothing runs again
    assert runs == [cell.name]


def test_a_killed_holder_frees_the_cell(tmp_path, monkeypatch):
    """Another process holds the cell: it is named and left alone; killed with SIGKILL, its lock is gone."""
    cell = _cell()
    res, ck = tmp_path / "res", tmp_path / "ck"
    hold = ("import sys; from pathlib import Path; from prge_lib.experiments import reproduce as rp\n"
            f"cell = rp.grid_cells('table1', 'cpu', seeds=[0], only={cell.name!r}, **{TINY!r})[0]\n"
            f"with rp.cell_lock(cell, Path({str(ck)!r})):\n    print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(rp.CellBusy, match=rf"\(pid {holder.pid} on "):
            rp.run_cell(cell, res, ck, progress=False)
        assert rp.cell_status(cell, res, ck)["state"] == "running"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
    monkeypatch.setattr(runner, "_run_train", lambda cell_, *args, **kw: _train_result(cell_))
    assert rp.cell_status(cell, res, ck)["state"] == "missing"
    rp.run_cell(cell, res, ck, progress=False)
    assert rp.cell_status(cell, res, ck)["state"] == "done"


def test_a_cell_running_under_another_checkpoint_root_is_left_to_it(tmp_path, monkeypatch):
    """Two processes given different --checkpoint-root values take different checkpoint locks, but the same lock
    beside the result file they would both write: the second is told who runs the cell, and --list shows it running
    at the step of its checkpoint under the other root, which it names."""
    cell = _cell()
    res, ours, theirs = tmp_path / "res", tmp_path / "ck", tmp_path / "other-ck"
    hold = ("import sys; from pathlib import Path; from prge_lib.experiments import reproduce as rp\n"
            f"cell = rp.grid_cells('table1', 'cpu', seeds=[0], only={cell.name!r}, **{TINY!r})[0]\n"
            f"with rp.cell_lock(cell, Path({str(theirs)!r}), Path({str(res)!r})):\n"
            "    print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    monkeypatch.setattr(runner, "_run_train", lambda *a, **k: pytest.fail("a cell held elsewhere must not train"))
    try:
        assert holder.stdout.readline().strip() == "held"
        assert rp.cell_holder(cell, ours) is None                   # its checkpoint lock is another root's
        with pytest.raises(rp.CellBusy, match=rf"\(pid {holder.pid} on "):
            rp.run_cell(cell, res, ours, progress=False)
        assert rp.cell_status(cell, res, ours) == {"state": "running", "step": 0, "steps": cell.steps()}
        assert not list(cell.result_path(res).parent.glob("*.json"))   # its lock files are no result files
        # its checkpoint under the other root, which --list looks through: the step is read there
        cell.checkpoint_dir(theirs).mkdir(parents=True)
        (cell.checkpoint_dir(theirs) / "checkpoint.pt").write_bytes(b"a checkpoint")
        monkeypatch.setattr(status, "other_checkpoint_roots", lambda checkpoints: [theirs])
        monkeypatch.setattr(status, "read_checkpoint", lambda path, mmap: {"step": 7})
        assert rp.cell_status(cell, res, ours) == {"state": "running", "step": 7, "steps": cell.steps(),
                                                   "root": theirs}
        first = rp.list_cells([cell], res, ours).splitlines()[0]
        assert f"running 7/{cell.steps()}" in first and first.endswith(f"checkpoint under {theirs}")
    finally:
        holder.communicate("", timeout=60)
    assert rp.cell_status(cell, res, ours)["state"] == "missing"      # released with its holder
    monkeypatch.setattr(runner, "_run_train", lambda cell_, *args, **kw: _train_result(cell_))
    rp.run_cell(cell, res, ours, progress=False)
    assert rp.cell_status(cell, res, ours)["state"] == "done"


# ------------------------------------------------------------ 2. checkpoints are data
def test_a_checkpoint_holds_tensors_and_plain_values(tiny_factory, tokenizer, sst2_small, tmp_path):
    small_trainer(tiny_factory, tokenizer, sst2_small, tmp_path, q=2, E=4, steps=2, eval_every=0).run()
    payload = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    python = payload["rng"]["python"]
    assert isinstance(python, dict) and isinstance(python["state"], list) and len(python["state"]) == 625
    assert isinstance(payload["rng"]["torch"], torch.Tensor) and payload["step"] == 2


def _unreadable_checkpoints(folder: Path) -> dict[str, Path]:
    good = folder / "good.pt"
    torch.save({"format": 2, "step": 3, "weights": torch.zeros(1000)}, good)
    files = {"empty": b"", "truncated": good.read_bytes()[:len(good.read_bytes()) // 2],
             "random bytes": os.urandom(4096)}
    out = {}
    for kind, data in files.items():
        out[kind] = folder / kind.replace(" ", "_") / "checkpoint.pt"
        out[kind].parent.mkdir()
        out[kind].write_bytes(data)
    out["code"] = folder / "code" / "checkpoint.pt"
    out["code"].parent.mkdir()
    torch.save({"format": 1, "step": 3, "trap": _RunsCode(folder / "ran")}, out["code"])
    out["a list"] = folder / "list" / "checkpoint.pt"
    out["a list"].parent.mkdir()
    torch.save([1, 2], out["a list"])
    return out


def test_an_unreadable_checkpoint_is_one_line_naming_it_and_the_ways_on(tmp_path):
    for kind, path in _unreadable_checkpoints(tmp_path).items():
        with pytest.raises(CheckpointError) as caught:
            read_checkpoint(path)
        message = str(caught.value)
        assert "\n" not in message and str(path) in message, kind
        assert "--resume" in message and "--restart" in message, kind
    assert not (tmp_path / "ran").exists()           # the pickled call never ran
    with pytest.raises(CheckpointError, match=r"pickled Python object \(.*\).*predates the data format of checkpoints"):
        read_checkpoint(tmp_path / "code" / "checkpoint.pt")


def test_train_resume_of_a_hostile_checkpoint_refuses_without_running_it(fixture_data, tiny_folder, tmp_path,
                                                                         monkeypatch, capsys):
    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    folder = tmp_path / "ckpt"
    folder.mkdir()
    torch.save({"format": 2, "step": 1, "trap": _RunsCode(tmp_path / "ran")}, folder / "checkpoint.pt")
    args = ["train", "--task", "sst2", "--method", "prge", "--model", str(tiny_folder), "--q", "2", "--E", "4",
            "--steps", "2", "--n-train", "12", "--n-val", "6", "--n-test", "6", "--checkpoint-dir", str(folder),
            "--out", str(tmp_path / "t.json")]
    assert main(args + ["--resume"]) == 2
    err = capsys.readouterr().err
    assert not (tmp_path / "ran").exists()
    errors = [line for line in err.splitlines() if line.startswith("prge: error:")]
    assert len(errors) == 1 and str(folder / "checkpoint.pt") in errors[0] and "Traceback" not in err
    assert main(args) == 2                            # without --resume or --restart: refused, not overwritten
    assert "--restart" in capsys.readouterr().err and not (tmp_path / "ran").exists()


def test_a_cell_with_a_hostile_checkpoint_refuses_and_says_how_to_go_on(tiny_folder, fixture_data, tmp_path,
                                                                        monkeypatch):
    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    cell = _cell(model=str(tiny_folder))
    res, ck = tmp_path / "res", tmp_path / "ck"
    cell.checkpoint_dir(ck).mkdir(parents=True)
    torch.save({"format": 1, "step": 1, "trap": _RunsCode(tmp_path / "ran")}, cell.checkpoint_dir(ck) / "checkpoint.pt")
    with pytest.raises(CheckpointError, match="resume \\(the same command\\), or discard it \\(--restart\\)"):
        rp.run_cell(cell, res, ck, progress=False)
    assert not (tmp_path / "ran").exists() and not cell.result_path(res).exists()
    assert (cell.checkpoint_dir(ck) / "checkpoint.pt").is_file()          # kept for the user to decide
    rp.run_cell(cell, res, ck, progress=False, restart=True)             # --restart discards it
    assert rp.read_result(cell.result_path(res))["steps"] == TINY["steps"]


# ------------------------------------------------------------ 3. an existing checkpoint is not overwritten unasked
def test_train_refuses_to_start_over_a_checkpoint_unless_told(fixture_data, tiny_folder, tmp_path, monkeypatch,
                                                             capsys):
    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    folder = tmp_path / "ckpt"
    args = ["train", "--task", "sst2", "--method", "prge", "--model", str(tiny_folder), "--q", "2", "--E", "4",
            "--steps", "2", "--eval-every", "0", "--n-train", "12", "--n-val", "6", "--n-test", "6",
            "--checkpoint-dir", str(folder), "--checkpoint-every", "2", "--out", str(tmp_path / "t.json")]
    assert main(args) == 0
    saved = (folder / "checkpoint.pt").read_bytes()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{folder} already holds the checkpoint of a run at step 2" in err
    assert "--resume" in err and "--restart" in err
    assert (folder / "checkpoint.pt").read_bytes() == saved
    assert main(args + ["--resume", "--restart"]) == 2
    assert "give one of them" in capsys.readouterr().err
    assert main(args + ["--steps", "1", "--restart"]) == 0         # discarded: a new run, one step
    assert not (folder / "checkpoint.pt").exists()        # the old one is gone (one step saves none at every 2)
    assert json.loads((tmp_path / "t.json").read_text())["steps"] == 1


def test_trainer_run_refuses_an_existing_checkpoint(tiny_factory, tokenizer, sst2_small, tmp_path):
    small_trainer(tiny_factory, tokenizer, sst2_small, tmp_path, q=2, E=4, steps=2, eval_every=0).run()
    again = small_trainer(tiny_factory, tokenizer, sst2_small, tmp_path, q=2, E=4, steps=2, eval_every=0)
    with pytest.raises(ValueError, match="at step 2: continue it with --resume, or discard it with --restart"):
        again.run()
    assert again.run(restart=True)["resumed_at_steps"] == []


# ------------------------------------------------------------ 5. result files that cannot be read
def test_bad_result_files_are_named_with_the_field(tmp_path, capsys):
    cell = _cell()
    path = cell.result_path(tmp_path)
    path.parent.mkdir(parents=True)
    good = _train_result(cell)
    cases = {
        "empty": ("", r"not valid JSON \(Expecting value: line 1 column 1\)"),
        "half": (json.dumps(good)[:50], "not valid JSON"),
        "list": ("[]", "holds a JSON list, not a result object"),
        "no best_val": (json.dumps({k: v for k, v in good.items() if k != "best_val"}), "field best_val is missing"),
        "percent": (json.dumps({**good, "final": _point(val=55.0)}), r"field final\.val is 55\.0, which fails maximum"),
        "losses": (json.dumps({**good, "losses": [1.0, 2.0]}), "field losses: steps = 1 but 2 losses"),
    }
    for kind, (text, reason) in cases.items():
        path.write_text(text)
        for read in (lambda: rp.read_result(path), lambda: rp.load_results("table1", tmp_path),
                     lambda: rp.summarize("table1", tmp_path)):
            with pytest.raises(rp.ResultFileError, match=reason) as caught:
                read()
            assert str(caught.value).startswith(f"{path}: ") and len(str(caught.value)) < 200, kind
        status = rp.cell_status(cell, tmp_path, tmp_path / "ck")["state"]
        assert status.startswith("unreadable: ") and re.search(reason, status), kind
    assert main(["reproduce", "table1", "--summary", "--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("prge: error:")]
    assert len(errors) == 1 and str(path) in errors[0] and "field losses" in errors[0] and "Traceback" not in err


def test_list_shows_an_unreadable_cell_and_goes_on(tmp_path):
    cells = rp.grid_cells("table1", "cpu", seeds=[0, 1, 2], only="sst2/prge-q4", **TINY)
    res, ck = tmp_path / "res", tmp_path / "ck"
    cells[0].result_path(res).parent.mkdir(parents=True)
    cells[0].result_path(res).write_text("[]")
    cells[1].checkpoint_dir(ck).mkdir(parents=True)
    (cells[1].checkpoint_dir(ck) / "checkpoint.pt").write_bytes(b"not a checkpoint")
    lines = rp.list_cells(cells, res, ck).splitlines()
    assert "unreadable: holds a JSON list" in lines[0]
    assert "unreadable: truncated or not a torch checkpoint" in lines[1]
    assert "missing" in lines[2] and lines[3].startswith("0/3 done")


def test_list_names_another_root_that_holds_cells_it_calls_missing(tmp_path, monkeypatch):
    """A run started with --checkpoint-root X is missing to a --list without it: the listing says where it is."""
    monkeypatch.setenv("PRGE_CACHE_DIR", str(tmp_path / "cache"))
    cells = rp.grid_cells("table1", "cpu", seeds=[0, 1, 2], only="sst2/prge-q4", **TINY)
    res, clone = tmp_path / "res", tmp_path / "clone"
    cells[0].checkpoint_dir(clone).mkdir(parents=True)
    (cells[0].checkpoint_dir(clone) / "checkpoint.pt").write_bytes(b"step 300")
    default = rp.checkpoint_root(None)
    monkeypatch.setattr(status, "other_checkpoint_roots", lambda checkpoints: [clone, default])
    with rp.cell_lock(cells[2], default):                        # and one running under the default root
        assert status.elsewhere_checkpoints(cells, clone) == {clone: 1, default: 1}
        listing = rp.list_cells(cells, res, None).splitlines()
    assert [line.split()[1] for line in listing[:3]] == ["missing", "missing", "running"]
    assert listing[-1] == (f"1 cell listed missing has a checkpoint or a running process under {clone}: "
                           f"--checkpoint-root {clone} lists its step (and resumes it)")
    # the real roots: the cache folder's, and the clone's data/checkpoints, each when it exists and is not in use
    monkeypatch.undo()
    monkeypatch.setenv("PRGE_CACHE_DIR", str(tmp_path / "cache"))
    roots = status.other_checkpoint_roots(clone)
    assert default in roots and clone not in roots and default not in status.other_checkpoint_roots(None)


def test_summary_refuses_a_result_filed_under_another_cell(tmp_path):
    cell = _cell()
    path = cell.result_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_train_result(cell)))
    assert [r["lr"] for r in rp.summarize("table1", tmp_path)] == [1e-3]
    wrong = _train_result(cell, config={**cell.config(), "lr": 0.5})
    path.write_text(json.dumps(wrong))
    with pytest.raises(rp.ResultFileError, match=rf"{path}: .*lr 0\.5 \(the name says 1e-3\)"):
        rp.summarize("table1", tmp_path)
    path.write_text(json.dumps(_train_result(cell, seed=1, config={**cell.config(), "q": 16})))
    with pytest.raises(rp.ResultFileError, match=r"seed 1 \(the name says 0\).*q 16 \(row prge-q4-E16 has 4\)"):
        rp.summarize("table1", tmp_path)
