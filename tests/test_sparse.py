"""SensZOQ (chapter 8): masks, the sparse + NF4 layer (Eq. 21 and 23), ZO on the sparse values only."""
import math

import pytest
import torch

from prge_lib.methods.senszoq import sensitivity
from prge_lib.models.objective import collate, row_losses, synthetic_batch
from prge_lib.methods.senszoq.sensitivity import (MASK_KINDS, build_mask, c4_mask, c4_texts, coverage, fisher_diagonal,
                                  linear_weights, load_mask, mask_size, save_mask, task_fisher)
from prge_lib.methods.senszoq.sparse import (SensZOQ, SparseDenseLinear, build_senszoq, compare_forms, set_mode, sparsify)

SPARSITY = 0.01


def _tied_scores(model, seed=0):
    """Fake Fisher scores with many ties (small integers), to test exact counts and tie breaking."""
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randint(0, 4, m.weight.shape, generator=gen).float()
            for name, m in linear_weights(model).items()}


@pytest.fixture(scope="module")
def task_batches(tokenizer):
    """Two batches of answer-token rows of different lengths (left-padded)."""
    texts = [("The film was great. Sentiment:", " positive"), ("Awful. Sentiment:", " negative"),
             ("A calm, slow and careful story. Sentiment:", " positive"), ("No. Sentiment:", " negative")]
    items = [(tokenizer(p).input_ids, tokenizer(a, add_special_tokens=False).input_ids) for p, a in texts]
    return [collate(items[:2], tokenizer.pad_token_id), collate(items[2:], tokenizer.pad_token_id)]


def _kind_args(kind, model):
    return {"scores": _tied_scores(model)} if kind in ("c4", "task") else {}


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("scope", ["layer", "global"])
def test_masks_have_exactly_the_requested_entries(tiny_factory, kind, scope):
    model = tiny_factory()
    numels = {name: m.weight.numel() for name, m in linear_weights(model).items()}
    mask = build_mask(kind, model, SPARSITY, scope, **_kind_args(kind, model))
    assert set(mask) == set(numels) and len(mask) == 14
    for name, idx in mask.items():
        assert idx.dtype == torch.int64 and idx.dim() == 1
        assert bool((idx.diff() > 0).all()) and (idx.numel() == 0 or 0 <= int(idx[0]) <= int(idx[-1]) < numels[name])
        if scope == "layer":
            assert idx.numel() == max(1, round(SPARSITY * numels[name]))
    assert mask_size(mask) == (sum(max(1, round(SPARSITY * n)) for n in numels.values()) if scope == "layer"
                               else round(SPARSITY * sum(numels.values())))


def test_a_tiny_sparsity_still_keeps_one_entry_per_layer(tiny_factory):
    mask = build_mask("random", tiny_factory(), 1e-5)          # round(1e-5 · 2048) = 0 → 1
    assert all(idx.numel() == 1 for idx in mask.values())


@pytest.mark.parametrize("scope", ["layer", "global"])
def test_masks_are_deterministic(tiny_factory, scope):
    model = tiny_factory()
    for kind in MASK_KINDS:
        first, again = (build_mask(kind, model, SPARSITY, scope, **_kind_args(kind, model)) for _ in range(2))
        assert all(torch.equal(first[n], again[n]) for n in first), kind
    other = build_mask("random", model, SPARSITY, scope, seed=1)
    first = build_mask("random", model, SPARSITY, scope, seed=0)
    assert any(not torch.equal(first[n], other[n]) for n in first)


def _kept_and_rest(mask, values):
    kept, rest = [], []
    for name, v in values.items():
        flat, keep = v.reshape(-1), torch.zeros(v.numel(), dtype=torch.bool)
        keep[mask[name]] = True
        kept.append(flat[keep])
        rest.append(flat[~keep])
    return kept, rest


