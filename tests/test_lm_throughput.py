"""experiments/lm_throughput.py: the FLOP count, the peak table and a --quick run on CPU."""

import importlib.util
import json
import pathlib

import pytest

PATH = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "lm_throughput.py"
spec = importlib.util.spec_from_file_location("lm_throughput", PATH)
lm_throughput = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lm_throughput)


@pytest.mark.parametrize(
    "kind, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("TPU v5 lite", 197.0),
        ("cpu", None),
    ],
)
def test_peaks_by_device_kind(kind, peak):
    assert lm_throughput.peak_tflops(kind) == peak


def test_flops_per_token_of_gpt2_small():
    # 124,475,904 parameters (tied 50304 x 768 embedding, 1024 positions); attention
    # 6 * 12 layers * 1024 positions * 768 = 56.6M: about 803M FLOPs per token.
    flops = lm_throughput.flops_per_token(124_475_904, 12, 1024, 768)
    assert flops == 6 * 124_475_904 + 6 * 12 * 1024 * 768 == 803_478_528


def test_quick_run_reports_throughput(tmp_path):
    result = lm_throughput.main(["--quick", "--steps", "2", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "lm_throughput.json").read_text()) == result
    assert result["tokens_per_second"] > 0 and result["tflops"] > 0
    assert result["params"] == 544_256
    peak = lm_throughput.peak_tflops(result["device"])  # None on a CPU: no MFU then
    assert result["mfu"] == (
        None if peak is None else pytest.approx(result["tflops"] / peak, rel=0.02, abs=5e-5)
    )  # MFU is rounded to 4 places (on an H100 this run's is 0.0011 for 0.00106)
    expected = lm_throughput.flops_per_token(544_256, 2, 128, 128) * 8 * 128
    measured = expected / (result["step_ms"] / 1e3) / 1e12
    assert result["tflops"] == pytest.approx(measured, rel=0.02, abs=5e-4)  # rounded to 3 places


@pytest.mark.parametrize("flag", ["--batch", "--steps"])
def test_sizes_below_one_are_refused(flag, capsys):
    with pytest.raises(SystemExit):
        lm_throughput.parse_args([flag, "0"])
    assert f"{flag} must be >= 1, got 0" in capsys.readouterr().err
