"""Seeded sweeps with a verdict: `Spec.load(path)`, `run(spec)`; `jaxformer sweep SPEC`.
See `runner` for the spec, `report` for the results and `stats` for the tests."""

from jaxformer.sweep.report import write as write_report
from jaxformer.sweep.runner import Spec, run, status, train_command

__all__ = ["Spec", "run", "status", "train_command", "write_report"]
