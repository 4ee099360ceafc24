"""The closing comparison's benchmark: every method built as the trainer builds it, at the same batch."""
import json
import statistics

import pytest

from prge_lib.cli.main import main
from prge_lib.experiments.bench.footprint import footprint, method_config


@pytest.mark.parametrize("method,shape", [
    ("prge", {"E": 16, "q": 4, "batch_size": 4}), ("mezo", {"E": 16, "q": 1}), ("senszoq", {"E": 16, "q": 1}),
    ("fo-lorafa", {"batch_size": 16}), ("mebp", {"batch_size": 16}),
])
def test_every_method_sees_the_same_rows(method, shape):
    config = method_config(method, 16)
    assert {k: getattr(config, k) for k in shape} == shape
    assert config.quant == ("nf4" if method in ("senszoq", "mebp") else "none")


def test_footprint_measures_a_method_in_its_own_process(tmp_path):
    out = tmp_path / "fp.json"
    assert main(["footprint", "--method", "senszoq,fo-lorafa:nf4,prge", "--seq-len", "8", "--rows", "4", "--steps", "1",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["seed"] == 0 and result["provenance"]["command"].startswith("prge footprint")
    (row, plain, prge) = result["configs"]
    # the prompts each method is fed per step, as the trainer feeds them: P-RGE's q = 4 queries share E / 4
    assert (row["batch_rows"], plain["batch_rows"], prge["batch_rows"]) == (4, 4, 1)
    assert plain["method"] == "fo-lorafa:nf4" and plain["quant"] == "nf4"
    assert row["method"] == "senszoq" and row["quant"] == "nf4"
    assert 100_000 < row["trainable"] < 110_000          # 0.1% of the 106M projection weights
    assert row["total_mib"] == pytest.approx(row["held_mib"] + row["step_peak_mib"], abs=0.11)
    assert row["held_mib"] > 100
    for r in result["configs"]:          # the step time is the median of the recorded ones (each rounded to 1 ms)
        assert len(r["step_s"]["per_step"]) == 1 and r["step_s"]["median"] == pytest.approx(
            statistics.median(r["step_s"]["per_step"]), abs=5e-4)


def test_unknown_methods_are_named():
    with pytest.raises(ValueError, match=r"unknown method 'sgd' in 'sgd'"):
        footprint(["sgd"])
    with pytest.raises(ValueError, match=r"unknown quantization 'nf3' in 'fo-lorafa:nf3'"):
        footprint(["fo-lorafa:nf3"])
