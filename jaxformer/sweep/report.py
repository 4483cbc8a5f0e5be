"""A sweep's verdict: per variant the mean and 95% confidence interval over seeds of each
figure the runs report, the paired bootstrap p-value against the baseline, and the
curves. Written to `results.json`, `results.md` and `curves.png` in the sweep's folder."""

from __future__ import annotations

import json
import pathlib

from jaxformer.sweep import stats

# (summary key, column title, format of the mean): the figures compared, when runs report them.
FIGURES = (
    ("bleu", "BLEU", "{:.2f}"),
    ("chrf", "chrF", "{:.2f}"),
    ("test_bleu", "test BLEU", "{:.2f}"),
    ("test_chrf", "test chrF", "{:.2f}"),
    ("exact_match", "exact match", "{:.2%}"),
    ("eval_perplexity", "dev perplexity", "{:.3f}"),
    ("params", "parameters", "{:,.0f}"),
    ("train_tokens_per_second", "tokens/s", "{:,.0f}"),
    ("wall_seconds", "wall s", "{:.0f}"),
)

TITLES = {key: title for key, title, _ in FIGURES}


def write(spec) -> dict:
    """Collect every run of `spec` (a `sweep.Spec`), write the three files, return the results."""
    results = summarize(spec)
    (spec.out / "results.json").write_text(json.dumps(results, indent=2))
    (spec.out / "results.md").write_text(markdown(results))
    curves(spec, spec.out / "curves.png")
    return results


def summarize(spec) -> dict:
    from jaxformer.sweep.runner import status

    variants = {}
    for name in spec.variants:
        runs = {seed: status(spec.folder(name, seed)) for seed in spec.seeds}
        summaries = [_summary(spec.folder(name, s)) for s, st in runs.items() if st == "done"]
        figures = {}
        for key, *_ in FIGURES:
            values = [s[key] for s in summaries if s.get(key) is not None]
            if values:
                mean, ci = stats.mean_ci(values)
                figures[key] = {"mean": mean, "ci95": ci, "values": values}
        variants[name] = {"runs": runs, "figures": figures}
        if name != spec.baseline:
            variants[name]["p_value"] = p_values(spec, name)
    return {
        "out": str(spec.out),
        "baseline": spec.baseline,
        "seeds": list(spec.seeds),
        "variants": variants,
    }


