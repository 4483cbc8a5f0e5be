"""Multi-head attention as an NNX module (self- and cross-attention, grouped heads)."""

from __future__ import annotations

import jax
from flax import nnx

from jaxformer import functional as F
from jaxformer.checks import check_divisible, check_int
from jaxformer.nn.parameters import dropout_rng, dtype_of, lora_weight, param


class MultiHeadAttention(nnx.Module):
    """Projections W^Q [E, H, Dk], W^K [E, K, Dk], W^V [E, K, Dv], W^O [H, Dv, E].

    `num_kv_heads` K < H shares each key/value head among H / K query heads (GQA).
    key_dim and value_dim default to E / H. Dropout and the kernel are call arguments."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        key_dim: int | None = None,
        value_dim: int | None = None,
        use_bias: bool = False,
        dtype: str = "float32",
        param_dtype: str = "float32",
        rngs: nnx.Rngs,
    ):
        sizes = dict(num_kv_heads=num_kv_heads, key_dim=key_dim, value_dim=value_dim)
        for name, value in dict(d_model=d_model, num_heads=num_heads, **sizes).items():
            if name in ("d_model", "num_heads") or value is not None:
                check_int(name, value)
        K = num_heads if num_kv_heads is None else num_kv_heads
        check_divisible("num_heads", num_heads, "num_kv_heads", K)
        if key_dim is None or value_dim is None:
            check_divisible("d_model", d_model, "num_heads", num_heads)
        Dk = d_model // num_heads if key_dim is None else key_dim
        Dv = d_model // num_heads if value_dim is None else value_dim
        E, H, pdt = d_model, num_heads, dtype_of("param_dtype", param_dtype)
        in_proj = nnx.initializers.xavier_uniform(in_axis=0, out_axis=(1, 2))
        out_proj = nnx.initializers.xavier_uniform(in_axis=(0, 1), out_axis=2)
        self.wq = param(rngs, in_proj, (E, H, Dk), ("embed", "heads", "kv"), pdt)
        self.wk = param(rngs, in_proj, (E, K, Dk), ("embed", "heads", "kv"), pdt)
        self.wv = param(rngs, in_proj, (E, K, Dv), ("embed", "heads", "kv"), pdt)
        self.wo = param(rngs, out_proj, (H, Dv, E), ("heads", "kv", "embed"), pdt)
        if use_bias:
            zeros = nnx.initializers.zeros
            self.bq = param(rngs, zeros, (H, Dk), ("heads", "kv"), pdt)
            self.bk = param(rngs, zeros, (K, Dk), ("heads", "kv"), pdt)
            self.bv = param(rngs, zeros, (K, Dv), ("heads", "kv"), pdt)
            self.bo = param(rngs, zeros, (E,), ("embed",), pdt)
        self.use_bias = use_bias
        self.dtype = dtype_of("dtype", dtype)

    def params(self) -> F.AttentionParams:
        """The projections as arrays in the compute dtype."""
        names = ("wq", "wk", "wv", "wo") + (("bq", "bk", "bv", "bo") if self.use_bias else ())
        return F.AttentionParams(**{n: lora_weight(self, n).astype(self.dtype) for n in names})

    def __call__(
        self,
        x_q: jax.Array,
        x_kv: jax.Array | None = None,
        mask: jax.Array | None = None,
        *,
        dropout_rate: float = 0.0,
        implementation: str = "auto",
        deterministic: bool = True,
        rng: jax.Array | None = None,
        rope_positions: tuple[jax.Array, jax.Array] | None = None,
        return_weights: bool = False,
        kv_cache: F.KVCache | None = None,
        cache_positions: jax.Array | None = None,
    ) -> F.AttentionOutput:
        """x_q [B, T, E], x_kv [B, S, E] (None: self-attention, or with a kv_cache and no
        cache_positions, attention over the cache's projected keys and values), mask (an
        array or `AttentionMask`) -> AttentionOutput, as `functional.multi_head_attention`."""
        cross_from_cache = kv_cache is not None and cache_positions is None
        return F.multi_head_attention(
            x_q,
            None if cross_from_cache else x_q if x_kv is None else x_kv,
            self.params(),
            mask,
            dropout_rate=dropout_rate,
            rng=dropout_rng(deterministic, rng),
            rope_positions=rope_positions,
            return_weights=return_weights,
            implementation=implementation,
            kv_cache=kv_cache,
            cache_positions=cache_positions,
        )
