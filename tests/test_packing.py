"""Packed runs (prge_lib.zo.packing, prge_lib.training.packed): R ZO runs sharing each forward train as each
would alone, up to a float-rounding bound derived below; a packed run resumes exactly and diverges alone.

The bound (chapter 5 bounds the outer loop's rounding the same way). A packed run and its unpacked twin compute
every copy's loss from the same weights, the same z (same seeds, same per-layer draw) and the same rows; rows
never share a reduction. What changes is (i) how many rows each product has, which can change how a kernel
blocks the reductions over the inner dimension, (ii) the padded length (rows of other runs), which shifts
RoPE's positions (equal relative angles in exact arithmetic, other rounding) and (iii) how the LoRA-FA products
are grouped. So each of the S reduction stages on the way to the logits (per decoder layer: RMSNorm, q/k/v,
scores, softmax·V, o, RMSNorm, gate/up, down; then the final norm and the head: S = 10·layers + 2) may round
differently. A reduction of K terms summed in two orders differs by at most 2γ_K ≈ 2Ku relative to its terms
in the worst case, and by about 2√K·u with rounding errors of random sign (Higham & Mary 2019, the model that
describes matmul rounding in practice); with normalised activations these relative errors add along the
stages, so the logits z differ by at most

    Δz ≤ 2 S √K u Z,        K = the longest reduction (max of intermediate size, hidden size, length),
                             Z = max |z| over the run's rows, u = 2⁻²⁴ (fp32 unit roundoff).

The loss ℓ = logsumexp(z) − z_y is 1-Lipschitz in each of its two terms (∞-norm), so a copy's loss (a mean
over its rows) moves by at most 2Δz, plus the last few roundings of the scalar ops that follow (log, the
subtraction, the mean over b rows), a few ulps of ℓ: we allow 8u|ℓ|.

    β_ℓ = 4 S √K u Z + 8 u |ℓ|                                            per copy loss (and their mean)
    β_g = (β_ℓ + β_ℓ) / 2ε = β_ℓ / ε                                      g = (ℓ⁺ − ℓ⁻) / 2ε
    β_B = η T β_g max|z| + 2 T q u max|B|                                 B_T = B_0 − (η/q) Σ_t Σ_i g_t,i z_t,i
          ≥ Σ_t (η/q) Σ_i |Δg_t,i| |z_t,i|  +  the updates' own rounding

(the update adds bit-identical z with coefficients that differ by Δg; each of its T·q additions rounds at
most u·|B| in each of the two runs). Not vacuous: a wrong seed or a swapped run changes the noise (and the
data order), which on the tiny model moves the losses of 4 steps by ~1e-1, g by ~1 and B by ~1e-1, while the
bounds come to ~4e-5, ~4e-3 and ~4e-4: the test asserts they sit at least 100× below those differences.
Observed on a CPU: most runs agree bit for bit, the others by one ulp of ℓ (1e-6), hence 5e-5 in g.
"""
import math
import time
from collections import Counter

import pytest
import torch

from prge_lib.data.splits import sample_task
from prge_lib.data.tasks import get_task
from prge_lib.models.objective import Batch, tail_logits
from prge_lib.training.packed import PackStopped, PackedTrainer, check_packable
from prge_lib.training.trainer import TrainConfig, Trainer, TrainingDiverged
from prge_lib.zo.defaults import DEFAULT_TARGETS
from prge_lib.zo.estimator import step_seeds
from prge_lib.zo.packing import Pack, build_pack, group_by_width

U = 2.0 ** -24          # fp32 unit roundoff
COMMON = {"steps": 4, "eval_every": 2, "checkpoint_every": 2, "max_length": 32, "layers": 1}

# three mixed runs, q = 2, 1 (MeZO on LoRA-FA) and 4; "equal": every run has 2 rows per copy (the packed layer's
# fully batched products), "mixed": 2, 4 and 1 rows per copy and another task (the per-run products)
PACKS = {
    "equal": [dict(task="sst2", method="prge", q=2, E=4, lr=1e-2, seed=1),
              dict(task="sst2", method="mezo-lorafa", E=2, lr=5e-3, seed=2),
              dict(task="sst2", method="prge", q=4, E=8, lr=2e-2, seed=3, eps=2e-2)],
    "mixed": [dict(task="sst2", method="prge", q=2, E=4, lr=1e-2, seed=1),
              dict(task="sst2", method="mezo-lorafa", E=4, lr=5e-3, seed=2),
              dict(task="rte", method="prge", q=4, E=4, lr=2e-2, seed=3)],
    # one q and one row count: the fused pack's fully batched step (one product per run for x Aᵀ, one update)
    "same-q": [dict(task="sst2", method="prge", q=2, E=4, lr=1e-2, seed=1),
               dict(task="sst2", method="prge", q=2, E=4, lr=5e-3, seed=2, eps=2e-2),
               dict(task="sst2", method="prge", q=2, E=4, lr=2e-2, seed=3)],
}
# the fused engine (counter noise, the pack's stacked B's and one draw per step: what a GPU runs)
FUSED = {"engine": "fused", "noise": "counter"}


