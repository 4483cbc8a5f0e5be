"""The cases of `jaxformer bench parity` (jaxformer_lab.bench.parity): torch modules and
Hugging Face models with their configurations, each built, converted and compared with
the original. torch and transformers are imported by the functions that use them."""

from __future__ import annotations

import functools

import numpy as np

from jaxformer.config import TransformerConfig

# The torch configurations, one per line: name, then the values of FIELDS.
FIELDS = "d_model nhead dim_feedforward activation layer_norm_eps batch_first norm_first bias"
CONFIGS = [
    ("post-LN relu bias seq-first", 16, 4, 24, "relu", 1e-5, False, False, True),
    ("pre-LN gelu no-bias batch-first", 16, 2, 32, "gelu", 1e-6, True, True, False),
    ("pre-LN relu bias batch-first, 3 heads", 12, 3, 20, "relu", 1e-5, True, True, True),
    ("post-LN gelu no-bias seq-first, 1 head", 8, 1, 16, "gelu", 1e-3, False, False, False),
]
SMALL = {name: dict(zip(FIELDS.split(), values, strict=True)) for name, *values in CONFIGS}
INPUTS = {
    "padding+causal": dict(B=3, S=7, T=5, src_len=[7, 4, 1], tgt_len=[5, 2, 3], dtype="float"),
    "batch 1, bool masks": dict(B=1, S=4, T=6, src_len=None, tgt_len=None, dtype="bool"),
}
KINDS = ("MultiheadAttention", "EncoderLayer", "DecoderLayer", "Encoder", "Decoder", "Transformer")


def paper_runs() -> list[tuple]:
    """nn.Transformer at the paper's base size (post-LN relu, then pre-LN gelu), 6+6."""
    base = TransformerConfig.paper_base(1)
    paper = dict(d_model=base.d_model, nhead=base.num_heads, dim_feedforward=base.d_ff)
    paper |= dict(activation="relu", layer_norm_eps=1e-5, batch_first=False)
    paper |= dict(norm_first=False, bias=True)
    pre_ln_gelu = paper | dict(norm_first=True, activation="gelu")
    layers = (base.num_encoder_layers, base.num_decoder_layers)
    return [
        ("Transformer", "paper base (6+6 layers, d_model 512)", paper, "padding+causal", layers),
        ("Transformer", "paper base, pre-LN gelu", pre_ln_gelu, "padding+causal", layers),
    ]


def build(kind: str, c: dict, layers: tuple[int, int] = (2, 2)):
    """The torch module `kind` of configuration `c`, biases and norms drawn at random."""
    import torch

    tnn = torch.nn
    torch.manual_seed(0)
    E, H = c["d_model"], c["nhead"]
    kw = {k: c[k] for k in ("dim_feedforward", "activation", "layer_norm_eps")}
    kw |= dict(batch_first=c["batch_first"], norm_first=c["norm_first"], bias=c["bias"])
    final_norm = (
        tnn.LayerNorm(E, eps=c["layer_norm_eps"], bias=c["bias"]) if c["norm_first"] else None
    )
    make = {
        "MultiheadAttention": lambda: tnn.MultiheadAttention(
            E, H, bias=c["bias"], batch_first=c["batch_first"]
        ),
        "EncoderLayer": lambda: tnn.TransformerEncoderLayer(E, H, **kw),
        "DecoderLayer": lambda: tnn.TransformerDecoderLayer(E, H, **kw),
        "Encoder": lambda: tnn.TransformerEncoder(
            tnn.TransformerEncoderLayer(E, H, **kw),
            layers[0],
            final_norm,
            enable_nested_tensor=False,
        ),
        "Decoder": lambda: tnn.TransformerDecoder(
            tnn.TransformerDecoderLayer(E, H, **kw), layers[1], final_norm
        ),
        "Transformer": lambda: tnn.Transformer(E, H, *layers, **kw),
    }
    m = make[kind]()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 1:  # biases and LayerNorm parameters
                is_scale = ".norm" in f".{name}" and name.endswith("weight")
                p.copy_(torch.randn(p.shape) * 0.1 + (1.0 if is_scale else 0.0))
    return m.eval()


def torch_masks(inp: dict) -> dict:
    """torch's masks of an input set: key padding, causal, and (batch 1) a source mask;
    float (-inf) or bool as the input set says."""
    import torch

    S, T = inp["S"], inp["T"]

    def pad(lengths, L):
        return None if lengths is None else torch.arange(L)[None] >= torch.tensor(lengths)[:, None]

    tm = dict(src_kpm=pad(inp["src_len"], S), tgt_kpm=pad(inp["tgt_len"], T))
    tm["tgt_mask"] = torch.ones(T, T, dtype=torch.bool).triu(1)
    tm["src_mask"] = torch.ones(S, S, dtype=torch.bool).triu(1) if inp["B"] == 1 else None
    if inp["dtype"] == "float":
        tm = {
            k: None if v is None else torch.zeros(v.shape).masked_fill(v, -torch.inf)
            for k, v in tm.items()
        }
    return tm


