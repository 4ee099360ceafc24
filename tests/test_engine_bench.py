"""The engine benchmark (prge_lib.experiments.bench.engine, prge bench --configs) on the CPU with the tiny model:
every configuration recorded, ratios recomputed from the recorded rates, the FLOP count against a hand count."""
import json

import pytest
import torch

from prge_lib.experiments.bench.engine import (ModelShape, eager_groups, engine_bench, engine_ratios, eval_spec,
                                               forward_flops,
                                               forward_tokens, pack_options, pack_spec, parse_configs, peak_flops,
                                               real_token_share, step_batches, step_flops)
from prge_lib.experiments.bench.methods import BatchSource
from prge_lib.models.objective import collate, length_chunks


def test_peaks_by_device_name():
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12 and peak_flops("NVIDIA H200") == 989e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12 and peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops("NVIDIA GeForce GTX 1080") is None


def test_config_names():
    assert parse_configs("eager, optimised,packed-8,packed-max") == ["eager", "optimised", "packed-8", "packed-max"]
    assert parse_configs("packed-256-g4,packed-max-g2") == ["packed-256-g4", "packed-max-g2"]
    assert pack_spec("packed-256-g4") == (256, 4) and pack_spec("packed-max") == (None, 1)
    assert pack_spec("packed-8") == (8, 1) and pack_spec("optimised") is None
    assert parse_configs("eval-16,packed-8") == ["eval-16", "packed-8"]
    assert pack_spec("packed-256-lowp") == (256, 1) and pack_spec("packed-max-g4-lowp") == (None, 4)
    assert eval_spec("eval-16") == 16 and eval_spec("eval-0") is None and eval_spec("packed-8") is None
    assert pack_spec("packed-256-lowp-compiled") == (256, 1) and pack_spec("packed-8-g2-compiled") == (8, 2)
    assert pack_options("packed-256-lowp-compiled") == ("packed-256", {"lowp_lora": True, "compiled": True})
    assert pack_options("packed-8-compiled") == ("packed-8", {"compiled": True})
    assert pack_options("packed-8") == ("packed-8", {})
    assert parse_configs("eager,eager-l4") == ["eager", "eager-l4"]
    assert eager_groups("eager") == 1 and eager_groups("eager-l4") == 4 and eager_groups("optimised") is None
    assert eager_groups("eager-l0") is None and eager_groups("packed-8") is None
    for bad in ("eager-l0", "eager-lx", "eager-4",
                "fast", "packed-0", "packed-x", "", "packed-8-g0", "packed-8-4", "packed-8-g2-g2", "packed-g2",
                "eval-0", "eval-x", "eval", "packed-lowp", "lowp", "packed-8-lowp-g2", "packed-8-compiled-lowp",
                "packed-compiled"):
        with pytest.raises(ValueError):
            parse_configs(bad)


def test_the_flop_count_is_the_hand_count(tiny_factory):
    """The tiny model: hidden 64, intermediate 128, 4 heads of 16, 2 kv heads, 2 layers; LoRA-FA r = 4 on q (64 →
    64) and v (64 → 32) of each layer. A row of 5 real tokens (2 pads) with 1 answer token:
      projections per token and layer: 2·(64·64 + 2·64·32 + 64·64 + 3·64·128) = 2·(4096 + 4096 + 4096 + 24576)
                                       = 73 728; two layers 147 456; × 5 tokens = 737 280
      attention: 2 layers · 2 products · 2 FLOPs · 64 wide · 15 causal pairs = 7 680
      LoRA-FA per token: 2 layers · 2·4·((64 + 64) + (64 + 32)) = 3 584; × 5 = 17 920
      head: 1 position · 2 · 64 · V"""
    model = tiny_factory(0, 2)
    shape = ModelShape.of(model.config)
    vocab = model.config.vocab_size
    lora = [(64, 64), (64, 32)] * 2
    expected = 737_280 + 7_680 + 17_920 + 2 * 64 * vocab
    assert forward_flops(shape, 5, 1, lora, 4) == expected
    batch = collate([([1, 2, 3, 4, 5], [7]), ([1, 2, 3, 4, 5, 6, 7], [8, 9])], pad_id=0)   # 5 + 2 pads, 7 tokens
    assert batch.input_ids.shape == (2, 7)
    assert step_flops(shape, batch, 4, lora, 4) == 4 * (expected + forward_flops(shape, 7, 2, lora, 4))


