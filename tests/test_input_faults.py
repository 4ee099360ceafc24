"""Bad input is refused before any work, in one line that names the value, file or line, with exit status 2:
programs that are not programs, numbers out of range or too large for this machine, malformed data rows, an
export path that collides with its settings file; and a Ray started by the runner keeps its APIs closed."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prge_lib.cli.main import main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def no_model(monkeypatch):
    """Every model load fails the test: a refusal must come before it."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was refused")

    for where in ("prge_lib.models.loading.load_model", "prge_lib.training.trainer.load_model",
                  "prge_lib.experiments.bench.methods.load_model", "prge_lib.deploy.export.load_model"):
        monkeypatch.setattr(where, refuse)


def _prge(*args, env=None):
    """``prge ARGS`` in a fresh interpreter (a crash there cannot take the test run with it)."""
    return subprocess.run([sys.executable, "-m", "prge_lib.cli.main", *args], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, timeout=600)


# ----- 4. a program file that is not an ExecuTorch program
@pytest.mark.parametrize("content", [os.urandom(4096), b""], ids=["random-bytes", "empty"])
def test_a_bad_program_is_one_line_naming_it_never_an_abort(content, tiny_program, fixture_data, tmp_path):
    bad = tmp_path / "bad.pte"
    bad.write_bytes(content)
    (tmp_path / "bad.json").write_text(tiny_program.with_suffix(".json").read_text())
    proc = _prge("device-train", "--pte", str(bad), "--task", "sst2", "--steps", "1", "--n-train", "8",
                 "--n-val", "4", "--n-test", "4", "--out", str(tmp_path / "r.json"),
                 env={"PRGE_DATA_DIR": str(fixture_data)})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"prge: error: {bad} is not an ExecuTorch program" in proc.stderr


