"""A run's evaluation: its settings, worked out once (`EvalSettings`), and its two hooks
(`Evaluation`): the in-run evaluation (the loss on every held-out batch, the first
`eval_sample` dev pairs decoded greedily) and the final one (every dev pair decoded with
the run's beam, averaged checkpoints and test pairs as configured).

The held-out metrics a dataset can name (`data.metrics`, in `METRICS`) are here too:
exact match, and BLEU and chrF as sacrebleu's corpus scores (0-100, BLEU with its default
13a tokenization), imported only when a data source names them
(`pip install 'jaxformer[bleu]'`)."""

from __future__ import annotations

import dataclasses
import importlib
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from flax import nnx

from jaxformer import decode
from jaxformer.checks import BadValue, MissingPackage
from jaxformer.data import TrainingData
from jaxformer.functional.losses import LossSums
from jaxformer.parallel import host_copy
from jaxformer.train import report
from jaxformer.train.config import RunConfig
from jaxformer.train.optim import eval_params
from jaxformer.train.run_folder import RunFolder
from jaxformer.train.setup import Setup

Pairs = list[tuple[str, str]]


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """A run's evaluation options, worked out once from its config and data (`of`).

    sample          how many dev pairs (the first) the in-run evaluation decodes, greedily
    beam            the final evaluation's beam: eval_beam, else 4 for BLEU, else 1
    alpha           that beam search's length penalty (eval_alpha)
    metrics         the data's metrics (names in `METRICS`)
    average         how many of the last checkpoints the final model averages
    test            whether the final model is scored on the data's test pairs (final_test)
    batch_size, pad_multiple  decoding batches
    max_new_tokens  the most tokens a prediction has: the data's tgt_len
    """

    sample: int
    beam: int
    alpha: float
    metrics: tuple[str, ...]
    average: int
    test: bool
    batch_size: int
    pad_multiple: int
    max_new_tokens: int

    @classmethod
    def of(cls, run: RunConfig, data: TrainingData) -> EvalSettings:
        beam = run.eval.eval_beam
        if beam is None:
            beam = 4 if "bleu" in data.metrics else 1
        return cls(
            sample=run.eval.eval_sample,
            beam=beam,
            alpha=run.eval.eval_alpha,
            metrics=data.metrics,
            average=run.eval.average_checkpoints,
            test=run.eval.final_test,
            batch_size=run.optim.batch_size,
            pad_multiple=run.data.pad_multiple,
            max_new_tokens=data.tgt_len,
        )


class FinalModel(NamedTuple):
    """What the final evaluation leaves for the summary and the report.

    params  the final model's parameters (last step's or averaged), on the host
    fields  summary.json's fields of its dev evaluation (eval_loss, ..., averaged_steps)
    tests   those of its test: final_test and the test_* scores ({} without final_test)
    dev     the dev pairs and the final model's predictions of them
    """

    params: Any
    fields: dict[str, Any]
    tests: dict[str, Any]
    dev: tuple[Pairs, list[str]]