def test_real_tokens_against_the_positions_a_forward_computes():
    """Two runs' batches in one forward: 5 + 7 real tokens in rows of width 7, and 3 + 2 in rows of width 3. The
    pack pads every row to 7, its bucket 16: 4 rows × 16 = 64 positions, 17 real; without buckets 4 × 7 = 28."""
    one = collate([([1, 2, 3, 4, 5], [7]), ([1, 2, 3, 4, 5, 6, 7], [8])], pad_id=0)
    two = collate([([1, 2, 3], [7]), ([1, 2], [8])], pad_id=0)
    assert forward_tokens([one, two], (16, 32)) == (17, 64)
    assert forward_tokens([one, two], None) == (17, 28)
    assert forward_tokens([two], (16, 32)) == (5, 32)
    assert real_token_share([[one, two], [two]], (16, 32)) == pytest.approx(22 / 96)
    with pytest.raises(ValueError, match="longer than the largest bucket 4"):
        forward_tokens([one], (4,))
    # two width groups: [two] alone (5 real of 2 × 16) and [one] alone (12 of 2 × 16)
    assert real_token_share([[one, two]], (16, 32), groups=2) == pytest.approx(17 / 64)
    assert real_token_share([[one, two]], None, groups=2) == pytest.approx(17 / (2 * 3 + 2 * 7))


def test_the_benchmark_runs_every_configuration_on_the_cpu(tiny_factory, tokenizer):
    def make_model(dtype):
        model = tiny_factory(0, 1)
        return (model.half() if dtype == "fp16" else model), tokenizer

    result = engine_bench(make_model, ["eager", "optimised", "packed-2", "packed-max", "packed-4-g2", "packed-2-lowp"],
                          ["sst2", "rte"],
                          q=2, E=4,
                          seq_len=48, buckets=(32, 64), dtype="fp32", steps=2, warmup=1, max_pack=4,
                          progress=lambda line: None)
    assert result["device"].startswith("cpu") and result["peak_fp16_flops"] is None
    json.dumps(result)                                          # a result file can hold it
    for task in ("sst2", "rte"):
        records, ratios = result["tasks"][task]["configs"], result["tasks"][task]["ratios"]
        assert set(records) == {"eager", "optimised", "packed-2", "packed-max", "packed-4-g2", "packed-2-lowp"}
        assert records["packed-2-lowp"]["lowp_lora"] is True and "lowp_lora" not in records["packed-2"]
        assert records["packed-4-g2"]["runs"] == 4 and records["packed-4-g2"]["width_groups"] == 2
        assert records["eager"]["engine"] == "layerwise" and records["eager"]["dtype"] == "fp32"
        assert records["optimised"]["engine"] == "fused" and records["optimised"]["cuda_graphs"] is False
        assert records["packed-2"]["runs"] == 2 and records["packed-max"]["runs"] == 4   # 1, 2, 4 fit; cap 4
        for name, r in records.items():
            assert r["mfu"] is None and len(r["step_s"]["per_step"]) == 2 and r["flops_per_step"] > 0
            assert r["step_s"]["median"] == pytest.approx(sum(r["step_s"]["per_step"]) / 2)           # two timed steps
            assert r["run_steps_per_s"] == pytest.approx(r["runs"] / r["step_s"]["median"])
            assert 0 < r["real_token_share"] <= 1
        # the share is that of the batches the timed steps drew (1 warm-up step, then 2): one run's padded to its
        # bucket (eager: to its own width), a pack's to the bucket of the widest of its runs' batches
        source = BatchSource(tokenizer.vocab_size, 48, task, tokenizer)
        for name, r in records.items():
            drawn = [step_batches(source, r["runs"], 2, t) for t in (1, 2)]
            assert r["real_token_share"] == pytest.approx(
                real_token_share(drawn, None if name == "eager" else (32, 64), r.get("width_groups", 1)))
        assert records["optimised"]["real_token_share"] < records["eager"]["real_token_share"]
        assert ratios == engine_ratios(records)
        for name in ("optimised", "packed-2", "packed-max", "packed-4-g2", "packed-2-lowp"):
            assert ratios[f"{name}_over_eager"] == pytest.approx(
                records[name]["run_steps_per_s"] / records["eager"]["run_steps_per_s"])


def test_the_per_layer_step_in_length_groups_is_measured_beside_it(tiny_factory, tokenizer):
    """eager-lK: the CPU's step with its rows in K forwards by length (--length-groups K); its real-token share is
    that of the length chunks the timed steps forwarded, at least eager's, and its rate is set beside eager's."""
    result = engine_bench(lambda dtype: (tiny_factory(0, 1), tokenizer), ["eager", "eager-l2", "eager-l9"], ["rte"],
                          q=1, E=4, seq_len=96, buckets=None, dtype="fp32", steps=2, warmup=1,
                          progress=lambda line: None)
    records, ratios = result["tasks"]["rte"]["configs"], result["tasks"]["rte"]["ratios"]
    assert records["eager-l2"]["length_groups"] == 2 and records["eager"]["length_groups"] == 1
    assert records["eager-l9"]["length_groups"] == 4                # at most one chunk per row of the batch
    source = BatchSource(tokenizer.vocab_size, 96, "rte", tokenizer)
    drawn = [step_batches(source, 1, 4, t)[0] for t in (1, 2)]
    assert records["eager-l2"]["real_token_share"] == pytest.approx(
        real_token_share([[chunk] for b in drawn for _, chunk in length_chunks(b, 2)], None))
    assert records["eager-l9"]["real_token_share"] == 1.0            # one row per forward: no padding at all
    assert records["eager-l2"]["real_token_share"] >= records["eager"]["real_token_share"]
    assert ratios["eager-l2_over_eager"] == pytest.approx(
        records["eager-l2"]["run_steps_per_s"] / records["eager"]["run_steps_per_s"])


