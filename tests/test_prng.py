"""The counter-based Gaussian generator (prge_lib.zo.prng): exact integer arithmetic, statistics, independence
across seeds and tensors, and export as a graph of core-ATen ops without random operators."""
from __future__ import annotations

import math

import pytest
import torch

from prge_lib.zo import prng
from prge_lib.zo.prng import MASK32, _mul32, counter_normal, counter_normal_seeds, mix32, tensor_key


def test_mul32_matches_python_integers():
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 2**32, (10_000,), dtype=torch.int64, generator=gen)
    for c in (0x7FEB352D, 0x846CA68B, 1, MASK32):
        expected = torch.tensor([(int(v) * c) & MASK32 for v in x[:500]])
        assert torch.equal(_mul32(x[:500], c), expected)


def test_mix32_is_a_bijection_on_a_sample():
    x = torch.arange(200_000, dtype=torch.int64)
    h = mix32(x)
    assert int(h.min()) >= 0 and int(h.max()) <= MASK32
    assert h.unique().numel() == x.numel()


def test_deterministic_and_shaped():
    a = counter_normal(7, 3, (64, 16))
    b = counter_normal(torch.tensor(7), 3, (64, 16))
    assert a.shape == (64, 16) and a.dtype == torch.float32
    assert torch.equal(a, b)
    assert counter_normal(7, 3, (10,), dtype=torch.float64).dtype == torch.float64


def test_standard_normal_statistics():
    z = counter_normal(123, 0, (400_000,)).double()
    n = z.numel()
    assert abs(float(z.mean())) < 5 / math.sqrt(n)                       # 5 standard errors
    assert abs(float(z.var()) - 1) < 5 * math.sqrt(2 / n)
    kurtosis = float(((z - z.mean()) ** 4).mean() / z.var() ** 2)
    assert abs(kurtosis - 3) < 0.05
    # tail mass beyond 3 sigma: 0.27% for a Gaussian
    assert abs(float((z.abs() > 3).double().mean()) - 0.0027) < 0.0006
    # uniform-looking CDF at a few points (Kolmogorov-style check at fixed quantiles)
    for x, p in [(-1.0, 0.1587), (0.0, 0.5), (1.0, 0.8413)]:
        assert abs(float((z < x).double().mean()) - p) < 0.003


@pytest.mark.parametrize("other", [(124, 0), (123, 1), (2**32 + 123, 7)])
def test_independent_across_seeds_and_tensors(other):
    a = counter_normal(123, 0, (100_000,))
    b = counter_normal(other[0], other[1], (100_000,))
    corr = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
    assert abs(corr) < 0.02
    assert not torch.equal(a[:10], b[:10])


def test_neighbouring_keys_do_not_share_draws():
    """Consecutive tensor indices and seeds must not produce shifted copies of each other."""
    draws = [counter_normal(s, j, (4096,)) for s in range(3) for j in range(3)]
    values = torch.cat(draws)
    assert values.unique().numel() > 0.999 * values.numel()
    assert tensor_key(0, 0) != tensor_key(0, 1) and tensor_key(0, 0) != tensor_key(1, 0)


def test_exports_without_random_ops():
    class Noise(torch.nn.Module):
        def forward(self, seed):
            return counter_normal(seed, 5, (32, 8))

    program = torch.export.export(Noise(), (torch.tensor(9),)).run_decompositions()
    ops = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert not any("rand" in op or "normal" in op or "bernoulli" in op for op in ops), ops
    out = program.module()(torch.tensor(9))
    assert torch.allclose(out, counter_normal(9, 5, (32, 8)), atol=1e-6)
    assert not torch.allclose(program.module()(torch.tensor(10)), out)


def test_runs_in_the_executorch_runtime(tmp_path):
    """Lowered to an ExecuTorch program (portable kernels), the generator matches eager and takes its seed as
    an input: new draws per seed from one program, no custom operator."""
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    class Noise(torch.nn.Module):
        def forward(self, seed):
            return counter_normal(seed, 5, (64, 16))

    program = to_edge_transform_and_lower(torch.export.export(Noise(), (torch.tensor(9),))).to_executorch()
    path = tmp_path / "noise.pte"
    path.write_bytes(program.buffer)
    method = Runtime.get().load_program(str(path)).load_method("forward")
    for seed in (9, 10, 2**31 + 5):
        out = method.execute([torch.tensor(seed)])[0]
        assert torch.allclose(out, counter_normal(seed, 5, (64, 16)), atol=1e-5)


@pytest.mark.parametrize("offset,numel", [(0, 7), (1, 6), (5, 1), (10, 33)])
def test_a_draw_at_an_offset_is_a_slice_of_the_long_draw(offset, numel):
    """What lets a program draw every layer's noise in one call and the eager layers draw their own part."""
    long = counter_normal(3, 0, (64,))
    assert torch.equal(counter_normal(3, 0, (numel,), offset=offset), long[offset:offset + numel])


@pytest.mark.parametrize("offset,numel", [(0, 8), (3, 10), (7, 1)])
def test_many_seeds_in_one_call_equal_one_seed_at_a_time(offset, numel):
    seeds = [3, 2**40 + 1, 3, 0]
    z = counter_normal_seeds(torch.tensor(seeds), 2, numel, offset)
    assert z.shape == (len(seeds), numel)
    for row, seed in zip(z, seeds):
        assert torch.equal(row, counter_normal(seed, 2, (numel,), offset=offset))
    with pytest.raises(ValueError, match=r"\(q,\) tensor, got shape \(2, 2\)"):
        counter_normal_seeds(torch.zeros(2, 2, dtype=torch.int64), 0, 4)


def test_the_compiled_draw_keeps_the_uniforms_and_rounds_like_the_eager_one():
    """What a GPU runs by default (counter_normal_seeds(..., compiled=True)), compiled here for the CPU: the
    uniforms come from integer operations and exactly rounded float ones, so they are the eager uniforms; the
    normals go through the compiler's log, cos and sin, so each may differ by a few ulps, no more."""
    seeds = torch.tensor([3, 2 ** 40 + 7, 11], dtype=torch.int64)
    eager = counter_normal_seeds(seeds, 0, 1001, offset=5, compiled=False)
    compiled = counter_normal_seeds(seeds, 0, 1001, offset=5, compiled=True)
    assert prng._COMPILE_FAILED == [] and compiled.shape == eager.shape == (3, 1001)
    keys = prng.tensor_key(seeds, 0).unsqueeze(1)
    assert torch.equal(torch.compile(prng.counter_uniforms, dynamic=False, fullgraph=True)(keys, 5, 1001),
                       prng.counter_uniforms(keys, 5, 1001))
    ulp = torch.nextafter(eager.abs(), torch.tensor(float("inf"))) - eager.abs()
    assert float(((compiled - eager).abs() / ulp).max()) <= 4