class Evaluation:
    """A run's evaluation as two hooks, `in_run` and `final` (the last step's), with the
    seconds spent on the dev pairs (`seconds`: a resumed run starts from its kept
    evaluations') and on the test pairs (`test_seconds`); `final` leaves its `FinalModel`
    in `result`. Made before the run folder: an unknown metric or a missing library is
    bad input then."""

    def __init__(self, setup: Setup):
        check_metrics(setup.data.metrics)
        self.setup, self.settings = setup, EvalSettings.of(setup.run, setup.data)
        self.seconds, self.test_seconds = 0.0, 0.0
        self.result: FinalModel | None = None
        self.prepared: dict[tuple, list[str]] = {}  # see `prepare`

    def decodes_due(self, step: int) -> list[tuple[int, list[str]]]:
        """(beam, sources) of each dev decode that the evaluations due after `step` make
        with that step's parameters (none when the data names no metrics)."""
        run, pairs = self.setup.run, self.setup.data.dev_pairs
        if not self.settings.metrics:
            return []
        if step == run.optim.steps:
            return [(self.settings.beam, [source for source, _ in pairs])]
        if step % run.eval.eval_every == 0:
            return [(1, [source for source, _ in pairs[: self.settings.sample]])]
        return []

    def prepare(self, step: int, beam: int, sources: list[str], predictions: list[str]) -> None:
        """Predictions of `sources` with `beam` by the parameters of `step`, made elsewhere
        (a seed group decodes its seeds in one program): that step's decode takes them."""
        self.prepared = {key: made for key, made in self.prepared.items() if key[0] == step}
        self.prepared[(step, beam, tuple(sources))] = predictions

    def in_run(self, step: int, params, folder: RunFolder, say: Callable[[str], None]) -> None:
        """The in-run evaluation of `params`, the laid-out parameters of `step`: logged
        (with the evaluations' seconds so far, for a resume) and shown."""
        pairs = self.setup.data.dev_pairs[: self.settings.sample]
        sampled, _ = self._dev(params, pairs, beam=1, step=step)
        seconds = round(self.seconds, 2)
        folder.log({"step": step, **sampled, "eval_seconds": seconds})
        say(report.eval_line(step, sampled))

    def final(self, step: int, state, folder: RunFolder, say: Callable[[str], None]) -> None:
        """The final evaluation of the laid-out TrainState `state` of `step`, each part
        logged and shown, its predictions written to predictions.tsv (the dev pairs') and
        test_predictions.tsv (with final_test)."""
        params, fields, predictions = self._final_dev(step, state, folder, say)
        tests = self._test(step, params, folder) if self.settings.test else {}
        dev_pairs = self.setup.data.dev_pairs
        _write_predictions(folder, "predictions.tsv", dev_pairs, predictions)
        one = host_copy(self.setup.placement.one_copy(params))
        self.result = FinalModel(one, fields, tests, (dev_pairs, predictions))

    def clocks(self, wall_seconds: float) -> dict[str, float]:
        """summary.json's eval_seconds, test_seconds (with final_test) and train_seconds:
        the rest of `wall_seconds`."""
        clocks = {"eval_seconds": round(self.seconds, 2)}
        if self.settings.test:
            clocks["test_seconds"] = round(self.test_seconds, 2)
        spent = self.seconds + self.test_seconds
        return clocks | {"train_seconds": round(wall_seconds - spent, 2)}

    def _final_dev(self, step, state, folder, say) -> tuple[Any, dict[str, Any], list[str]]:
        """The last step's parameters on every dev pair, then the mean of the last
        checkpoints (average > 1): the final model's laid-out parameters, its summary
        fields and its predictions."""
        params = eval_params(state)  # what the optimizer evaluates (optim.eval_params)
        pairs, beam = self.setup.data.dev_pairs, self.settings.beam
        last, predictions = self._dev(params, pairs, beam, step=step)
        _log(folder, say, step, last)
        averaged = steps = None
        if self.settings.average > 1:
            mean, steps = folder.average_checkpoints(state, self.settings.average)
            params = self.setup.placement.put(mean, like=self.setup.layout.params)
            averaged, predictions = self._dev(params, pairs, beam)
            _log(folder, say, step, averaged, averaged_steps=steps)
        fields = _headline(averaged or last, self.settings.metrics) | {"eval_beam": beam}
        fields |= dict(final_eval=last, averaged_eval=averaged, averaged_steps=steps)
        return params, fields, predictions

    def _dev(
        self, params, pairs: Pairs, beam: int, step: int | None = None
    ) -> tuple[dict[str, Any], list[str]]:
        """The held-out metrics of laid-out `params` (their predictions of `pairs` with
        `beam`; those `prepare`d for `step`, when they are that step's) and those
        predictions."""
        started, setup = time.perf_counter(), self.setup
        predict = self._predictor(params, beam, step)
        batch_size = self.settings.batch_size
        metrics, predictions = evaluate(
            setup.eval_step, params, setup.data, predict, batch_size, pairs
        )
        self.seconds += time.perf_counter() - started
        return metrics | {"eval_pairs": len(pairs), "eval_beam": beam}, predictions

    def _test(self, step: int, params, folder: RunFolder) -> dict[str, Any]:
        """The final model (laid-out `params`) on the test pairs, logged; its summary
        fields (final_test, test_*, test_pairs)."""
        started, pairs = time.perf_counter(), self.setup.data.test_pairs
        predictor = self._predictor(params, self.settings.beam)
        scores, predictions = score(predictor, pairs, self.settings.metrics)
        self.test_seconds += time.perf_counter() - started
        tests = {f"test_{k}": v for k, v in scores.items()} | {"test_pairs": len(pairs)}
        folder.log({"step": step, **tests})
        _write_predictions(folder, "test_predictions.tsv", pairs, predictions)
        return {"final_test": True, **tests}

    def _predictor(
        self, params, beam: int, step: int | None = None
    ) -> Callable[[list[str]], list[str]]:
        """Translations of sources by laid-out `params` (greedy for beam 1): those prepared
        for `step` (the parameters of that step), else decoded here."""
        setup = self.setup

        def predictions(sources):
            ready = self.prepared.pop((step, beam, tuple(sources)), None)
            if ready is not None:
                return ready
            model = nnx.merge(setup.graphdef, setup.placement.one_copy(params))
            return translate(model, setup.tokenizer, sources, self.settings, beam)

        return predictions


