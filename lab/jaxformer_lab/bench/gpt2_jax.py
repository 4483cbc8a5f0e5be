"""A minimal GPT-2 training step in plain JAX, the peer jaxformer's step is timed against
(`jaxformer bench gpt2-peers`): no jaxformer model, parameters in a dict of arrays.

The model is lm-throughput's: pre-LN GPT-2 with learned positions, the
token embedding tied as the output matrix, gelu_tanh, biases everywhere, LayerNorm eps
1e-5; attention through `jax.nn.dot_product_attention` (cuDNN's fused kernel for
bfloat16 on NVIDIA GPUs, XLA's elsewhere). Compute in `dtype` (bfloat16) from float32
parameters; the residual stream in `dtype`, LayerNorm statistics and the loss in float32;
logits (x @ wte^T) cast to float32. optax AdamW (lr 1e-4, b1 0.9, b2 0.95, eps 1e-8,
weight decay 0.1 on every parameter); one jitted step with donated state.

Sizes `s` are lm_throughput's dicts (FULL, QUICK): layers, d_model, heads, d_ff,
context, vocab, batch.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxformer_lab.bench.rounds import Program


def init_params(s: dict, seed: int = 0) -> dict:
    """float32 NumPy parameters (GPT-2's init: normals of std 0.02, the residual projections'
    scaled by 1 / sqrt(2 L); zero biases; unit norm scales): wte [V, E], wpe [T, E],
    ln_f_scale/ln_f_bias [E], and blocks, one dict per layer: ln1_*, ln2_* [E], qkv_w
    [E, 3E], out_w [E, E], fc_w [E, F], proj_w [F, E] and their biases *_b."""
    rng = np.random.default_rng(seed)
    E, F, L = s["d_model"], s["d_ff"], s["layers"]

    def normal(*shape, std=0.02):
        return std * rng.standard_normal(shape, dtype=np.float32)

    def norm(name):
        return {f"{name}_scale": np.ones(E, np.float32), f"{name}_bias": np.zeros(E, np.float32)}

    def dense(name, n_in, n_out, std=0.02):
        return {f"{name}_w": normal(n_in, n_out, std=std), f"{name}_b": np.zeros(n_out, np.float32)}

    residual = 0.02 / math.sqrt(2 * L)
    blocks = [
        norm("ln1")
        | dense("qkv", E, 3 * E)
        | dense("out", E, E, residual)
        | norm("ln2")
        | dense("fc", E, F)
        | dense("proj", F, E, residual)
        for _ in range(L)
    ]
    params = {"wte": normal(s["vocab"], E), "wpe": normal(s["context"], E), "blocks": blocks}
    return params | norm("ln_f")


def batch_tokens(s: dict, seed: int = 0) -> np.ndarray:
    """int32 [B, T + 1] random tokens: lm_throughput's batch (same generator and seed)."""
    shape = (s["batch"], s["context"] + 1)
    return np.random.default_rng(seed).integers(0, s["vocab"], shape, dtype=np.int32)


def attention_implementation(dtype) -> str | None:
    """ "cudnn" for bfloat16 or float16 on an NVIDIA GPU, else None (XLA's)."""
    nvidia = "nvidia" in jax.devices()[0].device_kind.lower()
    low = jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
    return "cudnn" if jax.default_backend() == "gpu" and nvidia and low else None


def loss(params: dict, tokens: jax.Array, *, heads: int, dtype, implementation=None):
    """Mean next-token cross-entropy of tokens [B, T + 1] (inputs [:, :-1], targets [:, 1:])."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    x = (params["wte"][inputs] + params["wpe"][None, : inputs.shape[1]]).astype(dtype)
    p = jax.tree.map(lambda a: a.astype(dtype), params)
    for block in p["blocks"]:
        x = x + _attention(block, _norm(x, block, "ln1"), heads, implementation)
        h = jax.nn.gelu(_dense(_norm(x, block, "ln2"), block, "fc"), approximate=True)
        x = x + _dense(h, block, "proj")
    logits = (_norm(x, p, "ln_f") @ p["wte"].T).astype(jnp.float32)  # [B, T, V]
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def _norm(x, p, name):
    """LayerNorm of x [B, T, E], statistics in float32, returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(jnp.square(x32 - mean).mean(-1, keepdims=True) + 1e-5)
    return (y * p[f"{name}_scale"][None, None] + p[f"{name}_bias"][None, None]).astype(x.dtype)


def _dense(x, p, name):
    return x @ p[f"{name}_w"] + p[f"{name}_b"][None, None]


def _attention(block, x, heads, implementation):
    """Causal self-attention of x [B, T, E]; q, k, v [B, T, H, D]."""
    B, T, E = x.shape
    qkv = _dense(x, block, "qkv").reshape(B, T, 3, heads, E // heads)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)
    return _dense(out.reshape(B, T, E), block, "out")


def make_step(s: dict, *, dtype="bfloat16", lr: float = 1e-4, implementation=None):
    """(step, optimizer): step(state, tokens) -> (state, loss), jitted with the state
    (params, optimizer state) donated."""
    optimizer = optax.adamw(lr, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1)
    loss_fn = functools.partial(
        loss, heads=s["heads"], dtype=jnp.dtype(dtype), implementation=implementation
    )

    def step(state, tokens):
        params, opt_state = state
        value, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), value

    return jax.jit(step, donate_argnums=0), optimizer


def program(s: dict, *, dtype="bfloat16", lr: float = 1e-4, seed: int = 0) -> Program:
    """The step on the default device from init_params(s, seed), on batch_tokens(s, seed)."""
    implementation = attention_implementation(dtype)
    step, optimizer = make_step(s, dtype=dtype, lr=lr, implementation=implementation)
    params = jax.device_put(init_params(s, seed))
    state = [(params, optimizer.init(params))]
    tokens = jax.device_put(batch_tokens(s, seed))

    def run(k: int) -> float:
        for _ in range(k):
            state[0], value = step(state[0], tokens)
        return float(value)

    info = dict(device=jax.devices()[0].device_kind, attention=implementation or "xla")
    return Program(run, sum(a.size for a in jax.tree.leaves(params)), info, peak_bytes)


def peak_bytes() -> int | None:
    """The most memory the default device has held (None where it does not say: CPUs)."""
    stats = jax.devices()[0].memory_stats()
    return stats.get("peak_bytes_in_use") if stats else None
