"""Token embeddings (also the tied output projection) and learned position tables."""

from __future__ import annotations

import jax
from flax import nnx

from jaxformer import functional as F
from jaxformer.checks import check_int, check_int_array
from jaxformer.nn.parameters import dtype_of, param
from jaxformer.nn.sharding import gather_whole


class Embed(nnx.Module):
    """Embedding table [V, E], initialised N(0, 1/E) so the scaled embeddings have unit
    variance. `__call__` looks tokens up and multiplies by sqrt(E) (section 3.4); `attend`
    is the pre-softmax projection with the same matrix."""

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        *,
        scale: bool = True,
        dtype: str = "float32",
        param_dtype: str = "float32",
        rngs: nnx.Rngs,
    ):
        check_int("vocab_size", vocab_size)
        check_int("d_model", d_model)
        init = nnx.initializers.normal(stddev=d_model**-0.5)
        pdt = dtype_of("param_dtype", param_dtype)
        self.table = param(rngs, init, (vocab_size, d_model), ("vocab", "embed"), pdt)
        self.scale = scale
        self.dtype = dtype_of("dtype", dtype)

    @property
    def vocab_size(self) -> int:
        return self.table.shape[0]

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """tokens [...] (int) -> [..., E] in the compute dtype."""
        check_int_array("tokens", tokens)
        rows = F.embed(tokens, gather_whole(self.table[...]), scale=self.scale)
        return rows.astype(self.dtype)  # the gradient summed into the table in its dtype

    def attend(self, x: jax.Array) -> jax.Array:
        """x [..., E] -> logits [..., V] in the compute dtype (accumulated in float32)."""
        return F.tied_logits(x, self.table[...].astype(self.dtype))


class LearnedPositions(nnx.Module):
    """A learned table [max_len, E] of position embeddings (the paper's Table 3 row E)."""

    def __init__(self, max_len: int, d_model: int, *, param_dtype: str = "float32", rngs: nnx.Rngs):
        check_int("max_len", max_len)
        check_int("d_model", d_model)
        init = nnx.initializers.normal(stddev=0.02)
        pdt = dtype_of("param_dtype", param_dtype)
        self.table = param(rngs, init, (max_len, d_model), ("position", "embed"), pdt)

    def __call__(self, positions: jax.Array) -> jax.Array:
        """positions [...] (int) -> [..., E]."""
        check_int_array("positions", positions, "of positions")
        return gather_whole(self.table[...])[positions]
