"""SQuAD F1 / exact match against hand-computed cases; accuracy and ranking AUC."""
import math

import pytest

from prge_lib.data.metrics import accuracy, exact_match, f1_score, normalize_answer, ranking_auc


def test_normalization_drops_case_punctuation_and_articles():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("an apple, a pear") == "apple pear"


def test_exact_match_takes_any_gold():
    assert exact_match("the Super Bowl XLIV", ["2010", "Super Bowl XLIV"]) == 1.0
    assert exact_match("Super Bowl", ["Super Bowl XLIV"]) == 0.0


def test_f1_by_hand():
    # prediction tokens {super, bowl}; gold {super, bowl, xliv}: P = 1, R = 2/3, F1 = 0.8
    assert f1_score("Super Bowl", ["Super Bowl XLIV"]) == pytest.approx(0.8)
    # best over golds: "in 2010" vs "2010" -> P = 1/2, R = 1, F1 = 2/3
    assert f1_score("in 2010", ["Super Bowl XLIV", "2010"]) == pytest.approx(2 / 3)
    assert f1_score("cats", ["dogs"]) == 0.0
    assert f1_score("the", ["a"]) == 1.0  # both normalize to empty


def test_accuracy_and_its_input_check():
    assert accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
    with pytest.raises(ValueError, match="got 2 and 3"):
        accuracy([1, 0], [1, 0, 1])


def test_ranking_auc():
    assert ranking_auc([0.9, 0.8, 0.1, 0.2], [1, 1, 0, 0]) == 1.0
    assert ranking_auc([0.1, 0.9], [1, 0]) == 0.0
    assert ranking_auc([0.5, 0.5], [1, 0]) == 0.5
    assert math.isnan(ranking_auc([0.5], [1]))
