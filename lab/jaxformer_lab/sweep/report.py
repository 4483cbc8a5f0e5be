"""A sweep's verdict, written to `results.json`, `results.md` and `curves.png` in its folder.

Per variant: each figure's mean and 95% t-interval over its finished seeds; against the
baseline, seed by seed (same seed, same data order): the mean difference of each figure
with its t-interval, and for corpus BLEU and chrF (or exact match) on the dev set the
seed-paired t-test and the crossed two-level bootstrap (jaxformer_lab.sweep.stats), each p
Holm-adjusted over every comparison the runs report (each variant against the baseline
and against each of the spec's other `readings`, in each metric), and the verdict. The
verdicts are always on dev (each run's predictions.tsv); runs that scored the test set
(final_test) show its figures beside them. A failed, diverged or missing seed is listed
and left out of the pairs. `record` gives the same tables as a results Record for the docs
(`jaxformer sweep report SPEC`), recomputed from the run folders.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import numpy as np

from jaxformer.checks import BadValue, MissingFile
from jaxformer.files import read_json, read_metrics, write_whole
from jaxformer_lab import results as results_lib
from jaxformer_lab.markdown import table as markdown_table
from jaxformer_lab.sweep import paper, stats, target
from jaxformer_lab.sweep.spec import Spec, status

# (summary key, column title, format of the mean): the figures shown, when runs report them.
FIGURES = (
    ("bleu", "dev BLEU", "{:.2f}"),
    ("chrf", "dev chrF", "{:.2f}"),
    ("exact_match", "dev exact match", "{:.2%}"),
    ("eval_perplexity", "dev perplexity", "{:.3f}"),
    ("steps_to_target", "steps to target", "{:.0f}"),
    ("seconds_to_target", "seconds to target", "{:.0f}"),
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
    write_whole(spec.out / "results.json", json.dumps(results, indent=2))
    (spec.out / "results.md").write_text(markdown(results))
    curves(spec, spec.out / "curves.png")
    return results


def record(
    spec: Spec,
    command: str,
    *,
    baseline: str | None = None,
    comparisons_only: bool = False,
    about: str = "",
    notes: tuple[str, ...] = (),
) -> tuple[results_lib.Record, dict]:
    """The report's tables as a results Record (the docs' format) and the results they
    were made from, recomputed from the run folders; `command` is the one that ran them.
    `baseline` reads the same runs against another variant (it joins the family of
    readings); `comparisons_only` leaves out the figures per variant; `about` goes before
    the first table's caption and `notes` under the last table."""
    if baseline is not None:
        if baseline not in spec.variants:
            raise BadValue(
                f"baseline {baseline!r} is not one of the variants {list(spec.variants)}"
            )
        spec = dataclasses.replace(spec, baseline=baseline, readings=spec.baselines)
    if not spec.out.is_dir():
        raise MissingFile(f"{spec.out}: no such sweep folder (run the sweep, or give its folder)")
    results = summarize(spec)
    shown = [results_lib.Table(**t) for t in tables(results, figures=not comparisons_only)]
    shown[0].caption = f"{about} {shown[0].caption}".strip()
    shown[-1].notes += notes
    made = results_lib.capture(shown, source="the sweep's run folders")
    return dataclasses.replace(made, command=command), results


def verdicts(results: dict) -> dict[str, dict[str, str]]:
    """variant -> metric -> verdict, of every variant paired with the baseline."""
    return {
        name: {metric: r["verdict"] for metric, r in v["paired"]["bootstrap"].items()}
        | {
            key: r["verdict"]
            for key, r in v["paired"].get("targets", {}).get("figures", {}).items()
        }
        for name, v in results["variants"].items()
        if "paired" in v
    }


