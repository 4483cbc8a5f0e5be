"""tokamax's kernels behind ATTENTION, "auto"'s table on pretend devices, and causality and
padding reaching the kernels as a flag and lengths (checked on the train steps' jaxprs)."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxformer import accelerators, train
from jaxformer import functional as F
from jaxformer.config import TransformerConfig
from jaxformer.functional import attention as attention_module
from jaxformer.functional import kernels
from jaxformer.functional.chunked_attention import chunked_attention
from jaxformer.models import DecoderLM, Transformer

tokamax = pytest.importorskip(
    "tokamax", reason="the kernels extra: pip install 'jaxformer[kernels]'"
)


def _qkv(B=2, T=12, S=12, H=4, K=2, D=8, dtype=jnp.float32, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(keys[0], (B, T, H, D), dtype)
    k = jax.random.normal(keys[1], (B, S, K, D), dtype)
    v = jax.random.normal(keys[2], (B, S, K, D), dtype)
    return q, k, v


def _value_and_grads(implementation, q, k, v, **kw):
    def loss(q, k, v):
        out = F.scaled_dot_product_attention(q, k, v, implementation=implementation, **kw)
        return jnp.sum(jnp.sin(out)), out

    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    return out, grads


@pytest.mark.parametrize("implementation", ["tokamax_xla", "chunked", "xla"])
def test_flag_and_lengths_equal_the_dense_mask(implementation):
    """causal=True with k_lengths computes what the dense causal and padding mask does."""
    q, k, v = _qkv()
    lengths = jnp.array([7, 0], jnp.int32)  # row 1: no key at all -> zero output
    dense = F.combine_masks(
        F.causal_mask(12), F.padding_mask(None, jnp.arange(12)[None, :] < lengths[:, None])
    )
    want_out, want_grads = _value_and_grads("xla", q, k, v, mask=dense)
    out, grads = _value_and_grads(implementation, q, k, v, causal=True, k_lengths=lengths)
    np.testing.assert_allclose(out, want_out, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(out[1], 0.0)
    for a, b in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_tokamax_xla_takes_explicit_masks_bias_and_grouped_heads():
    q, k, v = _qkv(T=6, S=9, H=6, K=3, seed=1)
    rng = np.random.default_rng(0)
    mask = jnp.asarray(rng.random((2, 1, 6, 9)) < 0.6)
    bias = jnp.asarray(rng.normal(size=(1, 6, 6, 9)), jnp.float32)
    want = F.scaled_dot_product_attention(q, k, v, mask, bias=bias, implementation="xla")
    got = F.scaled_dot_product_attention(q, k, v, mask, bias=bias, implementation="tokamax_xla")
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_tokamax_kernels_refuse_dropout():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="tokamax_xla' has no attention dropout"):
        F.scaled_dot_product_attention(
            q, k, v, dropout_rate=0.1, dropout_rng=jax.random.key(0), implementation="tokamax_xla"
        )


def test_without_tokamax_a_forced_name_says_how_to_install_and_auto_falls_back(monkeypatch, caplog):
    monkeypatch.setattr(kernels, "tokamax_or_none", lambda: None)
    q, k, v = _qkv(T=10, S=10)
    with pytest.raises(ImportError, match=r"pip install 'jaxformer\[kernels\]'"):
        F.scaled_dot_product_attention(q, k, v, causal=True, implementation="tokamax_xla")
    caplog.set_level("INFO", logger="jaxformer.attention")
    spec = [jax.ShapeDtypeStruct((3, 130, 4, 8), jnp.bfloat16)] * 3
    with _pretend(monkeypatch, "gpu", "NVIDIA H100 80GB HBM3", "9.0"):
        assert F.choose_implementation(*spec, masked=True, dropout_rate=0.0) == "cudnn"
    assert any("tokamax is not installed" in r.getMessage() for r in caplog.records)


# --- "auto" on pretend devices ----------------------------------------------------------


def _pretend(monkeypatch, platform, kind, capability=None):
    """Within: the default device is a stand-in `kind` on which tokamax's kernels build."""
    monkeypatch.setattr(accelerators, "kernel_failure", lambda name, capability=None: None)
    monkeypatch.setenv("XLA_FLAGS", "")
    return jax.default_device(accelerators.StandInDevice(platform, kind, capability))


def _choose(dtype, *, D=64, T=256, padded=False, explicit=False, dense=False, dropout_rate=0.0):
    spec = [jax.ShapeDtypeStruct((4, T, 8, D), dtype)] * 3
    return F.choose_implementation(
        *spec,
        masked=True,
        dropout_rate=dropout_rate,
        padded=padded,
        explicit=explicit,
        dense=dense,
    )