def test_evaluations_alone_and_together_are_measured(tiny_factory, tokenizer):
    """eval-N: N runs' validation sets scored one run after another and in shared forwards; both rates come from
    the two recorded times, and the predictions agree (the same adapters, the same examples)."""
    def make_model(dtype):
        return tiny_factory(0, 1), tokenizer

    lines = []
    result = engine_bench(make_model, ["eval-3"], ["sst2"], dtype="fp32", progress=lines.append, eval_examples=10)
    record = result["tasks"]["sst2"]["configs"]["eval-3"]
    assert record["runs"] == 3 and record["examples_per_run"] == 10 and record["same_predictions"] is True
    assert record["examples_per_s_alone"] == pytest.approx(30 / record["alone_s"])
    assert record["examples_per_s_together"] == pytest.approx(30 / record["together_s"])
    assert record["together_over_alone"] == pytest.approx(record["alone_s"] / record["together_s"])
    assert result["tasks"]["sst2"]["ratios"] == {} and "eval-3" in lines[0]


def test_the_largest_pack_stops_at_the_first_size_out_of_memory():
    from prge_lib.experiments.bench.engine import largest_pack

    def attempt(size):
        if size > 16:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
        return {"runs": size}

    size, record, stops = largest_pack(attempt, 8, 256)
    assert size == 16 and record == {"runs": 16} and stops[0]["runs"] == 32
    assert largest_pack(attempt, 32, 256)[:2] == (0, None)


