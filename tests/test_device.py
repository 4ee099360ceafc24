"""The exportable P-RGE step (prge_lib.deploy.program, .export, .runtime): same step as the eager engine, exports without random
operators, and runs in the ExecuTorch runtime with the eager trajectory."""
from __future__ import annotations

import math
import statistics

import pytest
import torch

from prge_lib.deploy.program import TrainStep
from prge_lib.zo.lora import inject_lorafa
from prge_lib.models.objective import Batch
from prge_lib.zo.prge import prge_step, step_seeds


def _batch(vocab: int, rows: int = 3, length: int = 12, seed: int = 0) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (rows, length), generator=gen)
    mask = torch.ones(rows, length, dtype=torch.long)
    ids[0, :4], mask[0, :4] = 0, 0                                    # one left-padded row
    return Batch(ids, mask, torch.randint(1, vocab, (rows, 1), generator=gen))


def _inputs(step: TrainStep, batch: Batch, adapter, seeds, lr=1e-2, eps=1e-2):
    return (batch.input_ids, batch.attention_mask, batch.targets, adapter, torch.tensor(seeds),
            torch.tensor(lr), torch.tensor(eps))


def test_counter_noise_is_required(tiny_factory):
    model = tiny_factory()
    inject_lorafa(model)
    with pytest.raises(ValueError, match="counter"):
        TrainStep(model, 2)
    with pytest.raises(ValueError, match="noise source"):
        inject_lorafa(tiny_factory(), noise="philox")


def test_step_equals_the_eager_engine(tiny_factory):
    """Three steps of the program (run eagerly) = three prge_step calls with the same seeds: same losses,
    same adapter, including the q copies in one forward and both signs in it."""
    model, twin = tiny_factory(), tiny_factory()
    inject_lorafa(model, noise="counter")
    layers = inject_lorafa(twin, noise="counter")
    step = TrainStep(model, q=2)
    adapter = step.adapter()
    for t in range(3):
        batch = _batch(model.config.vocab_size, seed=t)
        seeds = step_seeds(0, t, 2)
        with torch.no_grad():
            losses, adapter = step(*_inputs(step, batch, adapter, seeds))
        out = prge_step(twin, layers, batch, seeds, 1e-2, 1e-2)
        assert torch.allclose(losses[0], out["loss_plus"], rtol=1e-6)
        assert torch.allclose(losses[1], out["loss_minus"], rtol=1e-6)
        eager = torch.cat([layer.lora_B.detach().reshape(-1) for layer in layers])
        # one rounding unit in a loss is 1/2ε = 50 of them in g: compare the update to that scale
        assert float((adapter - eager).norm() / eager.norm()) < 1e-4
    assert adapter.abs().max() > 1e-4                                  # it did train


def _export(step: TrainStep, inputs):
    return torch.export.export(step, inputs)


def test_exported_graph_has_no_random_ops(tiny_factory):
    model = tiny_factory(layers=1)
    inject_lorafa(model, noise="counter")
    step = TrainStep(model, q=1)
    inputs = _inputs(step, _batch(model.config.vocab_size), step.adapter(), step_seeds(0, 0, 1))
    graph = _export(step, inputs).run_decompositions().graph
    ops = {str(node.target) for node in graph.nodes if node.op == "call_function"}
    assert not [op for op in ops if "rand" in op or "normal" in op or "bernoulli" in op], ops
    assert "aten.bitwise_xor.Tensor" in ops                            # the generator is in the graph


def test_runs_in_the_executorch_runtime_like_eager(tiny_factory, tmp_path):
    """The lowered program, fed its own adapter back for several steps, follows the eager trajectory."""
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    model = tiny_factory(layers=1)
    layers = inject_lorafa(model, noise="counter")
    step = TrainStep(model, q=2)
    batch0 = _batch(model.config.vocab_size)
    program = to_edge_transform_and_lower(
        _export(step, _inputs(step, batch0, step.adapter(), step_seeds(0, 0, 2)))).to_executorch()
    path = tmp_path / "step.pte"
    path.write_bytes(program.buffer)
    method = Runtime.get().load_program(str(path)).load_method("forward")
    adapter = step.adapter()
    for t in range(5):
        batch = _batch(model.config.vocab_size, seed=t)
        seeds = step_seeds(0, t, 2)
        losses, adapter = method.execute(list(_inputs(step, batch, adapter, seeds)))
        out = prge_step(model, layers, batch, seeds, 1e-2, 1e-2)
        assert torch.allclose(losses[0], out["loss_plus"], rtol=1e-5)
        assert torch.allclose(losses[1], out["loss_minus"], rtol=1e-5)
    eager = torch.cat([layer.lora_B.detach().reshape(-1) for layer in layers])
    # g = Δℓ/2ε magnifies the last-bit differences of the runtime's kernels; they stay far below the update
    assert float((adapter - eager).norm() / eager.norm()) < 1e-3


