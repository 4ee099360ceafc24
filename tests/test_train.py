"""The trainer: settings checks, data order, resume = uninterrupted, NaN guard (chapters 5–7)."""
import pytest
import torch

from prge_lib.training.checkpoints import CheckpointError
from prge_lib.training.trainer import TrainConfig, TrainingDiverged

from fixtures import crash_during_step, small_trainer as _trainer


@pytest.mark.parametrize("method,extra", [
    ("prge", {"q": 2, "E": 4}),
    ("mezo", {"E": 4, "lr": 1e-4}),
    ("fo-lorafa", {"batch_size": 4}),
    ("mezo", {"adapter": "dora", "r": 4, "E": 4}),        # MeZO over a peft adapter (chapter 4)
    ("senszoq", {"E": 4, "mask": "random", "lr": 1e-3}),  # sparse ZO over an NF4 base (chapter 8)
    ("senszoq", {"E": 4, "mask": "task", "quant": "none", "mask_scope": "global"}),
    ("mebp", {"batch_size": 4}),                          # memory-efficient backprop (chapter 9)
])
def test_resume_reproduces_the_uninterrupted_run(tiny_factory, tokenizer, sst2_small, tmp_path, method, extra):
    whole = _trainer(tiny_factory, tokenizer, sst2_small, method=method, **extra).run()

    broken = _trainer(tiny_factory, tokenizer, sst2_small, tmp_path, method=method, **extra)
    crash_during_step(broken, 5)
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["step"] == 4

    resumed = _trainer(tiny_factory, tokenizer, sst2_small, tmp_path, method=method, **extra)
    result = resumed.run(resume=True)
    assert result["losses"] == whole["losses"]          # identical, not merely close
    assert result["evals"] == whole["evals"]
    assert whole["resumed_at_steps"] == [] and result["resumed_at_steps"] == [4]   # the sittings are on record
    fresh = _trainer(tiny_factory, tokenizer, sst2_small, method=method, **extra)
    fresh.run()
    for name, tensor in fresh.method.trainable().items():
        assert torch.equal(tensor, resumed.method.trainable()[name]), name


def test_each_sitting_records_the_processor_it_ran_on(tiny_factory, tokenizer, sst2_small, tmp_path, monkeypatch):
    """A run resumed on another machine rounds its forwards otherwise from there on: its result says which processor
    ran which steps (``sittings``), beside ``resumed_at_steps``."""
    from prge_lib.common.provenance import cpu_name
    from prge_lib.training import trainer as trainer_module

    whole = _trainer(tiny_factory, tokenizer, sst2_small, method="prge", q=2, E=4).run()
    assert whole["sittings"] == [{"step": 0, "processor": cpu_name()}]
    broken = _trainer(tiny_factory, tokenizer, sst2_small, tmp_path, method="prge", q=2, E=4)
    crash_during_step(broken, 5)
    monkeypatch.setattr(trainer_module, "processor", lambda device: "Another CPU")
    result = _trainer(tiny_factory, tokenizer, sst2_small, tmp_path, method="prge", q=2, E=4).run(resume=True)
    assert result["sittings"] == [{"step": 0, "processor": cpu_name()}, {"step": 4, "processor": "Another CPU"}]
    assert result["resumed_at_steps"] == [4]


def test_result_reports_best_validation_and_final_test(tiny_factory, tokenizer, sst2_small):
    result = _trainer(tiny_factory, tokenizer, sst2_small, q=2, E=4).run()
    assert [e["step"] for e in result["evals"]] == [0, 3, 6]
    assert "test" in result["evals"][0] and result["zero_shot_val"] == result["evals"][0]["val"]
    assert result["best_val"]["val"] == max(e["val"] for e in result["evals"])
    assert result["final"]["step"] == 6 and "test" in result["final"]
    assert len(result["losses"]) == 6 and len(result["projected_grad"][0]) == 2
    assert result["config"]["batch_size"] == 2 and result["config"]["inner"] is True
    assert result["trainable_parameters"] == 2 * 16 * (64 + 32 + 32 + 64 + 128 + 128 + 64)   # B: out × r per projection


