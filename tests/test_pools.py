"""The task pools shipped in data/tasks (prge_lib.data.pools): checksummed, small, and sampling from them gives
exactly the examples the full data give for seeds 0–4."""
import json

import pytest

from prge_lib.data.splits import load_split, sample_task
from prge_lib.common.paths import POOL_DIR, REPO
from prge_lib.data.pools import POOL_SEEDS, PoolMissError, PooledSplit, open_text, sha256
from prge_lib.data.tasks import TASKS, get_task

MANIFEST = json.loads((POOL_DIR / "MANIFEST.json").read_text())


def test_manifest_lists_every_file_with_its_checksum_and_licence():
    shipped = {p.relative_to(REPO).as_posix() for p in (REPO / "data").rglob("*.xz")}
    assert shipped == set(MANIFEST["files"])
    for name, entry in MANIFEST["files"].items():
        assert sha256(REPO / name) == entry["sha256"], name
        assert entry["licence"], name
    assert MANIFEST["total_bytes"] < 6 * 2**20          # the repository stays small
    assert tuple(MANIFEST["seeds"]) == POOL_SEEDS


@pytest.fixture()
def shipped(monkeypatch):
    monkeypatch.delenv("PRGE_DATA_DIR", raising=False)


def test_with_no_setting_the_pools_are_read(shipped):
    rows = load_split(get_task("sst2"), "train")
    assert isinstance(rows, PooledSplit) and len(rows) == 67349
    with pytest.raises(PoolMissError, match=r"glue/sst2/train: row \d+ is not in the pool .* seeds \[0, 1, 2, 3, 4\]"
                                            r".*PRGE_DATA_DIR"):
        sample_task(get_task("sst2"), seed=7)
    assert sum(1 for _ in load_split(get_task("wnli"), "validation")) == 71     # complete splits iterate


@pytest.mark.needs_data
@pytest.mark.parametrize("name", list(TASKS))
def test_pools_sample_exactly_what_the_full_data_sample(name, shared_data, monkeypatch):
    task = get_task(name)
    for seed in POOL_SEEDS:
        full = sample_task(task, seed, root=shared_data)
        monkeypatch.delenv("PRGE_DATA_DIR", raising=False)
        pooled = sample_task(task, seed)
        small = sample_task(task, seed, n_train=64, n_val=16, n_test=32)   # smaller sizes are covered too
        monkeypatch.setenv("PRGE_DATA_DIR", str(shared_data))
        assert (pooled.train, pooled.val, pooled.test, pooled.notes) == (full.train, full.val, full.test, full.notes)
        assert small.train == sample_task(task, seed, 64, 16, 32, root=shared_data).train


def test_a_test_sample_beyond_the_pools_seeds_is_drawn_without_the_train_rows(shipped):
    """A seed the pools do not hold (the committed SST-2 runs reach seed 5): its train rows are missing, but where
    the test sample is the whole validation split, test_only draws it from the split's length alone, as the full
    draw orders it; the train and validation samples stay empty, never read."""
    sst2 = get_task("sst2")
    beyond = max(POOL_SEEDS) + 1
    with pytest.raises(PoolMissError):
        sample_task(sst2, beyond)
    drawn = sample_task(sst2, beyond, test_only=True)
    assert drawn.train == [] and drawn.val == [] and len(drawn.test) == 872
    assert sorted(map(json.dumps, drawn.test)) == sorted(map(json.dumps, sample_task(sst2, 0).test))   # all of it
    for name, seed in (("rte", 0), ("boolq", 1)):       # within the pools' seeds (boolq: no train split)
        task = get_task(name)
        full, alone = sample_task(task, seed), sample_task(task, seed, test_only=True)
        assert alone.test == full.test and (alone.train, alone.val) == ([], []) and alone.notes == full.notes


@pytest.mark.needs_data
def test_a_test_only_draw_beyond_the_pools_seeds_is_the_full_datas(shared_data):
    beyond = max(POOL_SEEDS) + 1
    for name in ("sst2", "rte"):
        task = get_task(name)
        assert sample_task(task, beyond, test_only=True, root=shared_data).test == \
            sample_task(task, beyond, root=shared_data).test


def test_every_grid_summarizes_from_the_shipped_pools_alone(shipped):
    """What the book does with no setting: every grid's summary (its commonest-answer rates sample the test split
    of every seed a committed run used, seed 5 on SST-2 included) builds from the pools."""
    from prge_lib.experiments import reproduce as rp
    from prge_lib.experiments.summaries import majority_rate

    majority_rate.cache_clear()                        # computed under another data setting, perhaps
    seeds = {r["seed"] for r in rp.load_results("table1") if r.get("task") == "sst2"}
    assert max(seeds) > max(POOL_SEEDS)                # what this test is about
    for grid in rp.GRIDS:
        for record in rp.summarize(grid):
            assert record["majority"] is None or 0 < record["majority"] <= 100, (grid, record["row"])
    majority_rate.cache_clear()


def test_text_samples_open_without_a_data_folder(shipped):
    with open_text("c4_sample.jsonl") as f:
        docs = [json.loads(line)["text"] for line in f]
    assert len(docs) == MANIFEST["files"]["data/text/c4_sample.jsonl.xz"]["rows"] and all(docs)
    with open_text("wikitext-2-raw-test.txt") as f:
        assert len(f.read()) > 1_000_000