@pytest.fixture()
def task_data(fixture_data):
    def sample(task: str):
        return sample_task(get_task(task), 0, 16, 8, 8, root=fixture_data)
    return sample


def configs(pack: str, **changes) -> list[TrainConfig]:
    return [TrainConfig(**{**COMMON, **run, **changes}) for run in PACKS[pack]]


def run_settings(seed: int, q: int = 2, eps: float = 1e-2, lr: float = 1e-2) -> dict:
    """One run's settings for build_pack on the tiny model: LoRA-FA r 4 on every target, counter noise."""
    return {"targets": DEFAULT_TARGETS, "r": 4, "alpha": 8, "noise": "counter", "q": q, "eps": eps, "lr": lr,
            "seed": seed, "keep_noise": True}


def packed(tiny_factory, tokenizer, task_data, runs, folders=None, width_groups: int = 1) -> PackedTrainer:
    return PackedTrainer(runs, tiny_factory(), tokenizer, [task_data(c.task) for c in runs], folders,
                         progress=False, width_groups=width_groups)


def solo(tiny_factory, tokenizer, task_data, config) -> Trainer:
    return Trainer(config, tiny_factory(), tokenizer, task_data(config.task), progress=False)


def max_logit(trainer: Trainer) -> float:
    """Z: the largest |logit| the run's model gives on its training batches, at its current adapter."""
    with torch.no_grad():
        return max(float(tail_logits(trainer.model, b.input_ids, b.attention_mask, b.targets.shape[1]).abs().max())
                   for b in (trainer.batch(t) for t in range(trainer.config.steps)))


def bounds(trainer: Trainer, z_logits: float, losses: list[float]) -> dict:
    """β_ℓ, β_g and β_B of the module docstring for this run."""
    config, model = trainer.config, trainer.model.config
    stages = 10 * model.num_hidden_layers + 2
    k = max(model.intermediate_size, model.hidden_size, config.max_length)
    loss = 4 * stages * math.sqrt(k) * U * z_logits + 8 * U * max(map(abs, losses))
    grad = loss / config.eps
    layers, steps = trainer.method.layers, len(losses)
    z_max = max(float(layer.noise(s).abs().max()) for layer in layers
                for t in range(steps) for s in step_seeds(config.seed, t, config.q))
    b_max = max(float(layer.lora_B.detach().abs().max()) for layer in layers)
    return {"loss": loss, "grad": grad, "B": config.lr * steps * grad * z_max + 2 * steps * config.q * U * b_max}


def trajectory_gaps(result: dict, trainer: Trainer, reference: dict, reference_trainer: Trainer) -> dict:
    """Max |difference| of the per-step losses, projected gradients and final B of two runs."""
    grads = [abs(a - b) for ga, gb in zip(result["projected_grad"], reference["projected_grad"])
             for a, b in zip(ga, gb)]
    mine, theirs = trainer.method.trainable(), reference_trainer.method.trainable()
    return {"loss": max(abs(a - b) for a, b in zip(result["losses"], reference["losses"])),
            "grad": max(grads),
            "B": max(float((mine[k] - theirs[k]).detach().abs().max()) for k in mine)}


@pytest.mark.parametrize("pack,engine", [("equal", "layerwise"), ("mixed", "layerwise"), ("equal", "fused"),
                                         ("mixed", "fused"), ("same-q", "fused"), ("mixed", "fused-grouped"),
                                         ("same-q", "fused-grouped")])