def test_adapter_round_trip(tiny_factory):
    model = tiny_factory()
    inject_lorafa(model, noise="counter")
    step = TrainStep(model, 2)
    state = torch.randn(step.adapter().shape)
    step.load(state)
    assert torch.equal(step.adapter(), state)
    with pytest.raises(ValueError, match="shape"):
        step.load(state[:-1])


def test_cli_export_then_train_in_the_runtime_with_eager_parity(fixture_data, tiny_folder, tiny_program, tmp_path,
                                                                 monkeypatch):
    """`prge export` writes the program and its settings; `prge device-train --check-eager` trains with it for
    20 steps and the losses agree with eager P-RGE (same seeds) within 1e-4 relative at every step."""
    import json

    from prge_lib.cli.main import main

    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    pte = tiny_program
    meta = json.loads(pte.with_suffix(".json").read_text())
    assert meta["settings"]["layers"] == 1 and meta["settings"]["target_width"] == 1 and meta["pte_bytes"] > 0
    assert "provenance" in meta and not [op for op in meta["ops"] if "rand" in op]
    out = tmp_path / "run.json"
    code = main(["device-train", "--pte", str(pte), "--task", "sst2", "--steps", "20", "--lr", "1e-2",
                 "--n-train", "40", "--n-val", "8", "--n-test", "8", "--check-eager", "--out", str(out)])
    result = json.loads(out.read_text())
    assert code == 0 and result["parity"]["steps"] == 20
    assert result["parity"]["max_rel_loss_diff"] <= 1e-4
    assert len(set(result["losses"])) > 1 and result["provenance"]["wall_time_s"] > 0

    # every operator of the exported graph is core ATen (the two exceptions are structural: tuple access and a
    # metadata assertion that lowering removes), so any ExecuTorch build runs it without custom operators
    structural = {"<built-in function getitem>", "aten._assert_tensor_metadata.default"}
    for name in set(meta["ops"]) - structural:
        namespace, op, overload = name.split(".")
        assert namespace == "aten" and torch.Tag.core in getattr(getattr(torch.ops.aten, op), overload).tags, name
    assert meta["planned_bytes"] > 0

    # stop after 10 steps, then resume with a freshly loaded program: the same 20-step trajectory, and the
    # adapter read back from the runtime loads into a PyTorch model
    ckpt, adapter = tmp_path / "ckpt", tmp_path / "adapter.safetensors"
    common = ["device-train", "--pte", str(pte), "--task", "sst2", "--lr", "1e-2", "--n-train", "40",
              "--n-val", "8", "--n-test", "8", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "5"]
    assert main(common + ["--steps", "10", "--out", str(tmp_path / "first.json")]) == 0
    assert main(common + ["--steps", "20", "--resume", "--save-adapter", str(adapter),
                          "--out", str(tmp_path / "resumed.json")]) == 0
    resumed = json.loads((tmp_path / "resumed.json").read_text())
    assert resumed["losses"] == result["losses"]
    from prge_lib.models.loading import truncate_layers
    from prge_lib.zo.lora import load_adapter, read_adapter
    from prge_lib.models.loading import load_model

    model, _ = load_model(str(tiny_folder))
    truncate_layers(model, 1)
    inject_lorafa(model, noise="counter")
    load_adapter(model, read_adapter(adapter))
    assert TrainStep(model, 2).adapter().abs().max() > 0