def test_a_non_finite_loss_stops_and_keeps_the_last_good_state(tiny_factory, tokenizer, sst2_small, tmp_path):
    trainer = _trainer(tiny_factory, tokenizer, sst2_small, tmp_path, q=2, E=4, eval_every=0)
    real_step = trainer.method.step
    good = {}

    def poison_at_3(batch, t):
        if t == 2:     # keep the state after two good steps, then make every later loss non-finite
            good.update({k: v.clone() for k, v in trainer.method.trainable().items()})
            with torch.no_grad():
                trainer.model.model.embed_tokens.weight[:] = float("inf")
        return real_step(batch, t)

    trainer.method.step = poison_at_3
    with pytest.raises(TrainingDiverged, match=r"step 3: the loss is nan .*after step 2"):
        trainer.run()
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert saved["step"] == 2 and len(saved["history"]["losses"]) == 2
    for name, value in saved["method"]["trainable"].items():
        assert torch.equal(value, good[name])


def test_data_order_is_a_pure_function_of_seed_and_step(tiny_factory, tokenizer, sst2_small):
    trainer = _trainer(tiny_factory, tokenizer, sst2_small, q=2, E=6)      # B = 3, 16 rows: 5 per epoch
    epoch = [i for t in range(5) for i in trainer.batch_indices(t)]
    assert len(set(epoch)) == 15
    assert trainer.batch_indices(5) != trainer.batch_indices(0)
    again = _trainer(tiny_factory, tokenizer, sst2_small, q=2, E=6)
    assert [again.batch_indices(t) for t in range(12)] == [trainer.batch_indices(t) for t in range(12)]


@pytest.mark.parametrize("settings,message", [
    ({"method": "prge", "q": 3, "E": 16}, r"E = 16 must be a multiple of q = 3"),
    ({"method": "prge", "dtype": "bf16"}, r"refuses bf16"),
    ({"method": "mezo", "dtype": "bf16"}, r"refuses bf16"),
    ({"method": "sgd"}, r"unknown method 'sgd'"),
    ({"method": "mezo-lorafa", "q": 4}, r"mezo-lorafa is P-RGE with q = 1"),
    ({"method": "prge", "lr": -1.0}, r"lr must be a positive number, got -1.0"),
    ({"method": "fo", "optimizer": "adagrad"}, r"unknown optimizer 'adagrad'; choose one of \['adam', 'sgd'\]"),
    ({"method": "senszoq", "sparsity": 1.5}, r"sparsity.*1.5"),
    ({"method": "senszoq", "mask": "biggest"}, r"'biggest'.*c4"),
    ({"method": "senszoq", "quant": "int8"}, r"quant 'int8' is not supported \(choose nf4 or none\)"),
    ({"method": "mebp", "quant": "int8"}, r"quant 'int8' is not supported"),
    ({"method": "mebp", "optimizer": "sgd"}, r"mebp trains with Adam.*'sgd'"),
    ({"method": "prge", "mmap_dir": "/tmp/x"}, r"mmap_dir applies to method mebp only, not prge"),
])
def test_bad_settings_are_refused_with_the_value(settings, message):
    config = TrainConfig("sst2", **settings)
    with pytest.raises(ValueError, match=message):
        config.resolved()


def test_resume_with_other_settings_is_refused(tiny_factory, tokenizer, sst2_small, tmp_path):
    _trainer(tiny_factory, tokenizer, sst2_small, tmp_path, q=2, E=4, steps=2, eval_every=0).run()
    other = _trainer(tiny_factory, tokenizer, sst2_small, tmp_path, q=2, E=4, lr=5e-4, eval_every=0)
    with pytest.raises(ValueError, match="other settings.*'lr'"):
        other.run(resume=True)
    missing = _trainer(tiny_factory, tokenizer, sst2_small, tmp_path / "none", q=2, E=4)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        missing.run(resume=True)


@pytest.mark.parametrize("method,quant", [("senszoq", "nf4"), ("mebp", "nf4"), ("prge", "none"), ("fo", "none")])
def test_each_method_resolves_its_own_base_and_records_its_settings(method, quant):
    c = TrainConfig("sst2", method=method).resolved()
    assert c.quant == quant
    assert (c.mask, c.sparsity, c.mask_scope) == (("c4", 1e-3, "layer") if method == "senszoq" else (None,) * 3)