def summarize(spec: Spec) -> dict:
    """Every run's figures, and each variant against each of the spec's baselines (its
    readings), all verdicts read as one family."""
    variants = {}
    for name in spec.variants:
        runs = {seed: status(spec.folder(name, seed)) for seed in spec.seeds}
        summaries = {s: _summary(spec, name, s) for s, st in runs.items() if st == "done"}
        variants[name] = {
            "runs": runs,
            "problems": _problems(spec, name),
            "figures": _figures(summaries.values()),
        }
        for field, key in (("machine", "machines"), ("code", "codes")):
            made_by = {s: summary.get(field) for s, summary in summaries.items()}
            if any(made_by.values()):
                variants[name][key] = made_by
        if spec.stage_of(name) is not None:
            variants[name]["stage"] = spec.stage_of(name)
        if spec.target is not None:
            variants[name]["target"] = {s: _reach(summary) for s, summary in summaries.items()}
    pairs, cache = {}, {}  # (variant, baseline) -> comparison: each pair of variants once
    for baseline in spec.baselines:
        for name in spec.variants:
            if name != baseline and (baseline, name) not in pairs:
                pairs[name, baseline] = _paired(spec, name, baseline, cache)
    comparisons = _adjust(list(pairs.values()))
    for name in spec.variants:
        if name != spec.baseline:
            variants[name]["paired"] = pairs[name, spec.baseline]
    readings = {
        b: {
            n: pairs[n, b] if (n, b) in pairs else _reversed(pairs[b, n])
            for n in spec.variants
            if n != b
        }
        for b in spec.baselines[1:]
    }
    out = {
        "out": str(spec.out),
        "baseline": spec.baseline,
        "seeds": list(spec.seeds),
        "set": "dev",
        "bootstrap_samples": stats.BOOTSTRAP_SAMPLES,
        "comparisons": comparisons,
        "variants": variants,
        "readings": readings,
    }
    if spec.target is not None:
        out["target"] = dataclasses.asdict(spec.target)
    if spec.paper is not None:
        models = {name: spec.configs(name, spec.seeds[0])[0] for name in spec.variants}
        out["paper"] = paper.summary(spec.paper, models, spec.baseline)
    return out


def _done(spec: Spec, name: str) -> list[int]:
    return [s for s in spec.seeds if status(spec.folder(name, s)) == "done"]


def _reach(summary: dict) -> dict:
    """A finished run's steps and seconds to the spec's target, or when it did not."""
    return {k: summary[k] for k in (*target.FIGURES, "not_reached") if k in summary}


def _summary(spec: Spec, name: str, seed: int) -> dict:
    """A run's summary.json, with how soon it reached the spec's target (target.reach);
    a variant started from a stage counts the stage run's wall seconds in its own (what
    the variant cost)."""
    summary = read_json(spec.folder(name, seed) / "summary.json")
    if spec.target is not None:
        summary |= target.reach(spec.folder(name, seed), spec.target)
    stage = spec.stage_of(name)
    if stage is not None and "wall_seconds" in summary:
        staged = read_json(spec.folder(stage, seed) / "summary.json")
        summary["wall_seconds"] += staged.get("wall_seconds", 0)
    return summary


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


def _paired(spec: Spec, name: str, baseline: str, cache: dict) -> dict:
    """The variant against `baseline` on the seeds both finished."""
    done = _done(spec, baseline)
    seeds = [s for s in _done(spec, name) if s in done]
    summaries = {s: _summary(spec, name, s) for s in seeds}
    base_summaries = {s: _summary(spec, baseline, s) for s in seeds}
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
    folders = {s: (spec.folder(baseline, s), spec.folder(name, s)) for s in seeds}
    out = {"seeds": seeds, "differences": differences} | _bootstraps(folders, differences, cache)
    if spec.target is not None:
        out["targets"] = target.paired(
            {s: _reach(summaries[s]) for s in seeds}, {s: _reach(base_summaries[s]) for s in seeds}
        )
    return out


def _bootstraps(folders: dict[int, tuple], differences: dict, cache: dict) -> dict:
    """The crossed two-level and (secondary) sentence-level bootstraps of each corpus
    metric (BLEU and chrF where the runs report BLEU, else exact match) on the dev
    sentences that both runs of every paired seed translated, in the same order in every
    seed (the crossed bootstrap draws one set of sentences for all seeds); empty where no
    run wrote predictions."""
    keyed = {s: [_keyed(f / "predictions.tsv", cache) for f in pair] for s, pair in folders.items()}
    keyed = {s: pair for s, pair in keyed.items() if None not in pair}
    runs = [r for pair in keyed.values() for r in pair]
    shared = [k for k in (runs[0] if runs else ()) if all(k in r for r in runs)]
    metrics = ("bleu", "chrf") if "bleu" in differences else ("exact_match",)
    two_level, sentence_level = {}, {}
    for metric in [m for m in metrics if m in differences] if shared else []:
        base, other = (
            [_run_stats(folders[s][i], metric, shared, cache) for s in keyed] for i in (0, 1)
        )
        two_level[metric] = stats.bootstrap(metric, base, other)._asdict()
        sentence_level[metric] = stats.bootstrap(
            metric, base, other, resample_seeds=False
        )._asdict()
    return {"bootstrap": two_level, "sentence_level": sentence_level}