def test_packed_runs_train_as_each_alone(tiny_factory, tokenizer, task_data, pack, engine):
    """fused-grouped: each step's runs in two forwards by batch width (width_groups = 2)."""
    changes = FUSED if engine.startswith("fused") else {}
    runs = configs(pack, **changes)
    trainer = packed(tiny_factory, tokenizer, task_data, runs, width_groups=2 if engine == "fused-grouped" else 1)
    results = trainer.run()
    alone, alone_results, z_logits = [], [], []
    for config in runs:
        one = solo(tiny_factory, tokenizer, task_data, config)
        start = max_logit(one)
        alone_results.append(one.run())
        alone.append(one)
        z_logits.append(max(start, max_logit(one)))
    for r, (result, reference) in enumerate(zip(results, alone_results)):
        bound = bounds(alone[r], z_logits[r], reference["losses"])
        gaps = trajectory_gaps(result, trainer.trainers[r], reference, alone[r])
        print(f"{pack} run {r} (q {runs[r].q or 1}): gaps {gaps}, bounds {bound}")
        for what in ("loss", "grad", "B"):
            assert gaps[what] <= bound[what], (r, what, gaps, bound)
        assert result["steps"] == reference["steps"] and result["status"] == "finished"
        assert len(result["losses"]) == 4 and len(result["projected_grad"][0]) == (runs[r].q or 1)
        # the same schema as the unpacked result, plus the pack
        assert set(result) - set(reference) == {"status", "model", "packed"}
        assert result["packed"]["runs"] == 3 and len(result["packed"]["with"]) == 2
        assert result["config"] == reference["config"]
        # not vacuous: another run's trajectory (other seed, data order, noise) is far outside the bound
        other = (r + 1) % 3
        wrong = trajectory_gaps(result, trainer.trainers[r], alone_results[other], alone[other])
        print("  another run:", wrong)
        assert all(100 * bound[w] < wrong[w] for w in bound), (r, wrong, bound)
    # a wrong seed alone (same data order, other noise) is also far outside: run 0 with run 0's data but seed 7
    swapped = TrainConfig(**{**COMMON, **PACKS[pack][0], **changes, "seed": 7})
    other = solo(tiny_factory, tokenizer, task_data, swapped)
    other.epoch_order = trainer.trainers[0].epoch_order        # same batches, other noise seeds
    wrong = trajectory_gaps(results[0], trainer.trainers[0], other.run(), other)
    bound = bounds(alone[0], z_logits[0], alone_results[0]["losses"])
    assert 100 * bound["grad"] < wrong["grad"] and 100 * bound["B"] < wrong["B"], (wrong, bound)


def crash_during_step(trainer: PackedTrainer, n: int) -> None:
    """Run the pack until its n-th step, which is interrupted as a killed process would be."""
    real_step, calls = trainer.pack.step, []

    def crashing(work):
        calls.append(sorted(work))
        if len(calls) == n:
            raise KeyboardInterrupt(f"simulated interruption during step {n}")
        return real_step(work)

    trainer.pack.step = crashing
    with pytest.raises(KeyboardInterrupt):
        trainer.run()


def test_a_stopped_pack_resumes_to_the_uninterrupted_trajectories(tiny_factory, tokenizer, task_data, tmp_path):
    runs = configs("mixed")
    runs[1].steps = 6          # runs with fewer steps leave the pack when done
    whole = packed(tiny_factory, tokenizer, task_data, runs).run()

    folders = [tmp_path / f"run{r}" for r in range(3)]
    broken = packed(tiny_factory, tokenizer, task_data, runs, folders)
    crash_during_step(broken, 4)
    assert [torch.load(f / "checkpoint.pt", weights_only=True)["step"] for f in folders] == [2, 2, 2]
    # the last run's folder holds a checkpoint, the others are new: neither resume nor restart is refused
    # before any run starts
    again = packed(tiny_factory, tokenizer, task_data, runs, [tmp_path / "new0", tmp_path / "new1", folders[2]])
    with pytest.raises(ValueError, match="already holds the checkpoint of a run at step 2"):
        again.run()
    assert [t.history["evals"] for t in again.trainers] == [[], [], []]
    resumed = packed(tiny_factory, tokenizer, task_data, runs, folders).run(resume=True)
    for a, b in zip(resumed, whole):
        assert a["losses"] == b["losses"] and a["projected_grad"] == b["projected_grad"]   # identical
        assert a["evals"] == b["evals"] and a["resumed_at_steps"] == [2]
    assert [len(r["losses"]) for r in resumed] == [4, 6, 4]

    # a deadline stops the pack after a step with every run checkpointed there; the pack resumes from it
    stopped = [tmp_path / f"stopped{r}" for r in range(3)]
    with pytest.raises(PackStopped, match="at step 1 of 4"):
        packed(tiny_factory, tokenizer, task_data, runs, stopped).run(deadline=time.time())
    again = packed(tiny_factory, tokenizer, task_data, runs, stopped).run(resume=True)
    assert [r["losses"] for r in again] == [r["losses"] for r in whole]


@pytest.mark.parametrize("pack,engine", [("equal", "layerwise"), ("same-q", "fused")])
def test_a_diverging_run_leaves_the_pack_and_the_others_finish(tiny_factory, tokenizer, task_data, tmp_path,
                                                               pack, engine):
    runs = configs(pack, **(FUSED if engine == "fused" else {}))
    runs[1].lr = 1e33                # B ~1e34 after step 1: attention scores overflow, the next losses are NaN
    folders = [tmp_path / f"run{r}" for r in range(3)]
    trainer = packed(tiny_factory, tokenizer, task_data, runs, folders)
    results = trainer.run()
    assert [r["status"] for r in results] == ["finished", "diverged", "finished"]
    bad = results[1]
    reference = solo(tiny_factory, tokenizer, task_data, runs[1])
    with pytest.raises(TrainingDiverged):
        reference.run()
    assert bad["steps"] == reference.step == 1 and "not finite" in bad["diverged"]
    saved = torch.load(folders[1] / "checkpoint.pt", weights_only=True)
    assert saved["step"] == 1
    for name, value in saved["method"]["trainable"].items():      # the last good state, as the trainer keeps
        assert torch.equal(value, trainer.trainers[1].method.trainable()[name])
    for r in (0, 2):
        one = solo(tiny_factory, tokenizer, task_data, runs[r])
        z_logits = max_logit(one)
        reference = one.run()
        bound = bounds(one, max(z_logits, max_logit(one)), reference["losses"])
        gaps = trajectory_gaps(results[r], trainer.trainers[r], reference, one)
        assert all(gaps[w] <= bound[w] for w in bound), (r, gaps, bound)


