"""jaxformer_lab.bench.attention (`jaxformer bench attention`): the kernels of one length are
timed together and compared with xla round by round; a program beyond the memory limit
is compiled, not run; a kernel that cannot run here says why."""

import pytest

from jaxformer_lab.bench import attention, registry


def test_causal_flops_are_half_the_square():
    T = 1024
    assert attention.causal_flops(T, backward=False) == 2 * 2 * 1 * 8 * T * T * 64 / 2
    assert attention.causal_flops(T, backward=True) == 3.5 * attention.causal_flops(T, False)


def test_a_quick_run_times_what_fits_and_compiles_the_rest(tmp_path):
    options = attention.AttentionOptions(
        quick=True, lengths=(256, 16384), rounds=2, out=str(tmp_path / "a.json")
    )
    record = registry.run("attention", options)
    rows = {(r["T"], r["implementation"]): r for r in record.data["rows"]}
    xla, chunked = rows[256, "xla"], rows[256, "chunked"]
    assert xla["ran"] and chunked["ran"] and xla["ms"]["n"] == chunked["over_xla"]["n"] == 2
    assert chunked["max_abs_diff_vs_xla"] < 1e-5 and "over_xla" not in xla
    assert (
        chunked["over_xla"]["low"] <= chunked["over_xla"]["median"] <= chunked["over_xla"]["high"]
    )
    big = rows[16384, "xla"]  # quick: the longest length is compiled only
    assert not big["ran"] and big["temp_bytes"] > 2**30 > rows[16384, "chunked"]["temp_bytes"]
    for kernel in ("tokamax_mosaic", "tokamax_triton"):  # no GPU here: why, not a crash
        assert "skipped" in rows[256, kernel] or rows[256, kernel]["ran"]
    text = record.markdown()
    assert "| 16384 | xla | float32 | not run |" in text
    assert record.data["headline"]["max_abs_diff_float32"] == pytest.approx(
        chunked["max_abs_diff_vs_xla"]
    )
