"""Held-out evaluation: loss sums over the eval batches, and the metrics the data names
(`data.metrics`, in `jaxformer.train.metrics`), computed on predictions of its
`dev_pairs` (`evaluate`: a sample decoded greedily during training, all of them with the
run's beam at the end) or of its `test_pairs` (`score`, once, by the final model, only
with `RunConfig.eval.final_test`).
"""

from __future__ import annotations

from collections.abc import Callable

from jaxformer import decode
from jaxformer.config import RunConfig
from jaxformer.data import TrainingData
from jaxformer.train.losses import LossSums
from jaxformer.train.metrics import METRICS


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