def _run_stats(folder: pathlib.Path, metric: str, keys: list, cache: dict) -> np.ndarray:
    """[len(keys), K] statistics of the run's dev predictions of the sentences `keys`;
    each run's are computed once per summary (`cache`)."""
    rows = _keyed(folder / "predictions.tsv", cache)
    if (folder, metric) not in cache:
        refs, hyps = zip(*rows.values(), strict=True)
        index = {k: i for i, k in enumerate(rows)}
        cache[folder, metric] = index, stats.sentence_stats(metric, list(hyps), list(refs))
    index, run = cache[folder, metric]
    return run[[index[k] for k in keys]]


def _keyed(path: pathlib.Path, cache: dict | None = None) -> dict | None:
    """(source, reference, n) -> (reference, prediction) of a finished run's predictions,
    in the file's order, n counting the pair's earlier rows; None if it has none."""
    if cache is not None and path in cache:
        return cache[path]
    rows, seen, out = _predictions(path), {}, {}
    for src, ref, pred in rows or ():
        n = seen[src, ref] = seen.get((src, ref), -1) + 1
        out[src, ref, n] = (ref, pred)
    out = None if rows is None else out
    if cache is not None:
        cache[path] = out
    return out


def paired(a: pathlib.Path, b: pathlib.Path) -> list[tuple[str, str, str]]:
    """(reference, prediction in a, prediction in b) of the sentences two finished runs'
    prediction files both hold, in a's order (a (source, reference) pair that repeats is
    paired as often as both hold it); [] if either run has none."""
    rows_a, rows_b = _keyed(a), _keyed(b)
    if rows_a is None or rows_b is None:
        return []
    return [(ref, pred, rows_b[k][1]) for k, (ref, pred) in rows_a.items() if k in rows_b]


def _adjust(comparisons: list[dict]) -> int:
    """Each metric's verdict in every comparison, read as one family (stats.verdicts): the
    seed-paired t-test of the runs' summaries and the crossed bootstrap of their
    predictions; returns the family's size."""
    tested = [
        (p["differences"][m]["values"], r) for p in comparisons for m, r in p["bootstrap"].items()
    ]
    family = [(stats.t_test(values), stats.Bootstrap(**_fields(r))) for values, r in tested]
    targets = target.family(comparisons)  # a spec's target: its t-tests alone
    family += [(seed_test, None) for _, seed_test in targets]
    read = stats.verdicts(family)
    booted = len(tested)
    for (_, r), (seed_test, _), v in zip(tested, family[:booted], read[:booted], strict=True):
        r |= {"t_p": seed_test.p} | v._asdict()
    for (r, seed_test), v in zip(targets, read[booted:], strict=True):
        verdict = target.WORDS.get(v.verdict, v.verdict)
        r |= {"t_p": seed_test.p, "t_p_holm": v.t_p_holm, "verdict": verdict}
    return len(family)


def _reversed(paired: dict) -> dict:
    """A comparison read the other way round (the baseline against the variant): every
    difference negated; the p-values, and so the family, unchanged."""
    flip = {"better": "worse", "worse": "better"}

    def minus(x: float) -> float:
        return 0.0 - x  # a difference of 0 stays +0, as computed the other way round

    def negated(r: dict) -> dict:
        out = r | {"difference": minus(r["difference"]), "low": minus(r["high"])}
        out["high"] = minus(r["low"])
        return out | ({"verdict": flip.get(r["verdict"], r["verdict"])} if "verdict" in r else {})

    differences = {
        k: d | {"mean": minus(d["mean"]), "values": [minus(v) for v in d["values"]]}
        for k, d in paired["differences"].items()
    }
    out = paired | {
        "differences": differences,
        "bootstrap": {m: negated(r) for m, r in paired["bootstrap"].items()},
        "sentence_level": {m: negated(r) for m, r in paired["sentence_level"].items()},
    }
    if "targets" in paired:
        out["targets"] = target.reversed_(paired["targets"])
    return out


def _fields(result: dict) -> dict:
    return {k: result[k] for k in stats.Bootstrap._fields}


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