def test_prge_bench_configs_writes_a_result(tiny_folder, tmp_path):
    from prge_lib.cli.main import main

    out = tmp_path / "engine.json"
    assert main(["bench", "--configs", "eager,optimised,packed-2", "--task", "sst2", "--model", str(tiny_folder),
                 "--q", "2", "--E", "4", "--seq-len", "32", "--buckets", "32", "--repeats", "1", "--warmup", "0",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["kind"] == "engine-bench" and result["device"].startswith("cpu")
    assert set(result["tasks"]["sst2"]["configs"]) == {"eager", "optimised", "packed-2"}
    assert "provenance" in result and result["buckets"] == [32]
    assert main(["bench", "--configs", "turbo", "--out", str(out)]) == 2
    assert main(["bench", "--configs", "eager", "--task", "nope", "--out", str(out)]) == 2
    assert main(["bench", "--out", str(out)]) == 2


def test_a_profiled_step_says_where_its_time_went(tiny_factory, tokenizer):
    """On the CPU the profile ranks operators; their self times add up to the total and split by kind, and the
    step's products are there as matmul work."""
    from prge_lib.experiments.bench.profile import kind_of

    def make_model(dtype):
        return tiny_factory(0, 1), tokenizer

    result = engine_bench(make_model, ["optimised", "packed-2"], ["sst2"], q=2, E=4, seq_len=48, buckets=(32, 64),
                          dtype="fp32", steps=1, warmup=1, progress=lambda line: None, profile=True)
    for record in result["tasks"]["sst2"]["configs"].values():
        profile = record["profile"]
        assert profile["where"] == "CPU operators (self time)" and profile["total_ms"] > 0
        assert sum(k["ms"] for k in profile["kinds"].values()) == pytest.approx(profile["total_ms"])
        assert sum(k["share"] for k in profile["kinds"].values()) == pytest.approx(1.0)
        assert profile["kinds"]["matmul"]["ms"] > 0 and 0 < len(profile["top"]) <= 15
        assert all(row["kind"] == kind_of(row["name"]) for row in profile["top"])
        assert [row["ms"] for row in profile["top"]] == sorted((row["ms"] for row in profile["top"]), reverse=True)
    json.dumps(result)


def test_the_byte_count_counts_what_operators_write_and_read():
    """Outputs written and inputs read, by the tensors' element bytes: a view writes nothing, an expanded input is
    read once per distinct element, an in-place result is written, and the noise draw is filed apart."""
    from prge_lib.experiments.bench.traffic import ByteCount, count_step, tensor_bytes

    a = torch.ones(4, 8)
    with ByteCount() as count:
        b = a.t()                                         # a view
        c = a @ b                                         # reads 2 × 128 bytes, writes 4 × 4 × 4
        d = torch.ones(1, 8).expand(4, 8) + 1             # reads 32 (one row), writes 128
        d.add_(c[:, :1])                                  # in place: writes 128, reads 128 + 16
    assert tensor_bytes(torch.ones(1, 8).expand(4, 8)) == 32
    assert "aten::t" not in count.calls and count.written["aten::mm"] == 64 and count.read["aten::mm"] == 256
    assert count.written["aten::add"] == 128 and count.read["aten::add"] == 32
    assert count.written["aten::add_"] == 128 and count.read["aten::add_"] == 128 + 16
    from prge_lib.zo import packing

    counted = count_step(lambda: (packing.counter_normal_seeds(torch.tensor([1, 2]), 0, 1000), a @ a.t()))
    assert counted["kinds"]["noise"]["written_bytes"] > 2 * 1000 * 4          # at least the draw it returns
    assert counted["kinds"]["matmul"]["written_bytes"] == 64
    assert sum(k["share"] for k in counted["kinds"].values()) == pytest.approx(1.0)


def test_the_traffic_count_shows_the_fp32_copies_a_pack_step_saves(tiny_factory, tokenizer, monkeypatch):
    """`--traffic` on the CPU: every configuration's step counted, split by kind and summing to its totals; and the
    count sees what the fused pack's changes save over an fp16 base: the fp32 copies of inputs that q, k, v (and
    gate, up) share, and all of them with the fp16 low-rank product."""
    from prge_lib.zo import packing

    def make_model(dtype):
        model = tiny_factory(0, 1)
        return (model.half() if dtype == "fp16" else model), tokenizer

    def copies(configs):
        result = engine_bench(make_model, configs, ["sst2"], q=2, E=4, seq_len=48, buckets=(32, 64), dtype="fp16",
                              steps=1, warmup=1, progress=lambda line: None, traffic=True)
        records = result["tasks"]["sst2"]["configs"]
        for record in records.values():
            traffic = record["traffic"]
            assert traffic["written_bytes"] > 0 and traffic["read_bytes"] > 0
            assert sum(k["written_bytes"] for k in traffic["kinds"].values()) == traffic["written_bytes"]
            assert sum(k["share"] for k in traffic["kinds"].values()) == pytest.approx(1.0)
            assert traffic["kinds"]["matmul"]["written_bytes"] > 0 and traffic["kinds"]["noise"]["written_bytes"] > 0
        json.dumps(result)
        return {name: r["traffic"]["kinds"]["copy"]["written_bytes"] for name, r in records.items()}

    shared = copies(["packed-2", "packed-2-lowp"])
    monkeypatch.setattr(packing._StepState, "low_rank_input", lambda self, x, dtype: x.to(dtype))
    each = copies(["packed-2"])
    assert shared["packed-2-lowp"] < shared["packed-2"] < each["packed-2"]


def test_a_compiled_pack_that_fails_is_recorded_and_the_others_run(tiny_factory, tokenizer, monkeypatch):
    """A -compiled configuration that cannot compile (here: made to raise) is the record's ``error``; the other
    configurations are measured and the ratios skip it; a compiled pack is not counted by --traffic."""
    from prge_lib.experiments.bench import engine

    real = engine.build_pack

    def build(*args, compiled=False, **kwargs):
        if compiled:
            raise RuntimeError("no compiler here\nmore lines")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "build_pack", build)
    result = engine_bench(lambda dtype: (tiny_factory(0, 1), tokenizer), ["eager", "packed-2", "packed-2-compiled"],
                          ["sst2"], q=2, E=4, seq_len=48, buckets=(32, 64), dtype="fp32", steps=1, warmup=1,
                          progress=lambda line: None)
    records = result["tasks"]["sst2"]["configs"]
    assert records["packed-2-compiled"] == {"config": "packed-2-compiled", "error": "RuntimeError: no compiler here"}
    assert records["packed-2"]["run_steps_per_s"] > 0
    assert set(result["tasks"]["sst2"]["ratios"]) == {"packed-2_over_eager"}


def test_kernels_and_operators_are_sorted_into_kinds():
    from prge_lib.experiments.bench.profile import kind_of

    assert kind_of("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64") == "matmul"
    assert kind_of("aten::baddbmm") == "matmul" and kind_of("aten::bmm") == "matmul"
    assert kind_of("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn") == "matmul"
    assert kind_of("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>") == "attention"
    assert kind_of("fmha_cutlassF_f16_aligned_64x64_rf_sm80") == "attention"
    assert kind_of("triton_poi_fused_add_bitwise_xor_mul_0") == "compiled"
    assert kind_of("Memcpy HtoD (Pageable -> Device)") == "copy" and kind_of("aten::copy_") == "copy"
    assert kind_of("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>") == "other"
    assert kind_of("aten::mul") == "other"
