"""jaxformer_lab.bench.torch_side: the lab's torch modes in a worker of the interpreter
that has torch (this one, or one found beside it): the same weights, so the same outputs
as JAX's jit; calls timed by the worker; its operators counted there."""

import numpy as np
import pytest

from jaxformer_lab.bench import modes, pythons, stats, torch_side
from jaxformer_lab.bench.workloads import bench_config, build

TORCH = pythons.torch_python()
needs_torch = pytest.mark.skipif(TORCH is None, reason=pythons.no_torch_found())


def test_a_workloads_spec_names_what_the_worker_rebuilds():
    w = build("layer", bench_config(64, 1, dtype="bfloat16"), 2, 8)
    spec = torch_side.spec_of(w, ("torch", "torch.compile"), ("torch.compile",))
    assert spec == {
        "workload": dict(
            name="layer", batch=2, length=8, d_model=64, layers=1, vocab=512, dtype="bfloat16"
        ),
        "modes": ["torch", "torch.compile"],
        "explain": ["torch.compile"],
    }


@needs_torch
@pytest.mark.parametrize("name", ["forward", "train_step"])
def test_the_workers_torch_computes_what_jit_computes_here(name):
    w = build(name, bench_config(64, 1), 2, 8)
    jit = modes.mode_call(w, None, "jit")
    here = [modes.to_numpy(jit()), modes.to_numpy(jit())]  # a train step's two first losses
    with torch_side.serving(TORCH["path"], "cpu", w, ("jit", "torch")) as remote:
        assert remote.modes == ["torch"]
        first, built = remote.first_outputs()
        assert built["torch"] > 0
        for theirs, ours in zip(first["torch"], here, strict=True):
            np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-5)
        seconds = remote.calls()["torch"]()
        assert isinstance(seconds, stats.Elapsed) and seconds > 0
        ops = remote.ask("ops")
        assert ops["torch"]["ops"] > 10


@needs_torch
def test_the_trivial_torch_op_runs_its_calls_per_step_in_the_worker():
    remote = torch_side.Remote(TORCH["path"], "cpu", {"primitive": 50})
    try:
        said = remote.ready["programs"][torch_side.PRIMITIVE]
        assert said["torch"] == TORCH["torch"] and said["initial_loss"] == 2.0  # 1 + 1
        assert remote.calls()[torch_side.PRIMITIVE]() > 0
    finally:
        remote.close()
