"""Held-out evaluation: loss sums over the eval batches, and the metrics the data names
(`data.metrics`), computed on predictions of its `test_pairs`."""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer import decode
from jaxformer.data.datasets import encode_pairs
from jaxformer.train.losses import LossSums


def exact_match(predictions: list[str], targets: list[str]) -> float:
    """The fraction of predictions equal to their targets."""
    return float(np.mean([p == t for p, t in zip(predictions, targets, strict=True)]))


# Metric name (as data sources give them) -> metric(predictions, targets).
METRICS: dict[str, Callable[[list[str], list[str]], float]] = {"exact_match": exact_match}


def evaluate(
    eval_step: Callable, params, data, predict_fn: Callable[[list[str]], list[str]], batch_size: int
) -> dict[str, float]:
    """eval_loss (label-smoothed), eval_nll, eval_perplexity and eval_token_accuracy over
    `data.eval_batches`, and each of `data.metrics` on `predict_fn(sources)` of the test
    pairs."""
    sums = None
    for batch in data.eval_batches(batch_size):
        s = eval_step(params, batch)
        sums = s if sums is None else LossSums(*(a + b for a, b in zip(sums, s, strict=True)))
    out = {f"eval_{k}": float(v) for k, v in sums.means().items() if k != "tokens"}
    if data.metrics:
        predictions = predict_fn([src for src, _ in data.test_pairs])
        targets = [tgt for _, tgt in data.test_pairs]
        out |= {name: METRICS[name](predictions, targets) for name in data.metrics}
    return out


def predict(model: nnx.Module, tokenizer, data, sources: list[str], batch_size: int) -> list[str]:
    """Greedy translations of `sources` (padded to fixed batches: one compilation), decoded
    with the tokenizer's special ids."""
    out = []
    for i in range(0, len(sources), batch_size):
        chunk = sources[i : i + batch_size]
        pairs = [(s, "") for s in chunk] + [None] * (batch_size - len(chunk))
        batch = encode_pairs(pairs, tokenizer, data.src_len, data.tgt_len)
        tokens = decode.greedy(
            model,
            jnp.asarray(batch["src"]),
            jnp.asarray(batch["src_valid"]),
            max_new_tokens=data.tgt_len,
            bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id,
            pad_id=tokenizer.pad_id,
        )
        out += [tokenizer.decode(row) for row in np.asarray(tokens)[: len(chunk)]]
    return out
