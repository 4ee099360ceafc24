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


def test_text_samples_open_without_a_data_folder(shipped):
    with open_text("c4_sample.jsonl") as f:
        docs = [json.loads(line)["text"] for line in f]
    assert len(docs) == MANIFEST["files"]["data/text/c4_sample.jsonl.xz"]["rows"] and all(docs)
    with open_text("wikitext-2-raw-test.txt") as f:
        assert len(f.read()) > 1_000_000
