"""LoRA-FA with n copies of B (chapters 4–5): shapes, copies, adapters, merging, agreement with peft."""
import pytest
import torch
from fixtures import randomize_b

from prge_lib.zo.lora import (DEFAULT_TARGETS, LoRAFALinear, adapter_state, draw_noise, inject_lorafa,
                           load_adapter, merge_lorafa, perturbed, read_adapter, save_adapter)
from prge_lib.models.objective import copy_losses, row_losses, synthetic_batch


def test_injection_targets_shapes_and_freezing(tiny_factory):
    model = tiny_factory()
    layers = inject_lorafa(model)
    assert len(layers) == 2 * len(DEFAULT_TARGETS)
    assert [layer.index for layer in layers] == list(range(len(layers)))
    k_proj = model.model.layers[0].self_attn.k_proj
    assert isinstance(k_proj, LoRAFALinear) and (k_proj.in_features, k_proj.out_features) == (64, 32)
    assert k_proj.lora_A.shape == (16, 64) and k_proj.lora_B.shape == (32, 16)
    assert float(k_proj.lora_A.abs().max()) <= 1 / 64 ** 0.5       # U(-1/sqrt(in), 1/sqrt(in))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == sum(layer.lora_B.numel() for layer in layers)

    qv = inject_lorafa(tiny_factory(), targets=("q_proj", "v_proj"), r=4)
    assert [type(layer.base).__name__ for layer in qv] == ["Linear"] * 4
    with pytest.raises(ValueError, match="no linear layer named.*q_proj"):
        inject_lorafa(tiny_factory(), targets=("query",))


def test_zero_b_leaves_the_model_unchanged(tiny_factory):
    base, wrapped = tiny_factory(), tiny_factory()
    inject_lorafa(wrapped)
    batch = synthetic_batch(2, 7, base.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(row_losses(wrapped, batch), row_losses(base, batch))


def test_copy_c_sees_only_its_own_perturbed_b(tiny_factory):
    """The loss of copy c in a batched forward equals a plain forward with B replaced by B + s_c z_c."""
    model = tiny_factory()
    layers = inject_lorafa(model)
    randomize_b(layers)
    batch = synthetic_batch(3, 9, model.config.vocab_size)
    copies = [(101, 0.01), (102, 0.01), (101, -0.01), (102, -0.01), (103, 0.5)]
    with torch.no_grad(), perturbed(layers, copies):
        together = copy_losses(model, batch.repeat(len(copies)), len(copies))
    master = [layer.lora_B.clone() for layer in layers]
    for c, (seed, scale) in enumerate(copies):
        with torch.no_grad():
            for layer, b in zip(layers, master):
                layer.lora_B.copy_(b + scale * layer.noise(seed))
            alone = row_losses(model, batch).mean()
            for layer, b in zip(layers, master):
                layer.lora_B.copy_(b)
        torch.testing.assert_close(together[c], alone, rtol=1e-5, atol=1e-5)
    assert len(set(together.tolist())) == len(copies)


@pytest.mark.parametrize("copies", [
    [(5, 0.01), (7, 0.01), (5, -0.01), (7, -0.01)],      # outer and inner: two blocks over the same seeds
    [(5, 0.01), (7, 0.01)], [(5, 0.01), (5, -0.01)], [(5, 0.01)],
    [(5, 0.01), (7, -0.01), (7, 0.01)],                    # no block structure: the copy-by-copy path
    [(5, torch.tensor(0.01)), (5, torch.tensor(-0.01))],  # tensor scales (an exported program's ε)
])
def test_the_copies_of_b_are_b_plus_s_z_bit_for_bit(tiny_factory, copies):
    layer = inject_lorafa(tiny_factory())[3]
    randomize_b([layer])
    layer.copies = copies
    expected = torch.stack([layer.lora_B + scale * layer.noise(seed) for seed, scale in copies])
    assert torch.equal(layer.copy_weights(), expected)


@pytest.mark.parametrize("threads", [1, 2])
def test_noise_drawn_in_threads_equals_the_draws_one_by_one(tiny_factory, threads):
    layers = inject_lorafa(tiny_factory())
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        drawn = draw_noise(layers, [11, 12, 11, 13])
    finally:
        torch.set_num_threads(before)
    assert [list(d) for d in drawn] == [[11, 12, 13]] * len(layers)
    for layer, d in zip(layers, drawn):
        assert all(torch.equal(z, layer.draw(seed)) for seed, z in d.items())


def test_a_batch_that_does_not_split_into_the_copies_is_an_error(tiny_factory):
    model = tiny_factory()
    layers = inject_lorafa(model)
    with torch.no_grad(), perturbed(layers, [(1, 0.1), (1, -0.1)]):
        with pytest.raises(ValueError, match="3 rows cannot be split into 2 copies"):
            model(input_ids=torch.zeros(3, 4, dtype=torch.long))


def test_same_output_as_peft_lora_with_the_same_a_and_b(tiny_factory):
    from prge_lib.methods.fo import add_peft_lorafa

    ours = tiny_factory()
    layers = inject_lorafa(ours, r=8, alpha=16)
    randomize_b(layers)
    theirs = add_peft_lorafa(tiny_factory(), r=8, alpha=16)
    named = {n: m for n, m in ours.named_modules() if isinstance(m, LoRAFALinear)}
    with torch.no_grad():
        for name, module in theirs.named_modules():
            if hasattr(module, "lora_A") and name.removeprefix("base_model.model.") in named:
                mine = named[name.removeprefix("base_model.model.")]
                module.lora_A["default"].weight.copy_(mine.lora_A)
                module.lora_B["default"].weight.copy_(mine.lora_B)
    batch = synthetic_batch(2, 6, ours.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(row_losses(ours, batch), row_losses(theirs, batch), rtol=1e-5, atol=1e-5)


def test_adapter_round_trip_and_merge(tiny_factory, tmp_path):
    model = tiny_factory()
    layers = inject_lorafa(model, seed=3)
    randomize_b(layers)
    batch = synthetic_batch(2, 6, model.config.vocab_size)
    with torch.no_grad():
        expected = row_losses(model, batch)
    path = save_adapter(model, tmp_path / "adapter.safetensors")
    other = tiny_factory()
    inject_lorafa(other, seed=99)              # another A: loading must replace it
    load_adapter(other, read_adapter(path))
    with torch.no_grad():
        torch.testing.assert_close(row_losses(other, batch), expected)
        assert merge_lorafa(other) == len(layers)
        assert not any(isinstance(m, LoRAFALinear) for m in other.modules())
        torch.testing.assert_close(row_losses(other, batch), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="does not match"):
        load_adapter(tiny_factory(), adapter_state(model))