def test_device_families_read_the_compute_capability():
    gpu = lambda cc: types.SimpleNamespace(device_kind="NVIDIA X", compute_capability=cc)  # noqa: E731
    assert kernels.device_families("gpu", gpu("9.0")) == ("gpu_sm90", "gpu")
    assert kernels.device_families("gpu", gpu("10.0")) == ("gpu_sm100", "gpu")
    assert kernels.device_families("gpu", gpu("8.0")) == ("gpu",)
    assert kernels.device_families("tpu", types.SimpleNamespace(device_kind="TPU v4")) == ("tpu",)
    assert kernels.device_families("cpu", types.SimpleNamespace(device_kind="cpu")) == ("cpu",)


def test_auto_on_a_tpu_runs_splash_for_flags_lengths_and_validity(monkeypatch):
    """Splash takes causality as its mask object and padding (lengths or validity
    vectors) as segment ids; what it cannot take runs XLA's code."""
    with _pretend(monkeypatch, "tpu", "TPU v5 lite"):
        assert _choose(jnp.bfloat16) == "splash"
        assert _choose(jnp.float32) == "splash"
        assert _choose(jnp.bfloat16, padded=True, explicit=True) == "splash"
        assert _choose(jnp.bfloat16, explicit=True, dense=True) == "xla"  # a mask or bias
        assert _choose(jnp.bfloat16, dropout_rate=0.1) == "xla"
        assert _choose(jnp.bfloat16, T=200) == "xla"  # not a multiple of splash's tile
    with _pretend(monkeypatch, "tpu", "TPU v4"):
        assert _choose(jnp.bfloat16) == "splash"


def test_auto_on_hopper_runs_mosaic_then_cudnn(monkeypatch):
    with _pretend(monkeypatch, "gpu", "NVIDIA H100 80GB HBM3", "9.0"):
        assert _choose(jnp.bfloat16) == "tokamax_mosaic"
        assert _choose(jnp.bfloat16, padded=True, explicit=True) == "tokamax_mosaic"
        assert _choose(jnp.bfloat16, dropout_rate=0.1) == "xla"  # neither takes dropout
        assert _choose(jnp.float32) == "xla"  # neither takes float32 at default precision
        monkeypatch.setattr(kernels, "tokamax_or_none", lambda: None)
        assert _choose(jnp.bfloat16) == "cudnn"
    with _pretend(monkeypatch, "gpu", "NVIDIA A100-SXM4-80GB", "8.0"):
        assert _choose(jnp.bfloat16) == "cudnn"


def test_auto_follows_the_table(monkeypatch):
    """The table is data: a row the GPU report adds (cuDNN first up to 1,024 keys) wins."""
    rule = F.AutoRule("gpu_sm90", "cudnn", 1024, "a pretend measurement")
    monkeypatch.setattr(attention_module, "AUTO_RULES", (rule, *F.AUTO_RULES))
    spec = [jax.ShapeDtypeStruct((1, 2048, 8, 64), jnp.bfloat16)] * 3
    with _pretend(monkeypatch, "gpu", "NVIDIA H100 80GB HBM3", "9.0"):
        assert _choose(jnp.bfloat16) == "cudnn"  # 256 keys
        assert F.choose_implementation(*spec, masked=True, dropout_rate=0.0) == "tokamax_mosaic"


def test_auto_skips_a_kernel_that_does_not_build_here(monkeypatch, caplog):
    """tokamax 0.0.12's Mosaic GPU kernel fails to trace under jax 0.11.2 (H200, 2026-11-26):
    "auto" runs cuDNN there, and says why; a forced call is one clear error."""
    failure = "TypeError: Mesh.__init__() got an unexpected keyword argument 'out_shape'"
    caplog.set_level("INFO", logger="jaxformer.attention")
    spec = [jax.ShapeDtypeStruct((2, 96, 4, 64), jnp.bfloat16)] * 3
    q, k, v = (jnp.zeros((1, 8, 2, 64), jnp.bfloat16),) * 3
    with _pretend(monkeypatch, "gpu", "NVIDIA H200", "9.0"):
        monkeypatch.setattr(accelerators, "kernel_failure", lambda name, capability=None: failure)
        assert F.choose_implementation(*spec, masked=True, dropout_rate=0.0) == "cudnn"
        with pytest.raises(RuntimeError, match=r"tokamax_mosaic' fails to build .*'out_shape'"):
            F.scaled_dot_product_attention(q, k, v, causal=True, implementation="tokamax_mosaic")
    assert any("fails to build with tokamax" in r.getMessage() for r in caplog.records)