def tables(results: dict, figures: bool = True) -> list[dict]:
    """The report as tables, each {caption, columns, rows, align, notes} (the format of
    docs/results): with the spec's `target`, first the steps and seconds to it
    (`target.table`); the figures per variant (unless not `figures`), with each seed's
    value of the compared metric and the runs left out; then, once a variant is paired
    with the baseline, the seed-paired differences and the verdicts on the dev set; with
    the spec's `paper`, each variant beside the paper's row and the verdict against its
    finding (`paper.table`)."""
    shown = [target.table(results)] if "target" in results else []
    shown += [_figures_table(results)] if figures else []
    compared = [t for t in (_differences_table(results), _verdict_table(results)) if t]
    flat = _flat_metric(results)
    if flat and compared:
        compared[-1]["caption"] = f"**{flat}** {compared[-1]['caption']}"
    shown += compared
    if "paper" in results:
        metric = _compared_metric(results)
        title = next(t for k, t, _ in FIGURES if k == metric).removeprefix("dev ")
        shown.append(paper.table(results, metric, title))
    return [t for t in shown if t is not None]


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
        "Each variant: mean ± half-width of the 95% t-interval over the seeds it finished, "
        f"of seeds {_seed_names(results['seeds'])} (the runs column counts them)."
    )
    notes = (
        _per_seed(results),
        _left_out(results),
        _staged(results),
        _made_by(results, "machines", MACHINES_NOTE),
        _made_by(results, "codes", CODES_NOTE),
    )
    head = ["variant", "runs"] + [t for _, t, _ in shown]
    return _table(caption, head, body, "ll" + "r" * len(shown), [n for n in notes if n])


MACHINES_NOTE = (
    "The runs ran on more than one machine (summary.json's machine), whose float kernels "
    "need not round alike."
)
CODES_NOTE = (
    "The runs ran at more than one version of the code (summary.json's code: the version "
    "that finished the run)."
)


def _made_by(results: dict, key: str, note: str) -> str:
    """Which runs each machine (key "machines") or code version ("codes") made, when the
    summaries name more than one ("" else)."""
    by_maker: dict[str, dict[int, list[str]]] = {}
    for name, r in results["variants"].items():
        done = [s for s, state in r["runs"].items() if state == "done"]
        for seed in done:
            maker = r.get(key, {}).get(seed) or "Not recorded"
            by_maker.setdefault(maker, {}).setdefault(seed, []).append(name)
    if len(by_maker) < 2:
        return ""
    every = list(results["variants"])  # named as "every variant" when more than two
    parts = []
    for maker, seeds in by_maker.items():
        runs: dict[tuple, list[int]] = {}  # the seeds that share their variants, together
        for seed, names in sorted(seeds.items()):
            runs.setdefault(tuple(names), []).append(seed)
        parts.append(
            f"{maker}: "
            + "; ".join(
                f"seed{'s' * (len(s) > 1)} {_and([str(k) for k in s])} of "
                + ("every variant" if list(names) == every and len(every) > 2 else _and(names))
                for names, s in runs.items()
            )
            + "."
        )
    return f"{note} {' '.join(parts)}"


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _staged(results: dict) -> str:
    """Which variants fine-tune a stage's runs ("" if none does)."""
    parts = [f"{n} from {r['stage']}'s" for n, r in results["variants"].items() if "stage" in r]
    if not parts:
        return ""
    return (
        f"Started from a stage's runs, seed by seed: {'; '.join(parts)}; their wall seconds "
        "count the stage's."
    )


def _per_seed(results: dict) -> str:
    """Each variant's value of the compared metric, seed by seed ("" if none has one)."""
    metric = _compared_metric(results)
    title, fmt = next((t, f) for k, t, f in FIGURES if k == metric)
    parts = []
    for name, r in results["variants"].items():
        done = [s for s, state in r["runs"].items() if state == "done"]
        figure = r["figures"].get(metric)
        if figure and len(figure["values"]) == len(done):
            values = ", ".join(fmt.format(v) for v in figure["values"])
            parts.append(f"{name} {values} (seeds {_seed_names(done)})")
    return f"{title[0].upper()}{title[1:]} of each run: " + "; ".join(parts) + "." if parts else ""


# The bounds a metric cannot pass: a run at one of them in every run says little.
BOUNDS = {"bleu": (0.0, 100.0), "chrf": (0.0, 100.0), "exact_match": (0.0, 1.0)}


