"""The result records as types (prge_lib.training.records): the schemas read off them, every committed result file
valid under them, older files upgraded in memory, and one builder per record whichever command writes it."""
import json
from pathlib import Path
from typing import NotRequired

import jsonschema
import pytest

from prge_lib.cli.main import main
from prge_lib.common.paths import RESULTS
from prge_lib.common.schema import json_schema
from prge_lib.experiments import reproduce as rp
from prge_lib.experiments import results
from prge_lib.training import records
from prge_lib.training.records import RECORD_TYPES, SCHEMA_VERSION, TrainRecord, ZeroShotRecord, upgrade_record

TINY = {"steps": 4, "n_train": 16, "n_val": 8, "n_test": 8, "eval_every": 2, "checkpoint_every": 1}


def test_a_field_added_to_the_type_is_in_the_schema_results_checks(monkeypatch):
    class Extended(TrainRecord):
        tokens_per_s: float
        note: NotRequired[str]

    monkeypatch.setitem(records.RECORD_TYPES, "train", Extended)
    results._validator.cache_clear()
    try:
        schema = results.result_schema("train")
        assert schema["properties"]["tokens_per_s"] == {"type": "number"} and "tokens_per_s" in schema["required"]
        assert schema["properties"]["note"] == {"type": "string"} and "note" not in schema["required"]
        run = json.loads(next(RESULTS.glob("table1/sst2/fo_*.json")).read_text())
        with pytest.raises(jsonschema.ValidationError, match="'tokens_per_s' is a required property"):
            results.validate_result(run)
        results.validate_result({**run, "tokens_per_s": 12.5})
    finally:
        monkeypatch.undo()
        results._validator.cache_clear()
    assert "tokens_per_s" not in results.result_schema("train")["properties"]


def test_the_schema_keeps_the_checks_of_a_run():
    schema = json_schema(TrainRecord)
    assert schema["properties"]["best_val"]["properties"]["test"] == {"type": "number", "minimum": 0, "maximum": 1}
    assert schema["properties"]["evals"]["minItems"] == 1 and schema["properties"]["kind"] == {"const": "train"}
    assert schema["properties"]["zero_shot_val"] == {"type": ["number", "null"]}
    with pytest.raises(ValueError, match="no JSON schema for type"):
        json_schema(set)


def _committed() -> list[Path]:
    """Every committed result file; a GPU sitting's logs (sitting.json, stages/<name>.json) are not results."""
    return sorted(p for p in RESULTS.rglob("*.json")
                  if not (p.relative_to(RESULTS).parts[0] == "gpu-sittings"
                          and (p.name == "sitting.json" or p.parent.name == "stages")))


def test_every_committed_result_file_validates_under_its_type():
    checked = {}
    for path in _committed():
        record = results.read_if_present(path)
        kind = record.get("kind")
        if kind in RECORD_TYPES:
            jsonschema.validate(record, json_schema(RECORD_TYPES[kind]))
            checked[kind] = checked.get(kind, 0) + 1
        if kind in ("train", "bench") and "cell" in record:
            results.read_result(path)       # what the runner and the summaries read
    assert checked["train"] >= 40 and checked["zeroshot"] == 14 and checked["bench"] >= 12, checked


def test_a_result_file_keeps_a_list_of_numbers_on_one_line(tmp_path):
    from prge_lib.common.provenance import result_json, write_result

    result = {"seed": 0, "losses": [0.5, 0.25, float("nan")], "projected_grad": [[1.0, -2.0], [3.5, 4.0]],
              "evals": [{"step": 0, "val": 0.5}], "empty": {}, "pair": (1, 2), 3: "three", "provenance": {"x": None}}
    text = write_result(tmp_path / "r.json", result).read_text()
    assert '  "losses": [0.5, 0.25, NaN],\n' in text and '    [1.0, -2.0],\n    [3.5, 4.0]\n' in text
    assert '  "evals": [\n    {\n      "step": 0,\n' in text and '"empty": {}' in text and '"3": "three"' in text
    assert json.loads(text) == json.loads(json.dumps(result, default=str)) != result      # NaN never equals itself
    assert json.dumps(json.loads(text)) == json.dumps(json.loads(json.dumps(result)))
    assert result_json([]) == "[]" and result_json({"a": [[]]}) == '{\n  "a": [\n    []\n  ]\n}'


