"""Single runs of the wyc-web speedrun compared with the first, the speedrun command's run:
the tables of `jaxformer sweep report --runs RUN...`, each run read from its summary.json,
config.json, metrics.jsonl and predictions.tsv.

    jaxformer sweep report --runs runs/speedrun runs/speedrun-no-dropout --out speedrun.json

The first run must be the speedrun command's (SPEEDRUN, its folder aside). A run is named
by the options in which it differs from the first, and the dev BLEU of its final model
(with average_checkpoints, the average's) is compared with the first run's on the same
dev sentences: the difference with the 95% interval of the paired bootstrap over
sentences, no verdict (one seed each: the variance between training runs is not in it).
A pair (BASE, RUN) compares two of the runs the same way. An evaluation's time is the
wall clock when it ended. The tables in full: docs/research.md, "The verdict".
"""

from __future__ import annotations

import dataclasses
import pathlib

from jaxformer.checks import BadValue, MissingFile
from jaxformer.files import read_json, read_metrics
from jaxformer.train.config import RunConfig, load_run
from jaxformer_lab import results
from jaxformer_lab.sweep import report, stats

SPEEDRUN = "jaxformer train --dataset wyc-web --steps 2000 --eval-every 500 --final-test"
SPEEDRUN_OPTIONS = dict(dataset="wyc-web", steps=2000, eval_every=500, final_test=True)
TARGETS = (15, 20)  # dev BLEU: the minutes to reach each
FIRST = "the speedrun command"  # the first run's name in the tables
NOT_OPTIONS = ("out", "vocab_size", "tracker", "tracker_group", "tracker_job")  # vocab_size:
# the tokenizer's; the trackers say where a run's numbers go, not what it computes


def record(
    folders: list[pathlib.Path],
    pairs: list[tuple[pathlib.Path, pathlib.Path]] = (),
    *,
    about: str = "",
    notes: tuple[str, ...] = (),
) -> results.Record:
    """The speedrun's tables of the runs in `folders` (the first the speedrun command's),
    with each (BASE, RUN) of `pairs` compared too, as a results Record for the docs;
    `about` goes before the first table's caption and `notes` under it."""
    runs = [load(folder) for folder in folders]
    check_speedrun(runs[0])
    shown = tables(runs, list(pairs), list(notes))
    shown[0].caption = f"{about} {shown[0].caption}".strip()
    made = results.capture(shown, source="the run folders named by the command")
    command = f"{SPEEDRUN} [options], then jaxformer sweep report --runs RUN..."
    return dataclasses.replace(made, command=command)


def load(folder: pathlib.Path) -> dict:
    """A run's summary, flat config (model and run fields) and metrics records."""
    needed = ("summary.json", "config.json", "metrics.jsonl")
    missing = [name for name in needed if not (folder / name).exists()]
    if missing:
        raise MissingFile(f"{folder}: not a finished run (no {', '.join(missing)})")
    summary = read_json(folder / "summary.json")
    if "test_seconds" not in summary:
        raise BadValue(f"{folder}: the run did not score the test set (final_test)")
    config = read_json(folder / "config.json")
    if not all(isinstance(config.get(key), dict) for key in ("model", "run")):
        raise BadValue(f"{folder / 'config.json'}: expected a run's model and run configs")
    records = read_metrics(folder / "metrics.jsonl")
    defaults = RunConfig.from_options().to_dict()  # for options a run predates
    flat = config["model"] | defaults | config["run"]
    return {"folder": folder, "summary": summary, "config": flat, "records": records}


def check_speedrun(run: dict) -> None:
    """Refuse a first run that is not the speedrun command's (its folder aside): the other
    runs are named by how they differ from it."""
    model, options = load_run(run=SPEEDRUN_OPTIONS)
    expected = model.to_dict() | options.to_dict()
    differ = sorted(
        k for k, v in expected.items() if k not in NOT_OPTIONS and run["config"].get(k) != v
    )
    if differ:
        raise BadValue(
            f"{run['folder']}: the first run must be the speedrun command's ({SPEEDRUN}); "
            f"it differs in {', '.join(differ)}"
        )


def options(run: dict, first: dict) -> str:
    """The command-line options in which `run` differs from `first` ("" if none)."""
    differ = [
        (k, v)
        for k, v in run["config"].items()
        if k not in NOT_OPTIONS and v != first["config"].get(k)
    ]
    return " ".join(_option(k, v) for k, v in differ)


def _option(field: str, value) -> str:
    flag = field.replace("_", "-")
    if isinstance(value, bool):
        return f"--{flag}" if value else f"--no-{flag}"
    return f"--{flag} {value}"


def _name(run: dict, first: dict) -> str:
    return options(run, first) or FIRST


