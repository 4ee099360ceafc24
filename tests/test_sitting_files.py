"""Reading what the GPU sittings committed (prge_lib.experiments.gpu_results) and the figures chapters 6, 7 and 10
derive from it, on sitting folders built here from real result files: the later sitting's file wins, every figure
names its device, the standard benchmark's speed-up is its two medians' ratio, and nothing else passes for one."""
import json
import math
from pathlib import Path

import pytest

from prge_lib.cli.main import main
from prge_lib.experiments import gpu_results, paper
from prge_lib.experiments import reproduce as rp

RESULTS = Path(__file__).resolve().parent.parent / "data" / "results"
RUNTIME = RESULTS / "runtime" / "synthetic"


def place(source: Path, sitting: Path, relative: str, device: str | None = None, scale: float = 1.0) -> Path:
    """Copy a committed result file into a sitting folder; with ``device``, as if that GPU had run it, and its
    P-RGE q 4 median scaled by ``scale`` (so that two sittings' copies can be told apart)."""
    data = json.loads(source.read_text())
    if device:
        data["provenance"]["hardware"]["cuda"] = device
    if "prge@q4" in data.get("configs", {}):
        data["configs"]["prge@q4"]["median_s"] *= scale
    target = sitting / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(data))
    return target


def test_the_latest_sitting_wins_and_each_result_names_its_device(tmp_path):
    cell = "results/runtime/synthetic/bench-none-L64_seed0.json"
    place(RUNTIME / "bench-none-L64_seed0.json", tmp_path / "1", cell, "NVIDIA H100 80GB HBM3")
    place(RUNTIME / "bench-none-L64_seed0.json", tmp_path / "10", cell, "NVIDIA H200", scale=0.5)
    place(RUNTIME / "bench-nf4-L64_seed0.json", tmp_path / "2", "results/runtime/synthetic/bench-nf4-L64_seed0.json",
          "NVIDIA H200")
    place(RUNTIME / "bench-none-L128_seed0.json", tmp_path / "notes", cell)      # not a sitting: not read
    assert [p.name for p in gpu_results.sitting_folders(tmp_path)] == ["1", "2", "10"]   # in the order they ran
    found = {r["config"]["quant"]: r for r in gpu_results.sitting_results("runtime", tmp_path)}
    assert set(found) == {"none", "nf4"}
    assert found["none"]["_sitting"] == "10" and gpu_results.device_name(found["none"]) == "NVIDIA H200"
    assert found["nf4"]["_sitting"] == "2"
    # the answers are the file's own numbers: the later sitting's halved P-RGE step doubles outer ÷ both
    committed = rp.runtime_answers(next(r for r in rp.load_results("runtime")
                                        if r["_file"] == "synthetic/bench-none-L64_seed0.json"))
    answers = rp.runtime_answers(found["none"])
    assert answers["outer only ÷ both, q 4"] == pytest.approx(2 * committed["outer only ÷ both, q 4"])
    assert answers["P-RGE spread over q (%)"] == committed["P-RGE spread over q (%)"]
    assert math.isnan(rp.runtime_answers(found["nf4"])["MeZO (Full) ÷ P-RGE q 4"])     # no MeZO (Full) on NF4
    assert gpu_results.sitting_results("runtime", tmp_path / "nowhere") == []
    assert gpu_results.sitting_results("memory", tmp_path) == []


def test_a_cpu_result_names_its_cpu():
    result = json.loads((RUNTIME / "bench-none-L64_seed0.json").read_text())
    assert gpu_results.device_name(result).startswith("CPU (")


