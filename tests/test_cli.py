"""``prge zeroshot`` writes a JSON result with its provenance; bad input exits 2 with a clear message."""
import json
import statistics
import subprocess
import sys

import pytest

from prge_lib.cli.main import main


def test_zeroshot_writes_result_with_provenance(fixture_data, tmp_path, monkeypatch):
    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    out = tmp_path / "r.json"
    assert main(["zeroshot", "--task", "sst2", "--n", "6", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["task"] == "sst2" and result["metric"] == "accuracy" and result["n"] == 6
    assert result["model"] == "SmolLM2-135M-Instruct" and result["seed"] == 0
    assert result["template_example"].endswith(" It was")
    assert any("first 6" in note for note in result["data_notes"])
    prov = result["provenance"]
    assert {"command", "commit", "versions", "hardware", "wall_time_s"} <= set(prov)
    assert prov["versions"]["torch"].startswith("2.13.0") and prov["wall_time_s"] > 0
    assert len(prov["load_average"]) == 3 and min(prov["load_average"]) >= 0     # was the CPU shared?


def test_unknown_task_lists_the_known_ones(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "prge_lib.cli.main", "zeroshot", "--task", "sst5", "--out",
                           str(tmp_path / "x.json")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "unknown task 'sst5'; known tasks: sst2, rte, mrpc" in proc.stderr
    assert not (tmp_path / "x.json").exists()


def test_missing_task_file_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PRGE_DATA_DIR", str(tmp_path))
    assert main(["zeroshot", "--task", "rte", "--out", str(tmp_path / "x.json")]) == 2
    assert "glue/rte/validation.jsonl" in capsys.readouterr().err


def test_train_writes_result_adapter_and_resumes(fixture_data, tiny_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    out, ckpt, adapter = tmp_path / "t.json", tmp_path / "ckpt", tmp_path / "a.safetensors"
    common = ["train", "--task", "sst2", "--method", "prge", "--model", str(tiny_folder), "--q", "2", "--E", "4",
              "--eval-every", "2", "--n-train", "12", "--n-val", "6", "--n-test", "6", "--checkpoint-dir",
              str(ckpt), "--checkpoint-every", "2", "--out", str(out)]
    assert main(common + ["--steps", "2"]) == 0
    assert main(common + ["--steps", "4", "--resume", "--save-adapter", str(adapter)]) == 0
    result = json.loads(out.read_text())
    assert result["status"] == "finished" and result["steps"] == 4 and len(result["losses"]) == 4
    assert result["config"]["q"] == 2 and result["config"]["lr"] == 1e-3 and result["config"]["outer"] is True
    assert result["provenance"]["command"].startswith("prge train --task sst2 --method prge")
    assert {"best_val", "final", "evals", "step_s", "data_notes"} <= set(result)
    from prge_lib.zo.lora import read_adapter
    assert len(read_adapter(adapter)) == 2 * 2 * 7


def test_a_kill_stops_train_after_the_step_with_a_checkpoint_to_resume(fixture_data, tiny_folder, tmp_path,
                                                                        monkeypatch, capsys):
    import os
    import signal

    from prge_lib.zo.prge import PRGE

    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    out, ckpt = tmp_path / "t.json", tmp_path / "ckpt"
    args = ["train", "--task", "sst2", "--method", "prge", "--model", str(tiny_folder), "--q", "2", "--E", "4",
            "--eval-every", "2", "--n-train", "12", "--n-val", "6", "--n-test", "6", "--steps", "4",
            "--checkpoint-dir", str(ckpt), "--checkpoint-every", "3", "--out", str(out)]
    real_step = PRGE.step

    def killed_in_step_2(self, batch, t):
        if t == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(self, batch, t)

    monkeypatch.setattr(PRGE, "step", killed_in_step_2)
    assert main(args) == 130 and not out.exists()
    err = capsys.readouterr().err
    assert "SIGTERM: stopping after the current step" in err
    assert f"stopped by SIGTERM after step 2 of 4; its checkpoint is {ckpt / 'checkpoint.pt'}: rerun with --resume" in err
    monkeypatch.setattr(PRGE, "step", real_step)
    assert main(args + ["--resume"]) == 0          # the step-2 checkpoint, though checkpoints fall every 3 steps
    result = json.loads(out.read_text())
    assert result["steps"] == 4 and result["resumed_at_steps"] == [2]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_train_refuses_bad_settings_before_loading(tmp_path, capsys):
    assert main(["train", "--task", "sst2", "--method", "prge", "--q", "3", "--out", str(tmp_path / "x.json")]) == 2
    assert "E = 16 must be a multiple of q = 3" in capsys.readouterr().err
    assert main(["train", "--task", "sst2", "--method", "mezo", "--dtype", "bf16",
                 "--out", str(tmp_path / "x.json")]) == 2
    assert "refuses bf16" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_bench_reports_times_memory_and_ratios(tiny_folder, tmp_path):
    out = tmp_path / "b.json"
    assert main(["bench", "--method", "inference,mezo,prge", "--model", str(tiny_folder), "--E", "4", "--q", "2",
                 "--seq-len", "8", "--repeats", "2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["configs"]) == {"inference", "mezo", "prge"}
    assert result["configs"]["prge"]["forwards_per_step"] == 1 and result["configs"]["mezo"]["forwards_per_step"] == 2
    configs, floor, ratios = result["configs"], result["floor"], result["ratios"]
    for c in configs.values():                      # each median is that of the recorded per-step times, to the
        # float32 precision a file keeps of a time that happens to be a float32 value (result_json writes its digits)
        assert len(c["step_s"]["per_step"]) == 2
        assert c["step_s"]["median"] == pytest.approx(statistics.median(c["step_s"]["per_step"]), rel=1e-7)
    assert floor == {k: statistics.median(f[k] for f in result["floor_rounds"]) for k in floor}
    # the ratios are those of the recorded medians (2E = 8 rows for the forward floor)
    assert ratios["prge_over_forward_2E"] == configs["prge"]["step_s"]["median"] / floor["forward_8_rows_s"]
    assert ratios["mezo_over_prge"] == configs["mezo"]["step_s"]["median"] / configs["prge"]["step_s"]["median"]
    assert ratios["mezo_structural_limit"] == 1 + 4 * floor["perturb_pass_s"] / floor["forward_8_rows_s"]
    assert result["provenance"]["wall_time_s"] > 0
    assert main(["bench", "--method", "nope", "--out", str(out)]) == 2


@pytest.mark.parametrize("command", [
    ["zeroshot", "--task", "sst2", "--n", "10"],
    ["train", "--task", "sst2", "--method", "prge"],
    ["bench", "--method", "prge"],
    ["export", "--task", "sst2"],
    ["device-train", "--pte", "step.pte", "--task", "sst2"],
    ["device-bench", "--pte", "step.pte"],
    ["footprint", "--method", "prge"],
])
def test_an_unwritable_output_is_refused_before_any_work(command, tmp_path, capsys):
    """An output path under an existing file fails at once, naming the path (it used to fail after the
    whole computation, losing the result)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(command + ["--out", str(blocker / "x.json")]) == 2
    err = capsys.readouterr().err
    assert f"--out {blocker / 'x.json'} cannot be written: {blocker} is a file, not a folder" in err
    assert main(command + ["--out", str(tmp_path)]) == 2
    assert f"--out {tmp_path} is a folder; give a file name inside it" in capsys.readouterr().err


@pytest.mark.parametrize("command,option", [
    (["train", "--task", "sst2", "--method", "prge", "--out", "r.json"], "--checkpoint-dir"),
    (["reproduce", "table1"], "--results-dir"),
    (["reproduce", "table1"], "--checkpoint-root"),
])
def test_an_unwritable_folder_is_refused_before_any_work(command, option, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(command + [option, str(blocker)]) == 2
    assert f"{option} {blocker} is a file, not a folder" in capsys.readouterr().err
    assert main(command + [option, str(blocker / "sub")]) == 2
    assert f"{option} {blocker / 'sub'} cannot be written" in capsys.readouterr().err


def test_train_options_are_the_train_config_fields():
    """Each training setting is declared once, in TrainConfig; `prge train` offers every one of them."""
    import dataclasses

    from prge_lib.cli.main import build_parser
    from prge_lib.training.trainer import TrainConfig

    args = build_parser().parse_args(["train", "--task", "sst2", "--noise", "counter", "--layers", "2",
                                      "--targets", "q_proj,v_proj", "--no-outer", "--out", "x.json"])
    fields = {f.name for f in dataclasses.fields(TrainConfig) if "help" in f.metadata}
    assert fields <= set(vars(args)) and len(fields) >= 30
    assert (args.noise, args.layers, args.targets, args.outer, args.method) == \
        ("counter", 2, ("q_proj", "v_proj"), False, "prge")
    defaults = build_parser().parse_args(["train", "--task", "sst2", "--out", "x.json"])
    assert {name: getattr(defaults, name) for name in fields - {"task"}} == \
        {name: getattr(TrainConfig("sst2"), name) for name in fields - {"task"}}


def test_the_commit_is_dirty_for_changed_code_not_for_changed_results(tmp_path, monkeypatch):
    import subprocess

    from prge_lib.common.provenance import git_commit

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "data" / "results").mkdir(parents=True)
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "data" / "results" / "r.json").write_text("{}\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "start")
    clean = git_commit(tmp_path)
    assert clean and not clean.endswith("+dirty")
    (tmp_path / "data" / "results" / "r.json").write_text('{"step": 1}\n')    # a result written by a run
    assert git_commit(tmp_path) == clean
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_commit(tmp_path) == clean + "+dirty"
    # a copy sent to another machine names the commit it is a copy of, whatever git folder came with it
    monkeypatch.setenv("PRGE_SOURCE_COMMIT", "0123abc")
    assert git_commit(tmp_path) == "0123abc"


def test_export_options_have_the_defaults_of_train_config(capsys):
    """`prge export` shares its settings with TrainConfig: the same defaults, and where TrainConfig leaves a
    setting to the method, P-RGE's resolved value; `--help` shows each."""
    import dataclasses

    from prge_lib.cli.device import EXPORT_SETTINGS
    from prge_lib.cli.main import build_parser
    from prge_lib.training.config import TrainConfig

    args = build_parser("export").parse_args(["export", "--task", "sst2", "--out", "step.pte"])
    declared = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    resolved = dataclasses.asdict(TrainConfig(task="sst2", method="prge").resolved())
    for name in EXPORT_SETTINGS:
        expected = declared[name] if declared[name] is not None or name in ("layers", "model") else resolved[name]
        assert getattr(args, name) == (expected if name != "task" else "sst2"), name
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for name in ("q", "E", "r", "alpha", "seed", "dtype"):
        value = getattr(args, name)
        assert f"--{name} " in shown and f"(default {value}" in shown, name
    assert f"(default{','.join(declared['targets'])})" in shown.replace(" ", "")     # wrapped: spaces inside
