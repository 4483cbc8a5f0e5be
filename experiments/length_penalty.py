"""The beam's length penalty, tuned on dev: each run's final model (its checkpoint
average, if it made one) decodes every dev pair with the run's beam at each length
penalty alpha, and each alpha's dev BLEU is compared with the first's.

    python experiments/length_penalty.py RUN [RUN...] [--alphas 0.6 0.8 1.0 1.2 1.5] \
        [--device "..."] [--source "..."] [--note "..."] [--out results/length_penalty.json]

The runs are the seeds of one configuration (the script refuses runs that differ in
more). The paper chose its alpha 0.6 on its development set; so does this, and the test
books stay unseen (score them with the alpha chosen: `jaxformer train ... --eval-alpha A
--final-test`). A larger alpha favours longer outputs, and BLEU's brevity penalty punishes
outputs shorter than the references, so the table shows the length ratio beside the
scores. Against the first alpha, the verdict rule of jaxformer_lab.sweep.stats over the alphas
compared: the difference seed by seed with its 95% t-interval and exact p, the crossed
two-level bootstrap (the seeds, and one draw of dev sentences every seed shares; with one
run the sentences alone, so training variance is not in it and there is no verdict), each
p Holm-adjusted over the alphas, better or worse only when both are below 0.05. The best
of several alphas on the same sentences flatters itself: confirm a chosen alpha on the
test books or on runs of other seeds. Writes --out in the docs/results format
and prints a JSON line: each alpha's dev BLEU, run by run.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import pathlib
import sys

import flax
import jax
import sacrebleu

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from jaxformer.checkpoints import restore_model  # noqa: E402
from jaxformer.checks import BadValue, MissingFile, check_number  # noqa: E402
from jaxformer.train.config import RunConfig  # noqa: E402
from jaxformer.train.evaluate import EvalSettings, translate  # noqa: E402
from jaxformer.train.setup import build_data  # noqa: E402
from jaxformer_lab.sweep import stats  # noqa: E402


def load_run(folder: pathlib.Path):
    """The run's final model, tokenizer, RunConfig, data and summary."""
    if not (folder / "summary.json").is_file():
        raise MissingFile(f"{folder}: no summary.json; is it a finished `jaxformer train` run?")
    run = RunConfig.from_options(**json.loads((folder / "config.json").read_text())["run"])
    model, tokenizer = restore_model(folder)
    _, data = build_data(run, tokenizer)
    if "bleu" not in data.metrics:
        raise BadValue(f"{folder}: its data is not scored by BLEU; tune alpha on a translation run")
    return model, tokenizer, run, data, json.loads((folder / "summary.json").read_text())


def decode_at(folder: pathlib.Path, alphas: list[float]) -> dict:
    """A run's dev translations at each alpha, scored: per alpha its sacrebleu BLEU and
    chrF and its per-sentence BLEU statistics [N, K]."""
    model, tokenizer, run, data, _ = load_run(folder)
    sources, references = (list(x) for x in zip(*data.dev_pairs, strict=True))
    settings, out = EvalSettings.of(run, data), {}
    for alpha in alphas:
        print(f"{folder}: decoding {len(sources)} dev pairs at alpha {alpha:g}", file=sys.stderr)
        at_alpha = dataclasses.replace(settings, alpha=alpha)
        hyps = translate(model, tokenizer, sources, at_alpha, settings.beam)
        out[alpha] = {
            "bleu": sacrebleu.corpus_bleu(hyps, [references]),
            "chrf": sacrebleu.corpus_chrf(hyps, [references]).score,
            "sentences": stats.sentence_stats("bleu", hyps, references),
        }
    return out


def _mean(values: list[float], digits: int, sign: str = "") -> str:
    """The mean, and ± the half-width of its 95% t-interval with several values."""
    mean, half = stats.mean_ci(values)
    return f"{mean:{sign}.{digits}f}" + ("" if half is None else f" ± {half:.{digits}f}")


def rows_by_alpha(scored: list[dict], alphas: list[float]) -> list[list[str]]:
    """One row per alpha, over the runs (the seeds of one configuration): mean dev BLEU,
    chrF and length ratio (± the 95% t-interval's half-width with several runs), and
    against the first alpha the verdict of jaxformer_lab.sweep.stats over the alphas compared:
    the seed-paired difference with its t-interval and p, the crossed bootstrap's
    interval and p (the seeds and one draw of sentences; sentences alone for one run),
    each p beside its Holm adjustment over the alphas."""
    first, compared = alphas[0], alphas[1:]
    tests = [
        stats.t_test([s[alpha]["bleu"].score - s[first]["bleu"].score for s in scored])
        for alpha in compared
    ]
    results = [
        stats.bootstrap(
            "bleu",
            [s[first]["sentences"] for s in scored],
            [s[alpha]["sentences"] for s in scored],
            resample_seeds=len(scored) > 1,
        )
        for alpha in compared
    ]
    verdicts = stats.verdicts(list(zip(tests, results, strict=True)))
    rows = []
    for alpha in alphas:
        bleu = [s[alpha]["bleu"] for s in scored]
        row = [
            f"{alpha:g}",
            _mean([b.score for b in bleu], 2),
            _mean([s[alpha]["chrf"] for s in scored], 2),
            _mean([b.sys_len / b.ref_len for b in bleu], 3),
        ]
        if alpha == first:
            rows.append(row + [""] * 5)
            continue
        i = compared.index(alpha)
        t, r, v = tests[i], results[i], verdicts[i]
        rows.append(row + _verdict_cells(t, r, v))
    return rows


