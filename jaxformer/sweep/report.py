"""A sweep's verdict, written to `results.json`, `results.md` and `curves.png` in its folder.

Per variant: each figure's mean and 95% t-interval over its finished seeds; against the
baseline, seed by seed (same seed, same data order): the mean difference of each figure
with its t-interval, and the two-level bootstrap (seeds, then sentences) of the difference
in corpus BLEU and chrF (or exact match) on the compared set, with its 95% interval,
p-value, Holm-adjusted p over the sweep's variants and verdict. The compared set is dev
(each run's predictions.tsv) unless the spec's base sets final_test (test_predictions.tsv).
A failed, diverged or missing seed is listed and left out of the pairs.
"""

from __future__ import annotations

import json
import pathlib

from jaxformer.checks import BadValue
from jaxformer.markdown import table as markdown_table
from jaxformer.sweep import stats
from jaxformer.sweep.spec import Spec, status
from jaxformer.train.run_folder import read_json, read_metrics

# (summary key, column title, format of the mean): the figures shown, when runs report them.
FIGURES = (
    ("bleu", "dev BLEU", "{:.2f}"),
    ("chrf", "dev chrF", "{:.2f}"),
    ("exact_match", "dev exact match", "{:.2%}"),
    ("eval_perplexity", "dev perplexity", "{:.3f}"),
    ("test_bleu", "test BLEU", "{:.2f}"),
    ("test_chrf", "test chrF", "{:.2f}"),
    ("test_exact_match", "test exact match", "{:.2%}"),
    ("params", "parameters", "{:,.0f}"),
    ("train_tokens_per_second", "tokens/s", "{:,.0f}"),
    ("wall_seconds", "wall s", "{:.0f}"),
)
METRIC_TITLES = {"bleu": "BLEU", "chrf": "chrF", "exact_match": "exact match"}
METRIC_FORMATS = {"bleu": "{:+.2f}", "chrf": "{:+.2f}", "exact_match": "{:+.2%}"}


def write(spec: Spec) -> dict:
    """Collect every run of `spec`, write the three files, return the results."""
    results = summarize(spec)
    (spec.out / "results.json").write_text(json.dumps(results, indent=2))
    (spec.out / "results.md").write_text(markdown(results))
    curves(spec, spec.out / "curves.png")
    return results


def summarize(spec: Spec) -> dict:
    variants = {}
    for name in spec.variants:
        runs = {seed: status(spec.folder(name, seed)) for seed in spec.seeds}
        summaries = {s: _summary(spec.folder(name, s)) for s, st in runs.items() if st == "done"}
        variants[name] = {
            "runs": runs,
            "problems": _problems(spec, name),
            "figures": _figures(summaries.values()),
        }
    base_summaries = {
        s: _summary(spec.folder(spec.baseline, s)) for s in _done(spec, spec.baseline)
    }
    for name in spec.variants:
        if name != spec.baseline:
            variants[name]["paired"] = _paired(spec, name, base_summaries)
    _adjust(variants, prefix="test_" if spec.on_test else "")
    return {
        "out": str(spec.out),
        "baseline": spec.baseline,
        "seeds": list(spec.seeds),
        "set": "test" if spec.on_test else "dev",
        "bootstrap_samples": stats.BOOTSTRAP_SAMPLES,
        "variants": variants,
    }


def _done(spec: Spec, name: str) -> list[int]:
    return [s for s in spec.seeds if status(spec.folder(name, s)) == "done"]


def _summary(folder: pathlib.Path) -> dict:
    return read_json(folder / "summary.json")


def _figures(summaries) -> dict:
    figures = {}
    for key, *_ in FIGURES:
        values = [s[key] for s in summaries if s.get(key) is not None]
        if values:
            mean, ci = stats.mean_ci(values)
            figures[key] = {"mean": mean, "ci95": ci, "values": values}
    return figures


