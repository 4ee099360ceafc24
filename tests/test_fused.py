"""The fused P-RGE step with counter noise (prge_lib.zo.fused): one draw for the whole step equal to the
per-layer draws, the same losses, g and update as prge_step, and no host sync inside the step."""
import pytest
import torch
from fixtures import randomize_b

from prge_lib.models.objective import synthetic_batch
from prge_lib.zo import fused as fused_module
from prge_lib.zo.fused import FusedPRGE, draw_all, fused_prge_step
from prge_lib.zo.lora import inject_lorafa
from prge_lib.zo.prge import PRGE, prge_step, step_seeds

U = 2.0 ** -24                                    # unit roundoff of float32


def _counter_model(tiny_factory, seed=0, noise="counter"):
    model = tiny_factory(seed, 2)
    layers = inject_lorafa(model, r=4, noise=noise)
    randomize_b(layers, seed=seed)
    return model, layers


def test_one_draw_equals_every_layers_own_draws(tiny_factory):
    _, layers = _counter_model(tiny_factory)
    seeds = step_seeds(3, 0, 3)
    z = draw_all(layers, seeds)
    d = sum(layer.lora_B.numel() for layer in layers)
    assert z.shape == (3, d) and len(layers) == 14
    for layer in layers:
        for i, seed in enumerate(seeds):
            part = z[i, layer.offset:layer.offset + layer.lora_B.numel()].view(layer.lora_B.shape)
            assert torch.equal(part, layer.draw(seed)), (layer.index, seed)


def test_a_subset_of_layers_draws_its_own_span(tiny_factory):
    _, layers = _counter_model(tiny_factory)
    tail = layers[5:8]
    z = draw_all(tail, [11])
    assert z.shape == (1, sum(layer.lora_B.numel() for layer in tail))
    assert torch.equal(z[0, :tail[0].lora_B.numel()].view(tail[0].lora_B.shape), tail[0].draw(11))


def test_torch_noise_is_refused(tiny_factory):
    model, layers = _counter_model(tiny_factory, noise="torch")
    with pytest.raises(ValueError, match="needs counter noise.*'torch'"):
        FusedPRGE(model, layers, q=2, eps=1e-2, lr=1e-2)


def _update_bound(before: torch.Tensor, parts: torch.Tensor, g: torch.Tensor, lr: float) -> torch.Tensor:
    """Elementwise bound on |fused − per-layer| after B ← B − (η/q) Σ_i g_i z_i.

    Per layer: q adds of fl32(−η g_i / q) · z_i into B, each term with ≤ 2 roundings and the running sum with
    one per add: within γ_{q+2} · T of the exact value, T = |B| + Σ_i |η g_i z_i / q|. Fused: the coefficient
    fl32(fl32(−η/q) · g_i) (2 roundings), its product with z_i (1), a q-term sum in any order (q − 1) and the add
    into B (1): within γ_{q+3} · T. So the two differ by at most 2 γ_{q+3} · T, γ_n = n u / (1 − n u)."""
    q = g.numel()
    gamma = (q + 3) * U / (1 - (q + 3) * U)
    terms = (lr / q) * (g.double().abs().view(q, 1, 1) * parts.double().abs()).sum(0)
    return 2 * gamma * (before.double().abs() + terms)


