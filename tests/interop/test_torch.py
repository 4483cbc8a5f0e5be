"""Parity with PyTorch: modules converted by `from_torch` give torch's outputs (within
1e-5) and input gradients (within 1e-4) over a grid of configurations and inputs, and
`to_torch` returns the weights bit for bit."""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer import nn as jnn

torch = pytest.importorskip(
    "torch", reason="the PyTorch parity tests need torch (make test installs torch==2.13.0)"
)
from jaxformer.interop.torch import (  # noqa: E402
    config_from_torch,
    from_torch,
    mask_from_torch,
    to_torch,
)

tnn = torch.nn
pytestmark = [
    pytest.mark.filterwarnings("ignore:enable_nested_tensor is True"),
    pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype"),
]

# Torch's constructor options; activations given in each of torch's accepted forms.
FIELDS = "d_model nhead dim_feedforward activation layer_norm_eps batch_first norm_first bias"
CONFIGS = {
    name: dict(zip(FIELDS.split(), values, strict=True))
    for name, *values in [
        ("post_relu_bias_seqfirst", 16, 4, 24, "relu", 1e-5, False, False, True),
        ("pre_gelu_nobias_batchfirst", 16, 2, 32, tnn.functional.gelu, 1e-6, True, True, False),
        ("pre_relu_bias_batchfirst_3heads", 12, 3, 20, tnn.ReLU(), 1e-5, True, True, True),
        ("post_gelu_nobias_seqfirst_1head", 8, 1, 16, "gelu", 1e-3, False, False, False),
    ]
}

# padded: source and target key padding and a causal target mask, as float (0 / -inf)
# masks; batch1: a single row, causal bool masks on both sides, source shorter.
INPUTS = {
    "padded": dict(B=3, S=7, T=5, src_len=[7, 4, 1], tgt_len=[5, 2, 3], mask_dtype="float"),
    "batch1": dict(B=1, S=4, T=6, src_len=None, tgt_len=None, mask_dtype="bool"),
}
KINDS = ("mha", "encoder_layer", "decoder_layer", "encoder", "decoder", "transformer")


def build(kind, cfg, *, seed=0):
    """A torch module in eval mode with every parameter random (torch zeroes biases)."""
    torch.manual_seed(seed)
    c = dict(cfg)
    E, H, bias, bf = c["d_model"], c["nhead"], c["bias"], c["batch_first"]
    layer_kw = dict(
        dim_feedforward=c["dim_feedforward"],
        dropout=0.1,
        activation=c["activation"],
        layer_norm_eps=c["layer_norm_eps"],
        batch_first=bf,
        norm_first=c["norm_first"],
        bias=bias,
    )
    final_norm = tnn.LayerNorm(E, eps=c["layer_norm_eps"], bias=bias) if c["norm_first"] else None
    if kind == "mha":
        m = tnn.MultiheadAttention(E, H, dropout=0.1, bias=bias, batch_first=bf)
    elif kind == "encoder_layer":
        m = tnn.TransformerEncoderLayer(E, H, **layer_kw)
    elif kind == "decoder_layer":
        m = tnn.TransformerDecoderLayer(E, H, **layer_kw)
    elif kind == "encoder":
        layer = tnn.TransformerEncoderLayer(E, H, **layer_kw)
        m = tnn.TransformerEncoder(layer, 2, final_norm, enable_nested_tensor=False)
    elif kind == "decoder":
        m = tnn.TransformerDecoder(tnn.TransformerDecoderLayer(E, H, **layer_kw), 2, final_norm)
    else:
        m = tnn.Transformer(E, H, 2, 1, **layer_kw)
    return randomize(m).eval()


def randomize(m):
    """Every parameter N(0, 0.3^2), LayerNorm scales around 1."""
    with torch.no_grad():
        for name, p in m.named_parameters():
            owner = name.split(".")[-2] if "." in name else ""
            offset = 1.0 if owner.startswith("norm") and name.endswith("weight") else 0.0
            p.copy_(torch.randn(p.shape) * 0.3 + offset)
    return m


