"""The P-RGE step (Gao et al. Alg. 1): outer × inner switches, MeZO special cases, agreement with autograd."""
import pytest
import torch
from fixtures import randomize_b

from prge_lib.zo.lora import inject_lorafa, lorafa_layers
from prge_lib.models.objective import row_losses, synthetic_batch
from prge_lib.zo.mezo import MeZOFull, explicit_noise, mezo_step
from prge_lib.zo import prge as prge_module
from prge_lib.zo.prge import PRGE, forward_groups, keeps_noise, prge_step, step_seeds


def _model_with_b(tiny_factory, seed=0, n_layers=2, **kw):
    model = tiny_factory(seed, n_layers)
    layers = inject_lorafa(model, **kw)
    randomize_b(layers, seed=seed)
    return model, layers


def test_forward_counts_of_the_four_settings():
    assert [len(forward_groups(4, o, i)) for o, i in [(1, 1), (1, 0), (0, 1), (0, 0)]] == [1, 2, 4, 8]
    for outer in (True, False):
        for inner in (True, False):
            flat = sorted(c for group in forward_groups(3, outer, inner) for c in group)
            assert flat == sorted((i, s) for i in range(3) for s in (1, -1))


@pytest.mark.parametrize("q", [1, 3])
def test_outer_and_inner_switches_compute_the_same_step(tiny_factory, q):
    """Same noise, four schedules: the same per-query losses and the same update (fp32 tolerance).
    q = 1 with the inner loop on is the case where an update can silently lose its projected gradient."""
    results = {}
    batch = synthetic_batch(2, 11, tiny_factory().config.vocab_size, seed=1)
    seeds = step_seeds(5, 0, q)
    eps, lr, loss_tol = 1e-2, 1e-2, 1e-6
    # B moves by lr * g * z with g = (L+ - L-) / (2 eps): losses that agree to loss_tol give updates that agree
    # to lr * loss_tol / eps * |z| (|z| < 5 for these draws), far below the update itself (asserted below).
    b_tol = lr * loss_tol / eps * 5
    for outer in (True, False):
        for inner in (True, False):
            model, layers = _model_with_b(tiny_factory)
            out = prge_step(model, layers, batch, seeds, eps=eps, lr=lr, outer=outer, inner=inner)
            results[outer, inner] = (out, [layer.lora_B.clone() for layer in layers])
    ref_out, ref_b = results[True, True]
    assert float(ref_out["projected_grad"].abs().max()) > 0
    start, _ = _model_with_b(tiny_factory)
    moved = max(float((b - layer.lora_B).abs().max()) for b, layer in zip(ref_b, lorafa_layers(start)))
    assert moved > 100 * b_tol                   # B moved, by far more than the schedules may disagree
    for out, b in results.values():
        for key in ("loss_plus", "loss_minus"):
            torch.testing.assert_close(out[key], ref_out[key], rtol=loss_tol, atol=loss_tol)
        torch.testing.assert_close(out["projected_grad"], ref_out["projected_grad"], rtol=1e-3, atol=1e-4)
        for x, y in zip(b, ref_b):
            torch.testing.assert_close(x, y, rtol=0, atol=b_tol)


def test_keeping_the_noise_changes_nothing_but_speed(tiny_factory):
    batch = synthetic_batch(2, 5, tiny_factory().config.vocab_size)
    after = []
    for keep in (False, True):
        model, layers = _model_with_b(tiny_factory)
        prge_step(model, layers, batch, step_seeds(0, 1, 3), 1e-2, 0.1, outer=False, keep_noise=keep)
        assert all(layer.kept is None for layer in layers)      # nothing kept after the step
        after.append([layer.lora_B.clone() for layer in layers])
    for a, b in zip(*after):
        assert torch.equal(a, b)


def test_the_default_keeps_the_noise_only_within_the_budget(tiny_factory, monkeypatch):
    model, layers = _model_with_b(tiny_factory)
    d = sum(layer.lora_B.numel() for layer in layers)
    assert PRGE(model, layers, q=4, eps=1e-2, lr=1e-3).keep_noise          # 4·d floats: well inside
    assert not PRGE(model, layers, q=4, eps=1e-2, lr=1e-3, keep_noise=False).keep_noise
    monkeypatch.setattr(prge_module, "KEEP_NOISE_BUDGET_MIB", 4 * d * 4 / 2 ** 20)   # exactly q = 4's floats
    assert keeps_noise(layers, 4) and not keeps_noise(layers, 5) and keeps_noise(layers, 5, keep_noise=True)


def test_update_is_lr_over_q_times_sum_of_g_z(tiny_factory):
    model, layers = _model_with_b(tiny_factory)
    before = [layer.lora_B.clone() for layer in layers]
    seeds, lr = step_seeds(0, 3, 4), 0.1
    out = prge_step(model, layers, synthetic_batch(2, 5, model.config.vocab_size), seeds, 1e-2, lr)
    for layer, b in zip(layers, before):
        expected = b - lr / 4 * sum(g * layer.noise(s) for g, s in zip(out["projected_grad"], seeds))
        torch.testing.assert_close(layer.lora_B, expected)


