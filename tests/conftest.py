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


@pytest.fixture(scope="session")
def embedded():
    """(model, tokenizer) of the embedded SmolLM2-135M-Instruct, loaded once for the session."""
    from prge_lib.models import load_model

    return load_model()


@pytest.fixture(scope="session")
def tokenizer(embedded):
    return embedded[1]