def torch_masks(inp):
    """Torch's masks: True / -inf = may not attend."""
    B, S, T = inp["B"], inp["S"], inp["T"]

    def pad(lengths, L):
        if lengths is None:
            return None
        return torch.arange(L)[None, :] >= torch.tensor(lengths)[:, None]

    def causal(L):
        return torch.ones(L, L, dtype=torch.bool).triu(1)

    masks = dict(src_kpm=pad(inp["src_len"], S), tgt_kpm=pad(inp["tgt_len"], T))
    masks["tgt_mask"] = causal(T)
    masks["src_mask"] = causal(S) if inp["src_len"] is None else None
    if inp["mask_dtype"] == "float":
        for k, m in masks.items():
            if m is not None:
                masks[k] = torch.zeros(m.shape).masked_fill(m, float("-inf"))
    assert B == 1 or masks["src_kpm"] is not None
    return masks


def functions(kind, m, j, inp, cfg):
    """(input arrays, torch function, jaxformer function) on batch-first arrays."""
    rng = np.random.default_rng(1)
    E = cfg["d_model"]
    src = rng.standard_normal((inp["B"], inp["S"], E)).astype(np.float32)
    tgt = rng.standard_normal((inp["B"], inp["T"], E)).astype(np.float32)
    tm = torch_masks(inp)
    L = (lambda x: x) if cfg["batch_first"] else (lambda x: x.transpose(0, 1))
    src_mask = mask_from_torch(tm["src_mask"], tm["src_kpm"])
    tgt_mask = mask_from_torch(tm["tgt_mask"], tm["tgt_kpm"])
    memory_mask = mask_from_torch(None, tm["src_kpm"])
    if kind == "mha" and inp["src_len"] is not None:  # cross-attention with key padding

        def tf(q, kv):
            return L(m(L(q), L(kv), L(kv), key_padding_mask=tm["src_kpm"], need_weights=False)[0])

        return (tgt, src), tf, lambda q, kv: j(q, kv, memory_mask).out
    if kind == "mha":  # causal self-attention

        def tf(x):
            x = L(x)
            return L(m(x, x, x, attn_mask=tm["tgt_mask"], need_weights=False)[0])

        return (tgt,), tf, lambda x: j(x, None, tgt_mask).out
    if kind == "encoder_layer":
        tf = lambda x: L(m(L(x), tm["src_mask"], tm["src_kpm"]))  # noqa: E731
        return (src,), tf, lambda x: j(x, src_mask)
    if kind == "encoder":
        tf = lambda x: L(m(L(x), mask=tm["src_mask"], src_key_padding_mask=tm["src_kpm"]))  # noqa: E731
        return (src,), tf, lambda x: j(x, src_mask)
    if kind in ("decoder_layer", "decoder"):

        def tf(y, memory):
            out = m(
                L(y),
                L(memory),
                tgt_mask=tm["tgt_mask"],
                tgt_key_padding_mask=tm["tgt_kpm"],
                memory_key_padding_mask=tm["src_kpm"],
            )
            return L(out)

        return (tgt, src), tf, lambda y, mem: j(y, tgt_mask, memory=mem, cross_mask=memory_mask).y

    def tf(s, t):
        out = m(
            L(s),
            L(t),
            src_mask=tm["src_mask"],
            tgt_mask=tm["tgt_mask"],
            src_key_padding_mask=tm["src_kpm"],
            tgt_key_padding_mask=tm["tgt_kpm"],
            memory_key_padding_mask=tm["src_kpm"],
        )
        return L(out)

    return (src, tgt), tf, lambda s, t: j(s, t, src_mask, tgt_mask, memory_mask)


def max_differences(kind, cfg, inp):
    """Max |torch - jaxformer| of the outputs and of the input gradients."""
    m = build(kind, cfg)
    j = from_torch(m)
    arrays, tf, jf_ = functions(kind, m, j, inp, cfg)
    t_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    t_out = tf(*t_in)
    cotangent = np.random.default_rng(2).standard_normal(t_out.shape).astype(np.float32)
    (t_out * torch.tensor(cotangent)).sum().backward()

    # One compilation instead of many small eager ones; the arrays are tiny, so skip
    # LLVM's optimisations (compiles ~40% faster; the math is the same).
    @functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})
    def forward_backward(*xs):
        out, vjp = jax.vjp(jf_, *xs)
        return out, vjp(jnp.asarray(cotangent))

    j_out, j_grads = forward_backward(*map(jnp.asarray, arrays))
    t_out = t_out.detach().numpy()
    assert j_out.shape == t_out.shape and np.isfinite(t_out).all()
    assert np.abs(t_out).max() > 0.1  # a real output, not a trivial zero
    grad_diff = max(
        float(np.abs(np.asarray(g) - t.grad.numpy()).max())
        for g, t in zip(j_grads, t_in, strict=True)
    )
    assert all(np.abs(t.grad.numpy()).max() > 1e-3 for t in t_in)
    return float(np.abs(np.asarray(j_out) - t_out).max()), grad_diff


