"""Length groups (chapter 5's padding share): a ZO step's rows forwarded in chunks of similar length, each padded to
its own longest row. The losses are the one padded batch's up to float rounding; one group is that batch itself."""
import pytest
import torch
from fixtures import randomize_b

from prge_lib.models.objective import (IGNORE, collate, copy_losses, grouped_copy_losses, length_chunks, mean_loss,
                                       row_losses)
from prge_lib.zo.lora import inject_lorafa, perturbed
from prge_lib.zo.prge import device_losses


def _ragged_batch(vocab: int, lengths=(3, 11, 5, 17, 8, 4), seed: int = 0):
    """Rows of these prompt lengths (one or two target tokens each), left-padded as training batches are."""
    gen = torch.Generator().manual_seed(seed)
    items = []
    for i, n in enumerate(lengths):
        ids = torch.randint(1, vocab, (n,), generator=gen).tolist()
        items.append((ids, ids[-1:] if i % 2 else ids[-2:]))
    return collate(items, pad_id=0)


def test_chunks_partition_the_rows_by_length_and_cut_only_padding(tiny_factory):
    batch = _ragged_batch(tiny_factory().config.vocab_size)
    chunks = length_chunks(batch, 3)
    rows = torch.cat([r for r, _ in chunks])
    assert sorted(rows.tolist()) == list(range(batch.rows))                      # every row once
    lengths = batch.attention_mask.sum(1)
    assert lengths[rows].tolist() == sorted(lengths.tolist())                    # shortest first
    for r, sub in chunks:
        assert sub.input_ids.shape[1] == int(lengths[r].max())                  # padded to its own longest row
        assert torch.equal(sub.attention_mask.sum(1), lengths[r])               # no real token cut
        for i, row in enumerate(r.tolist()):                                     # the same targets, right-aligned
            assert (sub.targets[i][sub.targets[i] != IGNORE].tolist()
                    == batch.targets[row][batch.targets[row] != IGNORE].tolist())
    assert sum(sub.input_ids.numel() for _, sub in chunks) < batch.input_ids.numel()
    assert len(length_chunks(batch, 50)) == batch.rows                           # at most one chunk per row
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(ValueError, match="length groups"):
            length_chunks(batch, bad)


def test_grouped_copy_losses_match_the_padded_batch_under_perturbed_copies(tiny_factory):
    model = tiny_factory()
    layers = inject_lorafa(model)
    randomize_b(layers)
    batch = _ragged_batch(model.config.vocab_size)
    copies = [(11, 0.01), (12, 0.01), (11, -0.01), (12, -0.01)]
    with torch.no_grad(), perturbed(layers, copies):
        padded = copy_losses(model, batch.repeat(len(copies)), len(copies))
        assert torch.equal(grouped_copy_losses(model, batch, len(copies), 1), padded)   # one group: bit for bit
        for groups in (2, 3, 6):
            torch.testing.assert_close(grouped_copy_losses(model, batch, len(copies), groups), padded,
                                       rtol=1e-5, atol=1e-6)
    assert len(set(padded.tolist())) == len(copies)            # the copies do differ: the check can fail


def test_a_prge_step_in_groups_gives_the_padded_steps_projected_gradients(tiny_factory):
    model = tiny_factory()
    layers = inject_lorafa(model)
    randomize_b(layers)
    batch = _ragged_batch(model.config.vocab_size)
    with torch.no_grad():
        one = device_losses(model, layers, batch, [5, 6], 1e-2)
        grouped = device_losses(model, layers, batch, [5, 6], 1e-2, length_groups=3)
    torch.testing.assert_close(grouped, one, rtol=1e-5, atol=1e-6)
    g_one, g_grouped = (one[0] - one[1]) / 2e-2, (grouped[0] - grouped[1]) / 2e-2
    torch.testing.assert_close(g_grouped, g_one, rtol=1e-3, atol=1e-4)


def test_mean_loss_in_groups_and_in_one(tiny_factory):
    model = tiny_factory()
    batch = _ragged_batch(model.config.vocab_size)
    with torch.no_grad():
        plain = row_losses(model, batch).mean()
        assert torch.equal(mean_loss(model, batch), plain)
        torch.testing.assert_close(mean_loss(model, batch, 4), plain, rtol=1e-5, atol=1e-6)