def evaluations(run: dict) -> list[dict]:
    """Each dev evaluation in metrics.jsonl (the final one, beam on every pair, last) with
    the minutes at its end."""
    s, records, out = run["summary"], run["records"], []
    end = s["wall_seconds"] - s["test_seconds"]
    for i, r in enumerate(records):
        if "bleu" in r and "loss" not in r:
            after = next((x["wall_seconds"] for x in records[i + 1 :] if "loss" in x), end)
            out.append(r | {"minutes": after / 60})
    return out


def minutes_to(evals: list[dict], bleu: float) -> str:
    """The minutes at the end of the first evaluation reaching dev BLEU `bleu`."""
    reached = [e["minutes"] for e in evals if e["bleu"] >= bleu]
    return f"{reached[0]:.1f}" if reached else "not reached"


def against(run: dict, base: dict) -> str:
    """The final dev BLEU's difference from `base`'s, with the 95% interval of the paired
    bootstrap over the dev sentences they share (one seed: training variance not included)."""
    if run is base:
        return ""
    rows = report.paired(base["folder"] / "predictions.tsv", run["folder"] / "predictions.tsv")
    if not rows:
        raise BadValue(f"{run['folder']} and {base['folder']} share no dev sentences")
    refs, a, b = zip(*rows, strict=True)
    base, other = (stats.sentence_stats("bleu", list(h), list(refs)) for h in (a, b))
    r = stats.bootstrap("bleu", [base], [other], resample_seeds=False)
    return f"{r.difference:+.2f} [{r.low:+.2f}, {r.high:+.2f}]"


def speedrun_row(run: dict, first: dict) -> list[str]:
    s, evals = run["summary"], evaluations(run)
    return [
        _name(run, first),
        f"{s['wall_seconds'] / 60:.1f}",
        *(minutes_to(evals, t) for t in TARGETS),
        f"{s['bleu']:.2f} / {s['chrf']:.2f}",
        against(run, first),
        f"{s['test_bleu']:.2f} / {s['test_chrf']:.2f}",
        f"{s['eval_seconds'] / s['wall_seconds']:.1%} + {s['test_seconds'] / s['wall_seconds']:.1%}",
    ]


def pair_rows(runs: list[dict], pairs: list[tuple[pathlib.Path, pathlib.Path]]) -> list[list]:
    """For each (BASE, RUN) of `pairs` (folders among `runs`): RUN against BASE on the dev
    sentences they share."""
    by_folder, first = {r["folder"].resolve(): r for r in runs}, runs[0]
    rows = []
    for folders in pairs:
        missing = [str(f) for f in folders if f.resolve() not in by_folder]
        if missing:
            raise BadValue(f"pair {' '.join(missing)}: not among the runs given")
        base, run = (by_folder[f.resolve()] for f in folders)
        bleus = [f"{r['summary']['bleu']:.2f}" for r in (run, base)]
        names = [_name(run, first), _name(base, first)]
        rows.append([*names, " against ".join(bleus), against(run, base)])
    return rows


def curve_rows(run: dict, first: dict) -> list[list[str]]:
    rows = []
    for e in evaluations(run):
        kind = (
            f"greedy, {e['eval_pairs']} sampled"
            if e["eval_beam"] == 1
            else f"beam {e['eval_beam']}, all {e['eval_pairs']}"
        )
        if "averaged_steps" in e:
            kind += f", mean of the last {len(e['averaged_steps'])} checkpoints"
        rows.append(
            [_name(run, first), str(e["step"]), f"{e['minutes']:.1f}", kind]
            + [f"{e['eval_perplexity']:.1f}", f"{e['bleu']:.2f}", f"{e['chrf']:.2f}"]
        )
    return rows


def tables(runs: list[dict], pairs: list, notes: list[str]) -> list[results.Table]:
    """The speedrun table, the pairs' comparisons (if any) and every dev evaluation."""
    first = runs[0]
    speedrun = results.Table(
        caption="The speedrun target: dev BLEU >= 20 on wyc-web within 30 minutes on 2 cores, "
        "evaluation included; one seed each, so a difference between rows has an interval "
        "over the dev sentences only, not over training runs:",
        columns=["configuration", "minutes"]
        + [f"minutes to dev BLEU {t}" for t in TARGETS]
        + ["final dev BLEU / chrF", "dev BLEU against the first [95% over sentences]"]
        + ["test BLEU / chrF", "evaluating: dev + test"],
        align="lrrrrrrr",
        rows=[speedrun_row(run, first) for run in runs],
        notes=notes,
    )
    paired = results.Table(
        caption="Runs compared with another than the first, on the dev sentences they "
        "share (one seed each):",
        columns=["configuration", "against", "final dev BLEU", "difference [95% over sentences]"],
        align="llrr",
        rows=pair_rows(runs, pairs),
    )
    curves = results.Table(
        caption="Each dev evaluation (minutes at its end):",
        columns=["configuration", "step", "minutes", "evaluation"]
        + ["dev perplexity", "dev BLEU", "dev chrF"],
        align="lrrlrrr",
        rows=[row for run in runs for row in curve_rows(run, first)],
    )
    return [speedrun, *([paired] if pairs else []), curves]