def _grid():
    """Every (kind, config, inputs); half of the configs per input run only with --slow
    tests (make test-all), so each kind still meets every config and every input."""
    for kind in KINDS:
        for i, config in enumerate(CONFIGS):
            for k, inputs in enumerate(INPUTS):
                marks = [pytest.mark.slow] if (i + k) % 2 else []
                yield pytest.param(
                    kind, config, inputs, marks=marks, id=f"{kind}-{config}-{inputs}"
                )


@pytest.mark.parametrize("kind, config, inputs", list(_grid()))
def test_outputs_and_input_gradients_match_torch(kind, config, inputs):
    out_diff, grad_diff = max_differences(kind, CONFIGS[config], INPUTS[inputs])
    assert out_diff <= 1e-5, out_diff
    assert grad_diff <= 1e-4, grad_diff


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_reproduces_the_weights(kind, config):
    cfg = CONFIGS[config]
    m = build(kind, cfg)
    back = to_torch(from_torch(m), batch_first=cfg["batch_first"], dropout=0.1)

    def architecture(module):  # torch lists an activation given as a module among the children
        return [line for line in repr(module).splitlines() if "(activation)" not in line]

    assert architecture(back) == architecture(m)
    a, b = m.state_dict(), back.state_dict()
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    layers_a, layers_b = dict(m.named_modules()), dict(back.named_modules())
    for name, sub in layers_a.items():
        for attr in ("norm_first", "batch_first"):
            assert getattr(sub, attr, None) == getattr(layers_b.get(name), attr, None), name
        if hasattr(sub, "linear1"):  # a layer: the same activation function
            x = torch.linspace(-3, 3, 13)
            assert torch.equal(sub.activation(x), layers_b[name].activation(x)), name


def test_config_records_torch_options():
    cfg = CONFIGS["post_gelu_nobias_seqfirst_1head"]
    c = config_from_torch(build("transformer", cfg))
    assert (c.d_model, c.num_heads, c.d_ff) == (8, 1, 16)
    assert (c.num_encoder_layers, c.num_decoder_layers) == (2, 1)
    assert c.norm_placement == "post" and c.use_final_norm  # nn.Transformer adds both
    assert c.activation == "gelu" and c.norm_eps == 1e-3
    assert not (c.attention_bias or c.ffn_bias or c.norm_bias)
    assert c.dropout_rate == c.attention_dropout_rate == 0.1
    no_norm = tnn.TransformerEncoder(tnn.TransformerEncoderLayer(8, 2, 16, norm_first=True), 2)
    assert not config_from_torch(no_norm).use_final_norm


def random_module(make):
    """make()'s module with N(0, 0.3) parameters, built without compiling initializers."""
    module = nnx.eval_shape(make)
    rng = np.random.default_rng(3)
    state = nnx.state(module, nnx.Param)
    for _, var in nnx.to_flat_state(state):
        var.set_value(jnp.asarray(rng.normal(0.0, 0.3, var.shape), var.dtype))
    nnx.update(module, state)
    return module


