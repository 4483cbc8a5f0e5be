"""The floor a translation model must beat (`jaxformer bench copy-baseline`): copying the
source as the translation, scored with the runs' own metrics (sacrebleu's corpus BLEU and
chrF, jaxformer.train.evaluate) on every dev and test pair of the Bible translation
datasets as `jaxformer train` loads them (aligned by content, shared quotations removed).
No model runs, so the scores are the same on any machine. Needs `pip install
-e 'lab[data]'`; about 10 s a dataset on 2 cores (it loads each).
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxformer.checks import BadValue
from jaxformer.train.evaluate import bleu, chrf
from jaxformer_lab import bible
from jaxformer_lab.bench.registry import BENCHMARKS, Options, say, setting
from jaxformer_lab.results import Record, Table, capture

# The pair datasets with held-out pairs (kjv-bbe has none: its bbe chapters are garbled).
DATASETS = ("wyc-web", "asv-web")


@dataclass(frozen=True)
class CopyBaselineOptions(Options):
    datasets: tuple[str, ...] = setting(DATASETS, "the translation datasets scored")

    def __post_init__(self):
        super().__post_init__()
        if not self.datasets or not set(self.datasets) <= set(DATASETS):
            raise BadValue(f"--datasets must be some of {DATASETS}, got {self.datasets}")


@BENCHMARKS.register("copy-baseline", CopyBaselineOptions)
def run(options: CopyBaselineOptions) -> Record:
    """Copying the source as the translation: the dev and test BLEU a model must beat."""
    scores = {}
    for name in options.datasets:
        scores[name] = copy_scores(name)
        say(f"{name}: dev BLEU {scores[name]['dev']['bleu']:.1f}")
    table = Table(
        caption="Copying the source as the translation:",
        columns=["dataset", "dev BLEU", "dev chrF", "dev pairs"]
        + ["test BLEU", "test chrF", "test pairs"],
        align="lrrrrrr",
        rows=[
            [name]
            + [_cell(s[split], k) for split in ("dev", "test") for k in ("bleu", "chrf", "pairs")]
            for name, s in scores.items()
        ],
    )
    source = "every dev and test pair as jaxformer train loads the dataset"
    return capture([table], source=source, data={"headline": scores})


def copy_scores(name: str) -> dict[str, dict[str, float]]:
    """{split: {"pairs", "bleu", "chrf"}} of copying each source, for dev and test."""
    corpus = bible.load(name)
    scores = {}
    for split in ("dev", "test"):
        sources = [src for _, src, _ in corpus.splits[split]]
        targets = [tgt for _, _, tgt in corpus.splits[split]]
        scores[split] = {
            "pairs": len(sources),
            "bleu": round(bleu(sources, targets), 2),
            "chrf": round(chrf(sources, targets), 2),
        }
    return scores


def _cell(split: dict, key: str) -> str:
    return f"{split[key]:,}" if key == "pairs" else f"{split[key]:.1f}"