def _summary(folder: pathlib.Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def p_values(spec, variant: str) -> dict:
    """Paired bootstrap p-values against the baseline, over the test predictions of the
    seeds both finished, pooled: the test set once per seed, each copy translated by that
    seed's runs, and `sentences`, how many were compared. Only the sentences both runs
    translated are compared (a variant with another tokenizer may drop other overlong
    sources). {} where the runs wrote no predictions.tsv."""
    base, other, refs = [], [], []
    for seed in spec.seeds:
        a = _predictions(spec.folder(spec.baseline, seed))
        b = _predictions(spec.folder(variant, seed))
        if a is None or b is None:
            continue
        for ref, pa, pb in _common(a, b):
            refs.append(ref)
            base.append(pa)
            other.append(pb)
    if not refs:
        return {}
    out = {"exact_match": stats.paired_exact_match(
        [p == r for p, r in zip(base, refs, strict=True)],
        [p == r for p, r in zip(other, refs, strict=True)],
    )}  # fmt: skip
    if "bleu" in _summary(spec.folder(variant, next(iter(spec.seeds)))):
        out |= stats.paired_bleu_chrf(base, other, refs)
    return out | {"sentences": len(refs)}


def _common(a: list[tuple[str, str, str]], b: list[tuple[str, str, str]]) -> list:
    """(reference, prediction in a, prediction in b) of the (source, reference) rows both
    hold, in a's order; a row that repeats is paired as often as both hold it."""
    in_b: dict[tuple[str, str], list[str]] = {}
    for src, ref, pred in b:
        in_b.setdefault((src, ref), []).append(pred)
    out = []
    for src, ref, pred in a:
        if in_b.get((src, ref)):
            out.append((ref, pred, in_b[(src, ref)].pop(0)))
    return out


def _predictions(folder: pathlib.Path) -> list[tuple[str, str, str]] | None:
    """(source, reference, prediction) rows of a finished run's predictions.tsv."""
    path = folder / "predictions.tsv"
    if not (folder / "summary.json").exists() or not path.exists():
        return None
    # Lines end in "\n" alone: an untrained model's prediction may hold "\x1c" or "\x85",
    # where splitlines() would split too.
    lines = path.read_text(encoding="utf-8").split("\n")[:-1]
    return [tuple(line.split("\t")) for line in lines]


def markdown(results: dict) -> str:
    """The comparison table: mean ± 95% CI over seeds, p-value against the baseline."""
    rows = results["variants"].values()
    shown = [f for f in FIGURES if any(f[0] in r["figures"] for r in rows)]
    main = next(
        (k for k in ("bleu", "exact_match") if any(k in r.get("p_value", {}) for r in rows)), None
    )
    head = (
        ["variant", "runs"]
        + [title for _, title, _ in shown]
        + ([f"p ({TITLES[main]})"] if main else [])
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in results["variants"].items():
        baseline = name == results["baseline"] and name != "baseline"
        cells = [name + (" (baseline)" if baseline else ""), _runs(r["runs"])]
        cells += [_cell(r["figures"].get(key), fmt) for key, _, fmt in shown]
        if main:
            p = r.get("p_value", {}).get(main)
            cells.append("" if p is None else f"{p:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    compared = sorted({r["p_value"]["sentences"] for r in rows if r.get("p_value")})
    counted = f" ({' or '.join(map(str, compared))} sentences)" if compared else ""
    note = (
        f"\nMean ± half-width of the 95% t-interval over seeds {results['seeds']}; "
        "p: paired bootstrap resampling against the baseline (1000 resamples) on the "
        "predictions.tsv of the final models (a Bible dataset's test books, else the held-out "
        f"pairs), the sentences of all seeds pooled{counted}.\n"
    )
    return "\n".join(lines) + "\n" + note


def _runs(runs: dict[int, str]) -> str:
    done = sum(s == "done" for s in runs.values())
    other = [f"{sum(s == k for s in runs.values())} {k}" for k in ("diverged", "failed", "pending")]
    return ", ".join([f"{done}/{len(runs)}"] + [o for o in other if not o.startswith("0 ")])


def _cell(figure: dict | None, fmt: str) -> str:
    if figure is None:
        return ""
    mean, ci = figure["mean"], figure["ci95"]
    if ci is None or ci == 0:  # one seed, or every seed the same (e.g. parameters)
        return fmt.format(mean)
    return f"{fmt.format(mean)} ± {fmt.format(ci)}"


def curves(spec, out_png: pathlib.Path) -> None:
    """Dev loss, and BLEU (or exact match), against steps: each variant's mean over its
    seeds, with a band from the lowest to the highest seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evals = {name: [_evals(spec.folder(name, s)) for s in spec.seeds] for name in spec.variants}
    logged = [r for runs in evals.values() for records in runs for r in records]
    keys = ("eval_loss", "bleu" if any("bleu" in r for r in logged) else "exact_match")
    titles = {
        "eval_loss": "dev loss (label-smoothed)",
        "bleu": "BLEU",
        "exact_match": "exact match",
    }
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, (name, runs) in enumerate(evals.items()):
        for ax, key in zip(axes, keys, strict=True):
            _band(ax, runs, key, name, f"C{i}")
    for ax, key in zip(axes, keys, strict=True):
        ax.set(xlabel="step", title=titles[key])
        ax.legend(fontsize=8)
    fig.suptitle(
        f"sweep {spec.out.name}: {len(spec.seeds)} seed(s) per variant (line: mean; band: min to max)"
    )
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def _evals(folder: pathlib.Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [r for r in records if "eval_loss" in r]


def _band(ax, evals: list[list[dict]], key: str, label: str, color: str) -> None:
    """Mean and min-max over the seeds that logged `key` at each step."""
    by_step: dict[int, list[float]] = {}
    for records in evals:
        for r in records:
            if r.get(key) is not None:
                by_step.setdefault(r["step"], []).append(r[key])
    if not by_step:
        return
    steps = sorted(by_step)
    values = [by_step[s] for s in steps]
    ax.plot(steps, [sum(v) / len(v) for v in values], "o-", color=color, label=label)
    ax.fill_between(
        steps, [min(v) for v in values], [max(v) for v in values], color=color, alpha=0.2
    )
