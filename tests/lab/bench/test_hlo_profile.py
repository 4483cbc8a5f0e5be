"""jaxformer_lab.bench.hlo_profile, the GPU profile by category: two H100 traces of a
GPT-2-small training step (tests/fixtures/gpu_traces: jaxformer's step and a minimal
pure-JAX one) read on a CPU, and the rules that sort a kernel, on small hand-written HLO."""

import collections
import gzip
import pathlib

import pytest

from jaxformer_lab.bench import hlo_profile, profile_step, registry
from jaxformer_lab.results import Record

ROOT = pathlib.Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests/fixtures/gpu_traces"
SIZES = profile_step.ProfileOptions(batch=32).sizes()  # GPT-2 small at batch 32
JAXFORMER = "lm_throughput-h100-gpt2-b32-cudnn-dense"
MINIMAL = "minimal-jax-gpt2-h100-b32-cudnn"
HEAD_BACKWARD = ("matmul: LM head, backward dX", "matmul: LM head, backward dW")


@pytest.fixture(scope="module")
def profiles():
    return {name: _read(name) for name in (JAXFORMER, MINIMAL)}


def _read(name: str) -> dict:
    trace, hlo = FIXTURES / f"{name}.perfetto.json.gz", FIXTURES / f"{name}.hlo.txt.gz"
    return hlo_profile.read_profile(trace, hlo, SIZES)


@pytest.mark.parametrize("name, kernel_ms", [(JAXFORMER, 91.4), (MINIMAL, 76.7)])
def test_the_categories_sum_to_the_kernel_time_of_a_step(profiles, name, kernel_ms):
    p = profiles[name]
    assert p["steps"] == 3
    assert p["kernel_ms"] == pytest.approx(kernel_ms, abs=0.05)
    assert sum(p["ms"].values()) == pytest.approx(p["kernel_ms"], abs=0.02)
    assert sum(p["shares"].values()) == pytest.approx(1.0, abs=0.002)
    # overlapping kernels (a graph's tails and heads) are counted once in the busy time
    assert p["kernel_ms"] - 0.5 < p["busy_ms"] < p["kernel_ms"]


@pytest.mark.parametrize("name", [JAXFORMER, MINIMAL])
def test_every_kernel_lands_in_one_category_and_nothing_large_is_unmatched(profiles, name):
    p = profiles[name]
    assert set(p["ms"]) <= set(hlo_profile.CATEGORIES)
    assert p["ms"]["unmatched"] < 0.1
    assert sum(ms for c, ms in p["ms"].items() if "matmul: other" in c) < 0.1
    for role in hlo_profile.ROLES[:-1]:  # each layer's products, forward and backward
        for step in hlo_profile.PASSES:
            assert p["ms"][f"matmul: {role}, {step}"] > 0.5, (role, step)
    assert p["ms"]["attention"] > 8 and p["ms"]["optimizer"] > 1


def test_the_lm_head_backward_is_float32_in_jaxformer_and_bfloat16_in_the_minimal_step(profiles):
    head = {name: sum(p["ms"][c] for c in HEAD_BACKWARD) for name, p in profiles.items()}
    assert 15.5 < head[JAXFORMER] < 17
    assert 5.5 < head[MINIMAL] < 6.7
    # The float32 GEMMs (TF32 cuBLAS kernels) are exactly jaxformer's head backward: the
    # cuBLAS kernels, which no HLO instruction names, were matched to the right calls.
    trace = FIXTURES / f"{JAXFORMER}.perfetto.json.gz"
    hlo = gzip.decompress((FIXTURES / f"{JAXFORMER}.hlo.txt.gz").read_bytes()).decode()
    events = hlo_profile.device_events(trace)
    sizes = profiles[JAXFORMER]["sizes"]
    by_kind = collections.defaultdict(set)
    for e, category in zip(events, hlo_profile.categorise(events, hlo, sizes), strict=True):
        by_kind["tf32" in e["name"]].add(category)
    assert by_kind[True] == set(HEAD_BACKWARD)
    assert not by_kind[False] & set(HEAD_BACKWARD)


def test_jaxformers_loss_makes_about_4_ms_more_passes_over_the_logits(profiles):
    extra = profiles[JAXFORMER]["ms"]["loss"] - profiles[MINIMAL]["ms"]["loss"]
    assert 3 < extra < 5


def test_a_trace_taken_elsewhere_is_read_into_a_record(tmp_path):
    trace, hlo = (
        str(FIXTURES / f"{JAXFORMER}.{end}") for end in ("perfetto.json.gz", "hlo.txt.gz")
    )
    options = profile_step.ProfileOptions(
        model="gpt2", batch=32, trace=trace, hlo=hlo, out=str(tmp_path / "p.json")
    )
    registry.run("profile", options)
    record = Record.read(tmp_path / "p.json")
    lines = record.markdown().splitlines()
    assert "| matmul: LM head, backward dW | 9.84 | 10.8% |" in lines
    assert "| all kernels | 91.42 | 100% |" in lines
    assert record.data["kernel_ms"] == pytest.approx(91.42, abs=0.01)
    assert f"--trace {trace}" in record.command and "--batch 32" in record.command
    with pytest.raises(ValueError, match="--trace and --hlo go together"):
        profile_step.ProfileOptions(model="gpt2", trace=trace)