def test_senszoq_result_records_its_mask_and_mebp_its_phases(tiny_factory, tokenizer, sst2_small):
    result = _trainer(tiny_factory, tokenizer, sst2_small, method="senszoq", E=4, mask="largest", steps=2).run()
    assert result["method_settings"]["mask"] == "largest" and result["method_settings"]["k"] > 0
    assert result["trainable_parameters"] == result["method_settings"]["k"]
    result = _trainer(tiny_factory, tokenizer, sst2_small, method="mebp", batch_size=4, steps=2).run()
    assert result["phase_times_s"]["recompute_backward"] > 0


@pytest.mark.parametrize("method,extra", [
    ("prge", {"q": 2, "E": 4}),                                                   # per layer, torch noise
    ("prge", {"q": 2, "E": 4, "noise": "counter", "engine": "fused"}),            # the GPU's fused step
    ("mezo-lorafa", {"E": 2}),
    ("mezo", {"E": 2, "q": 2, "lr": 1e-3}),          # MeZO (Full): every weight, its ±ε trips replayed too
    ("senszoq", {"E": 4, "q": 2, "mask": "random", "lr": 1e-3}),      # the sparse values, their trips replayed
    ("senszoq", {"E": 4, "q": 2, "mask": "random", "lr": 1e-3, "outer": True, "inner": True}),   # shared forwards
])
def test_a_seed_checkpoint_rebuilds_the_adapter_bit_for_bit(tiny_factory, tokenizer, sst2_small, tmp_path,
                                                            monkeypatch, method, extra):
    """PRGE_SEED_CHECKPOINTS=1: the checkpoint keeps the run's history and the adapter's digest, not its tensors;
    resuming replays the recorded projected gradients and gives the uninterrupted run's adapter and steps."""
    from prge_lib.zo.replay import adapter_digest

    whole = _trainer(tiny_factory, tokenizer, sst2_small, method=method, **extra)
    whole_result = whole.run()
    monkeypatch.setenv("PRGE_SEED_CHECKPOINTS", "1")
    broken = _trainer(tiny_factory, tokenizer, sst2_small, tmp_path, method=method, **extra)
    crash_during_step(broken, 5)
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert saved["step"] == 4 and "trainable" not in saved["method"]
    assert saved["method"]["digest"] == adapter_digest(broken.method.trainable())
    assert not any(isinstance(v, torch.Tensor) and v.numel() > 1000 for v in saved["method"].values())
    resumed = _trainer(tiny_factory, tokenizer, sst2_small, tmp_path, method=method, **extra)
    result = resumed.run(resume=True)
    assert result["losses"] == whole_result["losses"] and result["evals"] == whole_result["evals"]
    assert adapter_digest(resumed.method.trainable()) == adapter_digest(whole.method.trainable())

    # a history that does not replay to the recorded adapter is refused, naming the replay
    saved["history"]["projected_grad"][1] = [2 * g + 1 for g in saved["history"]["projected_grad"][1]]
    torch.save(saved, tmp_path / "checkpoint.pt")
    with pytest.raises(CheckpointError, match="replaying its 4 steps did not give the adapter it recorded"):
        _trainer(tiny_factory, tokenizer, sst2_small, tmp_path, method=method, **extra).run(resume=True)
    saved["history"]["projected_grad"] = saved["history"]["projected_grad"][:3]
    torch.save(saved, tmp_path / "checkpoint.pt")
    with pytest.raises(CheckpointError, match="at step 4 holds the projected gradients of 3 steps"):
        _trainer(tiny_factory, tokenizer, sst2_small, tmp_path, method=method, **extra).run(resume=True)


def _ranked_elsewhere(monkeypatch):
    """Make SensZOQ masks as another processor might: the first layer's top-k holds one other entry (a Fisher
    that rounds otherwise swaps two scores at the boundary). Returns the function that undoes it."""
    from prge_lib.methods.senszoq import sparse

    real = sparse.build_mask

    def elsewhere(*args, **kwargs):
        mask = real(*args, **kwargs)
        name = next(iter(mask))
        kept = set(mask[name].tolist())
        outside = next(i for i in range(len(kept) + 1) if i not in kept)
        mask[name] = torch.tensor(sorted(kept - {max(kept)} | {outside}), dtype=torch.int64)
        return mask

    monkeypatch.setattr(sparse, "build_mask", elsewhere)
    return lambda: monkeypatch.setattr(sparse, "build_mask", real)


