"""TPU programs compiled (with libtpu) or lowered (without) on this CPU: `jaxformer_lab.aot`
and `jaxformer compile-check`. Every figure here is compiled, not run."""

import importlib.util
import subprocess
import sys

import jax
import pytest

from jaxformer_lab import aot, results

libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="deviceless TPU compiles need libtpu: pip install 'jaxformer[tpu]' (the Python 3.12 line has it)",
)


def _count(config) -> int:
    from flax import nnx

    from jaxformer.models import DecoderLM, Transformer, count_params

    kind = Transformer if config.num_encoder_layers else DecoderLM
    return count_params(nnx.eval_shape(lambda: kind(config, rngs=nnx.Rngs(0))))


def test_targets_are_read_and_refused_in_one_line():
    assert aot.parse_target("tpu:v5p:2x2x1") == aot.Target("v5p", "2x2x1")
    assert aot.parse_target("tpu:v5e:2x4").chips == 8
    for bad in ("gpu:h100", "tpu:v9:2x2", "tpu:v5e", "tpu:v5e:2"):
        with pytest.raises(ValueError, match=r"expected tpu:GENERATION:TOPOLOGY"):
            aot.parse_target(bad)


@pytest.mark.devices(8)
def test_without_libtpu_the_step_is_lowered_for_a_tpu_with_splash_attention():
    """Lowered only, over this host's CPU devices: the program is the TPU's (splash's
    Mosaic kernel in it), and the per-chip bytes are those of the FSDP layout."""
    report = aot.check("tiny_lm", aot.Target("v5e", "2x2"), layout="fsdp", length=128,
                       lowered_only=True)  # fmt: skip
    assert not report.compiled and report.temp_bytes is None and report.fits is None
    assert report.attention == "splash"
    assert report.mesh == {"data": 1, "fsdp": 4}
    whole = 4 * _count(aot.models()["tiny_lm"].config)  # float32 parameters
    assert whole / 4 <= report.params_bytes < whole / 2  # split by d_model, 4 ways
    assert report.optimizer_bytes >= 2 * report.params_bytes  # Adam's two moments


@pytest.mark.devices(8)
@pytest.mark.parametrize("program", ["train", "eval"])
def test_packed_rows_lower_for_a_tpu_with_splash_taking_their_segment_ids(program):
    """Packed rows reach splash as segment ids: its segmented kernels, no [T, T] mask."""
    report = aot.check("tiny_lm", aot.Target("v5e", "2x2"), program=program, length=256,
                       lowered_only=True, packed=True)  # fmt: skip
    assert report.packed and report.attention == "splash"
    config, _, _ = aot.models()["tiny_lm"]
    placement = aot.MeshPlacement(aot.make_mesh(data=1, fsdp=4, devices=jax.devices()[:4]),
                                  aot.DEFAULT_RULES)  # fmt: skip
    build = aot._train_program if program == "train" else aot._eval_program
    with jax.default_device(aot.StandInDevice("tpu", "TPU v5e")):  # as check() lowers it
        text = build(config, placement, 16, 256, False, packed=True)[0].as_text()
    assert "splash_mha_fwd_segmented" in text and "256x256xi1>" not in text  # T = 256
    with pytest.raises(ValueError, match="--pack: packed rows are a decoder's train and eval"):
        aot.check("tiny", aot.Target("v5e", "2x2"), length=128, lowered_only=True, packed=True)


@pytest.mark.devices(8)
@pytest.mark.parametrize("program", ["eval", "decode", "beam"])
def test_without_libtpu_evaluation_and_decoding_lower_for_a_tpu(program):
    report = aot.check("tiny", aot.Target("v5e", "2x2"), program=program, length=128,
                       lowered_only=True)  # fmt: skip
    assert not report.compiled and report.optimizer_bytes == 0 and report.params_bytes > 0
    assert report.attention == ("splash" if program == "eval" else "XLA's code (xla or chunked)")