def test_device_bench_compares_runtime_and_eager(tiny_xnnpack_program, tmp_path):
    """`prge device-bench` times the program's step in the runtime and the same step eager on one batch,
    meters both processes' memory and traces the runtime's operators."""
    import json

    from prge_lib.cli.main import main

    pte, out = tiny_xnnpack_program, tmp_path / "bench.json"
    assert main(["device-bench", "--pte", str(pte), "--repeats", "2", "--profile", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    for side in ("runtime", "eager"):
        r = result[side]
        assert len(r["step_s"]["per_step"]) == 2 and r["step_s"]["median"] > 0 and r["load_s"] > 0
        assert r["resident_after_first_step_mib"] > r["resident_before_load_mib"] > 0
        # the median of the timed steps, to the float32 precision a file keeps of a time that is a float32 value
        assert r["step_s"]["median"] == pytest.approx(statistics.median(r["step_s"]["per_step"]), rel=1e-7)
    assert result["eager_over_runtime"] == pytest.approx(result["eager"]["step_s"]["median"] / result["runtime"]["step_s"]["median"])
    profile = result["profile"]
    assert profile["delegated_ms"] > 0 and profile["portable_ms"] > 0       # XNNPACK took part, not all
    assert any(name.startswith("bitwise") for name in profile["portable_top"])   # the generator: portable


def test_program_refuses_other_settings(fixture_data, tiny_folder, tiny_program, monkeypatch):
    from prge_lib.deploy.runtime import build_program_method
    from prge_lib.training.trainer import TrainConfig, Trainer

    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    pte = tiny_program
    config = TrainConfig(task="sst2", method="prge", q=4, E=4, noise="counter", layers=1, max_length=24,
                         model=str(tiny_folder), program=str(pte), n_train=40, n_val=8, n_test=8)
    with pytest.raises(ValueError, match="other settings"):
        Trainer(config, method_builder=build_program_method)
    with pytest.raises(ValueError, match="trains through the runtime host"):   # the trainer alone cannot
        Trainer(config)
    with pytest.raises(ValueError, match="counter"):
        TrainConfig(task="sst2", method="prge", program=str(pte), max_length=24).resolved()


def test_train_in_runtime_refuses_resume_without_a_folder(tiny_program, tmp_path):
    from prge_lib.deploy.device_train import train_in_runtime

    with pytest.raises(ValueError, match="checkpoint_dir"):
        train_in_runtime(tiny_program, "sst2", 4, resume=True)
    with pytest.raises(FileNotFoundError, match="settings"):
        train_in_runtime(tmp_path / "missing.pte", "sst2", 4)


def test_fp16_program_keeps_the_adapter_in_fp32(fixture_data, tiny_folder, tmp_path, monkeypatch):
    """`--dtype fp16` halves the frozen weights; the adapter input and output stay fp32 and the runtime
    follows eager fp16 P-RGE; bf16 is refused."""
    from prge_lib.deploy.export import export_training_program
    from prge_lib.deploy.device_train import train_in_runtime

    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    with pytest.raises(ValueError, match="bf16"):
        export_training_program("sst2", tmp_path / "x.pte", model=str(tiny_folder), layers=1, dtype="bf16")
    pte = tmp_path / "half.pte"
    record = export_training_program("sst2", pte, model=str(tiny_folder), layers=1, q=2, E=4, seq_len=16,
                                     dtype="fp16")
    assert record["settings"]["dtype"] == "fp16" and "float32" in record["settings"]["inputs"][3]
    run = train_in_runtime(pte, "sst2", 3, lr=1e-2, check_eager=True, progress=False, n_train=40, n_val=8,
                           n_test=8)
    assert run["config"]["dtype"] == "fp16" and all(map(math.isfinite, run["losses"]))
    assert run["parity"]["max_rel_loss_diff"] < 1e-2        # fp16 kernels round differently from PyTorch's


def test_unavailable_device_is_refused_by_name():
    """The Jetson path runs the eager trainer with --device cuda; where torch has no GPU the error says so."""
    from prge_lib.models.loading import check_device

    check_device("cpu")
    if torch.cuda.is_available():
        check_device("cuda")                 # on a GPU machine the Jetson path is accepted
    else:
        with pytest.raises(ValueError, match="no CUDA device"):
            check_device("cuda")
    with pytest.raises(ValueError, match="choose cpu or cuda"):
        check_device("meta")
