"""The paper's Table 3 rerun on a laptop: its rows, scaled down by one rule, trained on the
`wyc-web` translation task (Middle English -> modern English) with the sweep runner, and
each row's change checked against the paper's directional finding.

    python experiments/table3.py [--quick] [--data wyc-web|dates] [--rows base A1 ...]
                                 [--seeds 3] [--steps 2000] [--batch-size 64] [--jobs N]
                                 [--set key=value ...] [--out runs/sweeps/table3]

The scaling rule, the same for every row: widths (d_model, d_ff, d_k, d_v) / 4, layers
N / 2, heads, dropout and label smoothing and positions as the paper; so base is N=3,
d_model 128, d_ff 512, h 8, d_k = d_v 16, and row C3 (N=8) has 4 layers.

The training rules are the paper's (section 5.3): Adam(0.9, 0.98, 1e-9) and its schedule
lr = c * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (jaxformer's `paper`
schedule), so a row's rate scales with its own d_model^-0.5 as in the paper (the C rows).
Two things are scaled to the run: warm-up is 4% of the steps (the paper's 4,000 of
100,000), and c, the same for every row, is set so that the base row peaks at 3e-3, the
rate the earlier laptop runs trained well at (with c = 1 a 128-wide model warmed up for 80
steps would peak at 1e-2). Gradients are clipped at norm 1, jaxformer's default (the paper
names no clipping).

Every row trains for the same steps and seeds; the variants are compared with base on
the dev set, seed by seed (see jaxformer.sweep.report): the difference in dev BLEU (or
exact match) with its two-level bootstrap interval, the Holm-adjusted p's of the
seed-paired t-test and of the bootstrap (the sweep's verdict needs both), and a verdict
against the paper's finding for the row: reproduces / contradicts / inconclusive.

--quick runs rows base, A1, C1 and D1 on 3 seeds (a verdict needs the seed-paired
t-interval to exclude 0 too, which the 12.7 t-quantile of two seeds all but rules out)
for 500 steps on the synthetic `dates` task, scored by exact match on 500 held-out dates:
on wyc-web, 500 steps left the base row at dev BLEU 0.21 (below copying the source, 4.7),
where no row can differ. --data wyc-web --quick runs the same on the translation task.
Runs resume if interrupted (finished ones are kept). Writes <out>/table3.md and
table3.json (and the sweep's results.md, curves.png); prints a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from jaxformer import sweep  # noqa: E402
from jaxformer.config import TABLE3_ROWS, TransformerConfig  # noqa: E402
from jaxformer.markdown import table as markdown_table  # noqa: E402
from jaxformer.sweep import stats  # noqa: E402

# The paper's Table 3: dev (newstest2013) BLEU. Its perplexities are per word-piece of
# another vocabulary and another language pair: no figure of ours is in that unit.
PAPER_BLEU = {
    "base": 25.8,
    "A1": 24.9,
    "A2": 25.5,
    "A3": 25.8,
    "A4": 25.4,
    "B1": 25.1,
    "B2": 25.4,
    "C1": 23.7,
    "C2": 25.3,
    "C3": 25.5,
    "C4": 24.5,
    "C5": 26.0,
    "C6": 25.4,
    "C7": 26.2,
    "D1": 24.6,
    "D2": 25.5,
    "D3": 25.3,
    "D4": 25.7,
    "E": 25.7,
    "big": 26.4,
}
# The paper's directional findings (section 6.2), as the row against base.
FINDINGS = {
    "A1": ("worse", "one head is worse than eight"),
    "A4": ("worse", "too many heads hurt"),
    "B1": ("worse", "a small d_k hurts"),
    "B2": ("worse", "a small d_k hurts"),
    "C1": ("worse", "bigger models are better"),
    "C2": ("worse", "bigger models are better"),
    "C3": ("better", "bigger models are better"),
    "C4": ("worse", "bigger models are better"),
    "C5": ("better", "bigger models are better"),
    "C6": ("worse", "bigger models are better"),
    "C7": ("better", "bigger models are better"),
    "D1": ("worse", "dropout helps"),
    "D3": ("worse", "label smoothing helps (BLEU)"),
    "E": ("equal", "learned and sinusoidal positions are equal"),
    "big": ("better", "bigger models are better"),
}
# What each task is scored by, and "equal" when the 95% interval of the difference lies
# within ± the margin: 1 BLEU point, or 1 point of exact match (a fraction).
METRICS = {"wyc-web": ("bleu", "BLEU", 1.0), "dates": ("exact_match", "exact match", 0.01)}
QUICK_ROWS = ("base", "A1", "C1", "D1")
LAYERS = ("num_encoder_layers", "num_decoder_layers")
SIZE_COLUMNS = (  # Table 3's: N, d_model, d_ff, h, d_k, d_v, P_drop, eps_ls, positions
    "num_encoder_layers",
    "d_model",
    "d_ff",
    "num_heads",
    "d_k",
    "d_v",
    "dropout_rate",
    "label_smoothing",
    "position_embedding",
)
COLUMNS = (  # the table's: Table 3's, then the BLEU figures and the verdict
    "row",
    "N",
    "d_model",
    "d_ff",
    "h",
    "d_k",
    "d_v",
    "P_drop",
    "eps_ls",
    "pos",
    "params (M)",
    "paper dev BLEU",
    "paper Δ",
    "our dev BLEU",
    "our Δ dev BLEU [95%]",
    "Holm p (t / bootstrap)",
    "paper's finding",
    "verdict",
    "seeds",
)
BASE_PEAK_LR = 3e-3
WARMUP_FRACTION = 0.04  # the paper's 4,000 warm-up steps of 100,000


def scaled(row: str) -> dict:
    """The row's model (the paper's base with the row's changes) by the scaling rule."""
    paper = TransformerConfig.table3(row, vocab_size=1)
    sizes = dict(d_model=paper.d_model, d_ff=paper.d_ff, d_k=paper.key_dim, d_v=paper.value_dim)
    fields = {k: v // 4 for k, v in sizes.items()}
    fields |= {name: max(1, getattr(paper, name) // 2) for name in LAYERS}
    keep = ("num_heads", "dropout_rate", "label_smoothing", "position_embedding")
    return fields | {name: getattr(paper, name) for name in keep}


def paper_training(steps: int) -> dict:
    """The paper's schedule and optimizer, warm-up and the multiplier c scaled to `steps`:
    c * d_model^-0.5 * warmup^-0.5 (the peak, at step = warmup) is BASE_PEAK_LR for base."""
    warmup = max(1, round(WARMUP_FRACTION * steps))
    c = BASE_PEAK_LR * scaled("base")["d_model"] ** 0.5 * warmup**0.5
    return dict(schedule="paper", warmup_steps=warmup, lr=round(c, 6), optimizer="adam")


def spec_file(args) -> pathlib.Path:
    """The sweep spec of the chosen rows, written into the sweep's folder."""
    evals = 1 if args.quick else 4
    data = (
        dict(dataset="wyc-web", pad_multiple=32) if args.data == "wyc-web" else dict(task="dates")
    )
    base = data | dict(
        preset="paper_base",
        steps=args.steps,
        batch_size=args.batch_size,
        eval_every=max(1, args.steps // evals),
        checkpoint_every=max(1, args.steps // 4),
        eval_examples=args.eval_examples,
    )
    base |= paper_training(args.steps) | ({"eval_beam": 1} if args.quick else {})
    spec = dict(
        base=base,
        variants={row: scaled(row) for row in args.rows},
        seeds=args.seeds,
        baseline="base" if "base" in args.rows else args.rows[0],
        out=str(args.out),
    )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "spec.json"
    path.write_text(json.dumps(spec, indent=1))
    return path


def verdict(row: str, result: dict | None, margin: float = METRICS["wyc-web"][2]) -> str:
    """The row against the paper's finding, from the bootstrap of its dev score against
    base: reproduces / contradicts / inconclusive ("" where the paper states no finding);
    "equal" reproduces when the interval lies within ± margin."""
    if row not in FINDINGS:
        return ""
    if result is None or result["seeds"] < 2:
        return "inconclusive"
    expected, ours = FINDINGS[row][0], result["verdict"]
    if expected == "equal":
        if ours in ("better", "worse"):
            return "contradicts"
        within = -margin < result["low"] and result["high"] < margin
        return "reproduces" if within else "inconclusive"
    if ours == expected:
        return "reproduces"
    return "contradicts" if ours in ("better", "worse") else "inconclusive"


def table(results: dict, spec: sweep.Spec, data: str) -> str:
    """Table 3's columns (our scaled sizes), the paper's dev BLEU and its change from base,
    our dev score over seeds (exact match in %), and the verdict against the paper's finding."""
    metric, title, margin = METRICS[data]
    scale = 100 if metric == "exact_match" else 1
    unit = " (%)" if scale == 100 else ""
    columns = (*COLUMNS[:13], f"our dev {title}{unit}", "our Δ [95%]", *COLUMNS[15:])
    rows = []
    for row, r in results["variants"].items():
        m, fig = spec.variants[row], r["figures"]
        score = fig.get(metric)
        boot = r.get("paired", {}).get("bootstrap", {}).get(metric)
        delta = "" if boot is None else _interval(boot, scale)
        holm = "" if boot is None else _holm(boot)
        finding = FINDINGS.get(row, ("", ""))
        cells = [
            row,
            *(m[k] for k in SIZE_COLUMNS),
            f"{fig['params']['mean'] / 1e6:.2f}" if "params" in fig else "",
            PAPER_BLEU[row],
            f"{PAPER_BLEU[row] - PAPER_BLEU['base']:+.1f}",
            "" if score is None else _mean(score, scale),
            delta,
            holm,
            f"{finding[1]} ({finding[0]})" if finding[0] else "",
            verdict(row, boot, margin) if row != spec.baseline else "",
            sum(s == "done" for s in r["runs"].values()),
        ]
        rows.append(cells)
    return "\n".join(markdown_table(columns, rows, "l" * len(columns))) + "\n"


def _holm(result: dict) -> str:
    """The verdict's two Holm-adjusted p's: the seed-paired t-test's and the bootstrap's."""
    t_p, p = (
        stats.format_p(result["t_p_holm"]),
        stats.format_p(result["p_holm"], result["p_holm_bound"]),
    )
    return f"{t_p} / {p}"


def _mean(figure: dict, scale: float) -> str:
    ci = figure["ci95"]
    return f"{scale * figure['mean']:.2f}" + ("" if ci is None else f" ± {scale * ci:.2f}")


def _interval(result: dict, scale: float) -> str:
    d, low, high = (scale * result[k] for k in ("difference", "low", "high"))
    return f"{d:+.2f} [{low:+.2f}, {high:+.2f}]"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help=f"rows {' '.join(QUICK_ROWS)}, 3 seeds, dates"
    )
    parser.add_argument("--data", choices=list(METRICS), help="default wyc-web; quick dates")
    parser.add_argument("--rows", nargs="+", choices=list(TABLE3_ROWS), help="default: all but big")
    parser.add_argument("--seeds", type=int, help="seeds per row (default 3)")
    parser.add_argument("--steps", type=int, help="steps per run (default 2000; quick 500)")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per step")
    parser.add_argument(
        "--eval-examples", type=int, help="dev examples evaluated (default 1000; quick 500)"
    )
    parser.add_argument("--jobs", type=int, help="runs at once (default: one per GPU, or 1)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a base field"
    )
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/sweeps/table3"))
    args = parser.parse_args(argv)
    args.data = args.data or ("dates" if args.quick else "wyc-web")
    args.rows = args.rows or list(
        QUICK_ROWS if args.quick else [r for r in TABLE3_ROWS if r != "big"]
    )
    args.seeds = args.seeds or 3
    args.steps = args.steps or (500 if args.quick else 2000)
    args.eval_examples = args.eval_examples or (500 if args.quick else 1000)
    spec = sweep.Spec.load(spec_file(args), overrides=tuple(args.set))
    results = sweep.run(spec, jobs=args.jobs)
    text = table(results, spec, args.data)
    (args.out / "table3.md").write_text(text)
    (args.out / "table3.json").write_text(json.dumps(results, indent=1))
    print(text)
    metric, _, margin = METRICS[args.data]
    base = results["variants"].get("base", {}).get("figures", {})
    verdicts = [
        verdict(row, r.get("paired", {}).get("bootstrap", {}).get(metric), margin)
        for row, r in results["variants"].items()
        if row != spec.baseline
    ]
    headline = {
        "data": args.data,
        "rows": len(args.rows),
        "seeds": args.seeds,
        "steps": args.steps,
        f"base_{metric}": base.get(metric, {}).get("mean"),
        "base_wall_seconds": base.get("wall_seconds", {}).get("mean"),
        "verdicts": {v: verdicts.count(v) for v in ("reproduces", "contradicts", "inconclusive")},
    }
    print(json.dumps(headline))
    return headline


if __name__ == "__main__":
    main()