def test_export_records_size_and_digest_and_a_changed_program_is_refused(tiny_program, tmp_path):
    from prge_lib.deploy.export import check_program

    meta = json.loads(tiny_program.with_suffix(".json").read_text())
    data = tiny_program.read_bytes()
    assert meta["pte_bytes"] == len(data) and meta["pte_sha256"] == hashlib.sha256(data).hexdigest()
    assert data[4:8] == b"ET12"
    changed = tmp_path / "changed.pte"
    changed.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))          # same size, one bit flipped
    (tmp_path / "changed.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=f"{changed} does not match the SHA-256"):
        check_program(changed)
    short = tmp_path / "short.pte"
    short.write_bytes(data[:-8])
    (tmp_path / "short.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=f"{short} is {len(data) - 8} bytes, but .* records {len(data)}"):
        check_program(short)


def test_a_program_without_a_digest_is_checked_as_far_as_it_can_be(tmp_path):
    from prge_lib.deploy.export import check_program

    pte = tmp_path / "old.pte"
    pte.write_bytes(b"\x3c\0\0\0ET12" + bytes(100))
    (tmp_path / "old.json").write_text(json.dumps({"settings": {}, "pte_bytes": 108}))
    said = []
    assert check_program(pte, say=said.append) == {"settings": {}, "pte_bytes": 108}
    assert said and "records no SHA-256" in said[0] and "size were checked, its content was not" in said[0]


# ----- 6. numbers checked when the config is resolved, before any model loads
@pytest.mark.parametrize("command, message", [
    (["train", "--task", "sst2", "--eval-batch-size", "0"], "--eval-batch-size must be a whole number at least 1, got 0"),
    (["train", "--task", "sst2", "--max-length", "0"], "--max-length must be a whole number at least 1, got 0"),
    (["train", "--task", "sst2", "--seed", "-1"], "--seed must be a whole number from 0 to 4294967295, got -1"),
    (["train", "--task", "sst2", "--alpha", "nan"], "--alpha must be a positive number, got nan"),
    (["train", "--task", "sst2", "--stop-rising", "1"], r"--stop-rising must be a number above 1 \(how many times "
                                                          r"its start the loss must rise to\), got 1\.0"),
    (["train", "--task", "sst2", "--stop-rising", "inf"], "--stop-rising must be a number above 1 .*, got inf"),
    (["train", "--task", "sst2", "--max-length", "9000"], "max_length 9000 is beyond the model's 8192 positions"),
    (["train", "--task", "sst2", "--layers", "31"], "layers 31: the model has 30 decoder layers"),
    (["train", "--task", "sst2", "--q", "100000", "--E", "100000"], "a prge step with q = 100000, E = 100000 needs about .* GiB .* more than the"),
    (["zeroshot", "--task", "sst2", "--batch-size", "0"], "--batch-size must be a whole number at least 1, got 0"),
    (["bench", "--method", "prge", "--E", "0"], "--E must be a whole number at least 1, got 0"),
    (["bench", "--method", "prge", "--q", "4,0"], "--q must be a whole number at least 1, got 0"),
    (["footprint", "--rows", "0"], "--rows must be a whole number at least 1, got 0"),
    (["device-bench", "--pte", "x.pte", "--warmup", "-1"], "--warmup must be a whole number at least 0, got -1"),
])
def test_numbers_are_refused_before_the_model_loads(command, message, no_model, tmp_path, capsys):
    import re

    assert main(command + ["--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert re.search("prge: error: " + message, err), err


def test_the_step_bound_names_the_estimate_and_lets_the_defaults_through(monkeypatch):
    from prge_lib.training import checks
    from prge_lib.training.trainer import TrainConfig

    for method in ("prge", "mezo", "senszoq", "mebp", "fo-lorafa", "fo"):     # the defaults, prompts of 256 tokens
        config = TrainConfig("sst2", method=method, max_length=256).resolved()
        assert checks.step_bytes(config, checks.model_dims(None))[0] < (2 if method in ("prge", "mezo") else 6) * 2**30
    monkeypatch.setattr(checks, "available_bytes", lambda device: 2**30)
    with pytest.raises(ValueError, match=r"a prge step with q = 16, E = 64 needs about \d+\.\d GiB \(128 rows per "
                                         r"forward of 256 tokens.*more than the 1\.0 GiB of memory available"):
        TrainConfig("sst2", method="prge", q=16, E=64, max_length=256).resolved()


def test_a_local_model_folder_gives_its_sizes(tiny_folder):
    from prge_lib.training.checks import model_dims

    dims = model_dims(str(tiny_folder))
    assert dims["hidden_size"] == 64 and dims["num_hidden_layers"] == 2
    assert model_dims("no/such-model-here") is None


# ----- 7. data rows: file and line in every error, missing fields and labels out of range named
def _data(tmp_path, train: bytes, validation: bytes = None) -> Path:
    folder = tmp_path / "data" / "glue" / "sst2"
    folder.mkdir(parents=True)
    (folder / "train.jsonl").write_bytes(train)
    good = b"".join(json.dumps({"sentence": f"film {i}", "label": i % 2, "idx": i}).encode() + b"\n"
                    for i in range(8))
    (folder / "validation.jsonl").write_bytes(good if validation is None else validation)
    return tmp_path / "data"


GOOD_ROW = b'{"sentence": "a fine film", "label": 1, "idx": 0}\n'


@pytest.mark.parametrize("bad, message", [
    (b'{"sentence": "a film", "label": 1\n', r"train\.jsonl, line 2: not valid JSON"),
    (b'{"sentence": "caf\xe9", "label": 1}\n', r"train\.jsonl, line 2: not UTF-8 text \(byte 0xe9 at column 18\)"),
    (b'[1, 2]\n', r"train\.jsonl, line 2: a JSON object expected, got list"),
    (b'{"text": "a film", "label": 1}\n', r"train\.jsonl, line 2: no field 'sentence', which task 'sst2' reads"),
    (b'{"sentence": "a film", "label": 5}\n',
     r"train\.jsonl, line 2: label 5 is not one of the 2 classes of task 'sst2'; allowed: 0, 1 \(' terrible', ' great'\)"),
    (b'{"sentence": "a film", "label": -1}\n', r"train\.jsonl, line 2: label -1 is not one of"),
])
def test_a_bad_data_row_names_file_line_and_field(bad, message, no_model, tmp_path, monkeypatch, capsys):
    import re

    monkeypatch.setenv("PRGE_DATA_DIR", str(_data(tmp_path, GOOD_ROW + bad)))
    assert main(["train", "--task", "sst2", "--n-train", "4", "--n-val", "2", "--n-test", "4",
                 "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert re.search("prge: error: .*" + message, err), err
    assert main(["zeroshot", "--task", "sst2", "--out", str(tmp_path / "z.json")]) == 2


def test_winogrande_answers_are_checked_as_one_or_two(tmp_path):
    from prge_lib.data.splits import DataFormatError, check_row
    from prge_lib.data.tasks import get_task

    row = {"sentence": "Ann gave Bo books because _ had many.", "option1": "Ann", "option2": "Bo", "answer": "3"}
    with pytest.raises(DataFormatError, match=r"here: answer '3' is not one of the 2 classes of task 'winogrande'; "
                                              r"allowed: 1, 2$"):
        check_row(get_task("winogrande"), row, "here")
    check_row(get_task("winogrande"), {**row, "answer": "2"}, "here")


def test_a_bad_pool_line_is_named(tmp_path):
    import lzma

    from prge_lib.data.pools import DataFormatError, read_pool

    path = tmp_path / "glue" / "sst2" / "train.jsonl.xz"
    path.parent.mkdir(parents=True)
    with lzma.open(path, "wb") as f:
        f.write(b'{"n_rows": 3, "seeds": [0]}\n{"i": 0, "row": {}}\n{"i": 1,\n')
    with pytest.raises(DataFormatError, match=r"train\.jsonl\.xz, line 3: not valid JSON"):
        read_pool("glue/sst2", "train", tmp_path)


# ----- 8. an export path that would be overwritten by its own settings
@pytest.mark.parametrize("out", ["x.json", "x", "x.pt"])
def test_export_refuses_a_name_that_is_not_pte_before_exporting(out, no_model, tmp_path, capsys):
    assert main(["export", "--task", "sst2", "--out", str(tmp_path / out)]) == 2
    assert f"a program's name ends in .pte" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


# ----- 9. exit status 2 for every bad input; a local Ray with its APIs closed
def test_the_range_checks_of_the_command_exit_with_2_not_1(tmp_path, capsys):
    assert main(["zeroshot", "--task", "sst2", "--n", "0", "--out", str(tmp_path / "z.json")]) == 2
    assert "prge: error: --n must be a whole number at least 1, got 0" in capsys.readouterr().err
    assert main(["reproduce", "table1", "--seeds", "0,-3", "--results-dir", str(tmp_path / "r"),
                 "--checkpoint-root", str(tmp_path / "c")]) == 2
    assert "seed must be a whole number from 0 to 4294967295, got -3" in capsys.readouterr().err
    assert main(["reproduce", "table1", "--stop-rising", "0.5", "--list"]) == 2
    assert "--stop-rising must be a number above 1" in capsys.readouterr().err
    assert main(["reproduce", "runtime", "--stop-rising", "3", "--list"]) == 2
    assert "--stop-rising stops training cells, and grid 'runtime' has none" in capsys.readouterr().err


class _FakeRay:
    def __init__(self, version="2.60.0"):
        self.__version__, self.calls = version, []

    def init(self, **kwargs):
        self.calls.append((kwargs, os.environ.get("RAY_AUTH_MODE")))


def test_a_local_ray_starts_without_dashboard_and_with_token_auth(monkeypatch):
    from prge_lib.experiments.reproduce import connect_ray

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    ray = _FakeRay()
    connect_ray(ray, None)
    assert ray.calls == [({"include_dashboard": False, "log_to_driver": False}, "token")]
    cluster = _FakeRay()
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")     # a choice made by whoever runs it is kept
    connect_ray(cluster, "auto")
    assert cluster.calls == [({"address": "auto", "log_to_driver": False}, "disabled")]
    with pytest.raises(RuntimeError, match="needs Ray 2.52 or later .* found 2.40.0"):
        connect_ray(_FakeRay("2.40.0"), None)


def test_the_cluster_extra_asks_for_a_ray_with_token_auth():
    assert '"ray>=2.52"' in (REPO / "pyproject.toml").read_text()


def test_sampled_rows_from_any_source_are_checked():
    """Rows that come from the hub or the shipped pools (not read from a data folder's file) are checked once
    sampled: a label outside the task's classes names the split and the example."""
    from prge_lib.data.pools import DataFormatError
    from prge_lib.data.splits import sample_rows
    from prge_lib.data.tasks import get_task

    task = get_task("sst2")
    rows = [{"sentence": f"a film number {i}", "label": i % 2} for i in range(40)]
    data = sample_rows(task, rows, rows[:10], seed=0, n_train=20, n_val=10, n_test=10)
    assert len(data.train) == 20 and len(data.test) == 10
    bad = [dict(row, label=5) if i == 3 else row for i, row in enumerate(rows)]
    with pytest.raises(DataFormatError, match=r"task 'sst2', (train|validation) example \d+ of seed 0: .*label 5"):
        sample_rows(task, bad, rows[:10], seed=0, n_train=30, n_val=10, n_test=10)
