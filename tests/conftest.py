import os
from pathlib import Path

import pytest

from fixtures import write_fixture_data


@pytest.fixture(scope="session")
def fixture_data(tmp_path_factory) -> Path:
    """A data folder of synthetic rows for all 14 tasks (tests/fixtures.py)."""
    return write_fixture_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real benchmark data, when PRGE_DATA_DIR points at it; otherwise the test is skipped."""
    value = os.environ.get("PRGE_DATA_DIR")
    if not value or not Path(value).is_dir():
        pytest.skip("PRGE_DATA_DIR is not set to the benchmark data")
    return Path(value)


@pytest.fixture()
def sst2_small(fixture_data):
    """A 16 / 8 / 8 SST-2 sample of the fixture data (for trainer tests)."""
    from prge_lib.data.splits import sample_task
    from prge_lib.data.tasks import get_task

    return sample_task(get_task("sst2"), 0, 16, 8, 8, root=fixture_data)


@pytest.fixture(scope="session")
def embedded():
    """(model, tokenizer) of the embedded SmolLM2-135M-Instruct, loaded once for the session."""
    from prge_lib.models.loading import load_model

    return load_model()


@pytest.fixture(scope="session")
def tokenizer(embedded):
    return embedded[1]


@pytest.fixture(scope="session")
def tiny_factory(tokenizer):
    """Make a fresh, seeded two-layer Llama with the embedded tokenizer's vocabulary: k/v projections are
    64 → 32 (not square), like SmolLM2's 576 → 192. Fast enough for step-by-step equality tests."""
    from prge_lib.models.tiny import tiny_llama

    def make(seed: int = 0, layers: int = 2):
        return tiny_llama(tokenizer, seed, layers)

    return make


@pytest.fixture(scope="session")
def tiny_folder(tokenizer, tmp_path_factory) -> Path:
    """The tiny model and the embedded tokenizer saved as a local model folder (for the command line)."""
    from prge_lib.models.tiny import save_tiny_llama

    return save_tiny_llama(tokenizer, tmp_path_factory.mktemp("tiny-llama"))


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` (minutes of real training) run only with PRGE_SLOW=1."""
    if os.environ.get("PRGE_SLOW", "").strip().lower() in {"1", "true", "yes", "on"}:
        return
    skip = pytest.mark.skip(reason="slow: set PRGE_SLOW=1 to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def _export_tiny(fixture_data, tiny_folder, folder: Path, backend: str, seq_len: int) -> Path:
    """`prge export` of the tiny model cut to one layer (q 2, E 4), for sst2."""
    from prge_lib.cli.main import main

    pte = folder / "step.pte"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PRGE_DATA_DIR", str(fixture_data))
        assert main(["export", "--task", "sst2", "--model", str(tiny_folder), "--layers", "1", "--q", "2", "--E",
                     "4", "--seq-len", str(seq_len), "--backend", backend, "--out", str(pte)]) == 0
    return pte


@pytest.fixture(scope="session")
def tiny_program(fixture_data, tiny_folder, tmp_path_factory) -> Path:
    """The tiny model's one-layer training program on the portable kernels (24 tokens), exported once."""
    return _export_tiny(fixture_data, tiny_folder, tmp_path_factory.mktemp("program"), "portable", 24)


@pytest.fixture(scope="session")
def tiny_xnnpack_program(fixture_data, tiny_folder, tmp_path_factory) -> Path:
    """The same step lowered to XNNPACK (16 tokens), exported once: the runtime and native host tests share it."""
    return _export_tiny(fixture_data, tiny_folder, tmp_path_factory.mktemp("xnnpack"), "xnnpack", 16)
