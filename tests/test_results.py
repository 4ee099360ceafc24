"""Reading one result file: absent while not produced, an error naming a file that is not a result."""
import json

import pytest

from prge_lib.experiments.results import read_if_present


def test_read_result_reads_a_file_and_is_none_for_one_not_produced(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"kind": "train", "losses": [1.5, 1.25]}))
    assert read_if_present(path) == {"kind": "train", "losses": [1.5, 1.25]}
    assert read_if_present(str(path)) == read_if_present(path)
    assert read_if_present(tmp_path / "missing.json") is None
    assert read_if_present(tmp_path) is None                    # a folder is no result file


@pytest.mark.parametrize("text, message", [("{not json", "not valid JSON"),
                                           ("[1, 2]", "holds a JSON list, not a result object")])
def test_read_result_names_a_file_that_is_not_a_result(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as err:
        read_if_present(path)
    assert str(path) in str(err.value)
