"""Recompute the derived figures of a committed XLA-vs-eager report from its own raw
timings, with the validated model (jaxformer_lab.bench.validate): every constant, gap split,
crossover and predicted speed-up with its bootstrap interval, the model scored on points it
was not fitted to, its constants checked against the same run's measured roofs. Nothing is
measured again: the per-round times, counts and roofs are the run's own.

    python experiments/revalidate_xla_vs_eager.py docs/results/xla_vs_eager/NAME [...]

Rewrites report.json ("why", and for a report of the lab's first version a "revalidated"
note naming this script and what that version did not measure), report.md, the body of
record.json (the docs render it) and the plots in each folder (for a current report: its
why and pages re-rendered by the current code).
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib

from jaxformer_lab.bench import plots, report, validate
from jaxformer_lab.results import Record

NOT_MEASURED = (
    "what one eager call launched (the dispatch term uses the jaxpr's estimate), other "
    "processes' use of the cores (only the load average, the lab's own processes included), "
    "torch op by op (its 'torch' ran torch's default, the fused fast path where it applies), "
    "torch.compile's other modes and the one-graph functional step, eager functional JAX, "
    "first calls with every cache off (JAX's persistent cache was on, writing every program), "
    "the host's instruction-set flags (a note naming them was written by hand, not read)"
)


def revalidate(folder: pathlib.Path) -> dict:
    """The folder's report.json with its why recomputed; rewrites the folder."""
    path = folder / "report.json"
    result = json.loads(path.read_text())
    for row in result["workloads"] + (result.get("scale") or []):
        row.setdefault("tolerance", result.get("tolerance"))
    why = validate.validate(
        result["workloads"], result.get("scale"), result["roofs"], result["dispatch_us"]
    )
    result |= {"why": why, "why_missing": None}
    if result.get("lab", 1) < 2:
        result["revalidated"] = {
            "command": f"python experiments/revalidate_xla_vs_eager.py {folder}",
            "date": datetime.date.today().isoformat(),
            "not_measured": NOT_MEASURED,
        }
    path.write_text(json.dumps(result, indent=1))
    (folder / "report.md").write_text(report.markdown(result))
    record = Record.read(folder / "record.json")
    record.body = report.tables(result)
    record.write(folder / "record.json")
    plots.plots(result, folder)
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=pathlib.Path)
    for folder in parser.parse_args(argv).folders:
        why = revalidate(folder)["why"]
        print(json.dumps({"folder": str(folder), "failures": len(why["failures"])}))


if __name__ == "__main__":
    main()
