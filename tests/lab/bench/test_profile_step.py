"""jaxformer_lab.bench.profile_step (`jaxformer bench profile`): a live profile keeps its trace
and HLO next to the record and reads them as a trace taken elsewhere is read; the dates
profile sorts a traced step's operations by kind."""

import pytest

from jaxformer_lab.bench import hlo_profile, profile_step, registry


def test_the_live_gpt2_profile_keeps_its_trace_and_hlo_and_reads_them_again(tmp_path):
    options = profile_step.ProfileOptions(
        model="gpt2", quick=True, batch=2, out=str(tmp_path / "profile.json")
    )
    live = registry.run("profile", options).data
    trace, hlo = tmp_path / "profile.perfetto.json.gz", tmp_path / "profile.hlo.txt.gz"
    again = hlo_profile.read_profile(trace, hlo, options.sizes())
    assert {k: live[k] for k in again} == again
    assert sum(live["ms"].values()) == pytest.approx(live["kernel_ms"], abs=0.02)
    assert live["ms"]["matmul: LM head, forward"] > 0 and live["ms"]["unmatched"] == 0


def test_operations_are_sorted_by_kind():
    names = ["ynn_fusion.3", "dot.1", "copy.2", "transpose.7", "threefry2x32", "reduce.4", "add"]
    kinds = [profile_step.kind_of(n) for n in names]
    assert kinds == ["matrix products"] * 2 + ["layout copies"] * 2 + [
        "random bits",
        "reductions",
        "other fusions",
    ]
    events = [
        dict(name="dot.1", thread="a", ts=0.0, dur=3000.0),
        dict(name="copy.2", thread="b", ts=1000.0, dur=1000.0),
    ]
    summary = profile_step.summarise(events)
    assert summary["span_ms"] == 3.0 and summary["busy_ms"] == 4.0
    assert summary["shares"] == {"matrix products": 0.75, "layout copies": 0.25}


@pytest.mark.slow
def test_the_dates_profile_writes_a_row_per_run_and_its_timeline(tmp_path):
    options = profile_step.ProfileOptions(steps=3, out=str(tmp_path / "profile.json"))
    record = registry.run("profile", options)
    assert len(record.tables[0].rows) == 1 and (tmp_path / "profile.png").is_file()
    shares = record.data["runs"][0]["shares"]
    assert sum(shares.values()) == pytest.approx(1.0, abs=0.01) and "matrix products" in shares
