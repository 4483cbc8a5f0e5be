"""How closely modules converted from PyTorch reproduce torch, in float32 on CPU.

    python experiments/torch_parity.py [--out results]

For each torch module kind (MultiheadAttention, encoder/decoder layer, encoder/decoder
stack, nn.Transformer), each configuration (norm_first, activation, bias, layer_norm_eps,
batch_first, sizes) and each input set (key padding and causal masks; batch 1 with bool
masks), the torch module (eval mode, autograd on, attention on SDPA's math backend: torch's
reference path) is converted with `jaxformer.interop.torch.from_torch` and both are run on the same inputs.
Reported: the max absolute difference of the outputs and of the gradients of
sum(output * g), for a random g, with respect to every input, and each over the largest
absolute value of its array in torch (relative). Weights are torch's
initialisation with biases and LayerNorm parameters drawn at random (torch starts them at
0 and 1, which would hide a misplaced bias). The last rows are nn.Transformer at the
paper's base size. Writes results/torch_parity.{json,md}; the last line printed is a
JSON summary.
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from jaxformer.interop.torch import from_torch, mask_from_torch
from jaxformer.markdown import table

tnn = torch.nn
warnings.filterwarnings("ignore", message="enable_nested_tensor is True")

# The torch configurations, one per line: name, then the values of FIELDS.
FIELDS = "d_model nhead dim_feedforward activation layer_norm_eps batch_first norm_first bias"
CONFIGS = [
    ("post-LN relu bias seq-first", 16, 4, 24, "relu", 1e-5, False, False, True),
    ("pre-LN gelu no-bias batch-first", 16, 2, 32, "gelu", 1e-6, True, True, False),
    ("pre-LN relu bias batch-first, 3 heads", 12, 3, 20, "relu", 1e-5, True, True, True),
    ("post-LN gelu no-bias seq-first, 1 head", 8, 1, 16, "gelu", 1e-3, False, False, False),
    ("paper base", 512, 8, 2048, "relu", 1e-5, False, False, True),
]
SMALL = {name: dict(zip(FIELDS.split(), values, strict=True)) for name, *values in CONFIGS}
PAPER = SMALL.pop("paper base")
INPUTS = {
    "padding+causal": dict(B=3, S=7, T=5, src_len=[7, 4, 1], tgt_len=[5, 2, 3], dtype="float"),
    "batch 1, bool masks": dict(B=1, S=4, T=6, src_len=None, tgt_len=None, dtype="bool"),
}
KINDS = ("MultiheadAttention", "EncoderLayer", "DecoderLayer", "Encoder", "Decoder", "Transformer")


def build(kind: str, c: dict, layers: tuple[int, int] = (2, 2)) -> torch.nn.Module:
    torch.manual_seed(0)
    E, H = c["d_model"], c["nhead"]
    kw = {k: c[k] for k in ("dim_feedforward", "activation", "layer_norm_eps")}
    kw |= dict(batch_first=c["batch_first"], norm_first=c["norm_first"], bias=c["bias"])
    final_norm = (
        tnn.LayerNorm(E, eps=c["layer_norm_eps"], bias=c["bias"]) if c["norm_first"] else None
    )
    if kind == "MultiheadAttention":
        m = tnn.MultiheadAttention(E, H, bias=c["bias"], batch_first=c["batch_first"])
    elif kind == "EncoderLayer":
        m = tnn.TransformerEncoderLayer(E, H, **kw)
    elif kind == "DecoderLayer":
        m = tnn.TransformerDecoderLayer(E, H, **kw)
    elif kind == "Encoder":
        m = tnn.TransformerEncoder(
            tnn.TransformerEncoderLayer(E, H, **kw),
            layers[0],
            final_norm,
            enable_nested_tensor=False,
        )
    elif kind == "Decoder":
        m = tnn.TransformerDecoder(tnn.TransformerDecoderLayer(E, H, **kw), layers[1], final_norm)
    else:
        m = tnn.Transformer(E, H, *layers, **kw)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 1:  # biases and LayerNorm parameters
                is_scale = ".norm" in f".{name}" and name.endswith("weight")
                p.copy_(torch.randn(p.shape) * 0.1 + (1.0 if is_scale else 0.0))
    return m.eval()


def case(kind: str, c: dict, inp: dict, layers=(2, 2)) -> dict:
    m = build(kind, c, layers)
    j = from_torch(m)
    rng = np.random.default_rng(1)
    B, S, T, E = inp["B"], inp["S"], inp["T"], c["d_model"]
    src = rng.standard_normal((B, S, E)).astype(np.float32)
    tgt = rng.standard_normal((B, T, E)).astype(np.float32)

    def pad(lengths, L):
        return None if lengths is None else torch.arange(L)[None] >= torch.tensor(lengths)[:, None]

    tm = dict(src_kpm=pad(inp["src_len"], S), tgt_kpm=pad(inp["tgt_len"], T))
    tm["tgt_mask"] = torch.ones(T, T, dtype=torch.bool).triu(1)
    tm["src_mask"] = torch.ones(S, S, dtype=torch.bool).triu(1) if B == 1 else None
    if inp["dtype"] == "float":
        tm = {
            k: None if v is None else torch.zeros(v.shape).masked_fill(v, -torch.inf)
            for k, v in tm.items()
        }
    L = (lambda x: x) if c["batch_first"] else (lambda x: x.transpose(0, 1))
    src_mask = mask_from_torch(tm["src_mask"], tm["src_kpm"])
    tgt_mask = mask_from_torch(tm["tgt_mask"], tm["tgt_kpm"])
    mem_mask = mask_from_torch(None, tm["src_kpm"])

    if kind == "MultiheadAttention" and inp["src_len"] is not None:  # cross, key padding
        arrays = (tgt, src)

        def tf(q, kv):
            return m(L(q), L(kv), L(kv), key_padding_mask=tm["src_kpm"], need_weights=False)[0]

        def jf_(q, kv):
            return j(q, kv, mem_mask).out

    elif kind == "MultiheadAttention":  # causal self-attention
        arrays = (tgt,)

        def tf(x):
            return m(L(x), L(x), L(x), attn_mask=tm["tgt_mask"], need_weights=False)[0]

        def jf_(x):
            return j(x, None, tgt_mask).out

    elif kind in ("EncoderLayer", "Encoder"):
        arrays = (src,)

        def tf(x):
            return m(L(x), tm["src_mask"], tm["src_kpm"])

        def jf_(x):
            return j(x, src_mask)

    elif kind in ("DecoderLayer", "Decoder"):
        arrays = (tgt, src)

        def tf(y, mem):
            return m(L(y), L(mem), tm["tgt_mask"], None, tm["tgt_kpm"], tm["src_kpm"])

        def jf_(y, mem):
            return j(y, tgt_mask, memory=mem, cross_mask=mem_mask).y

    else:
        arrays = (src, tgt)

        def tf(s, t):
            masks = (tm["src_mask"], tm["tgt_mask"], None, tm["src_kpm"], tm["tgt_kpm"])
            return m(L(s), L(t), *masks, tm["src_kpm"])

        def jf_(s, t):
            return j(s, t, src_mask, tgt_mask, mem_mask)

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
    t_out = t_out.detach().numpy()
    t_grads = [t.grad.numpy() for t in t_in]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results")
    args = parser.parse_args()
    jax.config.update("jax_platforms", "cpu")
    runs = [
        (kind, name, c, inp, (2, 2))
        for kind in KINDS
        for name, c in SMALL.items()
        for inp in INPUTS
    ]
    pre_ln_gelu = PAPER | dict(norm_first=True, activation="gelu")
    runs += [
        ("Transformer", "paper base (6+6 layers, d_model 512)", PAPER, "padding+causal", (6, 6)),
        ("Transformer", "paper base, pre-LN gelu", pre_ln_gelu, "padding+causal", (6, 6)),
    ]
    rows = []
    start = time.perf_counter()
    header = f"{'module':<19} {'configuration':<40} {'inputs':<20} {'output':>9} {'input grad':>10}"
    print(header + f" {'relative':>9} {'relative':>9}")
    for kind, name, c, inp, layers in runs:
        r = dict(module=kind, config=name, inputs=inp, **case(kind, c, INPUTS[inp], layers))
        rows.append(r)
        print(
            f"{kind:<19} {name:<40} {inp:<20} {r['output_max_abs']:>9.1e} {r['grad_max_abs']:>10.1e}"
            f" {r['output_max_rel']:>9.1e} {r['grad_max_rel']:>9.1e}"
        )
    summary = dict(
        cases=len(rows),
        output_max_abs=max(r["output_max_abs"] for r in rows),
        grad_max_abs=max(r["grad_max_abs"] for r in rows),
        output_max_rel=max(r["output_max_rel"] for r in rows),
        grad_max_rel=max(r["grad_max_rel"] for r in rows),
        outputs_within_1e_5=all(r["output_max_abs"] <= 1e-5 for r in rows),
        grads_within_1e_4=all(r["grad_max_abs"] <= 1e-4 for r in rows),
        torch=torch.__version__,
        jax=jax.__version__,
        seconds=round(time.perf_counter() - start, 1),
    )
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "torch_parity.json").write_text(json.dumps(dict(summary=summary, rows=rows), indent=2))
    lines = [
        "# PyTorch parity (float32, CPU)",
        "",
        "Max absolute difference between torch and the module converted by `from_torch`: "
        "outputs, and gradients of sum(output * g) with respect to every input; relative: "
        "over the largest absolute value of the same array in torch. "
        f"torch {torch.__version__}, jax {jax.__version__}. "
        "Command: `python experiments/torch_parity.py`.",
        "",
    ]
    columns = ["module", "configuration", "inputs", "output", "input grad"]
    columns += ["output, relative", "input grad, relative", "max abs output", "max abs grad"]
    cells = [
        [
            r["module"],
            r["config"],
            r["inputs"],
            f"{r['output_max_abs']:.1e}",
            f"{r['grad_max_abs']:.1e}",
            f"{r['output_max_rel']:.1e}",
            f"{r['grad_max_rel']:.1e}",
            f"{r['output_scale']:.2f}",
            f"{r['grad_scale']:.2f}",
        ]
        for r in rows
    ]
    lines += table(columns, cells, "lllrrrrrr")
    (out / "torch_parity.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