def test_every_committed_result_file_is_written_as_write_result_writes_it():
    """Compact lists keep the repository small enough to travel to a GPU machine (tests/test_sitting.py)."""
    from prge_lib.common.provenance import result_json

    for path in _committed():
        text = path.read_text()
        record = json.loads(text)
        if isinstance(record, dict) and "provenance" in record and "seed" in record:
            assert text == result_json(record) + "\n", path


def test_committed_files_are_read_with_one_step_time_name():
    for path in _committed():
        text = path.read_text()
        record = results.read_if_present(path)
        flat = json.dumps(record)
        assert '"step_time_s"' not in flat and '"median_s"' not in flat and '"times_s"' not in flat, path
        if '"step_time_s"' in text or '"median_s"' in text:         # an older file: upgraded, not rewritten
            assert '"median"' in flat and '"per_step"' in flat


def test_upgrade_renames_every_older_step_time_and_the_error_of_a_diverged_run():
    run = {"kind": "train", "status": "diverged", "error": "step 3: nan", "step_time_s": {"median": 2, "per_step": [2]},
           "eager": {"step_time_s": {"median": 3, "per_step": [3]}}}
    assert upgrade_record(run) == {"kind": "train", "status": "diverged", "diverged": "step 3: nan",
                                   "step_s": {"median": 2, "per_step": [2]},
                                   "eager": {"step_s": {"median": 3, "per_step": [3]}}}
    bench = {"kind": "bench", "configs": {"prge": {"median_s": 2.0, "times_s": [1.0, 2.0, 3.0], "q": 4}}}
    assert upgrade_record(bench)["configs"]["prge"] == {"step_s": {"median": 2.0, "per_step": [1.0, 2.0, 3.0]}, "q": 4}
    footprint = {"kind": "footprint", "configs": [{"method": "mezo", "step_s": 1.5, "times_s": [1.5]}]}
    assert upgrade_record(footprint)["configs"][0] == {"method": "mezo", "step_s": {"median": 1.5, "per_step": [1.5]}}
    device = {"kind": "device-bench", "runtime": {"step_s": [1.0, 3.0], "median_s": 2.0}, "eager": {"load_s": 1.0}}
    assert upgrade_record(device)["runtime"] == {"step_s": {"median": 2.0, "per_step": [1.0, 3.0]}}
    assert device["eager"] == {"load_s": 1.0}
    new = {"kind": "train", "schema_version": SCHEMA_VERSION, "error": "kept", "step_s": {"median": 1, "per_step": [1]}}
    assert upgrade_record(dict(new)) == new            # a file of this version is left as it is


def test_a_diverged_run_has_one_shape_from_prge_train_and_from_a_grid(fixture_data, tiny_folder, tmp_path,
                                                                      monkeypatch):
    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    from prge_lib.zo.prge import PRGE
    real_step = PRGE.step

    def nan_at_step_3(self, batch, t):
        return {"loss": float("nan"), "finite": False} if t == 2 else real_step(self, batch, t)

    monkeypatch.setattr(PRGE, "step", nan_at_step_3)
    out = tmp_path / "cli.json"
    assert main(["train", "--task", "sst2", "--method", "prge", "--model", str(tiny_folder), "--q", "4", "--E", "16",
                 "--steps", "4", "--eval-every", "2", "--n-train", "16", "--n-val", "8", "--n-test", "8",
                 "--out", str(out)]) == 3
    cell = rp.grid_cells("table1", "cpu", seeds=[0], only="sst2/prge-q4", model=str(tiny_folder), **TINY)[0]
    rp.run_grid([cell], results=tmp_path / "res", checkpoints=tmp_path / "ck", progress=False, say=lambda _: None)
    from_cli, from_grid = (results.read_result(p) for p in (out, cell.result_path(tmp_path / "res")))
    for run in (from_cli, from_grid):
        assert run["status"] == "diverged" and "step 3: the loss is nan" in run["diverged"] and "error" not in run
        assert run["steps"] == len(run["losses"]) == 2 and run["final"]["step"] == 2
        assert run["schema_version"] == SCHEMA_VERSION and len(run["step_s"]["per_step"]) == 2
    assert set(from_grid) - set(from_cli) == {"cell"}           # the grid adds only where the cell sits
    assert set(from_cli) == set(from_grid) - {"cell"}
    assert from_cli["losses"] == from_grid["losses"]


