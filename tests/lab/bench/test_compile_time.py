"""jaxformer_lab.bench.compile_time (`jaxformer bench compile-time`): the depth part compiles
the unrolled and the scanned step alternately and measures every remat variant; the cache
part reads each fresh process's time to its first step."""

import pytest

from jaxformer_lab.bench import compile_time, registry


def test_a_quick_depth_run_measures_every_variant(tmp_path):
    given = dict(parts=("depth",), models=("lm",), layers=(1,), repeats=1)
    options = compile_time.CompileTimeOptions(quick=True, out=str(tmp_path / "c.json"), **given)
    record = registry.run("compile-time", options)
    (row,) = record.data["rows"]
    assert (row["model"], row["layers"]) == ("lm", 1)
    assert row["scan_compile_speedup"] == round(
        row["compile_s_unrolled"] / row["compile_s_scan"], 2
    )
    for key in ("unrolled", "scan", "scan_dots", "scan_full"):
        assert row[f"step_ms_{key}"] > 0 and row[f"peak_MiB_{key}"] >= row[f"temp_MiB_{key}"]
    assert (tmp_path / "c.png").is_file() and len(record.tables) == 2
    assert record.data["headline"]["scan_compile_speedup_lm"] == row["scan_compile_speedup"]


@pytest.mark.slow
def test_the_cache_part_times_cold_warm_and_off_processes(tmp_path):
    options = compile_time.CompileTimeOptions(
        parts=("cache",), cache_runs=1, out=str(tmp_path / "c.json")
    )
    record = registry.run("compile-time", options)
    (run,) = record.data["cache"]
    assert set(run) == {"cold", "warm", "off"} and run["warm"] < run["cold"]
    assert "| empty (cold) |" in record.markdown()
