"""The method registry (prge_lib.methods.registry): every registered method trains two steps through the
trainer and moves its trainable tensors (ZO methods exactly by −(lr/q) Σ g_i z_i), a name is registered once,
and a method declared in one spec trains through the trainer with no other edit."""
import math

import pytest
import torch

from prge_lib.methods import registry
from prge_lib.methods.base import Method, check_method
from prge_lib.methods.registry import MethodSpec
from prge_lib.models.objective import row_losses
from prge_lib.training.trainer import TrainConfig, Trainer
from prge_lib.zo.estimator import ZerothOrder, step_seeds
from prge_lib.zo.mezo import explicit_noise, mezo_step


@pytest.fixture(scope="module")
def sst2_rows():
    """8 / 4 / 4 rows of SST-2 from the pool shipped with the book."""
    from prge_lib.data.splits import sample_task
    from prge_lib.data.tasks import get_task

    return sample_task(get_task("sst2"), 0, 8, 4, 4)


def tiny_settings(name: str) -> dict:
    """Two cheap steps of method ``name``, read off its spec alone: B = 2 rows per query at its default q (ZO)
    or a batch of 2 (FO), a random mask where it takes one, one decoder layer, short prompts."""
    spec = registry.get(name)
    settings = {"method": name, "steps": 2, "eval_every": 0, "checkpoint_every": 0, "lr": 1e-3, "layers": 1,
                "max_length": 32}
    if spec.family == "zo":
        settings["E"] = 2 * spec.defaults.get("q", 1)
    else:
        settings["batch_size"] = 2
    if "mask" in spec.uses:
        settings["mask"] = "random"
    return settings


def train_two_steps(tiny_factory, tokenizer, data, name: str):
    """Run the trainer for two steps of ``name``; returns it, its result, and per step (trainable tensors
    before, the step's record, trainable tensors after)."""
    trainer = Trainer(TrainConfig("sst2", **tiny_settings(name)), tiny_factory(), tokenizer, data, progress=False)
    steps, real_step = [], trainer.method.step

    def recorded(batch, t):
        before = {k: v.detach().clone() for k, v in trainer.method.trainable().items()}
        record = real_step(batch, t)
        steps.append((before, record, {k: v.detach().clone() for k, v in trainer.method.trainable().items()}))
        return record

    trainer.method.step = recorded
    return trainer, trainer.run(), steps


def check_steps(trainer, result, steps) -> None:
    """Two finite steps, each moving the trainable tensors; for a ZO method by −(lr/q) Σ_i g_i z_i with z_i
    the seed trick's draw over the trainable tensors (up to float rounding: MeZO's ±ε passes restore θ to
    within a few ulp)."""
    c = trainer.config
    assert isinstance(trainer.method, Method)
    assert len(result["losses"]) == len(steps) == 2
    for t, (before, record, after) in enumerate(steps):
        assert record["finite"] and math.isfinite(record["loss"]), (c.method, t, record)
        assert any(not torch.equal(before[k], after[k]) for k in before), (c.method, t)
        if registry.get(c.method).family != "zo":
            continue
        g, seeds = record["projected_grad"], step_seeds(c.seed, t, c.q)
        assert len(g) == c.q and any(gi != 0 for gi in g)
        update = [torch.zeros_like(v) for v in before.values()]
        for seed, gi in zip(seeds, g):
            for u, z in zip(update, explicit_noise(list(before.values()), seed)):
                u.add_(z, alpha=-c.lr * gi / c.q)
        for (name, old), u in zip(before.items(), update):
            error = (after[name] - old - u).abs().max()
            rounding = 8 * torch.finfo(old.dtype).eps * old.abs().max()     # of the ±ε passes and the update
            assert error <= 1e-4 * u.abs().max() + rounding, (c.method, t, name, float(error), float(u.abs().max()))


@pytest.mark.parametrize("name", registry.names())
def test_every_registered_method_trains_two_steps(tiny_factory, tokenizer, sst2_rows, name):
    check_steps(*train_two_steps(tiny_factory, tokenizer, sst2_rows, name))


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="method 'prge' is already registered"):
        registry.register(registry.get("prge"))
    with pytest.raises(ValueError, match=r"unknown method 'sgd'; choose one of \['fo', "):
        registry.get("sgd")
    with pytest.raises(ValueError, match=r"unknown family 'so'; choose one of \['zo', 'fo'\]"):
        MethodSpec("x", "so", lambda *a: None, {})
    with pytest.raises(ValueError, match=r"uses \['lr'\] are not method-scoped settings"):
        MethodSpec("x", "zo", lambda *a: None, {}, uses={"lr"})