def test_a_run_whose_loss_rose_past_stop_rising_leaves_the_pack(tiny_factory, tokenizer, task_data, tmp_path,
                                                                 monkeypatch):
    """Run 1's booked loss is 10 times the real one from step 3 on (a loss window of one step): it stops after step
    3 as diverged with its checkpoint there; the others, under the same factor, finish."""
    from prge_lib.training import stopping

    monkeypatch.setattr(stopping, "LOSS_WINDOW", 1)
    runs = configs("equal", stop_rising=3.0)
    folders = [tmp_path / f"run{r}" for r in range(3)]
    trainer = packed(tiny_factory, tokenizer, task_data, runs, folders)
    real_step = trainer.pack.step

    def rising(work):
        records = real_step(work)
        if 1 in records and work[1][1] >= 2:
            records[1] = {**records[1], "loss": 10 * records[1]["loss"]}
        return records

    trainer.pack.step = rising
    results = trainer.run()
    assert [r["status"] for r in results] == ["finished", "diverged", "finished"]
    assert [len(r["losses"]) for r in results] == [4, 3, 4]
    assert "above the --stop-rising factor 3; training stopped" in results[1]["diverged"]
    assert torch.load(folders[1] / "checkpoint.pt", weights_only=True)["step"] == 3


def test_runs_of_other_models_or_methods_are_refused():
    base = {**COMMON, "task": "sst2", "E": 4, "q": 2}
    with pytest.raises(ValueError, match=r"run 1: layers = 2, but run 0 has 1"):
        check_packable([TrainConfig(**base), TrainConfig(**{**base, "layers": 2})])
    with pytest.raises(ValueError, match=r"run 0: method 'mezo' cannot be packed"):
        check_packable([TrainConfig(**{**base, "method": "mezo", "q": 1})])


def fused_step_ops(model, runs: int, q: int = 2, rows: int = 2, length: int = 12) -> Counter:
    """The ATen operations one fused pack step of ``runs`` runs (one q, one row count) dispatches, batch
    assembly left out: the pack's own work (noise, forward, losses, update, the record's copy)."""
    settings = [run_settings(r, q, lr=1e-3 * (r + 1)) for r in range(runs)]
    pack = build_pack(model, settings, pad_id=0, fused=True)
    generator = torch.Generator().manual_seed(0)
    n = 2 * q * rows
    ids = torch.randint(1, model.config.vocab_size, (runs * n, length), generator=generator)
    batch = Batch(ids, torch.ones_like(ids), torch.randint(1, model.config.vocab_size, (runs * n, 1),
                                                           generator=generator))
    order = list(range(runs))
    seeds = {r: step_seeds(r, 0, q) for r in order}
    work = [(r, n) for r in order]
    with torch.no_grad():
        pack._fused_step(order, seeds, batch, work)          # the plan is made once, at the first step
        return dispatched(lambda: pack._fused_step(order, seeds, batch, work))[1]