@pytest.mark.parametrize("scope", ["layer", "global"])
def test_masks_take_the_extreme_scores(tiny_factory, scope):
    """largest/smallest: the kept |w| bound the others from above/below; c4: the top Fisher scores."""
    model = tiny_factory()
    magnitude = {n: m.weight.detach().abs() for n, m in linear_weights(model).items()}
    scores = _tied_scores(model)
    negated = {n: -v for n, v in magnitude.items()}
    for kind, values in (("largest", magnitude), ("smallest", negated), ("c4", scores)):
        kept, rest = _kept_and_rest(build_mask(kind, model, SPARSITY, scope, scores=scores), values)
        pairs = [(torch.cat(kept), torch.cat(rest))] if scope == "global" else zip(kept, rest)
        for k, r in pairs:
            assert float(k.min()) >= float(r.max()), kind


def test_save_and_load_keep_indices_and_settings(tiny_factory, tmp_path):
    mask = build_mask("random", tiny_factory(), SPARSITY, "global", seed=3)
    mask["model.layers.0.self_attn.q_proj"] = torch.zeros(0, dtype=torch.int64)     # an empty layer too
    settings = {"kind": "random", "sparsity": SPARSITY, "scope": "global", "seed": 3, "note": "ünïcode"}
    loaded, read = load_mask(save_mask(tmp_path / "mask.safetensors", mask, settings))
    assert read == settings and set(loaded) == set(mask)
    assert all(torch.equal(loaded[n], mask[n]) and loaded[n].dtype == torch.int64 for n in mask)