@pytest.mark.parametrize("outer,inner", [(True, True), (False, True)])
def test_the_fused_step_computes_the_per_layer_steps_numbers(tiny_factory, outer, inner):
    """Three steps, each from the same B: identical losses and g (same z, same forward), and every B within
    the bound derived from the update's roundings, which is far below the update itself."""
    ref_model, ref_layers = _counter_model(tiny_factory)
    model, layers = _counter_model(tiny_factory)
    batch = synthetic_batch(2, 7, model.config.vocab_size, seed=1)
    eps, lr, q = 1e-2, 5e-2, 3
    worst, differing, loosest, largest_move = 0.0, 0, 0.0, 0.0
    for t in range(3):
        seeds = step_seeds(9, t, q)
        before = [layer.lora_B.detach().clone() for layer in ref_layers]
        ref = prge_step(ref_model, ref_layers, batch, seeds, eps, lr, outer, inner)
        out = fused_prge_step(model, layers, batch, seeds, eps, lr, outer, inner)
        assert torch.equal(out["loss_plus"], ref["loss_plus"]) and torch.equal(out["loss_minus"], ref["loss_minus"])
        assert torch.equal(out["projected_grad"], ref["projected_grad"]) and bool(out["finite"])
        for layer, ref_layer, b in zip(layers, ref_layers, before):
            parts = torch.stack([ref_layer.draw(seed) for seed in seeds])
            bound = _update_bound(b, parts, ref["projected_grad"], lr)
            moved = (ref_layer.lora_B.detach() - b).double().abs()
            assert float(bound.max()) < 1e-4 * float(moved.max())      # the bound is no looser than 0.01 % of a move
            difference = (layer.lora_B.detach() - ref_layer.lora_B.detach()).double().abs()
            assert bool((difference <= bound).all()), (t, layer.index, float((difference - bound).max()))
            worst, differing = max(worst, float(difference.max())), differing + int((difference > 0).sum())
            loosest, largest_move = max(loosest, float(bound.max())), max(largest_move, float(moved.max()))
            with torch.no_grad():
                layer.lora_B.copy_(ref_layer.lora_B)      # the next step starts from the same B again
    print(f"largest |fused − per-layer| B difference {worst:.2e} ({differing} elements differ), "
          f"largest bound {loosest:.2e}, largest move of B {largest_move:.2e}")


def test_a_non_finite_loss_leaves_the_adapter_untouched(tiny_factory):
    model, layers = _counter_model(tiny_factory)
    with torch.no_grad():
        model.model.embed_tokens.weight[:] = float("nan")
    before = [layer.lora_B.clone() for layer in layers]
    out = fused_prge_step(model, layers, synthetic_batch(2, 4, model.config.vocab_size), [1, 2], 1e-2, 1.0)
    assert not bool(out["finite"])
    for layer, b in zip(layers, before):
        assert torch.equal(layer.lora_B, b)


SYNCING = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")


def test_the_fused_step_reads_nothing_on_the_host(tiny_factory, monkeypatch):
    """On a GPU, torch.cuda.set_sync_debug_mode("error") would catch a sync; on the CPU every way a step could
    bring a tensor's value to the host raises instead, for the step only (the record is read after it).
    Eager attention: transformers' SDPA path reads ``padding_mask.all()`` on the host to choose its mask."""
    model, layers = _counter_model(tiny_factory)
    model.set_attn_implementation("eager")
    batch = synthetic_batch(2, 5, model.config.vocab_size)
    batch.attention_mask[0, :2] = 0                         # a left-padded row, as in training
    method = FusedPRGE(model, layers, q=2, eps=1e-2, lr=1e-2, seed=4)
    reference_model, reference_layers = _counter_model(tiny_factory)
    reference_model.set_attn_implementation("eager")
    reference = PRGE(reference_model, reference_layers, q=2, eps=1e-2, lr=1e-2, seed=4)

    def refuse(name):
        def read(*args, **kwargs):
            raise AssertionError(f"Tensor.{name} called inside the fused step")
        return read

    step = fused_module.fused_prge_step
    with monkeypatch.context() as patch:
        for name in SYNCING:
            patch.setattr(torch.Tensor, name, refuse(name))
        per_layer, per_layer_layers = _counter_model(tiny_factory)
        per_layer.set_attn_implementation("eager")
        with pytest.raises(AssertionError, match="Tensor.cpu"):
            prge_step(per_layer, per_layer_layers, batch, [1, 2], 1e-2, 1e-2)     # the per-layer step reads the losses
        out = step(model, layers, batch, step_seeds(4, 0, 2), 1e-2, 1e-2)
    assert bool(out["finite"])
    record = fused_module.host_record(out)                 # after the step: one copy to the host
    assert record == reference.step(batch, 0)
    assert method.step(batch, 1)["finite"]


def test_the_benchmark_times_every_step_kind(tiny_factory):
    from prge_lib.experiments.bench.fused import per_layer_vs_fused

    batch = synthetic_batch(1, 4, tiny_factory().config.vocab_size)
    result = per_layer_vs_fused(lambda: tiny_factory(0, 1), batch, q=2, r=4, steps=1, warmup=0)
    assert result["layers"] == 7 and result["adapter_size"] == 4 * (64 + 32 + 32 + 64 + 128 + 128 + 64)   # r · Σ out
    assert all(result[k] > 0 for k in ("per_layer_redraw_s", "per_layer_kept_s", "fused_s", "speedup"))
