"""Task metrics: accuracy, SQuAD F1 / exact match against all gold answers, and ranking AUC.

SQuAD scoring follows the official v1.1 definition: lower-case, drop punctuation and the articles
a/an/the, collapse whitespace; F1 over the bag of tokens; the best score over the gold answers counts.
"""
from __future__ import annotations

import re
import string
from collections import Counter

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, golds: list[str]) -> float:
    return float(any(normalize_answer(prediction) == normalize_answer(g) for g in golds))


def _f1(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, golds: list[str]) -> float:
    return max(_f1(prediction, g) for g in golds)


def accuracy(predictions, labels) -> float:
    predictions, labels = list(predictions), list(labels)
    if len(predictions) != len(labels) or not labels:
        raise ValueError(f"need equally many predictions and labels, got {len(predictions)} and {len(labels)}")
    return sum(int(p == y) for p, y in zip(predictions, labels)) / len(labels)


def ranking_auc(scores, labels) -> float:
    """Probability that a random positive scores above a random negative (ties count half)."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))