def test_mezo_on_the_b_list_equals_prge_with_q_1(tiny_factory):
    """MeZO's in-place seed trick over the B's and P-RGE's copies draw the same z: same step."""
    batch = synthetic_batch(3, 8, tiny_factory().config.vocab_size, seed=2)
    seed = step_seeds(1, 0, 1)
    model, layers = _model_with_b(tiny_factory)
    out = prge_step(model, layers, batch, seed, 1e-2, 1e-2, outer=False, inner=False)
    other, other_layers = _model_with_b(tiny_factory)
    ref = mezo_step([layer.lora_B for layer in other_layers], lambda: row_losses(other, batch).mean(),
                    seed, 1e-2, 1e-2)
    assert out["loss_plus"][0].item() == pytest.approx(ref["loss_plus"][0], rel=1e-6)
    assert out["loss_minus"][0].item() == pytest.approx(ref["loss_minus"][0], rel=1e-6)
    for a, b in zip(layers, other_layers):
        torch.testing.assert_close(a.lora_B, b.lora_B, rtol=1e-5, atol=1e-7)


def test_mezo_full_restores_between_queries_and_updates_by_the_formula(tiny_factory):
    model = tiny_factory()
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    method = MeZOFull(model, q=2, eps=1e-3, lr=1e-4, seed=4)
    record = method.step(synthetic_batch(2, 6, model.config.vocab_size), t=0)
    assert record["finite"]
    seeds = step_seeds(4, 0, 2)
    names = list(start)
    expected = {n: start[n].clone() for n in names}
    for seed, g in zip(seeds, record["projected_grad"]):
        for n, z in zip(names, explicit_noise([start[n] for n in names], seed)):
            expected[n] -= 1e-4 * g / 2 * z
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), expected[n], rtol=0, atol=2e-6)


def test_rge_on_lora_b_approaches_autograd_as_q_grows(tiny_factory):
    """Cosine(ĝ_q, ∇) against the autograd gradient of the same loss, in fp64 so that ε = 1e-4 is exact
    to many digits. For Gaussian z, E‖ĝ_q − g‖² = (d+1)‖g‖²/q gives cos ≈ sqrt(q / (q + d + 1)); each
    mean over 12 estimates must lie within 0.08 of it and the means must grow with q."""
    model, layers = _model_with_b(tiny_factory, n_layers=1, targets=("q_proj",), r=2)
    model.double()
    batch = synthetic_batch(2, 6, model.config.vocab_size, seed=3)
    for layer in layers:
        layer.lora_B.requires_grad_(True)
    row_losses(model, batch).mean().backward()
    grad = torch.cat([layer.lora_B.grad.flatten() for layer in layers])
    d = grad.numel()
    means = []
    for q in (1, 8, 64):
        cosines = []
        for trial in range(12):
            seeds = step_seeds(trial, q, q)
            out = prge_step(model, layers, batch, seeds, eps=1e-4, lr=0.0, update=False)
            z = torch.stack([torch.cat([layer.noise(s).double().flatten() for layer in layers]) for s in seeds])
            estimate = (out["projected_grad"].double()[:, None] * z).mean(0)
            cosines.append(float(torch.nn.functional.cosine_similarity(estimate, grad, dim=0)))
        mean = sum(cosines) / len(cosines)
        assert mean == pytest.approx((q / (q + d + 1)) ** 0.5, abs=0.08), (q, d, cosines)
        means.append(mean)
    assert means[0] < means[1] < means[2]


def test_a_non_finite_loss_leaves_the_adapter_untouched(tiny_factory):
    model, layers = _model_with_b(tiny_factory)
    with torch.no_grad():
        model.model.embed_tokens.weight[:] = float("nan")
    before = [layer.lora_B.clone() for layer in layers]
    out = prge_step(model, layers, synthetic_batch(2, 4, model.config.vocab_size), [1, 2], 1e-2, 1.0)
    assert not out["finite"]
    for layer, b in zip(layers, before):
        assert torch.equal(layer.lora_B, b)


def test_prge_method_trains_only_the_adapter_on_a_quantized_base(tiny_folder):
    from prge_lib.models.loading import load_model

    for quant in ("int8", "nf4"):
        model, _ = load_model(str(tiny_folder), quant=quant)
        batch = synthetic_batch(2, 6, model.config.vocab_size)
        with torch.no_grad():
            row_losses(model, batch)      # bitsandbytes repacks 4-bit weights for the CPU on first use
        frozen = {n: p.detach().clone() for n, p in model.named_parameters()}
        layers = inject_lorafa(model, r=4)
        method = PRGE(model, layers, q=2, eps=1e-2, lr=1e-1, seed=0)
        record = method.step(batch, t=0)
        assert record["finite"]
        assert any(float(layer.lora_B.detach().abs().max()) > 0 for layer in lorafa_layers(model))
        for n, p in model.named_parameters():
            if "lora_" not in n:
                assert torch.equal(p.detach(), frozen[n.replace("base.", "")]), (quant, n)
        with pytest.raises(ValueError, match="cannot perturb INT8/NF4"):
            MeZOFull(model, 1, 1e-3, 1e-6)