def dispatched(call) -> tuple[object, Counter]:
    """``call()``'s value and the ATen operations it dispatched, counted by name."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    with Count() as count:
        value = call()
    return value, count.ops


def test_a_fused_pack_step_dispatches_as_many_operations_for_8_runs_as_for_2(tiny_factory):
    """What makes packing pay on a GPU: the operations (kernel launches) of a fused step do not grow with the
    number of runs, only their sizes do. Counted with a dispatch mode on the CPU, where the same code runs."""
    two, eight = fused_step_ops(tiny_factory(), 2), fused_step_ops(tiny_factory(), 8)
    assert sum(two.values()) > 100                        # not vacuous: the whole forward is counted
    assert two == eight, {op: (two[op], eight[op]) for op in set(two) | set(eight) if two[op] != eight[op]}


def test_a_buffered_pack_step_gives_the_fused_steps_numbers(tiny_factory):
    """The pack's CUDA-graph path (graphs=True: the uniform step reading fixed buffers, one per set of runs and
    batch shape) runs eagerly on the CPU; its records and B's equal the plain fused pack's bit for bit, also
    when only some runs step (the update then adds into their rows alone)."""
    settings = [run_settings(r, eps=1e-2 * (r + 1), lr=1e-2 * (r + 1)) for r in range(3)]
    packs = [build_pack(tiny_factory(), settings, pad_id=0, fused=True, graphs=graphs) for graphs in (False, True)]
    generator = torch.Generator().manual_seed(1)

    def batch(length: int) -> Batch:
        ids = torch.randint(1, 500, (2, length), generator=generator)
        return Batch(ids, torch.ones_like(ids), torch.randint(1, 500, (2, 1), generator=generator))

    plan = [[0, 1, 2], [0, 1, 2], [0, 2], [0, 1, 2], [0, 2], [0, 1], [1, 2]]
    for t, order in enumerate(plan):
        work = {r: (batch(8 if t % 2 else 12), t) for r in order}
        plain, buffered = (pack.step(work) for pack in packs)
        assert plain == buffered
        assert all(math.isfinite(plain[r]["loss"]) for r in order)
    assert torch.equal(packs[0].flat, packs[1].flat) and packs[0].flat.abs().sum() > 0
    # one buffered step per number of runs and shape: runs 1 and 2 at width 12 replay the step recorded for
    # runs 0 and 2 (other ε and η, read from its buffers)
    assert sorted((key[0], key[4]) for key in packs[1].buffered) == [(2, 8), (2, 12), (3, 8), (3, 12)]


def test_runs_are_grouped_by_batch_width():
    widths = {0: 30, 1: 8, 2: 12, 3: 8, 4: 64}
    assert group_by_width([0, 1, 2, 3, 4], widths, 2) == [[1, 3, 2], [0, 4]]
    assert group_by_width([0, 1, 2, 3, 4], widths, 3) == [[1, 3], [2, 0], [4]]
    assert group_by_width([4, 0], widths, 8) == [[0], [4]]                     # no empty group
    assert group_by_width([4, 0, 2], widths, 1) == [[4, 0, 2]]                  # one group: the order given
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match=f"width_groups takes a whole number of groups ≥ 1, got {bad}"):
            Pack(torch.nn.Linear(2, 2), [], [], pad_id=0, width_groups=bad)


def test_a_grouped_pack_step_is_each_groups_step(tiny_factory):
    """width_groups = 2: the runs of a step sorted by batch width and cut in two, each group one forward padded
    to its own widest batch; its records and B's are those of the same pack stepping each group by itself, bit
    for bit (graphs and plain alike), and its forwards are no wider than their groups need."""
    settings = [run_settings(r, eps=1e-2 * (r + 1), lr=1e-2 * (r + 1)) for r in range(4)]
    generator = torch.Generator().manual_seed(2)

    def batch(length: int) -> Batch:
        ids = torch.randint(1, 500, (2, length), generator=generator)
        return Batch(ids, torch.ones_like(ids), torch.randint(1, 500, (2, 1), generator=generator))

    for graphs in (False, True):
        grouped = build_pack(tiny_factory(), settings, pad_id=0, fused=True, graphs=graphs, width_groups=2)
        by_hand = build_pack(tiny_factory(), settings, pad_id=0, fused=True, graphs=graphs)
        widths_seen = []
        grouped.model.register_forward_pre_hook(lambda module, args, kwargs: widths_seen.append(
            kwargs["input_ids"].shape[1] if "input_ids" in kwargs else args[0].shape[1]), with_kwargs=True)
        for t, lengths in enumerate([(5, 9, 6, 12), (12, 5, 5, 7), (8, 8, 8, 8)]):
            work = {r: (batch(n), t) for r, n in enumerate(lengths)}
            records = grouped.step(work)
            assert list(records) == [0, 1, 2, 3]
            expected = {}
            for group in group_by_width(list(work), {r: n for r, n in enumerate(lengths)}, 2):
                expected.update(by_hand.step({r: work[r] for r in group}))
            assert records == {r: expected[r] for r in range(4)}
            narrow, wide = sorted(lengths)[1], sorted(lengths)[3]
            assert widths_seen[-2:] == [narrow, wide], (lengths, widths_seen)
        assert torch.equal(grouped.flat, by_hand.flat) and grouped.flat.abs().sum() > 0


@pytest.mark.parametrize("pack", ["same-q", "mixed"])
def test_a_pack_resumes_from_seed_checkpoints(tiny_factory, tokenizer, task_data, tmp_path, monkeypatch, pack):
    """PRGE_SEED_CHECKPOINTS=1 in a fused pack: each run's checkpoint holds its history and digest; the pack
    killed after its checkpoints at step 2 resumes every run by replaying its projected gradients, to the
    uninterrupted trajectories and adapters bit for bit (the same-q pack updated its runs by one batched product,
    the replay redraws each run alone)."""
    from prge_lib.zo.replay import adapter_digest

    runs = configs(pack, **FUSED)
    whole = packed(tiny_factory, tokenizer, task_data, runs)
    whole_results = whole.run()
    monkeypatch.setenv("PRGE_SEED_CHECKPOINTS", "1")
    folders = [tmp_path / f"run{r}" for r in range(3)]
    broken = packed(tiny_factory, tokenizer, task_data, runs, folders)
    crash_during_step(broken, 4)
    for folder in folders:
        saved = torch.load(folder / "checkpoint.pt", weights_only=True)
        assert "trainable" not in saved["method"] and saved["step"] == 2
    again = packed(tiny_factory, tokenizer, task_data, runs, folders)
    results = again.run(resume=True)
    assert [r["losses"] for r in results] == [r["losses"] for r in whole_results]
    assert [r["projected_grad"] for r in results] == [r["projected_grad"] for r in whole_results]
    for r in range(3):
        assert adapter_digest(again.trainers[r].method.trainable()) == \
            adapter_digest(whole.trainers[r].method.trainable())


def evaluation_pack(tiny_factory, fused: bool) -> Pack:
    """Three runs on the tiny model, each with its own nonzero B (seeded), so an adapter mix-up shows."""
    settings = [{"targets": DEFAULT_TARGETS, "r": 4, "alpha": 8, "noise": "counter" if fused else "torch", "q": 2,
                 "eps": 1e-2, "lr": 1e-2, "seed": r, "keep_noise": True} for r in range(3)]
    pack = build_pack(tiny_factory(), settings, pad_id=0, fused=fused)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for run in pack.runs:
            for layer in run.layers:
                layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=generator))
    return pack


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("sizes", [(3, 3, 3), (3, 2, 4)])
def test_a_packs_evaluation_forward_scores_each_run_as_alone(tiny_factory, tokenizer, task_data, fused, sizes):
    """Pack.each_own: the runs' evaluation batches in one forward, each run's rows through its own adapter, give
    each run's answer logits as the run alone does, within the rounding bound of the module docstring (Δz ≤
    2 S √K u Z: only how products are grouped and the padded length change); two tasks (SST-2, RTE), batch sizes
    equal (the batched products over runs) or not (each run's rows in turn). Not vacuous: the rows of run 0
    scored through run 1's adapter differ by far more than the bound."""
    from prge_lib.data.tasks import check_single_token
    from prge_lib.training.evaluate import answer_logits, answer_logits_many, zero_shot, zero_shot_many

    pack = evaluation_pack(tiny_factory, fused)
    tasks = ["sst2", "rte", "sst2"]
    jobs = [(get_task(name), task_data(name).val[:6]) for name in tasks]
    sources = [([task.prompt(ex) for ex in examples], check_single_token(task, tokenizer)) for task, examples in jobs]
    parts_seen = []

    def own(parts):
        parts_seen.append(parts)
        return pack.each_own(parts)

    together = answer_logits_many(pack.model, tokenizer, sources, list(sizes), rows=own)
    alone = []
    for r, (prompts, ids) in enumerate(sources):
        with pack.solo(r):
            alone.append(answer_logits(pack.model, tokenizer, prompts, ids, batch_size=sizes[r]))
    assert len(parts_seen) == 6 // min(sizes)             # the most batches one run has, not the sum over runs
    assert any(len({n for _, n in parts}) > 1 for parts in parts_seen) == (len(set(sizes)) > 1)
    config = pack.model.config
    stages = 10 * config.num_hidden_layers + 2
    k = max(config.intermediate_size, config.hidden_size, 64)
    for r, (mine, theirs) in enumerate(zip(together, alone)):
        bound = 2 * stages * math.sqrt(k) * U * float(theirs.abs().max())
        gap = float((mine - theirs).abs().max())
        print(f"run {r}: gap {gap:.2e}, bound {bound:.2e}")
        assert gap <= bound, (r, gap, bound)
    with pack.each_own([(1, len(sources[0][0]))]):                # run 0's prompts, run 1's adapter
        crossed = answer_logits(pack.model, tokenizer, sources[0][0], sources[0][1], batch_size=len(sources[0][0]))
    assert float((crossed - alone[0]).abs().max()) > 100 * 2 * stages * math.sqrt(k) * U * float(alone[0].abs().max())
    # the whole evaluation: each run's result is its result alone (predictions and metric)
    results = zero_shot_many(jobs, pack.model, tokenizer, list(sizes), rows=pack.each_own)
    for r, (task, examples) in enumerate(jobs):
        with pack.solo(r):
            reference = zero_shot(task, pack.model, tokenizer, examples, sizes[r])
        assert results[r]["predictions"] == reference["predictions"] and results[r]["value"] == reference["value"]


def test_each_own_refuses_unknown_or_repeated_runs_and_gradients(tiny_factory):
    pack = evaluation_pack(tiny_factory, fused=False)
    for rows in ([(3, 2)], [(0, 2), (0, 2)], [(-1, 1)]):
        with pytest.raises(ValueError, match="each_own takes distinct runs of this pack of 3"):
            with pack.each_own(rows):
                pass
    ids = torch.ones(2, 4, dtype=torch.long)
    with pack.each_own([(0, 1), (1, 1)]), pytest.raises(RuntimeError, match="runs under torch.no_grad"):
        pack.model(input_ids=ids)


def test_a_pack_evaluates_its_runs_together(tiny_factory, tokenizer, task_data, monkeypatch):
    """PackedTrainer: the runs due an evaluation score their validation (and test) sets in shared forwards, and
    each run's evaluations are those of the same run trained alone; ``eval_together`` caps the runs per forward."""
    from prge_lib.training import packed as packed_module

    runs = configs("same-q", **FUSED)
    calls = []
    real = packed_module.zero_shot_many

    def spy(jobs, *args, **kwargs):
        calls.append(len(jobs))
        return real(jobs, *args, **kwargs)

    monkeypatch.setattr(packed_module, "zero_shot_many", spy)
    trainer = packed(tiny_factory, tokenizer, task_data, runs)
    results = trainer.run()
    assert calls and max(calls) == 3                   # the three runs' validation sets in one evaluation
    for config, result in zip(runs, results):
        reference = solo(tiny_factory, tokenizer, task_data, config).run()
        assert [e["step"] for e in result["evals"]] == [e["step"] for e in reference["evals"]] == [0, 2, 4]
        assert result["evals"] == reference["evals"], (result["evals"], reference["evals"])
        assert result["elapsed_s"]["eval_s"] > 0
    calls.clear()
    capped = PackedTrainer(runs, tiny_factory(), tokenizer, [task_data(c.task) for c in runs], progress=False,
                           eval_together=2)
    assert [r["evals"] for r in capped.run()] == [r["evals"] for r in results]
    assert max(calls) == 2
    with pytest.raises(ValueError, match="eval_together takes a whole number of runs ≥ 1, got 0"):
        PackedTrainer(runs, tiny_factory(), tokenizer, [task_data(c.task) for c in runs], eval_together=0)


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 0)], ids=["all-runs", "some-runs"])
def test_copies_by_broadcast_equal_copies_by_gather(tiny_factory, order):
    """A fused step of runs of one q makes each layer's 2q copies per run by broadcasting the run's q rows of z
    and its B; runs of mixed q gather them per copy. Same multiply, same add: the same copies, bit for bit,
    for every run of a pack or some of them, and in the order of the plan's copies (run, then ±ε, then seed)."""
    from dataclasses import replace

    from prge_lib.zo.packing import copy_weights

    settings = [run_settings(r, q=3, eps=1e-2 * (r + 1)) for r in range(3)]
    pack = build_pack(tiny_factory(), settings, pad_id=0, fused=True)
    plan = pack.plan(order)
    generator = torch.Generator().manual_seed(3)
    z = torch.randn(3 * len(order), 24, 4, generator=generator)
    b = torch.randn(3, 24, 4, generator=generator)
    broadcast = copy_weights(plan, z, b)
    gathered = copy_weights(replace(plan, q=None), z, b)
    assert plan.q == 3 and broadcast.shape == (2 * 3 * len(order), 24, 4)
    assert torch.equal(broadcast, gathered)
    for k, r in enumerate(order):                           # run r's copy c: B_r + s·z, +ε for c < q, then −ε
        for c in range(6):
            sign = 1 if c < 3 else -1
            expected = z[3 * k + c % 3] * (sign * settings[r]["eps"]) + b[r]
            assert torch.equal(broadcast[6 * k + c], expected)


