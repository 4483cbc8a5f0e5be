"""The NNX modules pass the KV cache through to the functional core."""

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer import TransformerConfig, nn
from jaxformer import functional as F
from tests import reference as ref


def test_attention_module_with_a_cache_matches_reference():
    mha = nn.MultiHeadAttention(24, 6, num_kv_heads=2, use_bias=True, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 24)).astype(np.float32)
    mem = rng.standard_normal((2, 5, 24)).astype(np.float32)
    p = mha.params()
    out = mha(x, kv_cache=F.project_kv(mem, p)).out  # cross-attention over projected memory
    np.testing.assert_allclose(out, ref.mha(x, mem, p), atol=1e-4, rtol=1e-4)
    empty = F.KVCache(jnp.zeros((2, 4, 2, 4)), jnp.zeros((2, 4, 2, 4)))
    positions = jnp.broadcast_to(jnp.arange(3), (2, 3))
    mask = F.causal_mask(3, 4)
    out, _, cache = mha(x, mask=mask, kv_cache=empty, cache_positions=positions)
    np.testing.assert_allclose(out, ref.mha(x, x, p, np.asarray(F.causal_mask(3))), atol=1e-4)
    np.testing.assert_allclose(cache.k[:, :3], F.project_kv(x, p).k, atol=1e-6)


def test_decoder_stack_with_a_cache_equals_the_full_stack():
    c = TransformerConfig.tiny(11, d_model=16, num_heads=2, d_ff=32, norm_placement="pre")
    stack = nn.DecoderStack(c, rngs=nnx.Rngs(1))
    rng = np.random.default_rng(1)
    y = rng.standard_normal((2, 4, 16)).astype(np.float32)
    memory = rng.standard_normal((2, 3, 16)).astype(np.float32)
    want = stack(y, F.causal_mask(4), memory=memory).y
    cache = stack.init_cache(2, 4, memory)
    got = []
    for t in range(4):
        out, _, cache = stack(
            y[:, t : t + 1],
            F.causal_mask(1, 4, offset=t),
            cache=cache,
            cache_positions=jnp.full((2, 1), t),
        )
        got.append(out)
    np.testing.assert_allclose(jnp.concatenate(got, axis=1), want, atol=1e-5, rtol=1e-5)