def test_a_zero_shot_result_has_one_shape_from_prge_zeroshot_and_from_a_grid(fixture_data, tiny_folder, tmp_path,
                                                                             monkeypatch):
    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    out = tmp_path / "zs.json"
    assert main(["zeroshot", "--task", "sst2", "--model", str(tiny_folder), "--out", str(out)]) == 0
    cell = rp.grid_cells("table1", "cpu", seeds=[0], only="sst2/zeroshot", model=str(tiny_folder),
                         n_train=16, n_val=8, n_test=8)[0]
    rp.run_grid([cell], results=tmp_path / "res", checkpoints=tmp_path / "ck", progress=False, say=lambda _: None)
    from_cli = results.read_if_present(out)
    from_grid = results.read_result(cell.result_path(tmp_path / "res"))
    jsonschema.validate(from_cli, json_schema(ZeroShotRecord))
    jsonschema.validate({**from_grid, "kind": "zeroshot"}, json_schema(ZeroShotRecord))   # a run of 0 steps too
    for key in set(ZeroShotRecord.__annotations__) - {"kind", "provenance"}:
        if key in from_cli:
            assert type(from_cli[key]) is type(from_grid[key]), key
    assert from_grid["best_val"]["test"] == from_grid["value"] and from_grid["n"] == 8
    assert from_cli["label_words"] == from_grid["label_words"] and from_grid["split"] == from_cli["split"] == "test"


def test_each_result_records_the_command_that_wrote_it(fixture_data, tiny_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["zeroshot", "--task", "sst2", "--n", "4", "--model", str(tiny_folder), "--out", str(first)]) == 0
    assert main(["zeroshot", "--task", "sst2", "--n", "6", "--model", str(tiny_folder), "--out", str(second)]) == 0
    commands = [json.loads(p.read_text())["provenance"]["command"] for p in (first, second)]
    assert commands == [f"prge zeroshot --task sst2 --n 4 --model {tiny_folder} --out {first}",
                        f"prge zeroshot --task sst2 --n 6 --model {tiny_folder} --out {second}"]
    from prge_lib.common.provenance import provenance
    assert provenance(1.0, "prge train --task rte")["command"] == "prge train --task rte"     # as given


def test_summary_rows_are_the_declared_type():
    """Every grid summary row has exactly SummaryRow's fields, of its types, in the committed CSV's column order."""
    import csv
    import typing

    from prge_lib.experiments.summary_row import SummaryRow

    schema = json_schema(SummaryRow)
    fields = list(typing.get_type_hints(SummaryRow))
    for grid in ("table1", "peft", "alternatives"):
        rows = rp.summarize(grid)
        assert rows, grid
        for row in rows:
            assert list(row) == fields, grid
            jsonschema.validate(row, schema)
        with open(RESULTS / grid / "summary.csv") as f:
            assert next(csv.reader(f)) == fields


def test_a_result_file_writes_float32_values_short_and_gives_them_back():
    """A list of float32 values (a run's losses and g) is written with at most 9 significant digits; read back and
    cast (provenance.as_float32) each is the run's value exactly. A double that is no float32 keeps all its
    digits, and what is not a finite float is written as JSON writes it."""
    import math

    import torch

    from prge_lib.common.provenance import as_float32, result_json

    computed = torch.randn(2000, generator=torch.Generator().manual_seed(0)).mul(30).tolist()   # float32, widened
    text = result_json({"losses": computed})
    back = json.loads(text)["losses"]
    assert back != computed and as_float32(back) == computed       # shorter numbers, the same float32 values
    assert max(len(repr(v).lstrip("-").replace(".", "").lstrip("0").split("e")[0]) for v in back) <= 9
    assert len(text) < 0.7 * len(json.dumps(computed))
    doubles = [0.1, 1 / 3, 2.5e-300]                               # not float32 values: every digit kept
    assert json.loads(result_json({"x": doubles}))["x"] == doubles
    mixed = [1, True, None, "a", float("inf"), 0.5]
    again = json.loads(result_json({"x": mixed}))["x"]
    assert again[:4] == mixed[:4] and math.isinf(again[4]) and again[5] == 0.5 and type(again[0]) is int
