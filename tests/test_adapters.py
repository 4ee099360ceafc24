"""Parameter spaces through peft (chapter 4): each trains only its own tensors, with the counts peft reports;
MeZO over them changes only the adapter; the trainer and the command line take ``adapter``."""
import json

import pytest
import torch

from prge_lib.methods.adapters import ADAPTERS, TRAINED_NAMES, add_adapter, add_peft_lorafa, check_adapter
from prge_lib.models.objective import row_losses, synthetic_batch
from prge_lib.zo.mezo import MeZOFull
from prge_lib.training.trainer import TrainConfig

from fixtures import small_trainer

PEFT_KINDS = [k for k in ADAPTERS if k != "none"]
# the tiny model (tests/conftest.py), per layer: q 64→64, k 64→32, v 64→32, o 64→64, gate 64→128,
# up 64→128, down 128→64; two layers. Sums over the seven projections: in 512, out 512.
IN, OUT, LAYERS = 512, 512, 2


def expected_count(kind: str, r: int) -> int:
    lora = LAYERS * r * (IN + OUT)
    return {"none": None, "lora": lora, "lora-fa": LAYERS * r * OUT, "dora": lora + LAYERS * OUT,
            "vera": LAYERS * (7 * r + OUT)}[kind]


@pytest.mark.parametrize("kind", PEFT_KINDS)
def test_each_space_trains_only_its_own_tensors_with_peft_counts(tiny_factory, kind):
    r = 8 if kind != "vera" else 96          # VeRA's rank may exceed in and out: peft slices its shared matrices
    model, params = add_adapter(tiny_factory(), kind, r=r, alpha=16)
    assert params, kind
    assert all(any(tag in name for tag in TRAINED_NAMES[kind]) for name in params), list(params)
    for tag in TRAINED_NAMES[kind]:
        assert any(tag in name for name in params), tag
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert not any(any(tag in n for tag in TRAINED_NAMES[kind]) for n in frozen if "lora_A" not in n)
    count = sum(p.numel() for p in params.values())
    assert count == model.get_nb_trainable_parameters()[0] == expected_count(kind, r)


def test_none_trains_every_weight_and_lorafa_matches_the_first_order_helper(tiny_factory):
    model = tiny_factory()
    same, params = add_adapter(model, "none")
    assert same is model and len(params) == len(list(model.parameters()))
    ours, _ = add_adapter(tiny_factory(), "lora-fa", seed=3)
    theirs = add_peft_lorafa(tiny_factory(), seed=3)
    for (n1, p1), (n2, p2) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2) and p1.requires_grad == p2.requires_grad


def test_the_seed_fixes_lora_a_and_leaves_the_global_generator_alone(tiny_factory):
    state = torch.get_rng_state()
    a, _ = add_adapter(tiny_factory(), "lora", seed=1)
    assert torch.equal(torch.get_rng_state(), state)
    b, _ = add_adapter(tiny_factory(), "lora", seed=1)
    c, _ = add_adapter(tiny_factory(), "lora", seed=2)
    first = [p for n, p in a.named_parameters() if "lora_A" in n][0]
    assert torch.equal(first, [p for n, p in b.named_parameters() if "lora_A" in n][0])
    assert not torch.equal(first, [p for n, p in c.named_parameters() if "lora_A" in n][0])


@pytest.mark.parametrize("kind", PEFT_KINDS)
def test_a_new_adapter_is_the_identity_and_vera_covers_non_square_layers(tiny_factory, kind):
    base = tiny_factory()
    batch = synthetic_batch(2, 6, base.config.vocab_size)
    with torch.no_grad():
        before = row_losses(base, batch)
        model, params = add_adapter(base, kind, r=8 if kind != "vera" else 64)
        torch.testing.assert_close(row_losses(model, batch), before)       # B = 0 (λ_b = 0): ΔW = 0
        for name, p in params.items():                                      # e.g. k_proj is 64 → 32
            if "k_proj" in name and ("lora_B" in name or "lambda_b" in name):
                p.add_(0.5)
        assert not torch.allclose(row_losses(model, batch), before)


@pytest.mark.parametrize("kind", PEFT_KINDS)
def test_mezo_steps_change_the_adapter_and_nothing_else(tiny_factory, kind):
    model, params = add_adapter(tiny_factory(), kind, r=4 if kind != "vera" else 32)
    before = {k: v.clone() for k, v in model.state_dict().items()}       # weights, adapters, VeRA's buffers
    method = MeZOFull(model, q=2, eps=1e-2, lr=1e-2, seed=0, params=params)
    batch = synthetic_batch(2, 6, model.config.vocab_size)
    for t in range(3):
        assert method.step(batch, t)["finite"]
    trained = {id(p) for p in params.values()}
    named = dict(model.named_parameters())
    for key, value in model.state_dict().items():
        moved = not torch.equal(value, before[key])
        is_trained = key in named and id(named[key]) in trained
        assert moved == is_trained, (key, moved, is_trained)