def compiled_steps(model, compiled: bool, seed_offset: int = 0):
    """Three fused steps of a pack of three runs (q 2) on ``model``, at batch widths 12, 16 and 20."""
    pack = build_pack(model, [run_settings(r + seed_offset) for r in range(3)], pad_id=0, fused=True,
                      compiled=compiled)
    generator = torch.Generator().manual_seed(5)
    records = []
    for t, width in enumerate((12, 16, 20)):
        ids = torch.randint(1, 500, (2, width), generator=generator)
        batch = Batch(ids, torch.ones_like(ids), torch.randint(1, 500, (2, 1), generator=generator))
        records.append(pack.step({r: (batch, t) for r in range(3)}))
    return records


def test_a_compiled_pack_traces_its_whole_decoder_as_one_graph(tiny_factory):
    """Pack(compiled=True): the decoder and its packed projections compile without a graph break, the second batch
    width compiles once more (with dynamic sizes) and the third reuses it; every run's loss and g stay within a
    small gap of the eager pack's (fused kernels round differently), far inside the gap to another seed's step."""
    import torch._dynamo as dynamo
    from torch._dynamo.utils import counters

    eager = compiled_steps(tiny_factory(), False)
    other = compiled_steps(tiny_factory(), False, seed_offset=10)
    dynamo.reset()
    counters.clear()
    compiled = compiled_steps(tiny_factory(), True)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 2
    for step, (a, b, c) in enumerate(zip(eager, compiled, other)):
        for r in range(3):
            gap = max(abs(x - y) for x, y in zip(a[r]["projected_grad"], b[r]["projected_grad"]))
            apart = max(abs(x - y) for x, y in zip(a[r]["projected_grad"], c[r]["projected_grad"]))
            print(f"step {step} run {r}: g gap {gap:.1e} compiled, {apart:.1e} to another seed's step")
            assert gap < 1e-3 * apart and abs(a[r]["loss"] - b[r]["loss"]) < 1e-5 * abs(a[r]["loss"])
    with pytest.raises(ValueError, match="compiled runs the fused step's forward through torch.compile: it needs"):
        build_pack(tiny_factory(), [run_settings(0)], 0, compiled=True)
    dynamo.reset()