def functions(kind: str, m, j, tm: dict, L, src, tgt):
    """(the arrays a case takes, torch's function of them, jaxformer's)."""
    from jaxformer.interop.torch import mask_from_torch

    src_mask = mask_from_torch(tm["src_mask"], tm["src_kpm"])
    tgt_mask = mask_from_torch(tm["tgt_mask"], tm["tgt_kpm"])
    mem_mask = mask_from_torch(None, tm["src_kpm"])
    if kind == "MultiheadAttention" and tm["src_kpm"] is not None:  # cross, key padding
        return (
            (tgt, src),
            lambda q, kv: m(L(q), L(kv), L(kv), key_padding_mask=tm["src_kpm"], need_weights=False)[
                0
            ],
            lambda q, kv: j(q, kv, mem_mask).out,
        )
    if kind == "MultiheadAttention":  # causal self-attention
        return (
            (tgt,),
            lambda x: m(L(x), L(x), L(x), attn_mask=tm["tgt_mask"], need_weights=False)[0],
            lambda x: j(x, None, tgt_mask).out,
        )
    if kind in ("EncoderLayer", "Encoder"):
        return (src,), lambda x: m(L(x), tm["src_mask"], tm["src_kpm"]), lambda x: j(x, src_mask)
    if kind in ("DecoderLayer", "Decoder"):
        return (
            (tgt, src),
            lambda y, mem: m(L(y), L(mem), tm["tgt_mask"], None, tm["tgt_kpm"], tm["src_kpm"]),
            lambda y, mem: j(y, tgt_mask, memory=mem, cross_mask=mem_mask).y,
        )
    masks = (tm["src_mask"], tm["tgt_mask"], None, tm["src_kpm"], tm["tgt_kpm"], tm["src_kpm"])
    return (
        (src, tgt),
        lambda s, t: m(L(s), L(t), *masks),
        lambda s, t: j(s, t, src_mask, tgt_mask, mem_mask),
    )


def torch_case(kind: str, c: dict, inp: dict, layers=(2, 2)) -> dict:
    """One torch module against its conversion: outputs and input gradients."""
    import jax
    import jax.numpy as jnp
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from jaxformer.interop.torch import from_torch

    m = build(kind, c, layers)
    j = from_torch(m)
    rng = np.random.default_rng(1)
    B, S, T, E = inp["B"], inp["S"], inp["T"], c["d_model"]
    src = rng.standard_normal((B, S, E)).astype(np.float32)
    tgt = rng.standard_normal((B, T, E)).astype(np.float32)
    L = (lambda x: x) if c["batch_first"] else (lambda x: x.transpose(0, 1))
    arrays, tf, jf_ = functions(kind, m, j, torch_masks(inp), L, src, tgt)
    t_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    # torch's reference attention: on a CPU, float32 attention otherwise runs its flash
    # kernel, whose input gradients differ from float64 by 1e-2 at base size (post-LN)
    with sdpa_kernel(SDPBackend.MATH):
        t_out = L(tf(*t_in))
        g = np.random.default_rng(2).standard_normal(t_out.shape).astype(np.float32)
        (t_out * torch.tensor(g)).sum().backward()

    @functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})
    def forward_backward(*xs):
        out, vjp = jax.vjp(jf_, *xs)
        return out, vjp(jnp.asarray(g))

    j_out, j_grads = forward_backward(*map(jnp.asarray, arrays))
    return compare(j_out, j_grads, t_out.detach().numpy(), [t.grad.numpy() for t in t_in])


def compare(j_out, j_grads, t_out, t_grads) -> dict:
    """The largest absolute differences (and scales) of the outputs and of the gradients."""
    grad_diffs = [_max_abs(a - t) for a, t in zip(j_grads, t_grads, strict=True)]
    return dict(
        output_max_abs=_max_abs(j_out - t_out),
        grad_max_abs=max(grad_diffs),
        output_scale=_max_abs(t_out),
        grad_scale=max(_max_abs(t) for t in t_grads),
        # each difference over the largest value of its array (torch's)
        output_max_rel=_max_abs(j_out - t_out) / _max_abs(t_out),
        grad_max_rel=max(d / _max_abs(t) for d, t in zip(grad_diffs, t_grads, strict=True)),
    )


def _max_abs(x) -> float:
    return float(np.abs(np.asarray(x)).max())