SMALL = dict(batch=2, context=3, d_model=8, d_ff=32, vocab=100, heads=2)  # 6 tokens
HLO = """HloModule jit_step
FileNames
1 "site-packages/optax/_src/transform.py"
2 "jaxformer/functional/layers.py"

FunctionNames
1 "update_fn"
2 "ffn"

FileLocations
1 {file_name_id=1 function_name_id=1 line=10 end_line=10 column=1 end_column=2}
2 {file_name_id=2 function_name_id=2 line=20 end_line=20 column=1 end_column=2}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=1}

ENTRY %main (x: bf16[6,8]) -> f32[8,32] {
  %x = bf16[6,8]{1,0} parameter(0), metadata={op_name="x"}
  %w1 = bf16[8,32]{1,0} parameter(1), metadata={op_name="w1"}
  %h = bf16[6,32]{1,0} custom-call(%x, %w1), custom_call_target="__cublas$gemm", metadata={op_name="jit(step)/jvp()/dot_general" stack_frame_id=2}
  %a = bf16[6,32]{1,0} fusion(%h), kind=kLoop, calls=%gelu, metadata={op_name="jit(step)/jvp()/tanh" stack_frame_id=2}
  %dy = bf16[6,8]{1,0} fusion(%x), kind=kLoop, calls=%f, metadata={op_name="jit(step)/transpose(jvp())/mul"}
  %dw2 = (f32[8,32]{1,0}, s8[4]{0}) custom-call(%dy, %a), custom_call_target="__cublas$gemm", metadata={op_name="jit(step)/transpose(jvp())/dot_general"}
  %da = bf16[6,32]{1,0} fusion(%x), kind=kLoop, calls=%g, metadata={op_name="jit(step)/transpose(jvp())/mul"}
  %dw1.bits = bf16[2,8,3]{2,1,0} bitcast(%x)
  %dw1 = f32[2,8,32]{2,1,0} fusion(%da, %dw1.bits), kind=kCustom, calls=%gemm, metadata={op_name="jit(step)/transpose(jvp())/dot_general"}, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
  %dx = bf16[2,3,8]{2,1,0} custom-call(%da, %w1), custom_call_target="__cublas$gemm", metadata={op_name="jit(step)/transpose(jvp())/dot_general"}
  %logits = f32[6,100]{1,0} fusion(%x), kind=kLoop, calls=%l, metadata={op_name="jit(step)/jvp()/convert_element_type"}
  %adam = f32[8,32]{1,0} fusion(%w1), kind=kLoop, calls=%o, metadata={op_name="jit(step)/add" stack_frame_id=1}
  ROOT %t = bf16[8,6]{1,0} transpose(%x), dimensions={1,0}, metadata={op_name="jit(step)/transpose"}
}
"""


def test_instructions_are_sorted_by_their_shapes_scopes_and_code():
    hlo, entry = hlo_profile.parse_hlo(HLO)
    assert entry[0] == "x" and entry[-1] == "t"
    assert hlo["adam"].file == "site-packages/optax/_src/transform.py"
    got = {n: hlo_profile.category_of(hlo[n], hlo, SMALL) for n in entry}
    assert got == {
        "x": "norms/elementwise",
        "w1": "norms/elementwise",
        "h": "matmul: feed-forward in, forward",
        "a": "norms/elementwise",
        "dy": "norms/elementwise",
        # X^T dY with the operands either way round: X, from the forward pass, is the input
        "dw2": "matmul: feed-forward out, backward dW",
        "da": "norms/elementwise",
        "dw1.bits": "norms/elementwise",
        "dw1": "matmul: feed-forward in, backward dW",  # split-K: [2, E, F]
        "dx": "matmul: feed-forward in, backward dX",  # [B, T, E]
        "logits": "loss",
        "adam": "optimizer",
        "t": "copies",
    }


def test_library_kernels_run_the_cublas_calls_in_schedule_order():
    kernels = ["Memset", "nvjet_a", "splitKreduce_kernel", "cudnn_fprop", "nvjet_b", "gemm_c"]
    got = hlo_profile._library(kernels, ["first", "second"], "attention")
    assert got == ["copies", "first", "first", "attention", "second", "unmatched"]


def test_steps_and_busy_time_of_hand_made_events():
    events = [
        dict(op="command_buffer_1", launch="1", ts=0.0, dur=10.0),
        dict(op="command_buffer_1", launch="1", ts=5.0, dur=10.0),
        dict(op="command_buffer_1", launch="2", ts=20.0, dur=5.0),
        dict(op="fusion.3", launch="7", ts=30.0, dur=1.0),
        dict(op="fusion.4", launch="8", ts=30.0, dur=1.0),
        dict(op="fusion.4", launch="9", ts=40.0, dur=1.0),
    ]
    assert hlo_profile.steps_in(events) == 2  # two launches of two of the three ops
    assert hlo_profile.busy_us(events) == 15 + 5 + 1 + 1
