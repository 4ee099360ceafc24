"""The GPU engine's parts that run on the CPU: the engine and noise chosen by device (a GPU run draws the z a
CPU run draws), the fused step without a host read under SDPA, its buffered (CUDA-graph) form, the packed fused
step, length buckets, and an fp16 base under an fp32 adapter."""
import dataclasses

import pytest
import torch
from fixtures import randomize_b, small_trainer

from prge_lib.models.buckets import bucket_length, parse_buckets, to_bucket
from prge_lib.models.objective import collate, synthetic_batch, tail_logits
from prge_lib.training.trainer import TrainConfig, build_method
from prge_lib.zo import fused as fused_module
from prge_lib.zo.fused import FusedPRGE, draw_all, fused_prge_step, host_record
from prge_lib.zo.graphs import GraphedPRGE
from prge_lib.zo.lora import inject_lorafa
from prge_lib.zo.prge import PRGE, step_seeds
from prge_lib.zo.prng import counter_normal

SYNCING = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")


def test_the_engine_and_noise_follow_the_device():
    gpu = TrainConfig("sst2", device="cuda").resolved()
    assert (gpu.noise, gpu.engine) == ("counter", "fused")
    cpu = TrainConfig("sst2").resolved()
    assert (cpu.noise, cpu.engine, cpu.buckets) == ("torch", "layerwise", None)     # the CPU's defaults, as before
    mezo = TrainConfig("sst2", method="mezo", device="cuda").resolved()
    assert (mezo.noise, mezo.engine) == ("torch", "layerwise")                      # not a LoRA-FA method
    assert TrainConfig("sst2", device="cuda", noise="torch").resolved().engine == "layerwise"
    assert TrainConfig("sst2", buckets="64, 32,64").resolved().buckets == "32,64"


@pytest.mark.parametrize("settings,message", [
    (dict(engine="fused"), "needs noise 'counter'"),
    (dict(engine="fused", noise="counter", cuda_graphs=True), "cuda_graphs .* needs device cuda"),
    (dict(method="mezo", engine="fused"), "engine applies to methods"),
    (dict(buckets="32,x"), "'x' is not an integer"),
    (dict(buckets="0"), "at least 1"),
])
def test_bad_engine_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig("sst2", **settings).resolved()


def test_a_gpu_configured_run_draws_the_z_of_a_cpu_run(tiny_factory):
    """The config resolved for a GPU, built on CPU tensors: its method draws, through the same device-agnostic
    integer code, exactly the z of a CPU run with counter noise, and of the generator called directly."""
    gpu = dataclasses.replace(TrainConfig("sst2", q=2, E=4, seed=3, device="cuda").resolved(), device="cpu")
    method = build_method(gpu, tiny_factory(0, 1))
    assert type(method) is FusedPRGE
    cpu = TrainConfig("sst2", q=2, E=4, seed=3, noise="counter").resolved()
    reference = build_method(cpu, tiny_factory(0, 1))
    assert type(reference) is PRGE
    seeds = step_seeds(3, 5, 2)
    z = draw_all(method.layers, seeds)
    for layer, ref in zip(method.layers, reference.layers):
        for i, seed in enumerate(seeds):
            own = z[i, layer.offset:layer.offset + layer.lora_B.numel()].view(layer.lora_B.shape)
            assert torch.equal(own, ref.draw(seed))
            assert torch.equal(own, counter_normal(seed, 0, layer.lora_B.shape, offset=layer.offset))


def test_cuda_graphs_build_the_graphed_step(tiny_factory):
    config = TrainConfig("sst2", q=2, E=4, device="cuda", buckets="64", cuda_graphs=True).resolved()
    method = build_method(dataclasses.replace(config, device="cpu"), tiny_factory(0, 1))
    assert type(method) is GraphedPRGE and not method.graphs          # CPU tensors: the buffered step, eagerly