@pytest.mark.parametrize("seeded", [True, False], ids=["seed checkpoint", "tensor checkpoint"])
def test_a_senszoq_run_resumes_on_a_machine_that_ranks_another_mask(tiny_factory, tokenizer, sst2_small, tmp_path,
                                                                    monkeypatch, seeded):
    """A SensZOQ checkpoint keeps the mask its run began with (``Method.start``). A resumed trainer builds its
    method from that mask without ranking one of its own, so where the mask would come out otherwise (another
    processor's Fisher) it continues the run that began elsewhere, step for step, instead of refusing it (a seed
    checkpoint) or writing its values onto other weights (a tensor checkpoint). A trainer whose method was
    already built from another mask loads the model again, or, given its model, says it cannot."""
    from prge_lib.methods.senszoq import sparse
    from prge_lib.training import trainer as trainer_module
    from prge_lib.training.trainer import TrainConfig, Trainer

    monkeypatch.setenv("PRGE_SEED_CHECKPOINTS", "1" if seeded else "0")
    settings = {"method": "senszoq", "E": 4, "mask": "random", "lr": 1e-3}
    back_home = _ranked_elsewhere(monkeypatch)
    whole = _trainer(tiny_factory, tokenizer, sst2_small, **settings)
    whole_result = whole.run()
    broken = _trainer(tiny_factory, tokenizer, sst2_small, tmp_path, **settings)
    crash_during_step(broken, 5)
    began_with = {layer.name: layer.indices.clone() for layer in broken.method.layers}
    back_home()

    def same_run(trainer, result):
        assert {layer.name: layer.indices for layer in trainer.method.layers}.keys() == began_with.keys()
        assert all(torch.equal(layer.indices, began_with[layer.name]) for layer in trainer.method.layers)
        assert result["losses"] == whole_result["losses"] and result["evals"] == whole_result["evals"]
        for name, tensor in whole.method.trainable().items():
            assert torch.equal(tensor, trainer.method.trainable()[name]), name
        assert result["method_settings"]["mask_from"] == "checkpoint"
        assert result["sittings"][0].get("start") is None and result["sittings"][-1]["start"] == "checkpoint"

    # resumed, the method is built from the checkpoint's mask: no mask is ranked, and the model given serves
    step_4 = (tmp_path / "checkpoint.pt").read_bytes()
    ranked, real_build = [], sparse.build_mask
    monkeypatch.setattr(sparse, "build_mask", lambda *args, **kwargs: ranked.append(args) or real_build(*args,
                                                                                                       **kwargs))
    first = _trainer(tiny_factory, tokenizer, sst2_small, tmp_path, **settings)
    same_run(first, first.run(resume=True))
    assert ranked == []
    monkeypatch.setattr(sparse, "build_mask", real_build)
    (tmp_path / "checkpoint.pt").write_bytes(step_4)

    # built before the resume (here, from this machine's mask), given its model, a trainer cannot build the model
    # again: it says so, before any step
    built = _trainer(tiny_factory, tokenizer, sst2_small, tmp_path, **settings)
    assert not torch.equal(built.method.layers[0].indices, began_with[built.method.layers[0].name])
    with pytest.raises(CheckpointError, match="built from another start than this one"):
        built.run(resume=True)

    # a trainer that loads its model loads it again and builds the run from the checkpoint's mask
    monkeypatch.setattr(trainer_module, "load_model", lambda *args, **kwargs: (tiny_factory(), tokenizer))
    config = TrainConfig("sst2", steps=6, eval_every=3, checkpoint_every=2, **settings)
    (tmp_path / "checkpoint.pt").write_bytes(step_4)
    resumed = Trainer(config, data=sst2_small, checkpoint_dir=tmp_path, progress=False)
    assert not torch.equal(resumed.method.layers[0].indices, began_with[resumed.method.layers[0].name])
    same_run(resumed, resumed.run(resume=True))

    # where this machine ranks the same mask, a method built before the resume is not built twice
    same = _trainer(tiny_factory, tokenizer, sst2_small, tmp_path / "here", **settings)
    crash_during_step(same, 5)
    again = _trainer(tiny_factory, tokenizer, sst2_small, tmp_path / "here", **settings)
    assert again.method is not None
    assert "mask_from" not in again.run(resume=True)["method_settings"]


