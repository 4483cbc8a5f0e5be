"""Held-out evaluation: loss sums over the eval batches, and the metrics the data names
(`data.metrics`), computed on predictions of its `dev_pairs` (`evaluate`: a sample
decoded greedily during training, all of them with the run's beam at the end) or of its
`test_pairs` (`score`, once, by the final model, only with `RunConfig.eval.final_test`).

BLEU and chrF are sacrebleu's corpus scores (0-100, BLEU with its default 13a
tokenization), imported only when a data source names them (`pip install 'jaxformer[data]'`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import numpy as np

from jaxformer import decode
from jaxformer.checks import BadValue, MissingPackage
from jaxformer.config import RunConfig
from jaxformer.data import TrainingData
from jaxformer.train.losses import LossSums


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
            "BLEU and chrF need sacrebleu: pip install 'jaxformer[data]'"
        ) from None


def evaluate(
    eval_step: Callable,
    params,
    data: TrainingData,
    predict_fn: Callable[[list[str]], list[str]],
    batch_size: int,
    pairs: list[tuple[str, str]],
) -> tuple[dict[str, float], list[str]]:
    """eval_loss (label-smoothed), eval_nll, eval_perplexity and eval_token_accuracy over
    `data.eval_batches`, and each of `data.metrics` on `predict_fn(sources)` of the
    held-out `pairs` (all or a sample of `data.dev_pairs`); with those predictions (none
    when the data names no metrics)."""
    sums = None
    for batch in data.eval_batches(batch_size):
        s = eval_step(params, batch)
        sums = s if sums is None else LossSums(*(a + b for a, b in zip(sums, s, strict=True)))
    out = {f"eval_{k}": float(v) for k, v in sums.means().items() if k != "tokens"}
    predictions = []
    if data.metrics:
        scores, predictions = score(predict_fn, pairs, data.metrics)
        out |= scores
    return out, predictions


def score(
    predict_fn: Callable[[list[str]], list[str]],
    pairs: list[tuple[str, str]],
    metrics: tuple[str, ...],
) -> tuple[dict[str, float], list[str]]:
    """Each of `metrics` (names in METRICS) of the predictions of (source, target) `pairs`,
    and those predictions."""
    predictions = predict_fn([src for src, _ in pairs])
    targets = [tgt for _, tgt in pairs]
    return {name: METRICS[name](predictions, targets) for name in metrics}, predictions


def translate(
    model,
    tokenizer,
    sources: list[str],
    run: RunConfig,
    data: TrainingData,
    *,
    beam: int,
    alpha: float | None = None,
) -> list[str]:
    """Translations of `sources` as a run's evaluation decodes them: greedy for beam 1,
    else beam search with the run's length penalty (or `alpha`), at most `data.tgt_len`
    tokens, in batches of the run's batch size padded to its pad multiple."""
    return decode.generate(
        model,
        tokenizer,
        sources,
        "beam" if beam > 1 else "greedy",
        beam_size=beam,
        alpha=run.eval.eval_alpha if alpha is None else alpha,
        max_new_tokens=data.tgt_len,
        batch_size=run.optim.batch_size,
        pad_multiple=run.data.pad_multiple,
    )


def eval_beam(run: RunConfig, data: TrainingData) -> int:
    """The run's eval_beam, else the paper's beam 4 for data scored by BLEU, greedy (1)
    for the rest."""
    if run.eval.eval_beam is not None:
        return run.eval.eval_beam
    return 4 if "bleu" in data.metrics else 1