# A tokamax kernel that is not for this platform: tokamax refuses it (NotImplementedError)
# before building it, on a CPU (Mosaic), on an NVIDIA GPU (Mosaic's TPU kernel) or a TPU.
NOT_FOR_THIS_PLATFORM = {"cpu": "mosaic", "gpu": "mosaic_tpu", "tpu": "triton"}


def test_the_build_check_traces_compiles_and_reports_a_failure(monkeypatch):
    """kernel_failure builds the kernel's forward and backward once per name, also when
    asked while another function is being traced, and names a failure in one line."""
    kernel_failure = accelerators.kernel_failure
    kernel_failure.cache_clear()
    jax.jit(lambda x: x + (kernel_failure("xla") is None))(1.0)  # asked in a trace
    assert kernel_failure("xla") is None
    elsewhere = kernel_failure(NOT_FOR_THIS_PLATFORM[jax.default_backend()])
    device = jax.devices()[0].device_kind
    assert elsewhere == f"NotImplementedError: Not supported on {device}."
    tokamax = kernels.tokamax_or_none()

    def broken(*args, **kwargs):
        raise AttributeError("pl.dot was removed\nmore lines")

    monkeypatch.setattr(tokamax, "dot_product_attention", broken)
    kernel_failure.cache_clear()
    assert kernel_failure("triton") == "AttributeError: pl.dot was removed"
    kernel_failure.cache_clear()


def test_forced_mosaic_off_its_devices_is_a_clear_error(monkeypatch):
    q, k, v = _qkv()
    message = "tokamax_mosaic' needs a Hopper or Blackwell GPU or a TPU"
    with _pretend(monkeypatch, "gpu", "NVIDIA A100-SXM4-80GB", "8.0"):  # also on a Hopper
        with pytest.raises(ValueError, match=message):
            F.scaled_dot_product_attention(q, k, v, causal=True, implementation="tokamax_mosaic")


