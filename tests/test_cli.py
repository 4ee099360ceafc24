"""``prge zeroshot`` writes a JSON result with its provenance; bad input exits 2 with a clear message."""
import json
import subprocess
import sys

from prge_lib.cli import main


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


def test_unknown_task_lists_the_known_ones(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "prge_lib.cli", "zeroshot", "--task", "sst5", "--out",
                           str(tmp_path / "x.json")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "unknown task 'sst5'; known tasks: sst2, rte, mrpc" in proc.stderr
    assert not (tmp_path / "x.json").exists()


def test_missing_task_file_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PRGE_DATA_DIR", str(tmp_path))
    assert main(["zeroshot", "--task", "rte", "--out", str(tmp_path / "x.json")]) == 2
    assert "glue/rte/validation.jsonl" in capsys.readouterr().err