def pack_step(model, qs=(2, 2, 2), rows=(2, 2, 2), seed_offset: int = 0, **options):
    """One fused pack step on ``model`` of runs with these q's and batch rows (each run its own batch), B set to
    small random values, the pack built with ``options`` (lowp_lora, …): the records and the ATen operations."""
    settings = [run_settings(r + seed_offset, q) for r, q in enumerate(qs)]
    pack = build_pack(model, settings, pad_id=0, fused=True, **options)
    with torch.no_grad():
        pack.flat.copy_(1e-2 * torch.randn(pack.flat.shape, generator=torch.Generator().manual_seed(4)))
    generator = torch.Generator().manual_seed(5)
    work = {}
    for r, b in enumerate(rows):
        ids = torch.randint(1, 500, (b, 12), generator=generator)
        work[r] = (Batch(ids, torch.ones_like(ids), torch.randint(1, 500, (b, 1), generator=generator)), 0)
    return dispatched(lambda: pack.step(work))


@pytest.mark.parametrize("qs, rows", [((2, 2, 2), (2, 2, 2)), ((2, 1, 3), (2, 2, 2)), ((2, 1), (2, 3))],
                         ids=["uniform", "mixed-q", "mixed-rows"])
def test_projections_reading_one_input_share_its_fp32_copy(tiny_factory, monkeypatch, qs, rows):
    """Over an fp16 base the fused step casts a projection's input to fp32 for x A_rᵀ; q, k and v read one tensor,
    and so do gate and up, so a layer's seven adapted projections need four casts, not seven. Sharing them changes
    no number: every run's record equals, bit for bit, that of a step that casts for every projection, on each of
    the fused step's three paths (one q, q's mixed, rows per copy mixed)."""
    from prge_lib.zo import packing

    shared, shared_ops = pack_step(tiny_factory().half(), qs, rows)
    monkeypatch.setattr(packing._StepState, "low_rank_input", lambda self, x, dtype: x.to(dtype))
    each, each_ops = pack_step(tiny_factory().half(), qs, rows)
    assert shared == each
    layers = 2                                              # the tiny model's decoder layers
    assert shared_ops["aten._to_copy"] == each_ops["aten._to_copy"] - 3 * layers