def test_a_mezo_full_replay_needs_the_perturbation_trips(tiny_factory):
    """MeZO (Full) perturbs every weight +ε, −2ε, +ε in place around its two forwards; in floating point that trip
    does not give the weights back bit for bit, so its replay redoes the trips: with them the replayed weights
    are the run's bit for bit, with the updates alone they are not (the test's reason to exist)."""
    from prge_lib.models.objective import Batch
    from prge_lib.zo.estimator import step_seeds
    from prge_lib.zo.mezo import MeZOFull, update_
    from prge_lib.zo.replay import adapter_digest, can_rebuild, rebuild

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 500, (4, 10), generator=generator)
    batch = Batch(ids, torch.ones_like(ids), torch.randint(1, 500, (4, 1), generator=generator))
    run = MeZOFull(tiny_factory(), q=2, eps=1e-3, lr=1e-3, seed=5)
    grads = [run.step(batch, t)["projected_grad"] for t in range(3)]
    replayed = MeZOFull(tiny_factory(), q=2, eps=1e-3, lr=1e-3, seed=5)
    assert can_rebuild(replayed)
    rebuild(replayed, grads)
    assert adapter_digest(replayed.trainable()) == adapter_digest(run.trainable())
    updates_only = MeZOFull(tiny_factory(), q=2, eps=1e-3, lr=1e-3, seed=5)
    with torch.no_grad():
        for t, g in enumerate(grads):
            update_(list(updates_only.params.values()), step_seeds(5, t, 2), g, 1e-3)
    assert adapter_digest(updates_only.trainable()) != adapter_digest(run.trainable())


def test_a_method_without_projected_gradients_keeps_its_tensors(tiny_factory, tokenizer, sst2_small, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setenv("PRGE_SEED_CHECKPOINTS", "1")
    trainer = _trainer(tiny_factory, tokenizer, sst2_small, tmp_path, method="fo-lorafa", batch_size=4, steps=2)
    trainer.run()
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert "trainable" in saved["method"] and "replay" not in saved["method"]


def test_a_long_run_keeps_its_series_in_windows(tiny_factory, tokenizer, sst2_small, monkeypatch):
    """A run past FULL_SERIES_STEPS writes each window's mean loss, g's root mean square and median step time
    instead of every step's; the file validates, and its size no longer grows with every step's g."""
    import json
    import math
    import statistics

    from prge_lib.experiments.results import validate_result
    from prge_lib.training import records

    short = _trainer(tiny_factory, tokenizer, sst2_small, method="prge", q=2, E=4)
    full = short.run()
    monkeypatch.setattr(records, "FULL_SERIES_STEPS", 4)
    monkeypatch.setattr(records, "SERIES_WINDOW", 4)
    long = _trainer(tiny_factory, tokenizer, sst2_small, method="prge", q=2, E=4)
    result = long.run()
    assert "losses" not in result and "projected_grad" not in result and result["step_s"]["per_step"] == []
    series = result["series"]
    assert series["every"] == 4 and len(series["loss"]) == 2                     # steps 0–3, then 4–5
    assert series["loss"] == [statistics.fmean(full["losses"][:4]), statistics.fmean(full["losses"][4:])]
    grads = [g for step in full["projected_grad"][:4] for g in step]
    assert series["grad_rms"][0] == math.sqrt(statistics.fmean(g * g for g in grads))
    assert series["step_s"] == [statistics.median(long.history["step_s"][:4]),
                                statistics.median(long.history["step_s"][4:])]
    point = {"step": 6, "val": 0.5, "test": 0.5}
    record = {**result, "kind": "train", "best_val": point, "final": point,
              "provenance": {"command": "x", "commit": None, "versions": {}, "hardware": {}, "wall_time_s": 1.0}}
    validate_result(record)
    from prge_lib.experiments.summaries import training_seconds
    assert training_seconds(record) == pytest.approx(4 * series["step_s"][0] + 2 * series["step_s"][1])
    import jsonschema
    with pytest.raises(jsonschema.ValidationError, match="make 2 windows of 4 but series.loss has 1"):
        validate_result({**record, "series": {**series, "loss": series["loss"][:1]}})
    with pytest.raises(jsonschema.ValidationError, match="needs losses"):
        validate_result({k: v for k, v in record.items() if k != "series"})
    # 20,000 steps of P-RGE at q 16 in windows of 100: tens of kilobytes, where every step's would be megabytes
    steps = 20_000
    big = records.windowed([1.0] * steps, [[0.5] * 16] * steps, [0.05] * steps, every=100)
    assert len(json.dumps(big)) < 20_000 and len(json.dumps([[0.123456789] * 16] * steps)) > 3_000_000