def _flat_metric(results: dict) -> str | None:
    """One line when the compared metric is the same in every run, or at its floor or
    ceiling in every run, naming the figures that did vary; else None."""
    metric = _compared_metric(results)
    runs = [r["figures"] for r in results["variants"].values()]
    values = [v for f in runs for v in f.get(metric, {}).get("values", [])]
    if len(values) < 2:
        return None
    low, high = BOUNDS[metric]
    fmt = next(f for k, _, f in FIGURES if k == metric)
    if all(v == low for v in values) or all(v == high for v in values):
        where = f"at its {'floor' if values[0] == low else 'ceiling'} ({fmt.format(values[0])})"
    elif len(set(values)) == 1:
        where = f"the same ({fmt.format(values[0])})"
    else:
        return None
    varied = [
        title
        for key, title, _ in FIGURES
        if len({v for f in runs for v in f.get(key, {}).get("values", [])}) > 1
    ]
    title = METRIC_TITLES[metric]
    did = f"these varied: {', '.join(varied)}" if varied else "no other figure varied"
    return (
        f"Dev {title} is {where} in every run, so its verdicts cannot tell the variants "
        f"apart; {did}."
    )


def _compared_metric(results: dict) -> str:
    """bleu where any run reports it, else exact_match."""
    runs = results["variants"].values()
    return "bleu" if any("bleu" in r["figures"] for r in runs) else "exact_match"


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
    notes = []
    if not any(p["bootstrap"] for p in paired.values()) and "target" not in results:
        notes.append(
            "No verdict: the paired runs decoded no dev sentence in common (or wrote no "
            "predictions), so the crossed bootstrap, which a verdict needs, has none to draw. "
            "Runs made before every seed was scored on the same pairs (datasets.DEV_SEED) "
            "drew each seed's own dev examples."
        )
    return _table(caption, head, body, "lr" + "r" * len(shown), notes)


def _verdict_table(results: dict) -> dict | None:
    paired = {n: r["paired"] for n, r in results["variants"].items() if "paired" in r}
    metrics = [m for m in stats.METRICS if any(m in p["bootstrap"] for p in paired.values())]
    if not metrics:
        return None
    tested = [m for m in metrics if any("test_" + m in p["differences"] for p in paired.values())]
    head = ["variant", "paired seeds", "dev sentences"]
    for m in metrics:
        title = f"dev {METRIC_TITLES[m]}"
        head += [f"Δ {title} [95% t]", f"t p / Holm ({title})", f"bootstrap [95%] ({title})"]
        head += [f"bootstrap p / Holm ({title})", f"verdict ({title})"]
    head += [f"Δ test {METRIC_TITLES[m]} [95% t], no verdict" for m in tested]
    head += [f"sentence-level p (dev {METRIC_TITLES[m]})" for m in metrics]
    body = []
    for name, p in paired.items():
        boot = p["bootstrap"]
        first = next(iter(boot.values()), None)
        row = [name, str(len(p["seeds"])), str(first["sentences"]) if first else ""]
        for m in metrics:
            row += _verdict_cells(boot.get(m), p["differences"].get(m), METRIC_FORMATS[m])
        row += [_t_interval(p["differences"].get("test_" + m), METRIC_FORMATS[m]) for m in tested]
        row += [_p(p["sentence_level"][m]) if m in p["sentence_level"] else "" for m in metrics]
        body.append(row)
    align = "lrr" + "rrrrl" * len(metrics) + "r" * (len(tested) + len(metrics))
    return _table(_verdict_caption(results, metrics, tested), head, body, align)


def _verdict_caption(results: dict, metrics: list[str], tested: list[str]) -> str:
    n, baselines = results["bootstrap_samples"], [results["baseline"], *results["readings"]]
    readings = f"each variant against {baselines[0]}"
    if len(baselines) > 1:
        readings = f"each variant against each of {', '.join(baselines)}, each pair once"
    test = (
        " The test set, which the runs scored at their end, is shown beside them (the t-interval "
        "of the seed-paired differences) and tested by no verdict."
        if tested
        else ""
    )
    return (
        f"Against {results['baseline']} on the dev set, seed by seed (same seed, same data "
        "order): the mean difference of the runs' corpus scores with its 95% t-interval over "
        "the paired seeds and the t-test's exact p; the crossed two-level bootstrap "
        f"({n:,} resamples, each drawing the seeds with replacement and one set of dev "
        "sentences that every drawn seed shares) with its 95% interval and p; each p beside "
        f"its Holm adjustment over the {results['comparisons']} comparisons reported from "
        f"these runs ({readings}; {', '.join(METRIC_TITLES[m] for m in metrics)}). "
        f"The verdict is better or worse only when both adjusted p's are below {stats.ALPHA} "
        f"on the same side.{test} Secondary, not a verdict: the sentence-level paired "
        "bootstrap (seeds fixed, so training variance is ignored). A p of "
        f"< {1 / (n + 1):.2g} is at the bootstrap's floor."
    )