def _problems(spec: Spec, name: str) -> dict[int, str]:
    """seed -> why it is not compared: "failed: <last line of its log>", "pending", ..."""
    out = {}
    for seed in spec.seeds:
        folder, state = spec.folder(name, seed), status(spec.folder(name, seed))
        if state in ("failed", "diverged"):
            message = read_json(folder / f"{state}.json").get("message", "")
            out[seed] = f"{state}: {message}".strip(": ")
        elif state == "pending":
            out[seed] = "pending (not run, or interrupted)"
    return out


def _paired(spec: Spec, name: str, base_summaries: dict[int, dict]) -> dict:
    """The variant against the baseline on the seeds both finished."""
    seeds = [s for s in _done(spec, name) if s in base_summaries]
    summaries = {s: _summary(spec.folder(name, s)) for s in seeds}
    differences = {}
    for key, *_ in FIGURES:
        values = [
            summaries[s][key] - base_summaries[s][key]
            for s in seeds
            if summaries[s].get(key) is not None and base_summaries[s].get(key) is not None
        ]
        if values:
            mean, ci = stats.mean_ci(values)
            differences[key] = {"mean": mean, "ci95": ci, "values": values}
    return {"seeds": seeds, "differences": differences} | _bootstraps(spec, name, seeds, summaries)


def _bootstraps(spec: Spec, name: str, seeds: list[int], summaries: dict[int, dict]) -> dict:
    """The two-level and (secondary) sentence-level bootstraps of each corpus metric on the
    compared set's predictions of the paired seeds; empty where no run wrote them."""
    rows = _paired_rows(spec, name, seeds)
    if not rows:
        return {"bootstrap": {}, "sentence_level": {}}
    bleu_data = any("bleu" in summaries[s] for s in rows)
    two_level, sentence_level = {}, {}
    for metric in ("bleu", "chrf") if bleu_data else ("exact_match",):
        base, other = _sentence_stats(metric, rows, 1), _sentence_stats(metric, rows, 2)
        two_level[metric] = stats.bootstrap(metric, base, other)._asdict()
        sentence_level[metric] = stats.bootstrap(
            metric, base, other, resample_seeds=False
        )._asdict()
    return {"bootstrap": two_level, "sentence_level": sentence_level}


def _sentence_stats(metric: str, rows: dict[int, list], column: int) -> list:
    """Per seed, the [N, K] statistics of the predictions in `column` (1 baseline, 2 variant)."""
    return [
        stats.sentence_stats(metric, [r[column] for r in seed], [r[0] for r in seed])
        for seed in rows.values()
    ]


def _paired_rows(spec: Spec, name: str, seeds: list[int]) -> dict[int, list]:
    """seed -> (reference, baseline's prediction, variant's) of the compared set's
    sentences both runs translated, for the seeds where both wrote predictions."""
    file = "test_predictions.tsv" if spec.on_test else "predictions.tsv"
    rows = {}
    for s in seeds:
        common = paired(spec.folder(spec.baseline, s) / file, spec.folder(name, s) / file)
        if common:
            rows[s] = common
    return rows


def paired(a: pathlib.Path, b: pathlib.Path) -> list[tuple[str, str, str]]:
    """(reference, prediction in a, prediction in b) of the sentences two finished runs'
    prediction files both hold, in a's order; [] if either run has none."""
    rows_a, rows_b = _predictions(a), _predictions(b)
    return _common(rows_a, rows_b) if rows_a is not None and rows_b is not None else []


def _adjust(variants: dict, prefix: str) -> None:
    """Holm's adjustment, per metric, across the variants compared, and each verdict (with
    the t-interval of the seed-paired differences of the summaries' `prefix + metric`)."""
    compared = [r["paired"] for r in variants.values() if "paired" in r]
    for metric in stats.METRICS:
        pairs = [(p, p["bootstrap"][metric]) for p in compared if metric in p["bootstrap"]]
        adjusted = stats.holm([r["p"] for _, r in pairs], [r["at_floor"] for _, r in pairs])
        for (paired, r), (p, bound) in zip(pairs, adjusted, strict=True):
            r["p_holm"], r["p_holm_bound"] = p, bound
            seeds = paired["differences"].get(prefix + metric)
            interval = None
            if seeds and seeds["ci95"] is not None:
                interval = (seeds["mean"] - seeds["ci95"], seeds["mean"] + seeds["ci95"])
            r["verdict"] = stats.verdict(stats.Bootstrap(**_fields(r)), p, interval)


