"""Training dynamics (`RunConfig.runtime.log_internals`), computed inside the compiled step
from the gradients, the parameters before and after the update, and named sites
(`functional/sites.py`). Keys (float32 scalars; `<module>` is a parameter path such as
`decoder/1/ffn`):
  grad_norm, grad_norm/<module>       the gradient before clipping
  param_norm, param_norm/<module>     the parameters after the update
  update_norm, update_norm/<module>   new parameters - old parameters
  attention_entropy/<stack>/<i>/<attention>/head<h>
                                      -sum p log p in nats, mean over real queries
  activation_rms/<stack>/<i>          RMS of the residual stream after layer i
scan_layers or remat models log the norms alone; entropy needs implementation "xla"."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxformer.config import DTYPES, TransformerConfig
from jaxformer.functional.attention import choose_implementation

RENAMED = {"self_attn": "self_attention", "cross_attn": "cross_attention"}


def site_patterns(config: TransformerConfig, batch: dict) -> list[str]:
    """The sites the internals step captures for `batch` (exact paths, no globs)."""
    if config.scan_layers or config.remat != "none":
        return []
    B, T = batch["tgt_in"].shape
    decoder = [f"decoder/{i}" for i in range(config.num_decoder_layers)]
    attention = {f"{d}/self_attention": (T, T) for d in decoder}
    layers = list(decoder)
    if "src" in batch:  # an encoder-decoder
        S = batch["src"].shape[1]
        encoder = [f"encoder/{i}" for i in range(config.num_encoder_layers)]
        attention |= {f"{e}/self_attention": (S, S) for e in encoder}
        attention |= {f"{d}/cross_attention": (T, S) for d in decoder}
        layers += encoder
    read = [f"{a}/weights" for a, (q, k) in attention.items() if _materialised(config, B, q, k)]
    return [f"{layer}/out" for layer in layers] + read


def _materialised(config: TransformerConfig, B: int, T: int, S: int) -> bool:
    """Whether the model's attention over [B, T] queries and [B, S] keys forms its weights."""
    if config.attention_impl != "auto":
        return config.attention_impl == "xla"
    dtype = DTYPES[config.dtype]
    q = jax.ShapeDtypeStruct((B, T, config.num_heads, config.key_dim), dtype)
    k = jax.ShapeDtypeStruct((B, S, config.kv_heads, config.key_dim), dtype)
    v = jax.ShapeDtypeStruct((B, S, config.kv_heads, config.value_dim), dtype)
    rate = config.attention_dropout_rate
    return choose_implementation(q, k, v, masked=True, dropout_rate=rate) == "xla"


def activation_sums(values: dict[str, jax.Array], batch: dict) -> dict[str, tuple]:
    """{key: (sum, count)} of the captured sites, over real tokens (add them over
    micro-batches and replicas; `finish` divides): entropy sums [H] of `.../weights`
    [B, H, T, S], squared sums of layer outputs `<stack>/<i>/out` [B, T, E]."""
    out = {}
    for path, x in values.items():
        x = jax.lax.stop_gradient(x).astype(jnp.float32)
        stack, layer = path.split("/")[:2]
        valid = _real_tokens(batch, "src" if stack == "encoder" else "tgt")
        if path.endswith("/weights"):
            entropy = -jnp.sum(x * jnp.log(jnp.where(x > 0, x, 1.0)), axis=-1)  # [B, H, T]
            key = f"attention_entropy/{path.removesuffix('/weights')}"
            out[key] = (jnp.einsum("bht,bt->h", entropy, valid), valid.sum())
        else:
            squares = jnp.einsum("bte,bt->", jnp.square(x), valid)
            out[f"activation_rms/{stack}/{layer}"] = (squares, valid.sum() * x.shape[-1])
    return out


def _real_tokens(batch: dict, side: str) -> jax.Array:
    """[B, S] or [B, T] float32: 1 for a real token of the source ("src") or target ("tgt")
    side, 0 for padding (all 1 where the batch has no validity array)."""
    valid = batch.get(f"{side}_valid")
    if valid is None:
        return jnp.ones(batch["src" if side == "src" else "tgt_in"].shape, jnp.float32)
    return valid.astype(jnp.float32)


def dynamics(grads, old_params, new_params, sums: dict[str, tuple]) -> dict[str, jax.Array]:
    """The internals (see the module docstring) of one step from its gradients, the
    parameters before and after, and `activation_sums` added over the batch."""
    updates = jax.tree.map(lambda n, o: n.astype(jnp.float32) - o, new_params, old_params)
    out = {}
    for kind, tree in (("grad_norm", grads), ("param_norm", new_params), ("update_norm", updates)):
        squares = module_squares(tree)
        out[kind] = jnp.sqrt(sum(squares.values()))
        out |= {f"{kind}/{name}": jnp.sqrt(s) for name, s in squares.items()}
    for key, (total, count) in sums.items():
        mean = total / jnp.maximum(count, 1.0)
        if key.startswith("attention_entropy/"):
            out |= {f"{key}/head{h}": mean[h] for h in range(mean.shape[0])}
        else:
            out[key] = jnp.sqrt(mean)
    return out


def module_squares(tree) -> dict[str, jax.Array]:
    """{module name: sum of squares of its leaves} (float32); stacked layers ([N, ...]
    under a `layers` key without an index, from scan_layers) give one module per layer."""
    out: dict[str, jax.Array] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        pieces = [p for p in jax.tree_util.keystr(path, simple=True, separator="/").split("/")]
        pieces = [RENAMED.get(p, p) for p in pieces if p != "value"]
        squares = jnp.square(leaf.astype(jnp.float32))
        at = pieces.index("layers") if "layers" in pieces else None
        if at is not None and not pieces[at + 1].isdigit():  # stacked [N, ...]
            per_layer = squares.reshape(squares.shape[0], -1).sum(axis=1)
            for i in range(squares.shape[0]):
                _add(out, module_name([*pieces[:at], str(i), *pieces[at + 1 :]]), per_layer[i])
        else:
            _add(out, module_name(pieces), squares.sum())
    return out


def module_name(pieces: list[str]) -> str:
    """`encoder/layers/0/self_attention/wq` -> `encoder/0/self_attention`; a top-level
    parameter (`logits_bias`) is its own module."""
    pieces = [p for p in pieces if p != "layers"]
    return "/".join(pieces[:-1] if len(pieces) > 1 else pieces)


def _add(out: dict, key: str, value) -> None:
    out[key] = out[key] + value if key in out else value