def test_tokamax_mosaic_tpu_kernel_in_pallas_interpret_mode(monkeypatch):
    """tokamax's Mosaic TPU kernel (splash attention), forward and backward, run on the CPU
    by Pallas's interpreter: the kernel's own code, not its speed or its TPU lowering.
    Reaches into tokamax's private modules (0.0.12) to allow a CPU and to interpret."""
    from tokamax._src.ops.attention import base, pallas_mosaic_tpu, pallas_mosaic_tpu_vjp
    from tokamax._src.ops.experimental.tpu.splash_attention import splash_attention_kernel

    config = splash_attention_kernel.SplashConfig
    default = config.get_default()
    monkeypatch.setattr(
        config, "get_default", classmethod(lambda cls: dataclasses.replace(default, interpret=True))
    )

    class OnCpu(pallas_mosaic_tpu.PallasMosaicTpuFlashAttention):
        def supported_on(self, device):
            return True

    class VjpOnCpu(pallas_mosaic_tpu_vjp.PallasMosaicTpuFlashAttentionVjp):
        def supported_on(self, device):
            return True

    kernel = OnCpu(vjp=VjpOnCpu())
    q, k, v = _qkv(B=1, T=256, S=256, H=2, K=1, D=64, seed=3)  # 128-row tiles
    mosaic = lambda q, k, v: kernel(q, k, v, mask=base.Mask(is_causal=True))  # noqa: E731
    plain = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=True)  # noqa: E731
    np.testing.assert_allclose(mosaic(q, k, v), plain(q, k, v), atol=1e-5, rtol=1e-5)
    loss = lambda f: lambda *a: jnp.sum(jnp.sin(f(*a)))  # noqa: E731
    got = jax.grad(loss(mosaic), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(plain), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


# --- the models pass causality as a flag and padding as lengths ----------------------------


@F.ATTENTION.register("chunked_tiles4", raw_masks=True)
def _chunked_tiles4(q, k, v, **kw):
    """ "chunked" with 4 x 4 tiles: shorter than the test's sequences, so any [T, S] mask
    in the program comes from outside the kernel."""
    return chunked_attention(q, k, v, block_q=4, block_k=4, **kw)


T, S = 12, 10  # target and source lengths; no other axis of the programs has these sizes
QUERY_KEY = ((T, T), (T, S), (S, S))


def _step_jaxpr(kind, implementation):
    """The jaxpr of one train step (forward, backward, update) on a padded batch."""
    config = TransformerConfig.tiny(
        32, d_model=16, d_ff=32, num_heads=2, attention_impl=implementation
    )
    model = (Transformer if kind == "transformer" else DecoderLM)(config, rngs=nnx.Rngs(0))
    opt = optax.adam(1e-3)
    graphdef, state = train.create_train_state(model, opt, 0)
    step = train.make_train_step(graphdef, opt, optax.constant_schedule(1e-3), label_smoothing=0.1)
    tgt = jnp.ones((2, T), jnp.int32)
    batch = dict(tgt_in=tgt, tgt_out=tgt, tgt_valid=jnp.arange(T)[None, :] < jnp.array([[T], [7]]))
    if kind == "transformer":
        batch |= dict(
            src=jnp.ones((2, S), jnp.int32),
            src_valid=jnp.arange(S)[None, :] < jnp.array([[S], [4]]),
        )
    if kind == "decoder_lm_packed":  # two documents and padding per row, as segment ids
        segment_ids = jnp.array([[1] * 5 + [2] * 7, [1] * 3 + [2] * 6 + [0] * 3], jnp.int32)
        batch |= dict(segment_ids=segment_ids, positions=jnp.zeros((2, T), jnp.int32))
        del batch["tgt_valid"]
    return jax.make_jaxpr(step)(state, batch)


def _masks_built(closed_jaxpr):
    """(where, shape) of every boolean array the program computes whose last two axes are
    query x key lengths ([T, T], [T, S], [S, S]), sub-programs included; where: the name
    stack and the source files of the equation's traceback."""
    found = []

    def walk(jaxpr, outer):
        for eqn in jaxpr.eqns:
            tb = eqn.source_info.traceback
            files = [] if tb is None else [f.file_name for f in tb.frames]
            where = " ".join([f"{outer}/{eqn.source_info.name_stack}", *files])
            for var in eqn.outvars:
                aval = var.aval
                lengths = tuple(getattr(aval, "shape", ())[-2:])
                if getattr(aval, "dtype", None) == jnp.bool_ and lengths in QUERY_KEY:
                    found.append((where, aval.shape))
            for sub in _sub_jaxprs(eqn.params):  # where the sub-program is called from
                walk(sub, where)

    walk(closed_jaxpr.jaxpr, "")
    return found


def _sub_jaxprs(params):
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, jax.extend.core.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jax.extend.core.Jaxpr):
                yield item


@pytest.mark.parametrize("kind", ["decoder_lm", "decoder_lm_packed", "transformer"])
def test_a_kernel_that_takes_flags_gets_no_dense_mask(kind):
    """With "chunked" (4 x 4 tiles) the whole train step, forward and backward, builds no
    boolean [T, T], [T, S] or [S, S] array: the models pass causality as a flag, padding as
    lengths and packed documents as segment ids, and the kernel applies them per tile."""
    assert _masks_built(_step_jaxpr(kind, "chunked_tiles4")) == []


@pytest.mark.parametrize("kind", ["decoder_lm", "decoder_lm_packed", "transformer"])
def test_xla_and_tokamax_xla_form_the_mask_inside_themselves_only(kind, monkeypatch):
    """The plain implementations need the dense mask: "xla" forms it inside its own name
    scope, tokamax's XLA reference inside tokamax's code (and packed documents' mask in its
    kernel's scope); nothing outside them forms one. Causality reaches tokamax as is_causal
    and the target padding as key lengths, with no boolean mask unless rows are packed."""
    calls = []

    def recorded(*args, **kw):
        calls.append(kw)
        return attend(*args, **kw)

    attend = tokamax.dot_product_attention
    monkeypatch.setattr(tokamax, "dot_product_attention", recorded)
    markers = {"xla": ("xla_attention",), "tokamax_xla": ("tokamax", "/tokamax/")}
    for implementation, inside in markers.items():
        built = _masks_built(_step_jaxpr(kind, implementation))
        assert built, "the check must see the masks the implementation forms"
        outside = [(w, shape) for w, shape in built if not any(m in w for m in inside)]
        assert outside == [], implementation
    causal = [kw for kw in calls if kw["is_causal"]]
    packed = kind == "decoder_lm_packed"  # its rows' padding is segment 0, not lengths
    assert causal and all((kw["mask"] is None) != packed for kw in causal)
    shapes = [getattr(kw["key_value_seq_lengths"], "shape", None) for kw in causal]
    assert shapes == [None if packed else (2,)] * len(causal)