def _verdict_cells(result: dict | None, seeds: dict | None, fmt: str) -> list[str]:
    if result is None or seeds is None:
        return ["", "", "", "", ""]
    t_p = f"{stats.format_p(result['t_p'])} / {stats.format_p(result['t_p_holm'])}"
    interval = f"[{fmt.format(result['low'])}, {fmt.format(result['high'])}]"
    holm = stats.format_p(result["p_holm"], result["p_holm_bound"])
    return [_t_interval(seeds, fmt), t_p, interval, f"{_p(result)} / {holm}", result["verdict"]]


def _t_interval(figure: dict | None, fmt: str) -> str:
    """ "+1.38 [+0.64, +2.12]": a mean difference and its 95% t-interval (one seed: alone)."""
    if figure is None:
        return ""
    mean, half = figure["mean"], figure["ci95"]
    if half is None:
        return fmt.format(mean)
    return f"{fmt.format(mean)} [{fmt.format(mean - half)}, {fmt.format(mean + half)}]"


def _p(result: dict) -> str:
    return stats.format_p(result["p"], result["at_floor"])


def _left_out(results: dict) -> str:
    lines = []
    for name, r in results["variants"].items():
        reasons: dict[str, list] = {}  # the seeds that share a reason, on one line
        for seed, why in r["problems"].items():
            reasons.setdefault(why, []).append(seed)
        for why, seeds in reasons.items():
            lines.append(f"- {name} seed{'s' * (len(seeds) > 1)} {_seed_names(seeds)}: {why}")
    if not lines:
        return ""
    return "Runs not compared (each comparison uses the seeds both runs finished):\n\n" + "\n".join(
        lines
    )


def _seed_names(seeds) -> str:
    return ", ".join(map(str, seeds))


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
    variants' batch sizes differ; a variant started from a stage, after its stage's): each
    variant's mean over its seeds, with a band from the lowest to the highest seed. With
    the spec's `target`, its metric against steps and training seconds (`target.curves`)."""
    if spec.target is not None:
        return target.curves(spec, out_png)
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
        stage = spec.stage_of(name)
        after = f", after {stage}" if stage else ""
        label = f"{name} ({done} of {len(spec.seeds)} seeds{after})"
        x0 = _stage_length(spec, stage, per_example) if stage else 0
        for ax, key in zip(axes, keys, strict=True):
            _band(ax, runs, key, label, f"C{i}", rows[name] if per_example else 1, x0)
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


def _stage_length(spec: Spec, stage: str, per_example: bool) -> int:
    """A stage's steps (its examples seen, `per_example`): where its variants start."""
    optim = spec.configs(stage, spec.seeds[0])[1].optim
    return optim.steps * (optim.batch_size if per_example else 1)


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


def _band(ax, evals: list[list[dict]], key: str, label: str, color: str, rows: int, x0: int):
    """Mean and min-max over the seeds that logged `key` at each step (x: x0 + step * rows),
    one series per evaluation protocol; a lone point (the final evaluation) is a square, its
    bar the range."""
    for protocol, by_step in _series(evals, key).items():
        steps = sorted(by_step)
        x = [x0 + s * rows for s in steps]
        mean = [sum(by_step[s]) / len(by_step[s]) for s in steps]
        low, high = [min(by_step[s]) for s in steps], [max(by_step[s]) for s in steps]
        name = f"{label} ({protocol})" if protocol else label
        if len(steps) == 1:
            bar = [[mean[0] - low[0]], [high[0] - mean[0]]]
            ax.errorbar(x, mean, yerr=bar, fmt="s", color=color, capsize=4, label=name)
        else:
            ax.plot(x, mean, "o-", color=color, label=name)
            ax.fill_between(x, low, high, color=color, alpha=0.2)
