"""The GPU engine's checks (prge_lib.experiments.bench.gpu_checks, prge gpu-check) run on the CPU where they can:
the same uniforms and z, the buffered step (a run alone, and a pack) against the fused one, an fp32 adapter over an fp16 base; the host-sync check
says it needs a GPU."""
import json

from prge_lib.experiments.bench.gpu_checks import CHECKS, gpu_checks


def test_the_checks_pass_where_they_can_run(tiny_factory):
    def make_model(dtype):
        model = tiny_factory(0, 1)
        return model.half() if dtype == "fp16" else model

    results = gpu_checks(make_model)
    assert list(results) == list(CHECKS)
    assert results["same_z"]["passed"] and results["same_z"]["differing"] == 0
    assert results["same_z"]["max_abs_diff"] == 0 and results["same_z"]["max_ulps"] == 0
    assert results["same_uniforms"]["passed"] and results["same_uniforms"]["elements"] > 0
    pack = results["pack_graphs"]        # on the CPU: the buffered pack step run eagerly, equal bit for bit
    assert pack["passed"] and pack["max_loss_or_g_gap"] == 0 and pack["max_b_gap"] == 0 and pack["graphs"] == 2
    groups = results["group_graphs"]     # two groups a step, their runs changing: one buffered step per width
    assert groups["passed"] and groups["max_loss_or_g_gap"] == 0 and groups["max_b_gap"] == 0
    assert groups["graphs"] == 2 and groups["width_groups"] == 2
    replayed = results["seed_replay"]    # every run of the pack rebuilt from its g alone, bit for bit
    assert replayed["passed"] and replayed["equal_runs"] == replayed["runs"] == 4 and replayed["max_b_gap"] == 0
    assert results["no_host_sync"] == {"passed": None, "why": "not on a GPU"}
    assert results["graphs_match"]["passed"] and results["graphs_match"]["graphs"] is False
    assert results["graphs_match"]["max_loss_or_g_gap"] == 0.0 and results["graphs_match"]["max_b_gap"] == 0.0
    assert results["fp16_adapter"]["passed"] and results["fp16_adapter"]["base_dtype"] == "torch.float16"


def test_a_check_that_breaks_is_recorded_as_failed():
    def broken(dtype):
        raise RuntimeError("no model here")

    results = gpu_checks(broken, ("same_z",))
    assert results == {"same_z": {"passed": False, "error": "RuntimeError: no model here"}}


def test_prge_gpu_check_writes_its_record(tiny_folder, tmp_path, capsys):
    from prge_lib.cli.main import main

    out = tmp_path / "check.json"
    assert main(["gpu-check", "--model", str(tiny_folder), "--device", "cpu", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["kind"] == "gpu-check" and result["failed"] == [] and "provenance" in result
    assert "no_host_sync: not run here" in capsys.readouterr().out
    assert main(["gpu-check", "--device", "tpu", "--out", str(out)]) == 2
    assert main(["gpu-check", "--model", str(tiny_folder), "--device", "cpu", "--checks", "group_graphs,same_z",
                 "--out", str(out)]) == 0
    assert list(json.loads(out.read_text())["checks"]) == ["group_graphs", "same_z"]
    assert main(["gpu-check", "--device", "cpu", "--checks", "fast", "--out", str(out)]) == 2
    assert "--checks: unknown check(s) ['fast']" in capsys.readouterr().err