def test_c4_mask_is_computed_once_and_reused(tiny_factory, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("PRGE_CACHE_DIR", str(tmp_path))
    model = tiny_factory()
    mask, settings = c4_mask(model, tokenizer, SPARSITY, n=2, max_length=16, progress=False)
    assert settings["sequences"] == 2 and settings["tokens"] == 32 and mask_size(mask) > 0

    def refuse(*args, **kwargs):
        raise AssertionError("the cached mask should have been reused")
    monkeypatch.setattr(sensitivity, "fisher_diagonal", refuse)
    again, read = c4_mask(model, tokenizer, SPARSITY, n=2, max_length=16, progress=False)
    assert read == settings and all(torch.equal(again[n], mask[n]) for n in mask)
    with pytest.raises(AssertionError, match="reused"):       # other settings: another cache entry
        c4_mask(model, tokenizer, 2 * SPARSITY, n=2, max_length=16, progress=False)


def test_fisher_sums_squared_gradients_one_sequence_at_a_time(tiny_factory, tokenizer):
    model = tiny_factory()
    model.lm_head.weight.requires_grad_(False)      # tied: the embedding too
    flags = [p.requires_grad for p in model.parameters()]
    texts = c4_texts(2)
    both = fisher_diagonal(model, tokenizer, texts, 24, progress=False)
    parts = [fisher_diagonal(model, tokenizer, [t], 24, progress=False) for t in texts]
    assert (both.sequences, both.tokens) == (2, 48) and len(both) == 14
    for name in both:
        torch.testing.assert_close(both[name], parts[0][name] + parts[1][name])
        assert bool((both[name] >= 0).all()) and float(both[name].sum()) > 0
    assert [p.requires_grad for p in model.parameters()] == flags and False in flags     # restored
    assert all(p.grad is None for p in model.parameters())
    # one sequence: the autograd gradient of its mean next-token cross-entropy, squared
    ids = tokenizer(texts[0], truncation=True, max_length=24, return_tensors="pt").input_ids
    weight = model.model.layers[1].mlp.down_proj.weight
    grad, = torch.autograd.grad(model(input_ids=ids, labels=ids).loss, weight.requires_grad_())
    torch.testing.assert_close(parts[0]["model.layers.1.mlp.down_proj"], grad.square())


def test_task_fisher_is_per_row_not_per_batch(tiny_factory, tokenizer, task_batches):
    model = tiny_factory()
    scores = task_fisher(model, task_batches[:1], progress=False)
    assert scores.sequences == 2 and scores.tokens == 2
    rows = [collate([(task_batches[0].input_ids[i][task_batches[0].attention_mask[i].bool()].tolist(),
                      task_batches[0].targets[i].tolist())], tokenizer.pad_token_id) for i in range(2)]
    name = "model.layers.0.self_attn.v_proj"
    weight = model.model.layers[0].self_attn.v_proj.weight.requires_grad_()
    grads = [torch.autograd.grad(row_losses(model, r).sum(), weight)[0] for r in rows]
    torch.testing.assert_close(scores[name], grads[0].square() + grads[1].square())
    assert not torch.allclose(scores[name], (grads[0] + grads[1]).square())


def test_coverage_of_the_task_mask_beats_random(tiny_factory, task_batches):
    model = tiny_factory()
    scores = task_fisher(model, task_batches, progress=False)
    for scope in ("layer", "global"):
        task = coverage(build_mask("task", model, SPARSITY, scope, scores=scores), scores)
        rand = coverage(build_mask("random", model, SPARSITY, scope), scores)
        assert task["overall"] >= rand["overall"]
        assert task["overall"] > 5 * SPARSITY
        if scope == "layer":
            assert all(task["per_layer"][n] >= rand["per_layer"][n] for n in scores)
    full = {n: torch.arange(s.numel()) for n, s in scores.items()}
    assert coverage(full, scores)["overall"] == pytest.approx(1.0)


def _logits(model, batch):
    with torch.no_grad():
        return model(input_ids=batch.input_ids).logits


@pytest.mark.parametrize("mode", ["dense", "spmm"])
def test_unquantized_split_computes_the_original_forward(tiny_factory, mode):
    model = tiny_factory()
    batch = synthetic_batch(2, 9, model.config.vocab_size)
    reference = _logits(model, batch)
    layers = sparsify(model, build_mask("largest", model, 0.05), quant="none", mode=mode)
    assert len(layers) == 14 and all(isinstance(m, SparseDenseLinear) for m in layers)
    torch.testing.assert_close(_logits(model, batch), reference, rtol=0, atol=1e-5)


def test_nf4_split_keeps_the_sparse_values_exact_and_bounds_the_error(tiny_factory):
    """NF4 moves each weight by ~9% of the matrix's scale (measured 9.1% on these N(0, 0.02) weights); an
    output passes through four quantized matrices in series (v→o, up→down, twice), whose errors add
    roughly in quadrature on top of the unquantized embedding, so the logits move by ~11% (measured).
    Bound: 0.2, and never more than 5% above quantizing the whole weights (the masked entries are exact)."""
    from prge_lib.models.quant import NF4Weight

    model, whole = tiny_factory(), tiny_factory()
    originals = {n: m.weight.detach().clone() for n, m in linear_weights(model).items()}
    batch = synthetic_batch(2, 9, model.config.vocab_size)
    reference = _logits(model, batch)
    with torch.no_grad():
        for m in linear_weights(whole).values():
            m.weight.copy_(NF4Weight(m.weight).dequantize())
    whole_error = float((_logits(whole, batch) - reference).norm() / reference.norm())
    layers = sparsify(model, build_mask("largest", model, SPARSITY), quant="nf4")
    error = float((_logits(model, batch) - reference).norm() / reference.norm())
    assert 0.01 < error < 0.2 and error <= 1.05 * whole_error
    for layer in layers:
        w = layer.effective_weight()
        assert torch.equal(w.view(-1)[layer.indices], originals[layer.name].view(-1)[layer.indices])
        assert not torch.equal(w, originals[layer.name])                   # the remainder is quantized
        assert bool((layer.dense(torch.float32).view(-1)[layer.indices] == 0).all())


def test_the_eq21_and_eq23_forms_agree(tiny_factory):
    model = tiny_factory()
    batch = synthetic_batch(2, 9, model.config.vocab_size)
    layers = sparsify(model, build_mask("random", model, 0.05), quant="nf4", mode="dense")
    with torch.no_grad():
        for layer in layers:     # values unlike the original weights, so the sparse term matters
            layer.values.copy_(torch.randn(layer.values.shape, generator=torch.Generator().manual_seed(1)))
    dense = _logits(model, batch)
    set_mode(layers, "spmm")
    torch.testing.assert_close(_logits(model, batch), dense, rtol=1e-5, atol=1e-5)
    set_mode(layers, "dense")
    layers[0].values.zero_()
    assert not torch.allclose(_logits(model, batch), dense, atol=1e-3)


def _senszoq(tiny_factory, seed=0, quant="nf4", q=2, **kw):
    model = tiny_factory()
    layers = sparsify(model, build_mask("smallest", model, SPARSITY), quant=quant)
    return SensZOQ(model, layers, q=q, eps=1e-2, lr=1e-3, seed=seed, **kw)


def _snapshot(model):
    state = {n: t.detach().clone() for n, t in model.state_dict().items() if not n.endswith(".values")}
    for name, m in model.named_modules():
        if isinstance(m, SparseDenseLinear) and m.nf4 is not None:
            state[name + ".nf4"] = m.nf4.packed.clone()
            state[name + ".absmax"] = m.nf4.state.absmax.clone()
    return state


def test_zo_changes_the_sparse_values_and_nothing_else(tiny_factory):
    method = _senszoq(tiny_factory)
    batch = synthetic_batch(2, 9, method.model.config.vocab_size)
    before, values = _snapshot(method.model), {n: v.clone() for n, v in method.trainable().items()}
    assert len(values) == 14 and all(n.endswith(".values") for n in values)
    for t in range(3):
        record = method.step(batch, t)
        assert record["finite"] and len(record["projected_grad"]) == 2
    assert all(not torch.equal(values[n], v) for n, v in method.trainable().items())
    after = _snapshot(method.model)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_the_step_is_deterministic_for_a_seed(tiny_factory):
    batch = synthetic_batch(2, 9, tiny_factory().config.vocab_size, seed=2)
    runs = {}
    for name, seed in (("a", 4), ("b", 4), ("c", 5)):
        method = _senszoq(tiny_factory, seed=seed)
        losses = [method.step(batch, t)["loss"] for t in range(2)]
        runs[name] = (losses, [v.clone() for v in method.trainable().values()])
    assert runs["a"][0] == runs["b"][0]
    assert all(torch.equal(x, y) for x, y in zip(runs["a"][1], runs["b"][1]))
    assert any(not torch.equal(x, y) for x, y in zip(runs["a"][1], runs["c"][1]))


@pytest.mark.parametrize("outer,inner", [(True, True), (True, False), (False, True)])
def test_parallel_queries_compute_the_sequential_step(tiny_factory, outer, inner):
    batch = synthetic_batch(2, 9, tiny_factory().config.vocab_size, seed=3)
    sequential, parallel = _senszoq(tiny_factory, quant="none", q=3), \
        _senszoq(tiny_factory, quant="none", q=3, outer=outer, inner=inner)
    a, b = sequential.step(batch, 0), parallel.step(batch, 0)
    assert max(abs(g) for g in a["projected_grad"]) > 0
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    assert a["projected_grad"] == pytest.approx(b["projected_grad"], rel=1e-3, abs=1e-3)
    # The values move by lr * g * z; losses that differ in their last bits (about 1e-6 here) change g by that over
    # eps, so the values may differ by lr * 1e-6 / eps * |z| (|z| < 5), as in test_prge's schedules.
    for x, y in zip(sequential.trainable().values(), parallel.trainable().values()):
        torch.testing.assert_close(x, y, rtol=0, atol=sequential.lr * 1e-6 / sequential.eps * 5)


def test_build_senszoq_for_each_mask_kind(tiny_factory, tokenizer, task_batches, tmp_path, monkeypatch):
    monkeypatch.setenv("PRGE_CACHE_DIR", str(tmp_path))
    batch = synthetic_batch(2, 9, tiny_factory().config.vocab_size)
    total = sum(m.weight.numel() for m in linear_weights(tiny_factory()).values())
    for kind in MASK_KINDS:
        method = build_senszoq(tiny_factory(), tokenizer, mask=kind, sparsity=SPARSITY, scope="global", q=1,
                               eps=1e-2, lr=1e-3, task_batches=task_batches, n_c4=2, max_length=16,
                               progress=False)
        assert method.settings["k"] == round(SPARSITY * total) and len(method.layers) == 14
        assert math.isfinite(method.step(batch, 0)["loss"])
    assert len(list((tmp_path / "masks").glob("c4-global-*.safetensors"))) == 1


def test_bad_settings_are_one_line_errors(tiny_factory, tokenizer):
    model = tiny_factory()
    cases = [(dict(kind="random", sparsity=s), repr(s)) for s in (0, 1, 1.5, -0.1, float("nan"), "x")]
    cases += [(dict(kind="topk", sparsity=SPARSITY), "'topk'"),
              (dict(kind="random", sparsity=SPARSITY, scope="row"), "'row'")]
    for kwargs, named in cases:
        with pytest.raises(ValueError) as err:
            build_mask(model=model, **kwargs)
        assert named in str(err.value) and "\n" not in str(err.value)
    assert "(0, 1)" in str(pytest.raises(ValueError, build_mask, "random", model, 2.0).value)
    mask = build_mask("random", model, SPARSITY)
    for kwargs, named in ((dict(quant="int4"), "'int4'"), (dict(mode="csr"), "'csr'")):
        with pytest.raises(ValueError, match=named):
            sparsify(tiny_factory(), mask, **kwargs)
    with pytest.raises(ValueError, match="scores="):
        build_mask("c4", model, SPARSITY)
    with pytest.raises(ValueError, match="'model.layers.0.self_attn.q_proj'"):
        build_mask("task", model, SPARSITY, scores={})
    with pytest.raises(ValueError, match="task_batches"):
        build_senszoq(model, tokenizer, mask="task")
    sparsify(model, mask, quant="none")
    with pytest.raises(TypeError, match="nn.Linear"):      # masks are built on the unsplit model
        build_mask("random", model, SPARSITY)


def test_compare_forms_reports_times_and_bytes():
    out = compare_forms((96, 64), rows=2, seq_len=8, sparsity=0.01, repeats=1, warmup=0)
    assert all(out[k] > 0 for k in ("fp32_forward_s", "eq23_forward_s", "eq21_forward_s"))
    assert out["bytes"]["dense"] < out["bytes"]["fp32_dense"] / 6 and out["k"] == round(0.01 * 96 * 64)
    assert out["bytes"]["values"] == 4 * out["k"] and out["bytes"]["indices"] == 8 * out["k"]


@pytest.mark.parametrize("outer,inner", [(False, False), (True, True)])
def test_a_replay_from_projected_gradients_gives_the_runs_values_bit_for_bit(tiny_factory, outer, inner):
    """MeZO's seed trick over the k values (a SensZOQ seed checkpoint): a run's projected gradients alone rebuild
    its values exactly. The sequential step perturbs the values +ε, −2ε, +ε in place, which in floating point does
    not give them back bit for bit, so its replay redoes the trips (with the updates alone the values differ);
    the parallel step never perturbs them in place, so the updates alone are its replay."""
    from prge_lib.zo.estimator import step_seeds
    from prge_lib.zo.mezo import update_
    from prge_lib.zo.replay import adapter_digest, can_rebuild, rebuild

    batch = synthetic_batch(2, 9, tiny_factory().config.vocab_size, seed=4)
    run = _senszoq(tiny_factory, seed=7, quant="none", outer=outer, inner=inner)
    grads = [run.step(batch, t)["projected_grad"] for t in range(3)]
    replayed = _senszoq(tiny_factory, seed=7, quant="none", outer=outer, inner=inner)
    assert can_rebuild(replayed)
    rebuild(replayed, grads)
    assert adapter_digest(replayed.trainable()) == adapter_digest(run.trainable())
    updates_only = _senszoq(tiny_factory, seed=7, quant="none")
    with torch.no_grad():
        for t, g in enumerate(grads):
            update_([layer.values for layer in updates_only.layers], step_seeds(7, t, 2), g, run.lr)
    same = adapter_digest(updates_only.trainable()) == adapter_digest(run.trainable())
    assert same == (outer or inner)
    with pytest.raises(ValueError, match="step 0: 1 projected gradients for a run with q = 2"):
        rebuild(_senszoq(tiny_factory, seed=7), [[0.5]])