@pytest.mark.parametrize("settings,message", [
    ({"method": "mezo", "adapter": "loha"}, r"unknown adapter 'loha'; choose one of \['none', 'lora'"),
    ({"method": "prge", "adapter": "dora"}, r"--adapter dora applies to --method mezo only"),
    ({"method": "fo", "adapter": "lora"}, r"--adapter lora applies to --method mezo only"),
])
def test_a_bad_adapter_setting_is_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig("sst2", **settings).resolved()


def test_a_bad_adapter_name_is_refused_by_the_builder(tiny_factory):
    with pytest.raises(ValueError, match=r"unknown adapter 'lora_fa'; choose one of .*'lora-fa'"):
        add_adapter(tiny_factory(), "lora_fa")
    with pytest.raises(ValueError, match="unknown adapter"):
        check_adapter("LoRA")


def test_adapter_defaults_follow_the_paper():
    vera = TrainConfig("sst2", method="mezo", adapter="vera").resolved()
    assert (vera.r, vera.lr, vera.eps, vera.q) == (1024, 1e-3, 1e-2, 1)
    dora = TrainConfig("sst2", method="mezo", adapter="dora", lr=5e-4).resolved()
    assert (dora.r, dora.lr, dora.eps) == (16, 5e-4, 1e-2)
    full = TrainConfig("sst2", method="mezo").resolved()
    assert (full.adapter, full.lr, full.eps) == ("none", 1e-6, 1e-3)
    assert full.identity()["adapter"] == "none" and dora.identity()["adapter"] == "dora"


# ----- the trainer


DORA = {"method": "mezo", "adapter": "dora", "r": 4, "E": 4}


def _trainer(tiny_factory, tokenizer, data, folder=None, **kw):
    return small_trainer(tiny_factory, tokenizer, data, folder, **{**DORA, **kw})


def test_mezo_over_an_adapter_records_it_and_refuses_another_on_resume(tiny_factory, tokenizer, sst2_small,
                                                                        tmp_path):
    """The run records its space and size; a checkpoint of a DoRA run does not resume as LoRA. (That it
    resumes exactly as DoRA is in tests/test_train.py, with the other methods.)"""
    whole = _trainer(tiny_factory, tokenizer, sst2_small, tmp_path).run()
    assert whole["adapter"] == "dora" and whole["config"]["adapter"] == "dora"
    assert whole["trainable_parameters"] == expected_count("dora", 4)
    other = _trainer(tiny_factory, tokenizer, sst2_small, tmp_path, adapter="lora")
    with pytest.raises(ValueError, match="other settings.*'adapter': \\('dora', 'lora'\\)"):
        other.run(resume=True)


def test_a_checkpoint_from_before_adapters_resumes_as_none(tiny_factory, tokenizer, sst2_small, tmp_path):
    settings = {"adapter": "none", "lr": 1e-4, "eval_every": 0, "steps": 2}
    _trainer(tiny_factory, tokenizer, sst2_small, tmp_path, **settings).run()
    path = tmp_path / "checkpoint.pt"
    payload = torch.load(path, weights_only=False)
    del payload["config"]["adapter"]
    torch.save(payload, path)
    settings["steps"] = 3
    assert _trainer(tiny_factory, tokenizer, sst2_small, tmp_path, **settings).run(resume=True)["steps"] == 3


def test_command_line_trains_vera(fixture_data, tiny_folder, tmp_path, monkeypatch, capsys):
    from prge_lib.cli.main import main

    monkeypatch.setenv("PRGE_DATA_DIR", str(fixture_data))
    out = tmp_path / "v.json"
    common = ["train", "--task", "sst2", "--method", "mezo", "--model", str(tiny_folder), "--E", "4", "--steps",
              "2", "--eval-every", "0", "--n-train", "12", "--n-val", "6", "--n-test", "6", "--out", str(out)]
    assert main(common + ["--adapter", "vera", "--r", "32"]) == 0
    result = json.loads(out.read_text())
    assert result["adapter"] == "vera" and result["config"]["r"] == 32 and result["config"]["lr"] == 1e-3
    assert result["trainable_parameters"] == expected_count("vera", 32) and len(result["losses"]) == 2
    assert main(common[:-2] + ["--adapter", "dora", "--out", str(tmp_path / "p.json")]) == 0
    with pytest.raises(SystemExit):
        main(common + ["--adapter", "loha"])
    assert "invalid choice: 'loha'" in capsys.readouterr().err