@pytest.mark.parametrize("extra, noted", [((), True), (("--buckets", "64", "--cuda-graphs"), False)])
def test_prge_train_on_a_gpu_points_to_cuda_graphs(monkeypatch, capsys, tmp_path, extra, noted):
    """`prge train --device cuda` steps the fused engine eagerly unless asked for graphs (buckets change the
    numbers by rounding, so they are the user's choice): it says so, with the options, before loading anything."""
    from prge_lib.cli.main import main
    from prge_lib.training import trainer as trainer_module

    class Stop(Exception):
        pass

    def refuse(*args, **kwargs):
        raise Stop
    monkeypatch.setattr(trainer_module, "Trainer", refuse)
    with pytest.raises(Stop):
        main(["train", "--task", "sst2", "--device", "cuda", "--out", str(tmp_path / "r.json"), *extra])
    said = capsys.readouterr().err
    assert ("--cuda-graphs (the padding" in said) is noted, said


def _model(tiny_factory, seed=0):
    model = tiny_factory(seed, 2)
    layers = inject_lorafa(model, r=4, noise="counter")
    randomize_b(layers, seed=seed)
    return model, layers


def _padded_batch(vocab):
    batch = synthetic_batch(2, 6, vocab)
    batch.attention_mask[0, :3] = 0                        # a left-padded row, as in training
    return batch


def test_the_device_mask_gives_transformers_numbers(tiny_factory):
    model, _ = _model(tiny_factory)
    batch = _padded_batch(model.config.vocab_size)
    own = tail_logits(model, batch.input_ids, batch.attention_mask, 2, device_mask=True)
    theirs = tail_logits(model, batch.input_ids, batch.attention_mask, 2, device_mask=False)
    assert torch.allclose(own, theirs, atol=1e-5, rtol=0)
    assert torch.isfinite(tail_logits(model, batch.input_ids, batch.attention_mask, 6, device_mask=True)).all()


def test_the_fused_step_reads_nothing_on_the_host_under_sdpa(tiny_factory, monkeypatch):
    """With the device mask, the fused step runs transformers' SDPA attention (the GPU's) without a host read:
    every way to bring a value to the host raises during the step."""
    model, layers = _model(tiny_factory)
    assert model.config._attn_implementation == "sdpa"
    batch = _padded_batch(model.config.vocab_size)
    seeds = step_seeds(4, 0, 2)

    def refuse(name):
        def read(*args, **kwargs):
            raise AssertionError(f"Tensor.{name} called inside the step")
        return read

    with monkeypatch.context() as patch:
        for name in SYNCING:
            patch.setattr(torch.Tensor, name, refuse(name))
        with pytest.raises(AssertionError, match="Tensor"):    # transformers' own mask reads the padding
            fused_module.fused_prge_step(model, layers, batch, seeds, 1e-2, 1e-2, device_mask=False)
        for layer in layers:
            layer.kept, layer.copies = None, None
        out = fused_module.fused_prge_step(model, layers, batch, seeds, 1e-2, 1e-2, device_mask=True)
    assert host_record(out)["finite"]


def test_the_buffered_step_is_the_fused_step(tiny_factory):
    """GraphedPRGE on the CPU runs its buffered step eagerly (seeds and batch read from fixed buffers): the
    losses, g and B of the fused step with the device mask, bit for bit, over steps of two shapes."""
    model, layers = _model(tiny_factory)
    ref_model, ref_layers = _model(tiny_factory)
    graphed = GraphedPRGE(model, layers, q=2, eps=1e-2, lr=5e-2, seed=7)
    assert not graphed.graphs
    batches = [synthetic_batch(2, 6, model.config.vocab_size, seed=s) for s in (1, 2)] + \
        [synthetic_batch(2, 9, model.config.vocab_size, seed=3)]
    for t, batch in enumerate(batches):
        record = graphed.step(batch, t)
        ref = host_record(fused_prge_step(ref_model, ref_layers, batch, step_seeds(7, t, 2), 1e-2, 5e-2,
                                          device_mask=True))
        assert record == ref
        for layer, ref_layer in zip(layers, ref_layers):
            assert torch.equal(layer.lora_B, ref_layer.lora_B)
    assert sorted(graphed.steps) == [(2, 6, 1), (2, 9, 1)]


def test_buckets():
    assert parse_buckets("128,32,64") == (32, 64, 128) and parse_buckets(None) is None
    assert bucket_length(33, (32, 64)) == 64 and bucket_length(32, (32, 64)) == 32
    with pytest.raises(ValueError, match="70 tokens is longer than the largest bucket 64"):
        bucket_length(70, (32, 64))
    batch = collate([([5, 6, 7], [8]), ([5], [9, 10])], pad_id=0)
    padded = to_bucket(batch, (4, 8), pad_id=0)
    assert padded.input_ids.shape == (2, 4) and padded.input_ids[0].tolist() == [0, 5, 6, 7]
    assert padded.attention_mask[1].tolist() == [0, 0, 0, 1] and torch.equal(padded.targets, batch.targets)


