"""The held-out metrics a dataset can name (`data.metrics`), each a function of the
predictions and their targets: exact match, and BLEU and chrF as sacrebleu's corpus scores
(0-100, BLEU with its default 13a tokenization), imported only when a data source names
them (`pip install 'jaxformer[bleu]'`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import numpy as np

from jaxformer.checks import BadValue, MissingPackage


def exact_match(predictions: list[str], targets: list[str]) -> float:
    """The fraction of predictions equal to their targets."""
    return float(np.mean([p == t for p, t in zip(predictions, targets, strict=True)]))


def bleu(predictions: list[str], targets: list[str]) -> float:
    """sacrebleu's corpus BLEU (0-100, 13a tokenization) against one reference each."""
    return _sacrebleu().corpus_bleu(predictions, [targets]).score


def chrf(predictions: list[str], targets: list[str]) -> float:
    """sacrebleu's corpus chrF (0-100) against one reference each."""
    return _sacrebleu().corpus_chrf(predictions, [targets]).score


# Metric name (as data sources give them) -> metric(predictions, targets).
METRICS: dict[str, Callable[[list[str], list[str]], float]] = {
    "exact_match": exact_match,
    "bleu": bleu,
    "chrf": chrf,
}
_NEEDS_SACREBLEU = ("bleu", "chrf")


def check_metrics(names: tuple[str, ...]) -> None:
    """Raise before training if a metric is unknown or its library is missing."""
    unknown = sorted(set(names) - set(METRICS))
    if unknown:
        raise BadValue(f"unknown metric(s) {unknown}; known: {sorted(METRICS)}")
    if any(name in _NEEDS_SACREBLEU for name in names):
        _sacrebleu()


def _sacrebleu():
    try:
        return importlib.import_module("sacrebleu")
    except ImportError:
        raise MissingPackage(
            "BLEU and chrF need sacrebleu: pip install 'jaxformer[bleu]'"
        ) from None