# Hugging Face: (model class, config class) by name in transformers, and config settings.
GPT2 = ("GPT2LMHeadModel", "GPT2Config")
MARIAN = ("MarianMTModel", "MarianConfig")
BART = ("BartForConditionalGeneration", "BartConfig")
TINY_GPT2 = dict(
    vocab_size=101, n_positions=64, n_layer=2, initializer_range=0.2, bos_token_id=0, eos_token_id=0
)
UNTIED_GPT2 = TINY_GPT2 | dict(
    n_embd=24, n_head=2, n_inner=48, activation_function="relu", tie_word_embeddings=False
)
SEQ2SEQ = dict(
    vocab_size=101,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    init_std=0.2,
)
TINY_MARIAN = SEQ2SEQ | dict(pad_token_id=100, decoder_start_token_id=100, eos_token_id=0)
HF_SMALL = {
    "GPT-2, 2 layers, d 32": (GPT2, TINY_GPT2 | dict(n_embd=32, n_head=4)),
    "GPT-2 untied, relu, d_ff 48": (GPT2, UNTIED_GPT2),
    "Marian, gelu": (MARIAN, TINY_MARIAN),
    "Marian, swish, scaled embeddings": (
        MARIAN,
        TINY_MARIAN | dict(activation_function="swish", scale_embedding=True),
    ),
    "BART": (BART, SEQ2SEQ),
}
OPUS_MT = dict(
    vocab_size=58101,
    decoder_vocab_size=58101,
    d_model=512,
    encoder_ffn_dim=2048,
    decoder_ffn_dim=2048,
    encoder_attention_heads=8,
    decoder_attention_heads=8,
    activation_function="swish",
    scale_embedding=True,
    pad_token_id=58100,
    decoder_start_token_id=58100,
    eos_token_id=0,
    max_position_embeddings=512,
)
HF_LARGE = {
    "GPT-2 small (12 layers, d 768, 124M)": (GPT2, {}),
    "Marian, OPUS-MT size (6+6, d 512)": (MARIAN, OPUS_MT),
}


def hf_model(kind: tuple[str, str], settings: dict):
    """The transformers model `kind` with `settings`, biases, norms and the logits bias
    drawn at random, in eval mode."""
    import torch
    import transformers

    model_class, config_class = (getattr(transformers, name) for name in kind)
    torch.manual_seed(0)
    hf = model_class(config_class(**settings))
    with torch.no_grad():
        for p in hf.parameters():
            if p.ndim == 1:
                p.add_(0.05 * torch.randn_like(p))
        if hasattr(hf, "final_logits_bias"):
            hf.final_logits_bias.normal_(std=0.1)
    return hf.eval()


def hf_case(kind: tuple[str, str], settings: dict) -> dict:
    """Build the transformers model, convert it, and compare logits and 20 greedy tokens."""
    import torch

    from jaxformer.interop.hf import from_hf
    from jaxformer.models import DecoderLM

    hf = hf_model(kind, settings)
    model = from_hf(hf)
    V = hf.config.vocab_size
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(3, V - 1, (3, 9)), rng.integers(3, V - 1, (3, 7))
    src_valid = np.arange(9) < np.array([[9], [5], [2]])
    tgt_valid = np.arange(7) < np.array([[7], [3], [6]])
    run = hf_lm if isinstance(model, DecoderLM) else hf_seq2seq
    with torch.no_grad():
        expected, got, hf_tokens, tokens = run(hf, model, src, tgt, src_valid, tgt_valid)
    diff = np.abs(np.asarray(got) - expected)[tgt_valid]
    return dict(
        logits_max_abs_diff=float(diff.max()),
        logits_max_abs=float(np.abs(expected).max()),
        greedy_20_equal=bool((np.asarray(tokens) == hf_tokens.numpy()).all()),
        parameters=sum(p.numel() for p in hf.parameters()),
    )


GREEDY = dict(max_new_tokens=20, do_sample=False, num_beams=1, eos_token_id=None)


def _long(a):
    import torch

    return torch.tensor(np.asarray(a)).long()


def hf_lm(hf, model, src, tgt, src_valid, tgt_valid):
    """(hf's logits, jaxformer's, hf's 20 greedy tokens, jaxformer's) of a decoder-only LM."""
    import jax.numpy as jnp
    import torch

    from jaxformer import decode

    expected = hf(_long(tgt), attention_mask=_long(tgt_valid)).logits.numpy()
    got = model(jnp.asarray(tgt), jnp.asarray(tgt_valid))
    ones = torch.ones(3, 7).long()
    hf_tokens = hf.generate(_long(tgt), attention_mask=ones, pad_token_id=0, **GREEDY)[:, 7:]
    tokens = decode.greedy(model, jnp.asarray(tgt), max_new_tokens=20, eos_id=None)
    return expected, got, hf_tokens, tokens


def hf_seq2seq(hf, model, src, tgt, src_valid, tgt_valid):
    """(hf's logits, jaxformer's, hf's 20 greedy tokens, jaxformer's) of an encoder-decoder."""
    import jax.numpy as jnp

    from jaxformer import decode

    expected = hf(
        input_ids=_long(src),
        attention_mask=_long(src_valid),
        decoder_input_ids=_long(tgt),
        decoder_attention_mask=_long(tgt_valid),
    ).logits.numpy()
    got = model(*map(jnp.asarray, (src, tgt, src_valid, tgt_valid)))
    hf_tokens = hf.generate(
        _long(src), attention_mask=_long(src_valid), forced_eos_token_id=None, **GREEDY
    )[:, 1:]
    tokens = decode.greedy(
        model,
        jnp.asarray(src),
        jnp.asarray(src_valid),
        max_new_tokens=20,
        bos_id=hf.config.decoder_start_token_id,
        eos_id=None,
    )
    return expected, got, hf_tokens, tokens