def test_jaxformer_model_exports_to_torch_with_parity():
    """The other direction: a jaxformer EncoderDecoder, exported, computes the same."""
    c = jf.TransformerConfig(
        vocab_size=1,
        num_encoder_layers=2,
        num_decoder_layers=2,
        d_model=16,
        d_ff=32,
        num_heads=4,
        norm_placement="pre",
        norm_eps=1e-5,
        activation="gelu",
        attention_bias=True,
        position_embedding="none",
    )
    j = random_module(lambda: jnn.EncoderDecoder(c, rngs=nnx.Rngs(0)))
    m = to_torch(j).eval()
    rng = np.random.default_rng(0)
    src = rng.standard_normal((2, 6, 16)).astype(np.float32)
    tgt = rng.standard_normal((2, 4, 16)).astype(np.float32)
    causal = tnn.Transformer.generate_square_subsequent_mask(4)
    with torch.no_grad():
        want = m(torch.tensor(src), torch.tensor(tgt), tgt_mask=causal).numpy()
    got = jax.jit(lambda s, t, m: j(s, t, tgt_mask=m))(src, tgt, mask_from_torch(causal))
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    again = from_torch(m)
    for a, b in zip(jax.tree.leaves(nnx.state(j)), jax.tree.leaves(nnx.state(again)), strict=True):
        np.testing.assert_array_equal(a, b)


def test_torch_fast_path_agrees_on_real_positions():
    """Under no_grad torch takes its fused path (nested tensors for padding, which zero the
    padded positions); real positions still match."""
    torch.manual_seed(0)
    layer = tnn.TransformerEncoderLayer(16, 4, 24, batch_first=True)
    m = randomize(tnn.TransformerEncoder(layer, 2, enable_nested_tensor=True)).eval()
    j = from_torch(m)
    inp = INPUTS["padded"]
    x = np.random.default_rng(0).standard_normal((3, 7, 16)).astype(np.float32)
    kpm = torch.arange(7)[None, :] >= torch.tensor(inp["src_len"])[:, None]
    with torch.inference_mode():
        want = m(torch.tensor(x), src_key_padding_mask=kpm).numpy()
    got = np.asarray(jax.jit(j)(x, mask_from_torch(None, kpm)))
    real = ~kpm.numpy()
    assert (want[~real] == 0).all()  # the fast path ran: padded positions come back zero
    np.testing.assert_allclose(got[real], want[real], atol=1e-5, rtol=0)


def test_mask_from_torch():
    causal = tnn.Transformer.generate_square_subsequent_mask(3)
    as_bool = causal.isinf()
    np.testing.assert_array_equal(mask_from_torch(causal), mask_from_torch(as_bool))
    np.testing.assert_array_equal(mask_from_torch(causal)[0, 0], np.tril(np.ones((3, 3), bool)))
    kpm = torch.tensor([[False, False, True]])
    m = mask_from_torch(causal, kpm)
    assert m.shape == (1, 1, 3, 3) and not m[0, 0, 2, 2] and m[0, 0, 1, 1]
    per_head = torch.zeros(2 * 4, 3, 3, dtype=torch.bool)
    per_head[5, 0, 1] = True
    m = mask_from_torch(per_head, num_heads=4)
    assert m.shape == (2, 4, 3, 3) and not m[1, 1, 0, 1] and int(m.sum()) == 2 * 4 * 9 - 1
    assert mask_from_torch() is None
    with pytest.raises(ValueError, match="attn_mask holds additive values other than 0"):
        mask_from_torch(torch.full((3, 3), -1.0))
    with pytest.raises(ValueError, match="num_heads"):
        mask_from_torch(per_head)
    with pytest.raises(TypeError, match="key_padding_mask must be boolean or float"):
        mask_from_torch(None, torch.zeros(1, 3, dtype=torch.int64))


