"""Loaders, MeZO-protocol sampling (deterministic, disjoint, deviations recorded), left padding, padding share."""
import json

import pytest
import torch

from prge_lib.data import splits as data_mod
from prge_lib.common.settings import data_dir
from prge_lib.data.splits import DataUnavailableError, left_pad, load_split, padding_share, sample_task
from prge_lib.data.tasks import TASKS, get_task


def _keys(rows):
    return [json.dumps(r, sort_keys=True) for r in rows]


def test_load_split_reads_the_fixture_folder(fixture_data):
    rows = load_split(get_task("sst2"), "train", fixture_data)
    assert len(rows) == 40 and set(rows[0]) == {"sentence", "label", "idx"}


def test_missing_file_error_names_the_file(fixture_data):
    with pytest.raises(DataUnavailableError, match=r"looked for .*squad/train\.jsonl"):
        load_split(get_task("squad"), "train", fixture_data)


def test_data_dir_setting_must_be_a_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("PRGE_DATA_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="PRGE_DATA_DIR='.*nowhere' is not a folder"):
        data_dir()


def test_an_unreachable_hub_error_says_what_to_set(monkeypatch):
    monkeypatch.setenv("PRGE_DATA_DIR", "hub")
    monkeypatch.setattr("prge_lib.common.hub.hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(DataUnavailableError, match="hub is unreachable.*Unset PRGE_DATA_DIR.*glue/rte/train.jsonl"):
        load_split(get_task("rte"), "train")


def test_data_dir_hub_reads_through_datasets(monkeypatch):
    calls = []

    def fake_load_dataset(repo, config, split):
        calls.append((repo, config, split))
        return [{"sentence": "a", "label": 1, "idx": 0}]

    monkeypatch.setenv("PRGE_DATA_DIR", "hub")
    monkeypatch.setattr("prge_lib.common.hub.hub_reachable", lambda timeout=3.0: True)
    monkeypatch.setattr("datasets.load_dataset", fake_load_dataset)
    assert load_split(get_task("sst2"), "validation") == [{"sentence": "a", "label": 1, "idx": 0}]
    assert load_split(get_task("winogrande"), "validation")
    assert calls == [("nyu-mll/glue", "sst2", "validation"), ("allenai/winogrande", "winogrande_xl", "validation")]


def test_sampling_is_deterministic_and_disjoint(fixture_data):
    task = get_task("rte")
    a = sample_task(task, seed=1, n_train=20, n_val=10, n_test=16, root=fixture_data)
    b = sample_task(task, seed=1, n_train=20, n_val=10, n_test=16, root=fixture_data)
    c = sample_task(task, seed=2, n_train=20, n_val=10, n_test=16, root=fixture_data)
    assert (a.train, a.val, a.test) == (b.train, b.val, b.test)
    assert _keys(a.train) != _keys(c.train)
    assert not set(_keys(a.train)) & set(_keys(a.val))
    assert a.sizes() == {"train": 20, "val": 10, "test": 16}
    train_idx = {r["idx"] for r in load_split(task, "train", fixture_data)}
    assert {r["idx"] for r in a.train + a.val} <= train_idx
    assert not {r["idx"] for r in a.test} & train_idx  # test rows come from the validation split


def test_short_train_split_shrinks_in_protocol_proportions(fixture_data):
    d = sample_task(get_task("sst2"), root=fixture_data)  # 40 train rows, 24 validation rows
    assert d.sizes() == {"train": 26, "val": 13, "test": 24}
    assert any("fewer than 1500" in n for n in d.notes) and any("all of them" in n for n in d.notes)


def test_missing_train_split_is_carved_from_validation_and_noted(fixture_data):
    d = sample_task(get_task("boolq"), n_train=10, n_val=4, n_test=8, root=fixture_data)
    assert d.sizes() == {"train": 10, "val": 4, "test": 8}
    keys = [_keys(d.train), _keys(d.val), _keys(d.test)]
    assert all(not set(x) & set(y) for i, x in enumerate(keys) for y in keys[i + 1:])
    assert any("no train split" in n and "carved disjointly" in n for n in d.notes)


@pytest.mark.parametrize("name", list(TASKS))
def test_real_data_follows_the_protocol(name, shared_data):
    d = sample_task(get_task(name), seed=0, root=shared_data)
    sizes = d.sizes()
    assert sizes["train"] <= 1000 and sizes["val"] <= 500 and sizes["test"] <= 1000
    assert min(sizes.values()) > 0
    if sizes != {"train": 1000, "val": 500, "test": 1000}:
        assert d.notes, f"{name}: sizes {sizes} deviate from 1000/500/1000 without a note"
    keys = [set(_keys(d.train)), set(_keys(d.val)), set(_keys(d.test))]
    assert not keys[0] & keys[1] and not keys[0] & keys[2] and not keys[1] & keys[2]


def test_left_pad_aligns_sequences_at_the_right():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert ids.dtype == mask.dtype == torch.long


def test_padding_share_by_hand():
    # batches of 2 (no shuffle effect with seed chosen so order matters less: check both by formula)
    lengths = [2, 4, 6, 8]
    assert padding_share(lengths, 1) == 0.0
    assert padding_share(lengths, 4) == pytest.approx((4 * 8 - 20) / (4 * 8))
    order = data_mod.random.Random(0).sample(lengths, 4)
    first, second = order[:2], order[2:]
    padded = 2 * max(first) + 2 * max(second)
    assert padding_share(lengths, 2) == pytest.approx((padded - 20) / padded)
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        padding_share(lengths, 0)
