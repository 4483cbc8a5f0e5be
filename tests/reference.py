"""Plain NumPy (float64) references for the tests, written from the paper's formulas,
independent of the library's code."""

import numpy as np


def softmax(x, mask=None):
    """Row softmax; masked entries get 0 and a row with nothing unmasked is all zeros."""
    x = np.asarray(x, np.float64)
    if mask is None:
        mask = np.ones(x.shape, bool)
    x = np.where(mask, x, -np.inf)
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(mask, np.exp(x - m), 0.0)
    s = e.sum(-1, keepdims=True)
    return e / np.where(s == 0, 1.0, s)


def attention(q, k, v, mask=None, bias=None, scale=None):
    """q [B,T,H,D], k [B,S,K,D], v [B,S,K,Dv] -> (out [B,T,H,Dv], weights [B,H,T,S])."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    B, T, H, D = q.shape
    K = k.shape[2]
    k = np.repeat(k, H // K, axis=2)  # head h reads kv head h // (H/K)
    v = np.repeat(v, H // K, axis=2)
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    logits = np.einsum("bthd,bshd->bhts", q, k) * scale
    if bias is not None:
        logits = logits + np.asarray(bias, np.float64)
    full = None if mask is None else np.broadcast_to(mask, logits.shape)
    w = softmax(logits, full)
    return np.einsum("bhts,bshd->bthd", w, v), w


def layer_norm(x, scale, bias, eps):
    x = np.asarray(x, np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * scale + (0.0 if bias is None else bias)


def mha(xq, xkv, p, mask=None):
    """Multi-head attention with params p (wq [E,H,D], wk, wv, wo [H,Dv,E], biases)."""
    xq, xkv = np.asarray(xq), np.asarray(xkv)  # NumPy from here: its broadcasting, not JAX's
    p = type(p)(*(None if a is None else np.asarray(a) for a in p))

    def proj(x, w, b):
        out = np.einsum("bte,ehd->bthd", x, w)
        return out if b is None else out + b

    q = proj(xq, p.wq, p.bq)
    k = proj(xkv, p.wk, p.bk)
    v = proj(xkv, p.wv, p.bv)
    o, _ = attention(q, k, v, mask)
    out = np.einsum("bthd,hde->bte", o, p.wo)
    return out if p.bo is None else out + p.bo


def ffn(x, p, activation="relu"):
    h = x @ p.w1 + (0.0 if p.b1 is None else p.b1)
    if activation == "relu":
        h = np.maximum(h, 0.0)
    elif activation == "gelu":
        from math import erf

        h = 0.5 * h * (1.0 + np.vectorize(erf)(h / np.sqrt(2.0)))
    elif activation == "gelu_tanh":
        h = 0.5 * h * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (h + 0.044715 * h**3)))
    elif activation == "silu":
        h = h / (1.0 + np.exp(-h))
    elif activation == "swiglu":
        g = x @ p.w_gate
        h = g / (1.0 + np.exp(-g)) * h
    return h @ p.w2 + (0.0 if p.b2 is None else p.b2)


def sinusoid(length, d_model, layout="interleaved"):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(same), element by element;
    layout "halves" puts the sine of pair i in column i and its cosine in d/2 + i."""
    pe = np.zeros((length, d_model))
    for pos in range(length):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            sin_col, cos_col = (
                (2 * i, 2 * i + 1) if layout == "interleaved" else (i, d_model // 2 + i)
            )
            pe[pos, sin_col] = np.sin(angle)
            pe[pos, cos_col] = np.cos(angle)
    return pe