def _headline(scores: dict[str, Any], metrics: tuple[str, ...]) -> dict[str, Any]:
    """summary.json's top-level figures of the final model, from its `scores`."""
    return {
        "eval_loss": scores["eval_loss"],  # label-smoothed, as trained
        "eval_nll": scores["eval_nll"],
        "eval_perplexity": scores["eval_perplexity"],
        "token_accuracy": scores["eval_token_accuracy"],
        **{name: scores[name] for name in metrics},
    }


def _log(folder, say, step: int, scores: dict[str, Any], averaged_steps=None) -> None:
    """Log and show a final evaluation (of the mean of `averaged_steps`' checkpoints)."""
    averaged = {} if averaged_steps is None else {"averaged_steps": averaged_steps}
    folder.log({"step": step, **averaged, **scores})
    say(report.eval_line(step, scores, averaged_steps=averaged_steps))


def _write_predictions(folder: RunFolder, name: str, pairs: Pairs, predictions: list[str]) -> None:
    """<folder>/`name` (process 0), when there are predictions (the data names metrics)."""
    if folder.is_main and predictions:
        report.write_predictions(pairs, predictions, folder.path / name)


def evaluate(
    eval_step: Callable,
    params,
    data: TrainingData,
    predict_fn: Callable[[list[str]], list[str]],
    batch_size: int,
    pairs: Pairs,
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
    predict_fn: Callable[[list[str]], list[str]], pairs: Pairs, metrics: tuple[str, ...]
) -> tuple[dict[str, float], list[str]]:
    """Each of `metrics` (names in METRICS) of the predictions of (source, target) `pairs`,
    and those predictions."""
    predictions = predict_fn([src for src, _ in pairs])
    targets = [tgt for _, tgt in pairs]
    return {name: METRICS[name](predictions, targets) for name in metrics}, predictions


def translate(model, tokenizer, sources: list[str], settings: EvalSettings, beam: int) -> list[str]:
    """Translations of `sources` as a run's evaluation decodes them with `settings`: greedy
    for beam 1, else beam search."""
    return decode.generate(
        model,
        tokenizer,
        sources,
        "beam" if beam > 1 else "greedy",
        beam_size=beam,
        alpha=settings.alpha,
        max_new_tokens=settings.max_new_tokens,
        batch_size=settings.batch_size,
        pad_multiple=settings.pad_multiple,
    )


# The held-out metrics, each a function of the predictions and their targets.
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