@libtpu
@pytest.mark.parametrize("model", ["tiny", "tiny_lm"])
def test_with_libtpu_each_model_kind_compiles_for_v5e_with_memory_and_cost(model):
    target = aot.Target("v5e", "2x2")
    report = aot.check(model, target, layout="fsdp", length=128, batch=8, find_largest_batch=False)
    assert report.compiled and report.fits and report.attention == "splash"
    assert 0 < report.temp_bytes < report.total_bytes <= aot.CHIPS["v5e"].hbm_bytes
    # At least 6 FLOPs per parameter per target token (forward 2, backward 4): the
    # decoder's layers and the tied output projection see every one.
    tokens = 8 * 128
    assert report.flops >= 6 * _count(aot.models()[model].config) * tokens / target.chips * 0.9
    assert report.roofline_seconds >= report.flops / aot.CHIPS["v5e"].bf16_flops


@libtpu
def test_the_largest_batch_found_fits_and_a_batch_beyond_hbm_does_not(monkeypatch):
    """With a pretend HBM of 64 MiB the search must stop below it: the batch it reports
    compiles within that HBM, and four times as many rows do not."""
    target = aot.Target("v5e", "2x2")
    monkeypatch.setitem(aot.CHIPS, "v5e", aot.CHIPS["v5e"]._replace(hbm_bytes=64 << 20))
    report = aot.check("tiny_lm", target, layout="fsdp", length=128, batch=8)
    assert report.fits and report.batch < report.largest_batch and report.largest_batch % 4 == 0
    fitting = aot.check("tiny_lm", target, layout="fsdp", length=128,
                        batch=report.largest_batch, find_largest_batch=False)  # fmt: skip
    assert fitting.fits and fitting.total_bytes <= 64 << 20
    beyond = aot.check("tiny_lm", target, layout="fsdp", length=128,
                       batch=4 * report.largest_batch, find_largest_batch=False)  # fmt: skip
    assert beyond.fits is False


@libtpu
@pytest.mark.parametrize("program", ["eval", "decode", "beam"])
def test_with_libtpu_the_evaluation_step_and_the_decoding_loops_compile(program):
    report = aot.check("tiny_lm", aot.Target("v5e", "2x2"), program=program, length=128)
    assert report.compiled and report.fits and report.optimizer_bytes == 0
    assert report.flops > 0 and report.largest_batch is None
    assert report.attention == ("splash" if program == "eval" else "XLA's code (xla or chunked)")


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "jaxformer", "compile-check", *args],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target", "gpu:h100"], "expected tpu:GENERATION:TOPOLOGY"),
        (["--target", "tpu:v5e:2x2", "--batch", "0"], "--batch"),
        (["--target", "tpu:v5e:2x2", "--model", "gpt5"], "--model 'gpt5'"),
        (["--target", "tpu:v5e:2x2", "--layout", "data", "--batch", "6"], "--batch 6"),
        (["--target", "tpu:v5e:2x2", "--out", "/no/such/folder/x.json"], "no folder"),
        (["--target", "tpu:v5e:2x2", "--model", "tiny", "--pack"], "--pack: packed rows are"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = _cli(*args)
    assert result.returncode == 2, result.stderr
    said = [line for line in result.stderr.splitlines() if not line.startswith("compiling ")]
    assert len(said) == 1 and said[0].startswith("jaxformer compile-check: error: ")
    assert message in said[0]


def test_the_command_prints_its_table_first_and_writes_a_record(tmp_path):
    out = tmp_path / "reports.json"
    result = _cli("--target", "tpu:v5e:2x2", "--model", "tiny_lm", "--program", "train",
                  "--layout", "data", "--length", "128", "--no-largest-batch", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    caption, _, header, _, row = result.stdout.splitlines()[:5]
    assert caption.startswith("Per chip of tpu:v5e:2x2, ")
    assert ("compiled, not run" in caption) == (importlib.util.find_spec("libtpu") is not None)
    assert header.startswith("| model | program | layout |")
    assert row.startswith("| tiny_lm | train | data | data=4 |") and "splash" in row
    record = results.Record.read(out)
    assert record.tables[0].rows[0][:4] == ["tiny_lm", "train", "data", "data=4"]
    assert record.data["reports"][0]["attention"] == "splash"