REFUSED = [
    (lambda: tnn.MultiheadAttention(8, 2, kdim=4), "kdim=4"),
    (lambda: tnn.MultiheadAttention(8, 2, vdim=6), "vdim=6"),
    (lambda: tnn.MultiheadAttention(8, 2, add_bias_kv=True), "add_bias_kv=True"),
    (lambda: tnn.MultiheadAttention(8, 2, add_zero_attn=True), "add_zero_attn=True"),
    (lambda: tnn.TransformerEncoderLayer(8, 2, 16, activation=torch.tanh), "activation="),
    (
        lambda: tnn.TransformerDecoderLayer(8, 2, 16, activation=tnn.GELU(approximate="tanh")),
        "activation=GELU",
    ),
    # torch quirk: nn.Transformer(activation=nn.GELU()) gives decoder layers whose
    # clones call F.relu (TransformerDecoderLayer.__setstate__ during deepcopy), so the
    # stacks really differ.
    (
        lambda: tnn.Transformer(8, 2, 1, 1, 16, activation=tnn.GELU()),
        "decoder.layers.0.activation='relu' differs from encoder.layers.0.activation='gelu'",
    ),
    (lambda: tnn.TransformerEncoderLayer(8, 2, 16).double(), "dtype"),
    (
        lambda: tnn.TransformerEncoder(
            tnn.TransformerEncoderLayer(8, 2, 16), 1, tnn.LayerNorm(8, eps=1e-6)
        ),
        "norm.eps=1e-06 differs",
    ),
    (
        lambda: tnn.TransformerEncoder(
            tnn.TransformerEncoderLayer(8, 2, 16), 1, tnn.LayerNorm(8, elementwise_affine=False)
        ),
        "elementwise_affine=False",
    ),
    (
        lambda: tnn.Transformer(
            8,
            2,
            1,
            1,
            16,
            custom_encoder=tnn.TransformerEncoder(tnn.TransformerEncoderLayer(8, 2, 16), 1),
        ),
        "final_norm",
    ),
    (
        lambda: tnn.Transformer(8, 2, 1, 1, 16, custom_decoder=tnn.Linear(8, 8)),
        "custom_decoder: a Linear",
    ),
]


@pytest.mark.parametrize("make, option", REFUSED, ids=[o for _, o in REFUSED])
def test_from_torch_refuses_what_it_cannot_represent(make, option):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = make()
    with pytest.raises(ValueError, match=option.replace("(", r"\(")):
        from_torch(module)


def test_from_torch_refuses_mixed_layers_and_other_types():
    m = build("encoder", CONFIGS["post_relu_bias_seqfirst"])
    m.layers[1].norm_first = True
    with pytest.raises(ValueError, match=r"layers\.1\.norm_first=True differs from layers\.0"):
        from_torch(m)
    m = build("encoder_layer", CONFIGS["post_relu_bias_seqfirst"])
    m.norm2.eps = 1e-3
    with pytest.raises(ValueError, match="layer_norm_eps differs between the norms"):
        from_torch(m)
    with pytest.raises(TypeError, match="from_torch converts .* got torch.nn.modules.linear"):
        from_torch(tnn.Linear(2, 2))


def _jax_module(**overrides):
    fields = dict(vocab_size=1, num_encoder_layers=1, num_decoder_layers=1, d_model=8, d_ff=16)
    fields |= dict(num_heads=2, position_embedding="none", attention_bias=True)
    return jf.TransformerConfig(**(fields | overrides))


@pytest.mark.parametrize(
    "overrides, option",
    [
        (dict(norm="rms"), "norm='rms'"),
        (dict(activation="swiglu"), "activation='swiglu'"),
        (dict(num_kv_heads=1), "num_kv_heads=1"),
        (dict(d_k=3), "d_k=3"),
        (dict(d_v=3), "d_v=3"),
        (dict(attention_bias=False), "bias"),
        (dict(num_encoder_layers=0), "num_encoder_layers=0"),
    ],
)
def test_to_torch_refuses_what_torch_cannot_represent(overrides, option):
    j = nnx.eval_shape(lambda: jnn.EncoderDecoder(_jax_module(**overrides), rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match=option):
        to_torch(j)


def test_to_torch_refuses_decoder_only_layers_and_other_types():
    layer = nnx.eval_shape(
        lambda: jnn.DecoderLayer(_jax_module(), cross_attention=False, rngs=nnx.Rngs(0))
    )
    with pytest.raises(ValueError, match="cross_attention=False"):
        to_torch(layer)
    with pytest.raises(TypeError, match="to_torch converts .* got Embed"):
        to_torch(nnx.eval_shape(lambda: jnn.Embed(5, 8, rngs=nnx.Rngs(0))))


def test_bfloat16_weights_convert_exactly():
    m = build("encoder_layer", CONFIGS["pre_gelu_nobias_batchfirst"]).to(torch.bfloat16)
    j = from_torch(m)
    assert j.self_attn.wq[...].dtype == jnp.bfloat16 and j.opts.norm_placement == "pre"
    back = to_torch(j, batch_first=True, dropout=0.1)
    for name, tensor in m.state_dict().items():
        assert back.state_dict()[name].dtype == torch.bfloat16
        assert torch.equal(back.state_dict()[name], tensor), name
