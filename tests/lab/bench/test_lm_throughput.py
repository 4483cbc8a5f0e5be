"""jaxformer_lab.bench.lm_throughput and shared: the FLOP count, the peak table, the quick
model from the presets, and a quick run on the CPU."""

import pytest

from jaxformer.config import TransformerConfig
from jaxformer_lab.bench import BENCHMARKS, registry, shared


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
    assert shared.peak_tflops(kind) == peak


def test_flops_per_token_of_gpt2_small():
    # 124,475,904 parameters (tied 50304 x 768 embedding, 1024 positions); attention
    # 6 * 12 layers * 1024 positions * 768 = 56.6M: about 803M FLOPs per token.
    flops = shared.flops_per_token(124_475_904, 12, 1024, 768)
    assert flops == 6 * 124_475_904 + 6 * 12 * 1024 * 768 == 803_478_528


def test_the_models_are_the_gpt2_run_file_full_or_at_the_tiny_size():
    full = shared.LMOptions()
    assert full.config() == TransformerConfig.gpt2_small()  # configs/models/gpt2_small.yaml
    quick = shared.LMOptions(quick=True, layers=3, batch=2, remat="dots")
    config = quick.config()
    sizes = dict(num_decoder_layers=3, d_model=128, d_ff=512, num_heads=4, max_len=128)
    assert config.replace(remat="none") == TransformerConfig.gpt2_small(1024, **sizes)
    assert (config.d_model, config.num_heads, config.vocab_size) == (128, 4, 1024)
    assert quick.sizes() == dict(
        layers=3, d_model=128, heads=4, d_ff=512, context=128, vocab=1024, batch=2
    )


def test_a_missing_model_file_is_named():
    with pytest.raises(FileNotFoundError, match="--model-file nowhere.yaml: no such file"):
        shared.LMOptions(model_file="nowhere.yaml")


def test_a_quick_run_reports_throughput(tmp_path):
    options = BENCHMARKS["lm-throughput"].options(
        quick=True, steps=2, out=str(tmp_path / "lm.json")
    )
    record = registry.run("lm-throughput", options)
    r = record.data
    assert r["tokens_per_second"] > 0 and r["tflops"] > 0 and r["params"] == 544_256
    assert r["resolved"] == {"attention": "xla", "lm_head": "dense"}
    assert r["step_ms_ci"]["n"] == 2  # two timed calls: their range, at 50%
    peak = shared.peak_tflops(record.device)  # None on a CPU: no MFU then
    assert r["mfu"] == (
        None if peak is None else pytest.approx(r["tflops"] / peak, rel=0.02, abs=5e-5)
    )
    expected = shared.flops_per_token(544_256, 2, 128, 128) * 8 * 128
    measured = expected / (r["step_ms"] / 1e3) / 1e12
    assert r["tflops"] == pytest.approx(measured, rel=0.02, abs=5e-4)  # rounded to 3 places
    assert record.command == f"jaxformer bench lm-throughput --out {options.out} --quick --steps 2"
    assert "| xla | dense | 8 | none |" in record.markdown()


def test_memory_only_compiles_and_runs_no_step(tmp_path):
    options = BENCHMARKS["lm-throughput"].options(
        quick=True, memory_only=True, layers=1, out=str(tmp_path / "lm.json")
    )
    r = registry.run("lm-throughput", options).data
    assert r["temp_bytes"] > 0 and "step_ms" not in r and r["layers"] == 1
