"""The paper's Table 3 rerun on a laptop: its rows, scaled down by one rule, trained on the
`wyc-web` translation task (Middle English -> modern English) with the sweep runner.

    python experiments/table3.py [--quick] [--rows base A1 ...] [--seeds 3] [--steps 2000]
                                 [--batch-size 64] [--jobs N] [--out runs/sweeps/table3]

The scaling rule, the same for every row: widths (d_model, d_ff, d_k, d_v) / 4, layers
N / 2, heads, dropout, label smoothing and positions as the paper; so base is N=3,
d_model 128, d_ff 512, h 8, d_k = d_v 16, and row C3 (N=8) has 4 layers. Every row trains
for the same steps with the same schedule (warm-up cosine, Adam as the paper), batch 64,
batches padded to multiples of 32 tokens (9 compiled shapes), and is evaluated four times
on the dev books with beam 4, alpha 0.6 (BLEU, chrF, perplexity); the final model is
scored on the test books (test BLEU, and the p-value against base). --quick trains 400
steps at batch 32, one seed, rows base, A1, B1, C1 and E, and evaluates once, at the end,
on 200 dev and 200 test pairs: a check of the pipeline and of its time, too short to rank
the rows. Runs resume if interrupted (finished ones are kept). Writes <out>/table3.md and
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

# The paper's Table 3: dev (newstest2013) perplexity per word-piece and BLEU, params x 10^6.
PAPER = {
    "base": (4.92, 25.8, 65), "A1": (5.29, 24.9, None), "A2": (5.00, 25.5, None),
    "A3": (4.91, 25.8, None), "A4": (5.01, 25.4, None), "B1": (5.16, 25.1, 58),
    "B2": (5.01, 25.4, 60), "C1": (6.11, 23.7, 36), "C2": (5.19, 25.3, 50),
    "C3": (4.88, 25.5, 80), "C4": (5.75, 24.5, 28), "C5": (4.66, 26.0, 168),
    "C6": (5.12, 25.4, 53), "C7": (4.75, 26.2, 90), "D1": (5.77, 24.6, None),
    "D2": (4.95, 25.5, None), "D3": (4.67, 25.3, None), "D4": (5.47, 25.7, None),
    "E": (4.92, 25.7, None), "big": (4.33, 26.4, 213),
}  # fmt: skip
QUICK_ROWS = ("base", "A1", "B1", "C1", "E")
LAYERS = ("num_encoder_layers", "num_decoder_layers")


def scaled(row: str) -> dict:
    """The row's model (the paper's base with the row's changes) by the scaling rule."""
    paper = TransformerConfig.table3(row, vocab_size=1)
    sizes = dict(d_model=paper.d_model, d_ff=paper.d_ff, d_k=paper.key_dim, d_v=paper.value_dim)
    fields = {k: v // 4 for k, v in sizes.items()}
    fields |= {name: max(1, getattr(paper, name) // 2) for name in LAYERS}
    keep = ("num_heads", "dropout_rate", "label_smoothing", "position_embedding")
    return fields | {name: getattr(paper, name) for name in keep}


def spec_file(args) -> pathlib.Path:
    """The sweep spec of the chosen rows, written into the sweep's folder."""
    evals = 1 if args.quick else 4
    base = dict(
        dataset="wyc-web", preset="paper_base", steps=args.steps, batch_size=args.batch_size,
        eval_every=max(1, args.steps // evals), checkpoint_every=max(1, args.steps // 4),
        eval_examples=args.eval_examples, pad_multiple=32,
    )  # fmt: skip
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


def table(results: dict, spec: sweep.Spec) -> str:
    """Table 3's columns (our scaled sizes), the paper's figures, and ours over seeds."""
    head = (
        "| row | N | d_model | d_ff | h | d_k | d_v | P_drop | eps_ls | pos | "
        "paper PPL | paper BLEU | paper params (M) | BLEU | chrF | dev PPL | test BLEU | params (M) | "
        "p (test BLEU) | runs |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row, r in results["variants"].items():
        m, fig = spec.variants[row], r["figures"]

        def cell(key, fmt="{:.2f}", fig=fig):
            f = fig.get(key)
            if f is None:
                return ""
            return fmt.format(f["mean"]) + ("" if not f["ci95"] else " ± " + fmt.format(f["ci95"]))

        ppl, bleu, params = PAPER[row]
        p = r.get("p_value", {}).get("bleu")
        cells = [
            row, m["num_encoder_layers"], m["d_model"], m["d_ff"], m["num_heads"], m["d_k"],
            m["d_v"], m["dropout_rate"], m["label_smoothing"], m["position_embedding"],
            ppl, bleu, params or "", cell("bleu"), cell("chrf"), cell("eval_perplexity"),
            cell("test_bleu"),
            f"{fig['params']['mean'] / 1e6:.2f}" if "params" in fig else "",
            "" if p is None else f"{p:.3f}", sum(s == "done" for s in r["runs"].values()),
        ]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="400 steps, 1 seed, 5 rows")
    parser.add_argument("--rows", nargs="+", choices=list(TABLE3_ROWS), help="default: all but big")
    parser.add_argument("--seeds", type=int, help="seeds per row (default 3; quick 1)")
    parser.add_argument("--steps", type=int, help="steps per run (default 2000; quick 400)")
    parser.add_argument("--batch-size", type=int, help="pairs per step (default 64; quick 32)")
    parser.add_argument(
        "--eval-examples", type=int, help="dev pairs evaluated (default all; quick 200)"
    )
    parser.add_argument("--jobs", type=int, help="runs at once (default: one per GPU, or 1)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/sweeps/table3"))
    args = parser.parse_args(argv)
    args.rows = args.rows or list(
        QUICK_ROWS if args.quick else [r for r in TABLE3_ROWS if r != "big"]
    )
    args.seeds = args.seeds or (1 if args.quick else 3)
    args.steps = args.steps or (400 if args.quick else 2000)
    args.batch_size = args.batch_size or (32 if args.quick else 64)
    args.eval_examples = args.eval_examples or (200 if args.quick else 1000)
    spec = sweep.Spec.load(spec_file(args))
    results = sweep.run(spec, jobs=args.jobs)
    text = table(results, spec)
    (args.out / "table3.md").write_text(text)
    (args.out / "table3.json").write_text(json.dumps(results, indent=1))
    print(text)
    base = results["variants"].get("base", {}).get("figures", {})
    headline = {
        "rows": len(args.rows), "seeds": args.seeds, "steps": args.steps,
        "base_bleu": base.get("bleu", {}).get("mean"),
        "base_wall_seconds": base.get("wall_seconds", {}).get("mean"),
    }  # fmt: skip
    print(json.dumps(headline))
    return headline


if __name__ == "__main__":
    main()