def _verdict_cells(t: stats.SeedTest, r: stats.Bootstrap, v: stats.Verdict) -> list[str]:
    """Δ [95% t], t p / Holm, the bootstrap's [95%] and p / Holm, and the verdict."""
    delta = f"{t.difference:+.2f}"
    if t.half_width is not None:
        delta += f" [{t.difference - t.half_width:+.2f}, {t.difference + t.half_width:+.2f}]"
    return [
        delta,
        "" if t.seeds < 2 else f"{stats.format_p(t.p)} / {stats.format_p(v.t_p_holm)}",
        f"[{r.low:+.2f}, {r.high:+.2f}]",
        f"{stats.format_p(r.p, r.at_floor)} / {stats.format_p(v.p_holm, v.p_holm_bound)}",
        v.verdict,
    ]


def check_seeds(folders: list[pathlib.Path]) -> list[int]:
    """The runs' seeds; refuse runs that differ in more than their seed and folder."""
    configs = []
    for folder in folders:
        if not (folder / "config.json").is_file():
            raise MissingFile(f"{folder}: no config.json; is it a finished `jaxformer train` run?")
        config = json.loads((folder / "config.json").read_text())
        configs.append(config["model"] | config["run"])
    for folder, config in zip(folders[1:], configs[1:], strict=True):
        differ = sorted(
            k for k in config if k not in ("seed", "out") and config[k] != configs[0].get(k)
        )
        if differ:
            raise BadValue(
                f"{folder} differs from {folders[0]} in {', '.join(differ)}: give the seeds "
                "of one configuration"
            )
    return [c["seed"] for c in configs]


def caption(seeds: list[int], beam: int, pairs: int, alphas: list[float]) -> str:
    """What the table shows, worded for one run or for several seeds."""
    several = len(seeds) > 1
    return (
        f"The final model of each run (seeds {', '.join(map(str, seeds))}; beam {beam}), "
        f"decoding every dev pair ({pairs}) at each length penalty alpha: "
        + ("the mean over the seeds ± the half-width of its 95% t-interval; " if several else "")
        + f"against alpha {alphas[0]:g}, "
        + (
            "the seed-by-seed difference with its 95% t-interval and exact p, the crossed "
            "bootstrap (the seeds, and one draw of sentences that every seed shares) with its "
            "95% interval and p, "
            if several
            else "the difference and the 95% interval and p of the bootstrap over the dev "
            "sentences (one model: training variance not in it, so no verdict), "
        )
        + f"each p beside its Holm adjustment over the {len(alphas) - 1} alphas compared, "
        "and the verdict (better or worse only when both adjusted p's are below 0.05 on the "
        "same side). Alpha is chosen on these dev sentences and scored on them: the best of "
        "several flatters itself; the test books are its fair score:"
    )


def results_file(args: argparse.Namespace, seeds: list[int], scored: list[dict], rows) -> dict:
    """The docs/results file: the command, the machine, the table and each run's scores."""
    pairs = len(scored[0][args.alphas[0]]["sentences"])
    beam = json.loads((args.runs[0] / "summary.json").read_text())["eval_beam"]
    first = f"{args.alphas[0]:g}"
    per_run = "; ".join(
        f"alpha {a:g}: " + ", ".join(f"{s[a]['bleu'].score:.2f}" for s in scored)
        for a in args.alphas
    )
    return {
        "command": "python experiments/length_penalty.py "
        + " ".join([*map(str, args.runs), "--alphas", *map(str, args.alphas)]),
        "device": args.device,
        "versions": {"jax": jax.__version__, "flax": flax.__version__},
        "date": datetime.date.today().isoformat(),
        "source": args.source,
        "tables": [
            {
                "caption": caption(seeds, beam, pairs, args.alphas),
                "columns": [
                    "alpha",
                    "dev BLEU",
                    "dev chrF",
                    "output / reference length",
                    f"Δ dev BLEU against {first} [95% t]",
                    "t p / Holm",
                    "bootstrap [95%]",
                    "bootstrap p / Holm",
                    "verdict",
                ],
                "align": "rrrrrrrrl",
                "rows": rows,
                "notes": [f"Dev BLEU of each run (seeds {', '.join(map(str, seeds))}): {per_run}."]
                + args.note,
            }
        ],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "runs",
        type=pathlib.Path,
        nargs="+",
        help="finished `jaxformer train` run folders: the seeds of one configuration",
    )
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.6, 0.8, 1.0, 1.2, 1.5])
    parser.add_argument("--device", default="2-core CPU", help="the machine, in words")
    parser.add_argument("--source", default="the run folders named by the command")
    parser.add_argument("--note", action="append", default=[], help="a note under the table")
    parser.add_argument("--out", default="results/length_penalty.json")
    args = parser.parse_args(argv)
    try:
        for alpha in args.alphas:
            check_number("alpha", alpha, "[0, inf)")
        seeds = check_seeds(args.runs)
        scored = [decode_at(folder, args.alphas) for folder in args.runs]
        rows = rows_by_alpha(scored, args.alphas)
    except (BadValue, MissingFile) as error:
        parser.error(str(error))
    result = results_file(args, seeds, scored, rows)
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    line = {
        "runs": [str(r) for r in args.runs],
        "dev_bleu": {a: [round(s[a]["bleu"].score, 2) for s in scored] for a in args.alphas},
    }
    print(json.dumps(line))
    return line


if __name__ == "__main__":
    main()
