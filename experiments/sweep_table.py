"""A sweep's report in the docs/results format, recomputed from its run folders (not read
from a results.json that an earlier version of the report may have written):

    jaxformer sweep configs/sweeps/wyc_web_speedrun.yaml
    python experiments/sweep_table.py configs/sweeps/wyc_web_speedrun.yaml \
        [--sweep-out DIR] [--baseline NAME] [--about "..."] [--device "..."] \
        [--source "..."] [--note "..."] [--curves PNG] [--comparisons-only] \
        --out docs/results/sweep_wyc_web_speedrun.json

The tables are the report's own (jaxformer.sweep.report.tables): the figures per variant
with each run's compared metric, the seed-paired differences, and the verdicts. --about
(what was trained, on what) goes before the first table's caption, each --note under the
last table. --curves also draws the runs' curves (the sweep's curves.png) to that file.
--baseline compares the same runs with another of the variants than the spec's baseline:
another reading of them. Every reading of one sweep is one family: the spec's `readings`
name the baselines its results are read against, and Holm's adjustment covers every
comparison of all of them (a --baseline the spec does not name joins the family, and the
caption counts it). --comparisons-only leaves out the figures per variant, for a second
reading of runs whose figures another results file shows. Prints a JSON line: the
verdicts.
Bad input (a missing or invalid spec, an unknown --baseline, no sweep folder) is one error
line, exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import pathlib

import flax
import jax

from jaxformer import sweep
from jaxformer.checks import InputError


def verdicts(results: dict) -> dict[str, dict[str, str]]:
    """variant -> metric -> verdict, of every variant paired with the baseline."""
    return {
        name: {metric: r["verdict"] for metric, r in v["paired"]["bootstrap"].items()}
        for name, v in results["variants"].items()
        if "paired" in v
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", type=pathlib.Path, help="the sweep's spec (YAML or JSON)")
    parser.add_argument("--sweep-out", help="the sweep's folder, if not the spec's out")
    parser.add_argument("--baseline", help="compare with this variant, not the spec's baseline")
    parser.add_argument("--about", default="", help="what the sweep trained, on what")
    parser.add_argument("--device", default="2-core CPU", help="the machine, in words")
    parser.add_argument("--source", default="the sweep's run folders")
    parser.add_argument("--note", action="append", default=[], help="a note under the tables")
    parser.add_argument("--curves", help="also draw the runs' curves to this PNG")
    parser.add_argument(
        "--comparisons-only",
        action="store_true",
        help="leave out the figures per variant (the differences and verdicts only)",
    )
    parser.add_argument("--out", required=True, help="the docs/results JSON to write")
    args = parser.parse_args(argv)
    try:
        spec = sweep.Spec.load(args.spec, out=args.sweep_out)
    except InputError as e:
        parser.error(str(e))
    if args.baseline is not None:
        if args.baseline not in spec.variants:
            parser.error(f"--baseline {args.baseline!r} is not one of {list(spec.variants)}")
        spec = dataclasses.replace(spec, baseline=args.baseline, readings=spec.baselines)
    if not spec.out.is_dir():
        parser.error(f"{spec.out}: no such sweep folder (run `jaxformer sweep {args.spec}`)")
    results = sweep.report.summarize(spec)
    tables = sweep.report.tables(results)[1 if args.comparisons_only else 0 :]
    tables[0]["caption"] = f"{args.about} {tables[0]['caption']}".strip()
    tables[-1]["notes"] += args.note
    result = {
        "command": f"jaxformer sweep {args.spec}",
        "device": args.device,
        "versions": {"jax": jax.__version__, "flax": flax.__version__},
        "date": datetime.date.today().isoformat(),
        "source": args.source,
        "tables": tables,
    }
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    if args.curves:
        sweep.report.curves(spec, pathlib.Path(args.curves))
    line = {"sweep": str(spec.out), "verdicts": verdicts(results), "out": str(path)}
    print(json.dumps(line))
    return line


if __name__ == "__main__":
    main()