@pytest.mark.parametrize("engine", ["layerwise", "fused"])
def test_bucketed_training_gives_the_same_losses(tiny_factory, tokenizer, sst2_small, engine):
    """Padding to a bucket is masked: three steps give the unbucketed losses up to float rounding."""
    settings = dict(steps=3, eval_every=0, q=2, E=4, lr=1e-2, noise="counter", engine=engine)
    plain = small_trainer(tiny_factory, tokenizer, sst2_small, **settings)
    bucketed = small_trainer(tiny_factory, tokenizer, sst2_small, buckets="40,80", **settings)
    assert plain.batch(0).input_ids.shape[1] < 40 and bucketed.batch(0).input_ids.shape[1] == 40
    a, b = plain.run(), bucketed.run()
    assert len(a["losses"]) == 3
    for x, y in zip(a["losses"], b["losses"]):
        assert abs(x - y) <= 1e-5 * max(1.0, abs(x)), (a["losses"], b["losses"])


def test_the_packed_fused_step_matches_the_packed_layerwise_step(tiny_factory, tokenizer):
    from prge_lib.zo.packing import build_pack

    runs = [dict(targets=("q_proj", "v_proj", "down_proj"), r=4, alpha=8, noise="counter", q=q, eps=1e-2,
                 lr=2e-2, seed=seed, keep_noise=None) for q, seed in ((2, 1), (1, 2))]
    vocab = tiny_factory().config.vocab_size
    work = {0: (synthetic_batch(2, 5, vocab, seed=1), 0), 1: (synthetic_batch(3, 7, vocab, seed=2), 0)}
    records = {}
    for fused in (False, True):
        pack = build_pack(tiny_factory(), runs, tokenizer.pad_token_id, fused=fused, buckets=(8, 16))
        records[fused] = (pack.step(work), [[layer.lora_B.clone() for layer in run.layers] for run in pack.runs])
    for r in (0, 1):
        assert records[True][0][r] == records[False][0][r]              # same losses and g
        for b_fused, b_layerwise in zip(records[True][1][r], records[False][1][r]):
            assert torch.allclose(b_fused, b_layerwise, atol=1e-7, rtol=1e-6)
    with pytest.raises(ValueError, match="needs counter noise"):
        build_pack(tiny_factory(), [{**runs[0], "noise": "torch"}], tokenizer.pad_token_id, fused=True)


@pytest.mark.parametrize("engine", ["layerwise", "fused"])
def test_an_fp16_base_keeps_the_adapter_its_noise_and_update_in_fp32(tiny_factory, engine):
    """--dtype fp16 holds the base in fp16; B, its noise, g and the update stay fp32 (the copies are cast to
    fp16 only for the low-rank product)."""
    model = tiny_factory(0, 1).half()
    layers = inject_lorafa(model, r=4, noise="counter")
    randomize_b(layers)
    assert model.model.layers[0].self_attn.q_proj.base.weight.dtype == torch.float16
    seeds = step_seeds(0, 0, 2)
    assert draw_all(layers, seeds).dtype == torch.float32 and layers[0].draw(seeds[0]).dtype == torch.float32
    before = [layer.lora_B.clone() for layer in layers]
    batch = synthetic_batch(2, 5, model.config.vocab_size)
    build = FusedPRGE if engine == "fused" else PRGE
    method = build(model, layers, q=2, eps=1e-2, lr=1e-1, seed=0)
    record = method.step(batch, 0)
    assert record["finite"] and all(isinstance(g, float) for g in record["projected_grad"])
    for layer, b in zip(layers, before):
        assert layer.lora_B.dtype == torch.float32 and layer.lora_A.dtype == torch.float32
        assert not torch.equal(layer.lora_B, b)                # the fp32 update moved B
    out = fused_prge_step(model, layers, batch, seeds, 1e-2, 1e-1)
    assert out["loss_plus"].dtype == torch.float32 and out["projected_grad"].dtype == torch.float32