def test_a_low_precision_low_rank_product_drops_the_fp32_copies_of_the_inputs(tiny_factory):
    """Pack(lowp_lora=True), a measurement option of the engine benchmark: over an fp16 base the fused step computes
    x A_rᵀ in fp16 and no longer casts every projection's input to fp32 (two LoRA-FA projections a layer: fewer
    dtype copies per step); its losses and g stay within a small gap of the fp32 product's, far inside the gap
    between two other seeds' steps. Over an fp32 base the option changes nothing, bit for bit."""
    plain32, _ = pack_step(tiny_factory())
    low32, _ = pack_step(tiny_factory(), lowp_lora=True)
    assert plain32 == low32
    plain, plain_ops = pack_step(tiny_factory().half())
    low, low_ops = pack_step(tiny_factory().half(), lowp_lora=True)
    other, _ = pack_step(tiny_factory().half(), seed_offset=10)
    layers = 2 * len(DEFAULT_TARGETS)                       # the tiny model's two layers, each target wrapped
    assert low_ops["aten._to_copy"] <= plain_ops["aten._to_copy"] - layers
    for r in range(3):
        gap = max(abs(a - b) for a, b in zip(low[r]["projected_grad"], plain[r]["projected_grad"]))
        seeds_apart = max(abs(a - b) for a, b in zip(other[r]["projected_grad"], plain[r]["projected_grad"]))
        print(f"run {r}: g gap {gap:.2e} with the fp16 product, {seeds_apart:.2e} to another seed's step")
        assert gap < 0.05 * seeds_apart and abs(low[r]["loss"] - plain[r]["loss"]) < 1e-2 * abs(plain[r]["loss"])
    with pytest.raises(ValueError, match="lowp_lora changes the fused step's low-rank product: it needs fused"):
        build_pack(tiny_factory(), [run_settings(0)], 0, lowp_lora=True)
