"""Seeded sweeps with a verdict: `Spec.load(path)`, `run(spec)`; `jaxformer sweep SPEC`.
See `spec` for the spec, `runner` for the runs, `report` for the results and `stats` for
the tests; `jaxformer sweep report` writes a sweep's tables (`report.record`), or those of
single speedrun runs (`runs.record`), as a results file for the docs."""

from jaxformer_lab.sweep.report import write as write_report
from jaxformer_lab.sweep.runner import run, train_command
from jaxformer_lab.sweep.spec import Spec, status

__all__ = ["Spec", "run", "status", "train_command", "write_report"]
