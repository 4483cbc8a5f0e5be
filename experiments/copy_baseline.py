"""The floor a translation model must beat: copying the source as the translation, scored
with the run's own metrics (sacrebleu corpus BLEU and chrF, jaxformer.train.evaluate)
on every dev and test pair of the Bible translation datasets as `jaxformer train` loads
them (aligned by content, shared quotations removed). See docs/data.md, "Other figures".

    python experiments/copy_baseline.py [--out docs/results/copy_baselines.json]

Needs `pip install 'jaxformer[data]'`; about 20 s on 2 cores (it loads each dataset). Prints a
final JSON line and writes --out in the docs/results format.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib

import sacrebleu

from jaxformer.data import bible
from jaxformer.train.metrics import bleu, chrf

# The pair datasets with held-out pairs (kjv-bbe has none: its bbe chapters are garbled).
DATASETS = ("wyc-web", "asv-web")


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/results/copy_baselines.json")
    args = parser.parse_args()
    scores = {name: copy_scores(name) for name in DATASETS}
    rows = [
        [name, f"{s['dev']['bleu']:.1f}", f"{s['dev']['chrf']:.1f}", f"{s['dev']['pairs']:,}"]
        + [f"{s['test']['bleu']:.1f}", f"{s['test']['chrf']:.1f}", f"{s['test']['pairs']:,}"]
        for name, s in scores.items()
    ]
    result = {
        "command": "python experiments/copy_baseline.py",
        "device": "any (no model; deterministic)",
        "versions": {"sacrebleu": sacrebleu.__version__},
        "date": datetime.date.today().isoformat(),
        "source": "every dev and test pair as jaxformer train loads the dataset",
        "tables": [
            {
                "caption": "Copying the source as the translation:",
                "columns": [
                    "dataset",
                    "dev BLEU",
                    "dev chrF",
                    "dev pairs",
                    "test BLEU",
                    "test chrF",
                    "test pairs",
                ],
                "align": "lrrrrrr",
                "rows": rows,
            }
        ],
    }
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(scores))


if __name__ == "__main__":
    main()