def test_the_config_caps_groups_at_a_querys_rows_and_refuses_what_cannot_cut():
    from prge_lib.training.config import TrainConfig

    assert TrainConfig("rte", method="mezo-lorafa", length_groups=4).resolved().length_groups == 4
    assert TrainConfig("rte", method="prge", q=4, E=16, length_groups=8).resolved().length_groups == 4  # B = 4
    assert TrainConfig("rte", method="prge", q=16, E=16, length_groups=4).resolved().length_groups == 1  # B = 1
    assert TrainConfig("rte", method="senszoq", length_groups=4).resolved().length_groups == 4
    assert TrainConfig("rte", method="mezo", length_groups=2).resolved().length_groups == 2
    with pytest.raises(ValueError, match="length_groups applies to"):
        TrainConfig("rte", method="fo-lorafa", length_groups=2).resolved()
    with pytest.raises(ValueError, match="length_groups must be a whole number at least 1, got 0"):
        TrainConfig("rte", method="mezo-lorafa", length_groups=0).resolved()
    with pytest.raises(ValueError, match="layerwise engine.*buckets '16,32'"):
        TrainConfig("rte", method="mezo-lorafa", length_groups=2, buckets="16,32").resolved()
    with pytest.raises(ValueError, match="engine 'fused'"):
        TrainConfig("rte", method="prge", length_groups=2, noise="counter", engine="fused").resolved()


def test_a_grouped_run_trains_and_each_sitting_says_how_it_was_cut(tiny_factory, tokenizer, sst2_small, tmp_path):
    """Length groups change the rounding, not the run: a run resumed with them says from which step they applied
    (``sittings``), and its losses stay within rounding of the run without them."""
    from fixtures import crash_during_step, small_trainer

    settings = {"method": "mezo-lorafa", "E": 4}
    plain = small_trainer(tiny_factory, tokenizer, sst2_small, **settings).run()
    crash_during_step(small_trainer(tiny_factory, tokenizer, sst2_small, tmp_path, length_groups=2, **settings), 5)
    result = small_trainer(tiny_factory, tokenizer, sst2_small, tmp_path, **settings).run(resume=True)   # in one
    assert [s.get("length_groups") for s in result["sittings"]] == [2, None]
    assert result["config"]["length_groups"] == 1
    assert result["losses"] == pytest.approx(plain["losses"], rel=1e-4)


def test_a_grids_length_groups_reach_its_zo_cells_only_and_their_commands():
    """``prge reproduce --length-groups K``: the ZO training cells carry K (a how-it-runs setting: their results
    still match the cells run without it), the first-order and zero-shot cells do not, and each cell's command
    names it so that the recorded command makes the run again as it ran."""
    from prge_lib.experiments import reproduce as rp
    from prge_lib.experiments.results import cell_matches

    cells = {c.name: c for c in rp.grid_cells("table1", "cpu", only="rte/", length_groups=4)}
    mezo, q16 = cells["rte/mezo-lorafa-E16_lr1e-3_seed0"], cells["rte/prge-q16-E16_lr1e-3_seed0"]
    assert mezo.config()["length_groups"] == 4 and mezo.command().endswith("--length-groups 4")
    assert "length_groups" not in cells["rte/fo-lorafa_lr3e-4_seed0"].config()
    assert "length_groups" not in cells["rte/zeroshot_seed0"].config()
    plain = {c.name: c for c in rp.grid_cells("table1", "cpu", only="rte/")}["rte/mezo-lorafa-E16_lr1e-3_seed0"]
    assert cell_matches(mezo, {"config": {**plain.config(), "length_groups": 1}}) == []
    from prge_lib.training.config import TrainConfig
    settings = {k: v for k, v in q16.config().items() if k in TrainConfig.__dataclass_fields__}
    assert TrainConfig(**settings).resolved().length_groups == 1            # B = 1: nothing to cut


def test_the_reproduce_command_refuses_length_groups_where_nothing_cuts(capsys):
    from prge_lib.cli.main import main

    assert main(["reproduce", "table1", "--length-groups", "0", "--list"]) == 2
    assert "--length-groups must be a whole number at least 1, got 0" in capsys.readouterr().err
    assert main(["reproduce", "runtime", "--length-groups", "2", "--list"]) == 2
    assert "grid 'runtime' has none" in capsys.readouterr().err
    assert main(["reproduce", "table1", "--length-groups", "2", "--device", "cuda", "--list"]) == 2
    assert "a pack cuts its forwards with --width-groups" in capsys.readouterr().err


def test_a_pack_refuses_length_groups_and_names_its_own_cut():
    from prge_lib.training.config import TrainConfig
    from prge_lib.training.packed import check_packable

    with pytest.raises(ValueError, match="run 1: length_groups 2 cuts one run's batch.*width_groups"):
        check_packable([TrainConfig("rte", method="mezo-lorafa"), TrainConfig("rte", method="mezo-lorafa",
                                                                                 length_groups=2)])