def test_the_standard_benchmark_speedup_is_the_ratio_of_its_medians(tiny_folder, tmp_path):
    out = tmp_path / "3" / "table13" / "fp32_L8_B2.json"
    assert main(["bench", "--method", "mezo-lorafa,prge-inner", "--model", str(tiny_folder), "--q", "1", "--E", "2",
                 "--seq-len", "8", "--repeats", "2", "--no-peaks", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert all(c["peak_mib"] is None for c in written["configs"].values())     # --no-peaks: step times only
    # a summary beside the results is no result file, and a pattern keeps it out
    (tmp_path / "3" / "table13" / "notes.txt").write_text("not json")
    row, = gpu_results.inner_speedups(gpu_results.sitting_files("table13", tmp_path))
    configs = written["configs"]
    assert row["speedup"] == configs["mezo-lorafa"]["step_s"]["median"] / configs["prge-inner"]["step_s"]["median"]
    assert (row["weights"], row["L"], row["B"], row["sitting"]) == ("fp32", 8, 2, "3")
    assert row["device"].startswith("CPU (")
    # a benchmark of other configurations cannot pass for the standard one
    other = tmp_path / "4" / "table13" / "fp32_L8_B4.json"
    assert main(["bench", "--method", "prge-outer", "--model", str(tiny_folder), "--q", "1", "--E", "2",
                 "--seq-len", "8", "--repeats", "1", "--no-peaks", "--out", str(other)]) == 0
    with pytest.raises(ValueError, match=r"fp32_L8_B4.json: not a standard-benchmark file .*'mezo-lorafa'"):
        gpu_results.inner_speedups(gpu_results.sitting_files("table13", tmp_path))


def test_flat_in_q_by_engine_reads_each_engines_own_step_times(tiny_folder, tmp_path):
    # the stage flat-q-engines' command on the CPU (without the graphed step, which needs a GPU): the per-layer and
    # the fused step at q 1 and 2 in one process, one file per length
    out = tmp_path / "5" / "flat_q" / "fp32_L{seq_len}.json"
    assert main(["bench", "--method", "prge,prge-fused", "--model", str(tiny_folder), "--q", "1,2", "--E", "2",
                 "--seq-len", "8,12", "--repeats", "2", "--no-peaks", "--out", str(out)]) == 0
    written = {L: json.loads((tmp_path / "5" / "flat_q" / f"fp32_L{L}.json").read_text()) for L in (8, 12)}
    assert set(written[8]["configs"]) == {"prge@q1", "prge@q2", "prge-fused@q1", "prge-fused@q2"}
    rows = gpu_results.flat_in_q(gpu_results.sitting_files("flat_q", tmp_path))
    assert [(r["engine"], r["L"]) for r in rows] == [("per-layer", 8), ("per-layer", 12), ("fused", 8), ("fused", 12)]
    for row in rows:
        configs = written[row["L"]]["configs"]
        key = "prge" if row["engine"] == "per-layer" else "prge-fused"
        times = [configs[f"{key}@q{q}"]["step_s"]["median"] for q in (1, 2)]
        assert (row["q1_s"], row["q2_s"]) == tuple(times) and row["spread"] == max(times) / min(times)
        assert row["E"] == 2 and row["device"].startswith("CPU (") and row["sitting"] == "5"
        # the file's own ratio says the same
        ratio = written[row["L"]]["ratios"][f"{key.replace('-', '_')}_spread_over_q"]
        assert ratio == pytest.approx(row["spread"] - 1)
    # an engine measured at one q only answers nothing
    one_q = tmp_path / "6" / "flat_q" / "fp32_L8.json"
    assert main(["bench", "--method", "prge-fused", "--model", str(tiny_folder), "--q", "2", "--E", "2",
                 "--seq-len", "8", "--repeats", "1", "--no-peaks", "--out", str(one_q)]) == 0
    assert gpu_results.flat_in_q(gpu_results.sitting_files("flat_q", tmp_path / "nowhere")) == []
    only_one = json.loads(one_q.read_text())
    assert gpu_results.flat_in_q([only_one]) == []


def test_the_graphed_benchmark_step_is_refused_off_a_gpu_before_any_work(tiny_folder, tmp_path, capsys):
    out = tmp_path / "graphs.json"
    assert main(["bench", "--method", "prge-graphs", "--model", str(tiny_folder), "--q", "2", "--E", "2",
                 "--seq-len", "8", "--repeats", "1", "--no-peaks", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "'prge-graphs' replays CUDA graphs: it needs --device cuda (the model is on cpu)" in err
    assert not out.exists()


def test_the_paper_table13_and_its_stated_maximum_agree():
    t13 = paper.TABLE13_SECONDS
    gains = {(L, B): t13["mezo-lorafa"][L][i] / t13["prge-inner"][L][i]
             for L in t13["seq_lens"] for i, B in enumerate(t13["batch_sizes"])}
    best = max(gains, key=gains.get)
    # the text's 1.79x is at L 64, B 1; the table's two-decimal times give 0.07 / 0.04 there
    assert best[1] == 1 and gains[64, 1] == pytest.approx(1.75) and paper.INNER_MAX_SPEEDUP["fp16"] == 1.79
    assert max(v for (L, B), v in gains.items() if B > 1) < 1.15


def test_memory_beyond_mezo_lorafa_ours_and_the_papers():
    memory = {r["config"]["seq_len"]: r["configs"] for r in rp.load_results("memory")}
    ours = rp.memory_beyond(memory[256])
    assert ours["prge"] == memory[256]["prge"]["peak_mib"] - memory[256]["mezo-lorafa"]["peak_mib"]
    theirs = rp.paper_memory_beyond(256)
    assert theirs["fo-lorafa"] == pytest.approx(1024 * (11.58 - 3.05))     # ACL Table 3, L 256, B 16
    assert rp.paper_memory_beyond(64, batch_size=1)["prge"] == pytest.approx(1024 * (2.11 - 2.09))


def test_a_gpu_benchmark_meters_each_peak_in_its_own_process_and_a_cpu_one_in_a_fresh_one(monkeypatch):
    """The CUDA allocator's peak counts live tensors only, so a GPU's configurations are metered in the
    benchmark's process (no start, imports and CUDA context per configuration); a CPU's resident set would carry
    freed memory over, so each is metered in a fresh process."""
    from prge_lib.experiments.bench import methods

    calls = []
    monkeypatch.setattr(methods, "_measure_peak", lambda job, fresh=None: calls.append(("here", job)) or 7.0)
    monkeypatch.setattr(methods, "in_fresh_process",
                        lambda module, job, what, live_memory=False: calls.append(("fresh", job)) or {"peak_mib": 9.0})
    args = ("prge", 16, 4, 64, 1, None, 1e-2, 1e-9)
    assert methods.step_peak({"device": "cuda", "dtype": "fp16"}, *args) == 7.0
    assert methods.step_peak({"device": "cuda:1"}, *args) == 7.0
    assert methods.step_peak({"device": "cpu"}, *args) == 9.0 and methods.step_peak({}, *args) == 9.0
    assert [where for where, _ in calls] == ["here", "here", "fresh", "fresh"]
    assert calls[0][1] == {"model": {"device": "cuda", "dtype": "fp16"}, "name": "prge", "E": 16, "q": 4,
                           "seq_len": 64, "warmup": 1, "task": None, "eps": 1e-2, "lr": 1e-9}
    assert calls[0][1] == {**calls[2][1], "model": calls[0][1]["model"]}      # the same job either way


def test_a_gpu_benchmark_copies_one_untouched_model_instead_of_loading_one_per_configuration(tiny_folder,
                                                                                            monkeypatch):
    """On a GPU each configuration gets a device copy of one model loaded once (a runtime cell asks for about
    sixty); the copy is a load's equal, and what a method does to it (LoRA-FA put in, weights perturbed in place)
    never reaches the original. Quantized weights, and the CPU, still load each time."""
    import torch
    from prge_lib.experiments.bench import methods
    from prge_lib.zo.lora import inject_lorafa

    assert methods.FreshModels({"device": "cuda", "dtype": "fp16"}).copies
    assert not methods.FreshModels({"device": "cuda", "quant": "nf4"}).copies
    assert not methods.FreshModels({"device": "cpu"}).copies and not methods.FreshModels({}).copies
    loads = []
    real_load = methods.load_model
    monkeypatch.setattr(methods, "load_model", lambda **spec: loads.append(spec) or real_load(**spec))
    fresh = methods.FreshModels({"name": str(tiny_folder)}, copies=True)
    first, _ = fresh()
    inject_lorafa(first)
    with torch.no_grad():
        for p in first.parameters():
            p.add_(1.0)
    second, _ = fresh()
    reference, _ = real_load(name=str(tiny_folder))
    assert len(loads) == 1 and second is not first
    assert second.state_dict().keys() == reference.state_dict().keys()
    assert all(torch.equal(second.state_dict()[k], v) for k, v in reference.state_dict().items())

    # the benchmark: one load with copies, one per configuration and round without
    for copies, expected in ((True, 1), (False, 2 * (1 + 2))):
        loads.clear()
        result = methods.bench({"name": str(tiny_folder)}, ["mezo-lorafa", "prge"], E=4, qs=(2,), seq_len=16,
                               repeats=2, warmup=0, peaks=False, progress=lambda _: None, copies=copies)
        assert len(loads) == expected and set(result["configs"]) == {"mezo-lorafa", "prge"}


def test_the_standard_benchmark_runs_every_shape_in_one_process_one_file_each(tiny_folder, tmp_path, capsys):
    """The sitting's table13 stages give every (L, B) to one ``prge bench``: one start, one set of imports and one
    CUDA context instead of nine; each shape's file is the one a single-shape run writes."""
    pattern = str(tmp_path / "5" / "table13" / "fp32_L{seq_len}_B{E}.json")
    assert main(["bench", "--method", "mezo-lorafa,prge-inner", "--model", str(tiny_folder), "--q", "1",
                 "--E", "1,2", "--seq-len", "8,12", "--repeats", "1", "--warmup", "0", "--no-peaks",
                 "--out", pattern]) == 0
    rows = gpu_results.inner_speedups(gpu_results.sitting_files("table13", tmp_path))
    assert [(r["L"], r["B"]) for r in rows] == [(8, 1), (8, 2), (12, 1), (12, 2)]
    for L, E in ((8, 1), (12, 2)):
        one = json.loads(Path(pattern.format(seq_len=L, E=E)).read_text())
        assert (one["seq_len"], one["E"], one["q"]) == (L, E, [1]) and "{E}" in one["provenance"]["command"]
    # several values need their placeholder in --out, and the engine's benchmark takes one shape: refused first
    capsys.readouterr()
    for argv, message in (
            (["--method", "prge-inner", "--q", "1", "--E", "1,2", "--out", str(tmp_path / "one.json")],
             "names one file, but --seq-len and --E give 2 shapes: put {E} in it"),
            (["--method", "prge-inner", "--q", "2", "--E", "2,3", "--out", str(tmp_path / "b{E}.json")],
             "the effective batch E = 3 must be a multiple of q = 2"),
            (["--configs", "eager", "--E", "4,8", "--out", str(tmp_path / "x")], "--E takes one value with --configs"),
            (["--method", "prge-inner", "--E", "4,x", "--out", str(tmp_path / "x")],
             "--E takes whole numbers separated by commas, got '4,x'")):
        assert main(["bench", "--model", str(tiny_folder), *argv]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "one.json").exists() and not (tmp_path / "b2.json").exists()


def test_a_benchmark_cut_short_measures_only_the_shapes_it_had_not_finished(tiny_folder, tmp_path, capsys,
                                                                            monkeypatch):
    """``prge bench --keep-done`` (the table13 stages): a shape whose file holds the same benchmark made on this
    machine is kept as it is; a missing, broken, differently made or other machine's file is measured again."""
    from prge_lib.experiments.bench import methods

    measured = []
    real = methods.bench

    def counting(spec, names, **kw):
        measured.append((kw["seq_len"], kw["E"]))
        return real(spec, names, **kw)

    monkeypatch.setattr(methods, "bench", counting)
    pattern = str(tmp_path / "table13" / "fp32_L{seq_len}_B{E}.json")
    argv = ["bench", "--method", "mezo-lorafa,prge-inner", "--model", str(tiny_folder), "--q", "1", "--E", "1,2",
            "--seq-len", "8,12", "--repeats", "1", "--warmup", "0", "--no-peaks", "--keep-done", "--out", pattern]
    assert main(argv) == 0 and measured == [(8, 1), (8, 2), (12, 1), (12, 2)]
    path = {shape: Path(pattern.format(seq_len=shape[0], E=shape[1])) for shape in measured}
    before = {shape: p.read_text() for shape, p in path.items()}
    path[(8, 2)].unlink()                                           # never finished
    path[(12, 1)].write_text(before[(12, 1)][:40])                  # cut off mid-write
    other = json.loads(before[(12, 2)])
    other["provenance"]["hardware"].update(cuda="NVIDIA H200")      # made on another machine
    path[(12, 2)].write_text(json.dumps(other))
    measured.clear()
    assert main(argv) == 0
    assert measured == [(8, 2), (12, 1), (12, 2)] and path[(8, 1)].read_text() == before[(8, 1)]
    assert "shape L 8, E 1: kept" in capsys.readouterr().err
    # the same files asked for with another setting (more repeats) are measured again
    measured.clear()
    assert main([*argv[:argv.index("--repeats") + 1], "2", *argv[argv.index("--repeats") + 2:]]) == 0
    assert len(measured) == 4
    measured.clear()
    assert main([a for a in argv if a != "--keep-done"]) == 0 and len(measured) == 4    # without it: all again