def _fields(result: dict) -> dict:
    return {k: result[k] for k in stats.Bootstrap._fields}


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


def _predictions(path: pathlib.Path) -> list[tuple[str, str, str]] | None:
    """(source, reference, prediction) rows of a finished run's predictions file; a line
    of another shape is an error naming the file and the line."""
    if not (path.parent / "summary.json").exists() or not path.exists():
        return None
    # Lines end in "\n" alone: an untrained model's prediction may hold "\x1c" or "\x85",
    # where splitlines() would split too.
    try:
        lines = path.read_text(encoding="utf-8").split("\n")[:-1]
    except UnicodeDecodeError as e:
        raise BadValue(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    rows = [tuple(line.split("\t")) for line in lines]
    for number, row in enumerate(rows, 1):
        if len(row) != 3:
            raise BadValue(
                f"{path}:{number}: expected source<TAB>reference<TAB>prediction, got "
                f"{len(row)} field(s)"
            )
    return rows


def markdown(results: dict) -> str:
    """The report's tables, each with its caption and notes, as markdown."""
    lines: list[str] = []
    for t in tables(results):
        lines += [t["caption"], "", *markdown_table(t["columns"], t["rows"], t["align"]), ""]
        for note in t["notes"]:
            lines += [note, ""]
    return "\n".join(lines)


def tables(results: dict) -> list[dict]:
    """The report as tables, each {caption, columns, rows, align, notes} (the format of
    docs/results): the figures per variant, with each seed's value of the compared metric
    and the runs left out; then, once a variant is paired with the baseline, the
    seed-paired differences and the bootstrap verdicts on the compared set."""
    return [
        t
        for t in (_figures_table(results), _differences_table(results), _verdict_table(results))
        if t is not None
    ]


def _table(caption: str, head: list[str], rows: list[list[str]], align: str, notes=()) -> dict:
    return {"caption": caption, "columns": head, "rows": rows, "align": align, "notes": list(notes)}


def _label(name: str, results: dict) -> str:
    return name + (" (baseline)" if name == results["baseline"] and name != "baseline" else "")


def _figures_table(results: dict) -> dict:
    rows = results["variants"]
    shown = [f for f in FIGURES if any(f[0] in r["figures"] for r in rows.values())]
    body = [
        [_label(name, results), _runs(r["runs"])]
        + [_cell(r["figures"].get(k), fmt) for k, _, fmt in shown]
        for name, r in rows.items()
    ]
    caption = (
        "Each variant: mean ± half-width of the 95% t-interval over its finished seeds "
        f"{results['seeds']}."
    )
    notes = [n for n in (_per_seed(results), _left_out(results)) if n]
    head = ["variant", "runs"] + [t for _, t, _ in shown]
    return _table(caption, head, body, "ll" + "r" * len(shown), notes)


def _per_seed(results: dict) -> str:
    """Each variant's value of the compared metric, seed by seed ("" if none has one)."""
    metric = ("test_" if results["set"] == "test" else "") + _compared_metric(results)
    title, fmt = next((t, f) for k, t, f in FIGURES if k == metric)
    parts = []
    for name, r in results["variants"].items():
        done = [s for s, state in r["runs"].items() if state == "done"]
        figure = r["figures"].get(metric)
        if figure and len(figure["values"]) == len(done):
            values = ", ".join(fmt.format(v) for v in figure["values"])
            seeds = ", ".join(str(seed) for seed in done)
            parts.append(f"{name} {values} (seeds {seeds})")
    return f"{title[0].upper()}{title[1:]} of each run: " + "; ".join(parts) + "." if parts else ""


def _compared_metric(results: dict) -> str:
    """bleu where any run reports it, else exact_match."""
    runs = results["variants"].values()
    return (
        "bleu"
        if any("bleu" in r["figures"] or "test_bleu" in r["figures"] for r in runs)
        else "exact_match"
    )


def _differences_table(results: dict) -> dict | None:
    paired = {n: r["paired"] for n, r in results["variants"].items() if "paired" in r}
    shown = [f for f in FIGURES if any(f[0] in p["differences"] for p in paired.values())]
    if not paired or not shown:
        return None
    body = [
        [name, str(len(p["seeds"]))]
        + [
            _cell(p["differences"].get(k), fmt.replace("{:", "{:+"), signed=True)
            for k, _, fmt in shown
        ]
        for name, p in paired.items()
    ]
    caption = (
        f"Variant minus {results['baseline']}, seed by seed (same seed, same data order): the "
        "mean difference ± half-width of its 95% t-interval over the paired seeds."
    )
    head = ["variant", "paired seeds"] + [f"Δ {t}" for _, t, _ in shown]
    return _table(caption, head, body, "lr" + "r" * len(shown))


def _verdict_table(results: dict) -> dict | None:
    paired = {n: r["paired"] for n, r in results["variants"].items() if "paired" in r}
    metrics = [m for m in stats.METRICS if any(m in p["bootstrap"] for p in paired.values())]
    if not metrics:
        return None
    where = "on the TEST set" if results["set"] == "test" else "on the dev set"
    head = ["variant", "paired seeds", "sentences"]
    for m in metrics:
        title = f"{results['set']} {METRIC_TITLES[m]}"
        head += [f"Δ {title} [95%]", f"p ({title})", f"Holm p ({title})", f"verdict ({title})"]
    head += [f"sentence-level p ({results['set']} {METRIC_TITLES[m]})" for m in metrics]
    body = []
    for name, p in paired.items():
        boot = p["bootstrap"]
        first = next(iter(boot.values()), None)
        row = [name, str(len(p["seeds"])), str(first["sentences"]) if first else ""]
        for m in metrics:
            row += _bootstrap_cells(boot.get(m), METRIC_FORMATS[m])
        row += [_p(p["sentence_level"][m]) if m in p["sentence_level"] else "" for m in metrics]
        body.append(row)
    n = results["bootstrap_samples"]
    caption = (
        f"Against {results['baseline']} {where}: two-level paired bootstrap ({n:,} resamples: "
        "the seeds both finished, then the sentences within each seed) of the mean over seeds "
        "of the corpus-score difference; its 95% interval, p-value, Holm's adjustment over "
        f"the {len(paired)} variant(s), and the verdict (better/worse when the Holm p < "
        f"{stats.ALPHA} and both this interval and the seed-paired t-interval of the "
        "differences table exclude 0). Secondary, not a verdict: the "
        "sentence-level paired bootstrap (seeds fixed, so training variance is ignored; "
        f"so it understates the uncertainty when seeds disagree). A p of < {1 / (n + 1):.2g} is at the "
        "bootstrap's floor."
    )
    align = "lrr" + "rrrl" * len(metrics) + "r" * len(metrics)
    return _table(caption, head, body, align)


def _bootstrap_cells(result: dict | None, fmt: str) -> list[str]:
    if result is None:
        return ["", "", "", ""]
    interval = f"{fmt.format(result['difference'])} [{fmt.format(result['low'])}, {fmt.format(result['high'])}]"
    holm = stats.format_p(result["p_holm"], result["p_holm_bound"])
    return [interval, _p(result), holm, result["verdict"]]


def _p(result: dict) -> str:
    return stats.format_p(result["p"], result["at_floor"])


def _left_out(results: dict) -> str:
    lines = [
        f"- {name} seed {seed}: {why}"
        for name, r in results["variants"].items()
        for seed, why in r["problems"].items()
    ]
    if not lines:
        return ""
    return "Runs not compared (each comparison uses the seeds both runs finished):\n\n" + "\n".join(
        lines
    )


def _runs(runs: dict[int, str]) -> str:
    done = sum(s == "done" for s in runs.values())
    other = [f"{sum(s == k for s in runs.values())} {k}" for k in ("diverged", "failed", "pending")]
    return ", ".join([f"{done}/{len(runs)}"] + [o for o in other if not o.startswith("0 ")])


def _cell(figure: dict | None, fmt: str, signed: bool = False) -> str:
    if figure is None:
        return ""
    mean, ci = figure["mean"], figure["ci95"]
    if ci is None or (ci == 0 and not signed):  # one seed, or every seed the same (parameters)
        return fmt.format(mean)
    return f"{fmt.format(mean)} ± {fmt.format(ci).lstrip('+')}"


def curves(spec: Spec, out_png: pathlib.Path) -> None:
    """Dev loss, and BLEU (or exact match), against steps (against examples seen when the
    variants' batch sizes differ): each variant's mean over its seeds, with a band from the
    lowest to the highest seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evals = {name: [_evals(spec.folder(name, s)) for s in spec.seeds] for name in spec.variants}
    logged = [r for runs in evals.values() for records in runs for r in records]
    keys = ("eval_loss", "bleu" if any("bleu" in r for r in logged) else "exact_match")
    titles = {
        "eval_loss": "dev loss (label-smoothed)",
        "bleu": "dev BLEU",
        "exact_match": "dev exact match",
    }
    rows = {name: spec.configs(name, spec.seeds[0])[1].optim.batch_size for name in spec.variants}
    per_example = len(set(rows.values())) > 1
    legend_rows = len(spec.variants)  # under both plots: up to 2 entries a variant, 2 a row
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2 + 0.25 * legend_rows), layout="constrained")
    for i, (name, runs) in enumerate(evals.items()):
        done = len(_done(spec, name))
        label = f"{name} ({done} of {len(spec.seeds)} seeds)"
        for ax, key in zip(axes, keys, strict=True):
            _band(ax, runs, key, label, f"C{i}", rows[name] if per_example else 1)
    for ax, key in zip(axes, keys, strict=True):
        xlabel = "examples seen (steps x batch size)" if per_example else "step"
        ax.set(xlabel=xlabel, title=titles[key])
    fig.suptitle(f"sweep {spec.out.name}: mean over the finished seeds (line), min to max (band)")
    handles, labels = axes[0].get_legend_handles_labels()
    if labels:  # some run logged an evaluation
        fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def _evals(folder: pathlib.Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    if not path.exists():
        return []
    return [r for r in read_metrics(path) if "eval_loss" in r]


def _series(evals: list[list[dict]], key: str) -> dict[str, dict[int, list[float]]]:
    """`key`'s values over the seeds' evaluation records, by protocol ("greedy, 200 pairs":
    an in-run sample and the final set are different measurements), then by step."""
    series: dict[str, dict[int, list[float]]] = {}
    for records in evals:
        for r in records:
            if r.get(key) is None:
                continue
            beam, pairs = r.get("eval_beam"), r.get("eval_pairs")
            protocol = ""
            if beam is not None and pairs is not None:
                protocol = f"{'greedy' if beam == 1 else f'beam {beam}'}, {pairs} pairs"
            series.setdefault(protocol, {}).setdefault(r["step"], []).append(r[key])
    return series


def _band(ax, evals: list[list[dict]], key: str, label: str, color: str, rows: int) -> None:
    """Mean and min-max over the seeds that logged `key` at each step (x: step * rows), one
    series per evaluation protocol; a lone point (the final evaluation) is a square, its bar
    the range."""
    for protocol, by_step in _series(evals, key).items():
        steps = sorted(by_step)
        x = [s * rows for s in steps]
        mean = [sum(by_step[s]) / len(by_step[s]) for s in steps]
        low, high = [min(by_step[s]) for s in steps], [max(by_step[s]) for s in steps]
        name = f"{label} ({protocol})" if protocol else label
        if len(steps) == 1:
            bar = [[mean[0] - low[0]], [high[0] - mean[0]]]
            ax.errorbar(x, mean, yerr=bar, fmt="s", color=color, capsize=4, label=name)
        else:
            ax.plot(x, mean, "o-", color=color, label=name)
            ax.fill_between(x, low, high, color=color, alpha=0.2)