def test_only_a_method_whose_builder_takes_a_start_is_built_from_one():
    """The trainer builds such a method on first use, so a resume builds it from its checkpoint's start (test_train
    checks the resume); every other method is built, and its settings refused, when the trainer is made."""
    assert [name for name in registry.names() if registry.get(name).builds_from_start] == ["senszoq"]
    assert MethodSpec("x", "zo", lambda c, m, t=None, b=None, start=None: None, {}).builds_from_start


def test_a_method_object_lacking_a_part_is_named():
    class NoTimes:
        model, optimizer, settings = None, None, {}

        def step(self, batch, t):
            return {}

        def trainable(self):
            return {}

    with pytest.raises(TypeError, match=r"method 'x' \(NoTimes\) lacks \['times', 'start'\]"):
        check_method(NoTimes(), "x")


class NormZO(ZerothOrder):
    """ZO-SGD with the seed trick on one tensor: the final norm's weight."""

    def __init__(self, model, q, eps, lr, seed):
        super().__init__(model, q, eps, lr, seed)
        self.weight = model.model.norm.weight

    def trainable(self):
        return {"model.norm.weight": self.weight}

    def step(self, batch, t):
        out = mezo_step([self.weight], lambda: row_losses(self.model, batch).mean(),
                        step_seeds(self.seed, t, self.q), self.eps, self.lr)
        return {"loss": (sum(out["loss_plus"]) + sum(out["loss_minus"])) / (2 * self.q), "finite": out["finite"],
                "projected_grad": out["projected_grad"]}


def test_a_method_declared_in_one_spec_trains_through_the_trainer(tiny_factory, tokenizer, sst2_rows):
    spec = MethodSpec("norm-zo", "zo", lambda c, model, tokenizer=None, task_batches=None:
                      NormZO(model, c.q, c.eps, c.lr, c.seed),
                      {"lr": 1e-3, "eps": 1e-3, "q": 2, "E": 4, "inner": False}, uses={"eps", "q", "E", "inner"})
    registry.register(spec)
    try:
        from prge_lib.cli.main import build_parser

        train = build_parser()._subparsers._group_actions[0].choices["train"]
        method = next(a for a in train._actions if a.dest == "method")
        assert "norm-zo" in method.choices and "norm-zo: lr=0.001" in train.description
        trainer, result, steps = train_two_steps(tiny_factory, tokenizer, sst2_rows, "norm-zo")
        assert result["method"] == "norm-zo" and result["trainable_parameters"] == 64
        assert result["config"]["sparsity"] is None and result["config"]["E"] == 4     # from the spec
        check_steps(trainer, result, steps)
    finally:
        registry.unregister("norm-zo")
    assert "norm-zo" not in registry.names()


def test_mezo_no_longer_imports_prge():
    import grimp

    graph = grimp.build_graph("prge_lib", include_external_packages=False)
    assert "prge_lib.zo.prge" not in graph.find_modules_directly_imported_by("prge_lib.zo.mezo")


def test_senszoq_lr_probe_files_back_the_registry_comment():
    """The probe the SensZOQ default lr comes from is committed as result files: one 100-step SST-2 run of senszoq
    per probed rate (C4 mask, 0.1%), the default among them, each recording the command that made it."""
    from prge_lib.common.paths import RESULTS
    from prge_lib.experiments.results import read_result

    default = registry.get("senszoq").defaults["lr"]
    probed = {}
    for path in sorted((RESULTS / "probes" / "senszoq_lr").glob("sst2_lr*_seed0.json")):
        run = read_result(path)
        assert run["method"] == "senszoq" and run["steps"] == 100 and len(run["losses"]) == 100, path
        assert run["config"]["mask"] == "c4" and run["config"]["sparsity"] == 1e-3, path
        command = run["provenance"]["command"].split()
        assert float(command[command.index("--lr") + 1]) == run["config"]["lr"], path
        probed[run["config"]["lr"]] = run
    assert sorted(probed) == [1e-5, 1e-4, 1e-3] and default in probed
