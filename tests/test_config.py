import pytest

from prge_lib.common.settings import fast_mode, pick


@pytest.mark.parametrize("value, expected", [("1", True), ("true", True), ("0", False), ("", False)])
def test_fast_switch(monkeypatch, value, expected):
    monkeypatch.setenv("PRGE_FAST", value)
    assert fast_mode() is expected
    assert pick("full", "fast") == ("fast" if expected else "full")


def test_bad_fast_value_is_named(monkeypatch):
    monkeypatch.setenv("PRGE_FAST", "maybe")
    with pytest.raises(ValueError, match="PRGE_FAST='maybe' is not a boolean"):
        fast_mode()
