"""jaxformer_lab.bench.op_profile: XLA's operations given to the steps they ran in, named
by labels that survive a release's renumbering, summed per step, and compared."""

import statistics

import numpy as np
import pytest

from jaxformer_lab.bench import op_profile, stats

HLO = """HloModule jit_step, entry_computation_layout={()->f32[]}

ENTRY %main {
  %p = f32[8,16]{1,0} parameter(0)
  %ynn_fusion.211 = f32[512,1024]{1,0} fusion(%p), kind=kCustom, calls=%c, metadata={op_name="jit(step)/jvp(ne,ef->nf)/dot_general" stack_frame_id=4}
  %copy.1063 = f32[256,4,64]{2,1,0} copy(%p)
  ROOT %wrapped_reduce.3 = f32[] fusion(%p), kind=kLoop, calls=%r, metadata={op_name="jit(step)/loss/reduce_sum"}
}
"""


def test_labels_keep_the_jax_code_and_shape_and_drop_the_number():
    names = op_profile.labels(HLO)
    assert names["ynn_fusion.211"] == "jvp(ne,ef->nf)/dot_general [512,1024]"
    assert names["copy.1063"] == "copy [256,4,64]"  # no op_name: the name without its number
    assert names["wrapped_reduce.3"] == "loss/reduce_sum []"  # a scalar
    # the same code in another release, fused differently and numbered anew, has the same label
    assert (
        op_profile.label("dot.82", "jit(step)/jvp(ne,ef->nf)/dot_general", ((512, 1024),))
        == (names["ynn_fusion.211"])
    )


def _op(name, ts, dur):
    return dict(name=name, thread="t", ts=ts, dur=dur)


def test_operations_go_to_the_step_they_start_in_and_are_summed_per_step():
    marks = [dict(ts=0, dur=100), dict(ts=200, dur=100), dict(ts=400, dur=100)]
    ops = [
        _op("ynn_fusion.211", 10, 40),
        _op("copy.1063", 60, 20),
        _op("copy.1063", 85, 10),
        _op("ynn_fusion.211", 210, 50),
        _op("ynn_fusion.211", 410, 60),
        _op("copy.1063", 480, 30),
        _op("stray", 150, 5),  # between steps: in none
    ]
    steps = op_profile.per_step(ops, marks)
    assert [len(s) for s in steps] == [3, 1, 2]
    summary = op_profile.summarise(steps, op_profile.labels(HLO), marks)
    dot, copy = "jvp(ne,ef->nf)/dot_general [512,1024]", "copy [256,4,64]"
    assert list(summary["ops"]) == [dot, copy]  # the largest median first
    # ms per step: dot 0.04, 0.05, 0.06; copy 0.03, 0 (absent), 0.03
    assert summary["ops"][dot]["median"] == pytest.approx(0.05)
    assert summary["ops"][copy]["median"] == pytest.approx(0.03)
    assert summary["ops"][copy]["low"] == 0.0
    kinds = summary["kinds"]
    assert kinds["matrix products"]["median"] == pytest.approx(0.05)
    assert kinds["layout copies"]["median"] == pytest.approx(0.03)
    busy = [(40 + 20 + 10) / 1e3, 50 / 1e3, (60 + 30) / 1e3]
    assert summary["busy_ms"]["median"] == pytest.approx(statistics.median(busy))
    assert summary["wall_ms"]["median"] == pytest.approx(0.1) and summary["steps"] == 3


def _summary(ops: dict[str, list[float]], kinds: dict[str, list[float]]) -> dict:
    def ci(v):
        return stats.best_median_ci(v)

    busy = np.sum([v for v in ops.values()], axis=0).tolist()
    return dict(
        busy_ms=ci(busy),
        kinds={k: ci(v) for k, v in kinds.items()},
        ops={k: ci(v) for k, v in ops.items()},
    )


def test_differences_name_only_what_lies_apart_beyond_the_intervals_largest_first():
    a = _summary(
        {"dot": [10, 11, 12, 10, 11, 12], "copy": [5, 6, 5, 6, 5, 6], "exp": [1, 1, 1, 1, 1, 1]},
        {"matrix products": [10, 11, 12, 10, 11, 12], "other fusions": [6] * 6},
    )
    b = _summary(
        {"dot": [11, 12, 13, 11, 12, 13], "copy": [9, 9, 9, 9, 9, 9], "gone": [2] * 6},
        {"matrix products": [11, 12, 13, 11, 12, 13], "other fusions": [2] * 6},
    )
    d = op_profile.differences(a, b)
    # dot's intervals [10, 12] and [11, 13] overlap: not named; copy +3.5, exp -1, gone +2 are
    assert [(r["key"], r["delta_ms"]) for r in d["ops"]] == [
        ("copy", 3.5),
        ("gone", 2.0),
        ("exp", -1.0),
    ]
    assert [r["key"] for r in d["kinds"]] == ["other fusions"]
    assert d["ops_apart"] == 3 and d["delta_of_ops_apart_ms"] == pytest.approx(4.5)
    assert d["delta_busy_ms"] == pytest.approx(b["busy_ms"]["median"] - a["busy_ms"]["median"])
    assert op_profile.differences(a, b, top=1)["ops"] == d["ops"][:1]
