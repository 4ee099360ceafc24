"""MeBP (prge_lib.methods.mebp; seed 004 Algorithm 1, chapter 9): exact gradients, the NF4 base, the checkpoint
files, training, resume and the settings checks, on the two-layer tiny Llama."""
import copy
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from prge_lib.methods.mebp import MeBP, lm_batches
from prge_lib.models.objective import IGNORE, collate, row_losses

REL_TOL = 1e-5     # ‖g_MeBP − g_autograd‖ ≤ 1e-5 ‖g_autograd‖ per tensor, in fp32


def padded_batch(tokenizer):
    """Three rows of different lengths (left padding) with 1–3 target tokens each."""
    texts = [("The movie was", " great fun"), ("A much longer prompt that goes on and on", " bad"),
             ("Hi", " there you are")]
    items = []
    for prompt, answer in texts:
        p = tokenizer(prompt).input_ids
        a = tokenizer(answer, add_special_tokens=False).input_ids
        items.append((p + a[:-1], a))
    batch = collate(items, tokenizer.pad_token_id)
    assert (batch.attention_mask == 0).any() and (batch.targets == IGNORE).any()
    return batch


def randomize_lora(mebp, seed=1):
    """B starts at 0 (so A's gradient would be 0): give every B a random value."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in mebp.trainable().items():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


def grads(mebp):
    return {n: p.grad.detach().clone() for n, p in mebp.trainable().items()}


@pytest.mark.parametrize("kind", ["lm", "padded"])
@pytest.mark.parametrize("quant", ["none", "nf4"])
def test_gradients_equal_plain_autograd(tiny_factory, tokenizer, kind, quant):
    batch = lm_batches(tokenizer, 24, 2, n_batches=1)[0] if kind == "lm" else padded_batch(tokenizer)
    mebp = MeBP(tiny_factory(0), lr=1e-3, quant=quant)
    randomize_lora(mebp)
    loss = mebp.backward(batch)
    ours = grads(mebp)
    mebp.optimizer.zero_grad(set_to_none=True)
    reference = row_losses(mebp.model, batch).mean()      # the model's own forward: HF masks and positions
    reference.backward()
    assert loss == pytest.approx(float(reference.detach()), rel=REL_TOL)
    assert len(ours) == 2 * 7 * 2                          # A and B of 7 projections in 2 blocks
    for name, p in mebp.trainable().items():
        assert p.grad.norm() > 0, name
        assert (ours[name] - p.grad).norm() <= REL_TOL * p.grad.norm(), name


def test_nf4_loss_is_the_forward_of_the_dequantized_weights(tiny_factory, tokenizer):
    batch = padded_batch(tokenizer)
    mebp = MeBP(tiny_factory(0), lr=1e-3, quant="nf4")
    reference = tiny_factory(0)                # the plain model, its block weights set to NF4's round trip
    with torch.no_grad():
        full = float(row_losses(reference, batch).mean())
        for block, lazy in zip(reference.model.layers, mebp.lazy):
            linears = [m for m in block.modules() if isinstance(m, torch.nn.Linear)]
            for plain, layer in zip(linears, lazy):
                assert layer.dense is None and not torch.equal(layer.nf4.dequantize(), plain.weight)
                plain.weight.copy_(layer.nf4.dequantize())
        dequantized = float(row_losses(reference, batch).mean())
    loss = mebp.backward(batch)
    assert loss == pytest.approx(dequantized, rel=1e-6)
    assert abs(loss - full) > 100 * 1e-6 * full          # NF4 is really in use: the fp32 loss differs


def test_block_inputs_go_through_files(tiny_factory, tokenizer, tmp_path):
    batch = lm_batches(tokenizer, 16, 2, n_batches=1)[0]
    model = tiny_factory(0)
    mebp = MeBP(model, lr=1e-3, quant="nf4", mmap_dir=tmp_path, keep_checkpoints=True)
    seen = []

    def record(block_index):
        def hook(module, args, output):
            live = [i for i, lazy in enumerate(mebp.lazy) if any(layer.live is not None for layer in lazy)]
            seen.append((block_index, torch.is_grad_enabled(), sorted(os.listdir(tmp_path)), live))
        return hook

    for i, block in enumerate(model.model.layers):
        block.register_forward_hook(record(i))
    mebp.backward(batch)
    files = ["block-000.bin", "block-001.bin"]
    # forward without grad, then the recomputes in reverse; only the running block's weights are dequantized
    assert seen == [(0, False, files[:1], [0]), (1, False, files, [1]), (1, True, files, [1]), (0, True, files, [0])]
    assert all(layer.live is None for lazy in mebp.lazy for layer in lazy)
    # layout: raw fp32 of (rows, tokens, hidden); block 0's input is the embedding of the batch
    stored = torch.from_file(str(tmp_path / files[0]), size=2 * 16 * 64, dtype=torch.float32).view(2, 16, 64)
    assert torch.equal(stored, model.model.embed_tokens(batch.input_ids).detach())

    # without keep_checkpoints each file is removed once its block's backward has read it (Alg. 1)
    seen.clear()
    mebp.keep = False
    for path in tmp_path.iterdir():
        path.unlink()
    mebp.optimizer.zero_grad(set_to_none=True)
    clean = mebp.backward(batch), grads(mebp)
    assert [entry[2] for entry in seen] == [files[:1], files, files, files[:1]] and os.listdir(tmp_path) == []

    # the backward really reads the files: zeroing block 1's input on disk before the backward changes
    # the gradients (and not the loss, which the forward computed from memory)
    def corrupt(module, args):
        if not torch.is_grad_enabled():
            return
        path = tmp_path / files[1]
        path.write_bytes(bytes(path.stat().st_size))
    handle = model.model.norm.register_forward_pre_hook(corrupt)
    mebp.optimizer.zero_grad(set_to_none=True)
    loss = mebp.backward(batch)
    handle.remove()
    assert loss == clean[0]
    for name in ("model.layers.1.self_attn.q_proj.lora_B", "model.layers.0.mlp.down_proj.lora_B"):
        assert clean[1][name].norm() > 0 and not torch.allclose(mebp.trainable()[name].grad, clean[1][name])


def test_default_folder_is_temporary(tiny_factory, tokenizer, tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    model = tiny_factory(0)
    mebp = MeBP(model, lr=1e-3, quant="none")
    during = []
    model.model.norm.register_forward_pre_hook(
        lambda m, a: during.extend(sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))))
    mebp.step(lm_batches(tokenizer, 8, 1, n_batches=1)[0], 0)
    folder = during[0]
    assert folder.startswith("mebp-") and during[1:] == [f"{folder}/block-000.bin", f"{folder}/block-001.bin"]
    assert list(tmp_path.iterdir()) == []


def test_training_lowers_the_loss(tiny_factory, tokenizer):
    batch = lm_batches(tokenizer, 16, 2, n_batches=1)[0]
    mebp = MeBP(tiny_factory(0), lr=1e-2, quant="nf4")
    losses = [mebp.step(batch, t)["loss"] for t in range(8)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] - 0.5, losses
    assert sum(mebp.times.values()) > 0 and all(mebp.times[k] > 0 for k in ("dequantize_forward", "dequantize_backward", "read"))


def test_resume_is_bit_identical(tiny_factory, tokenizer):
    batches = lm_batches(tokenizer, 12, 2, n_batches=3)
    first = MeBP(tiny_factory(0), lr=1e-2, quant="nf4", seed=3)
    for t in range(2):
        first.step(batches[t % 3], t)
    saved = {n: p.detach().clone() for n, p in first.trainable().items()}
    state = copy.deepcopy(first.optimizer.state_dict())
    after = [first.step(batches[t % 3], t)["loss"] for t in range(2, 5)]

    resumed = MeBP(tiny_factory(0), lr=1e-2, quant="nf4", seed=3)
    with torch.no_grad():
        for name, tensor in resumed.trainable().items():
            tensor.copy_(saved[name])
    resumed.optimizer.load_state_dict(state)
    assert [resumed.step(batches[t % 3], t)["loss"] for t in range(2, 5)] == after

    other = MeBP(tiny_factory(0), lr=1e-2, quant="nf4", seed=4)   # the seed draws A
    name = "model.layers.0.mlp.up_proj.lora_A"
    assert not torch.equal(other.trainable()[name], MeBP(tiny_factory(0), 1e-2, seed=3).trainable()[name])


def test_lm_batches_score_every_next_token(tiny_factory, tokenizer):
    batches = lm_batches(tokenizer, 10, 2, n_batches=2)
    assert len(batches) == 2 and batches[0].input_ids.shape == batches[0].targets.shape == (2, 10)
    flat = torch.cat([torch.cat([b.input_ids[:, :1], b.targets], 1) for b in batches]).reshape(-1)
    assert torch.equal(batches[1].input_ids[0], flat[22:32])        # consecutive windows of 11 tokens
    model = tiny_factory(0)
    b = batches[0]
    with torch.no_grad():
        logits = model(input_ids=b.input_ids).logits
        manual = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b.targets.reshape(-1))
        assert float(row_losses(model, b).mean()) == pytest.approx(float(manual), rel=1e-6)
    with pytest.raises(ValueError, match="seq_len"):
        lm_batches(tokenizer, 0, 1)


@pytest.mark.parametrize("settings, named", [
    ({"quant": "int4"}, "'int4'"), ({"lr": -1.0}, "-1.0"), ({"r": 0}, "got 0"),
    ({"targets": ("q_proj", "qkv")}, "'qkv'"), ({"keep_checkpoints": True}, "mmap_dir"),
    ({"mmap_dir": "FILE/sub"}, "FILE/sub")])
def test_bad_settings_say_what_is_wrong(tiny_factory, tmp_path, settings, named):
    blocker = tmp_path / "FILE"
    blocker.write_text("a file, not a folder")
    if "mmap_dir" in settings:
        settings = {"mmap_dir": str(tmp_path / settings["mmap_dir"])}
    kwargs = {"lr": 1e-3, **settings}
    with pytest.raises(ValueError) as err:
        MeBP(tiny_factory(0), **kwargs)
    message = str(err.value)
    assert named in message and "\n" not in message
    if "quant" in settings:
        assert "'nf4'" in message and "'none'" in message
