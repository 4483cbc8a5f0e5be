"""Weights to and from PyTorch's Transformer modules (torch imported only when called).

torch.nn MultiheadAttention, TransformerEncoderLayer/DecoderLayer, TransformerEncoder/
Decoder and Transformer map to jaxformer.nn MultiHeadAttention, EncoderLayer/DecoderLayer,
EncoderStack/DecoderStack and EncoderDecoder. `from_torch` copies the weights into the
jaxformer module of the same architecture; `to_torch` builds the torch module. jaxformer
is batch-first with boolean masks, True = may attend (`mask_from_torch` converts torch's).
What has no counterpart in `TransformerConfig` is refused with an error naming it. torch
gives NaN where jaxformer gives zeros for a query with no key."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer import nn as jnn
from jaxformer.checks import BadType, BadValue, MissingPackage
from jaxformer.config import TransformerConfig
from jaxformer.interop.weights import (
    Link,
    dense,
    fill_params,
    from_jax,
    heads_out,
    layer_norm,
    packed_attention,
    params_of,
    to_jax,
)


def from_torch(module) -> nnx.Module:
    """The jaxformer module equivalent to the torch `module`, with its weights (see the
    table above). Raises TypeError for other module types and ValueError naming the
    option for a configuration jaxformer cannot represent."""
    torch = _import_torch()
    tnn = torch.nn
    kind = type(module)
    if kind is tnn.MultiheadAttention:
        o, dtype = _attention_options(module, ""), _param_dtype(module)
        args = (o["d_model"], o["num_heads"])
        options = dict(use_bias=o["bias"], dtype=dtype, param_dtype=dtype)
        cls = jnn.MultiHeadAttention
    else:
        args, options = (config_from_torch(module),), {}
        cls = {
            tnn.TransformerEncoderLayer: jnn.EncoderLayer,
            tnn.TransformerDecoderLayer: jnn.DecoderLayer,
            tnn.TransformerEncoder: jnn.EncoderStack,
            tnn.TransformerDecoder: jnn.DecoderStack,
            tnn.Transformer: jnn.EncoderDecoder,
        }[kind]
    # no memory for random weights: every one is set below
    target = nnx.eval_shape(lambda: cls(*args, **options, rngs=nnx.Rngs(0)))
    weights = {name: _numpy(tensor) for name, tensor in module.state_dict().items()}
    links = _links(module)
    extra = sorted(set(weights) - {name for link in links for name in link.names})
    if extra:
        raise BadValue(f"from_torch: no jaxformer counterpart for the torch weights {extra}")
    fill_params(target, to_jax(links, weights, "from_torch"), "from_torch")
    return target


def to_torch(module: nnx.Module, *, batch_first: bool = True, dropout: float | None = None):
    """The torch module equivalent to the jaxformer `module` (see the table above), with
    its weights, in torch's default training mode (call `.eval()` for inference).

    batch_first: the layout of the torch module's inputs (jaxformer's is batch-first).
    dropout: torch's one dropout probability; default the layers' residual dropout rate.
    Raises ValueError naming the option for what torch cannot represent (RMSNorm, SwiGLU,
    grouped key/value heads, ...)."""
    torch = _import_torch()
    tnn = torch.nn
    states = nnx.to_flat_state(nnx.state(module, nnx.Param))
    dtypes = {var.dtype for _, var in states}
    dtype = torch.bfloat16 if dtypes == {jnp.dtype(jnp.bfloat16)} else torch.float32
    if isinstance(module, jnn.MultiHeadAttention):
        o = _jax_attention_options(module, "")
        kw = dict(bias=o["bias"], batch_first=batch_first, dtype=dtype)
        out = tnn.MultiheadAttention(o["d_model"], o["num_heads"], dropout=dropout or 0.0, **kw)
    else:
        out = _build_torch(module, batch_first, dropout, dtype)
    weights = from_jax(_links(out), params_of(module), "to_torch: torch")
    state = {name: torch.tensor(array, dtype=dtype) for name, array in weights.items()}
    out.load_state_dict(state, strict=True)
    return out


def config_from_torch(module) -> TransformerConfig:
    """The TransformerConfig of a torch Transformer, encoder/decoder stack or layer.

    vocab_size is 1 and position_embedding "none": torch's modules have neither."""
    tnn = _import_torch().nn
    layer_classes = {"encoder": tnn.TransformerEncoderLayer, "decoder": tnn.TransformerDecoderLayer}
    options = []  # (where, options) of every layer
    num_layers = {"encoder": 0, "decoder": 0}
    final_norms = {}  # where -> the stack's final norm or None
    for name, where, stack in _stacks(module):
        if stack is None:
            options.append(("", _layer_options(module, "")))
            num_layers[name] = 1
            continue
        for i, layer in enumerate(stack.layers):
            if type(layer) is not layer_classes[name]:
                raise BadValue(
                    f"{where}layers.{i}: a {type(layer).__name__} cannot be converted, only a "
                    f"torch.nn.{layer_classes[name].__name__}"
                )
            options.append((f"{where}layers.{i}.", _layer_options(layer, f"{where}layers.{i}.")))
        num_layers[name] = len(stack.layers)
        final_norms[f"{where}norm"] = stack.norm

    where0, first = options[0]
    for where, o in options[1:]:
        for key, value in o.items():
            if value != first[key]:
                raise BadValue(
                    f"{where}{key}={value!r} differs from {where0}{key}={first[key]!r}: the "
                    "layers of a jaxformer model share one set of options"
                )
    present = {where: norm is not None for where, norm in final_norms.items()}
    if len(set(present.values())) > 1:
        raise BadValue(
            f"final norm present: {present}; jaxformer's final_norm option applies to both stacks"
        )
    for where, norm in final_norms.items():
        if norm is not None:
            _check_final_norm(norm, where, first)
    dtype = _param_dtype(module)
    return TransformerConfig(
        vocab_size=1,
        num_encoder_layers=num_layers["encoder"],
        num_decoder_layers=num_layers["decoder"],
        d_model=first["d_model"],
        d_ff=first["dim_feedforward"],
        num_heads=first["num_heads"],
        dropout_rate=first["dropout"],
        attention_dropout_rate=first["attention_dropout"],
        position_embedding="none",
        norm="layer",
        norm_placement="pre" if first["norm_first"] else "post",
        norm_eps=first["layer_norm_eps"],
        norm_bias=first["bias"],
        final_norm=any(present.values()),
        activation=first["activation"],
        attention_bias=first["bias"],
        ffn_bias=first["bias"],
        dtype=dtype,
        param_dtype=dtype,
    )


def _stacks(module) -> list[tuple[str, str, object]]:
    """(part, where, stack) for each stack of `module` to read; a layer is a stack of one
    (stack None). Anything but torch's own Transformer classes is refused."""
    tnn = _import_torch().nn
    kind = type(module)
    stack_classes = {"encoder": tnn.TransformerEncoder, "decoder": tnn.TransformerDecoder}
    if kind is tnn.Transformer:
        parts = [(name, f"{name}.", getattr(module, name)) for name in ("encoder", "decoder")]
        for name, _, stack in parts:
            if type(stack) is not stack_classes[name]:
                raise BadValue(
                    f"custom_{name}: a {type(stack).__name__} cannot be converted, only a "
                    f"torch.nn.{stack_classes[name].__name__}"
                )
        return parts
    if kind in stack_classes.values():
        return [("encoder" if kind is tnn.TransformerEncoder else "decoder", "", module)]
    if kind in (tnn.TransformerEncoderLayer, tnn.TransformerDecoderLayer):
        return [("encoder" if kind is tnn.TransformerEncoderLayer else "decoder", "", None)]
    raise BadType(
        "from_torch converts torch.nn.MultiheadAttention, TransformerEncoderLayer, "
        "TransformerDecoderLayer, TransformerEncoder, TransformerDecoder and Transformer "
        f"(exactly these classes), got {kind.__module__}.{kind.__qualname__}"
    )


def mask_from_torch(attn_mask=None, key_padding_mask=None, *, num_heads: int | None = None):
    """torch's masks -> one jaxformer mask (bool, True = may attend), or None for none.

    attn_mask: [T, S] or [B * num_heads, T, S]; key_padding_mask: [B, S]. Either is
    boolean (True = may NOT attend) or float with only 0 (attend) and -inf (not), as
    torch accepts them; torch tensors or arrays. The result broadcasts to [B, H, T, S]."""
    masks = []
    if attn_mask is not None:
        allowed = _allowed("attn_mask", attn_mask)
        if allowed.ndim == 2:
            masks.append(allowed[None, None])
        elif allowed.ndim == 3:
            if num_heads is None or allowed.shape[0] % num_heads:
                raise BadValue(
                    f"attn_mask of shape {allowed.shape} is [B * num_heads, T, S]: pass "
                    f"num_heads dividing {allowed.shape[0]}, got num_heads={num_heads}"
                )
            masks.append(allowed.reshape(-1, num_heads, *allowed.shape[1:]))
        else:
            raise BadValue(
                f"attn_mask must have shape [T, S] or [B * num_heads, T, S], got {allowed.shape}"
            )
    if key_padding_mask is not None:
        allowed = _allowed("key_padding_mask", key_padding_mask)
        if allowed.ndim != 2:
            raise BadValue(f"key_padding_mask must have shape [B, S], got {allowed.shape}")
        masks.append(allowed[:, None, None, :])
    if not masks:
        return None
    try:
        return jnp.asarray(np.logical_and.reduce(np.broadcast_arrays(*masks)))
    except ValueError:
        raise BadValue(
            f"attn_mask {masks[0].shape} and key_padding_mask {masks[1].shape} (as [B, H, T, S]) "
            "do not broadcast together"
        ) from None


# --- torch side ------------------------------------------------------------------------


def _import_torch():
    try:
        import torch
    except ImportError:
        raise MissingPackage(
            "jaxformer.interop.torch needs PyTorch: pip install 'jaxformer[torch]'"
        ) from None
    return torch


def _numpy(tensor) -> np.ndarray:
    """float32 NumPy copy (exact for float32 and bfloat16, the dtypes _param_dtype allows)."""
    return tensor.detach().cpu().float().numpy()


def _param_dtype(module) -> str:
    torch = _import_torch()
    names = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
    dtypes = {p.dtype for p in module.parameters()}
    if len(dtypes) != 1 or next(iter(dtypes)) not in names:
        raise BadValue(
            f"dtype {sorted(map(str, dtypes))}: jaxformer converts modules whose "
            "parameters are all float32 or all bfloat16 (call module.float() first)"
        )
    return names[next(iter(dtypes))]


def _attention_options(mha, where: str) -> dict:
    """Options of a torch MultiheadAttention, refusing what jaxformer cannot represent."""
    if not mha._qkv_same_embed_dim:
        raise BadValue(
            f"{where}kdim={mha.kdim}, vdim={mha.vdim} differ from embed_dim={mha.embed_dim}: "
            "jaxformer's keys and values come from inputs of size d_model"
        )
    if mha.bias_k is not None or mha.bias_v is not None:
        raise BadValue(f"{where}add_bias_kv=True has no jaxformer counterpart")
    if mha.add_zero_attn:
        raise BadValue(f"{where}add_zero_attn=True has no jaxformer counterpart")
    bias = mha.in_proj_bias is not None
    if (mha.out_proj.bias is not None) != bias:
        raise BadValue(
            f"{where}bias: in_proj_bias and out_proj.bias must both be present or both absent"
        )
    return dict(
        d_model=mha.embed_dim,
        num_heads=mha.num_heads,
        bias=bias,
        attention_dropout=float(mha.dropout),
    )


def _layer_options(layer, where: str) -> dict:
    """The torch options of an encoder or decoder layer, checked for consistency."""
    attentions = {"self_attn": layer.self_attn}
    if hasattr(layer, "multihead_attn"):
        attentions["multihead_attn"] = layer.multihead_attn
    options = {name: _attention_options(m, f"{where}{name}.") for name, m in attentions.items()}
    o = options["self_attn"]
    for name, other in options.items():
        for key in ("d_model", "num_heads", "attention_dropout"):
            if other[key] != o[key]:
                raise BadValue(
                    f"{where}{name}.{key}={other[key]} differs from self_attn.{key}={o[key]}"
                )
    dropouts = {
        float(m.p) for n, m in layer.named_children() if n.startswith("dropout") and n != "dropout"
    }
    if len(dropouts) != 1:
        raise BadValue(
            f"{where}dropout: the residual dropouts differ ({sorted(dropouts)}); jaxformer has one"
        )
    o = dict(
        o,
        dim_feedforward=layer.linear1.out_features,
        norm_first=bool(layer.norm_first),
        activation=_activation_name(layer.activation, where),
        dropout=dropouts.pop(),
    )
    biases = {name: options[name]["bias"] for name in attentions}
    biases |= {name: getattr(layer, name).bias is not None for name in ("linear1", "linear2")}
    norm_names = [n for n, _ in layer.named_children() if n.startswith("norm")]
    eps = {}
    for name in norm_names:
        norm = getattr(layer, name)
        _check_layer_norm(norm, f"{where}{name}", o["d_model"])
        biases[name] = norm.bias is not None
        eps[name] = norm.eps
    if len(set(biases.values())) > 1:
        raise BadValue(
            f"{where}bias: torch's bias flag is mixed across sub-layers ({biases}); jaxformer "
            "converts all-bias or no-bias layers"
        )
    if len(set(eps.values())) > 1:
        raise BadValue(f"{where}layer_norm_eps differs between the norms ({eps})")
    o["layer_norm_eps"] = float(next(iter(eps.values())))
    return o


def _activation_name(fn, where: str) -> str:
    torch = _import_torch()
    F = torch.nn.functional
    if fn is F.relu or type(fn) is torch.nn.ReLU:
        return "relu"
    if fn is F.gelu or (type(fn) is torch.nn.GELU and fn.approximate == "none"):
        return "gelu"
    raise BadValue(
        f"{where}activation={fn!r} cannot be represented: jaxformer converts relu and exact "
        "(erf) gelu, given as 'relu'/'gelu', F.relu/F.gelu or nn.ReLU()/nn.GELU()"
    )


def _check_layer_norm(norm, where: str, d_model: int) -> None:
    torch = _import_torch()
    if type(norm) is not torch.nn.LayerNorm:
        raise BadValue(f"{where}: a {type(norm).__name__} cannot be converted, only a LayerNorm")
    if not norm.elementwise_affine:
        raise BadValue(f"{where}: elementwise_affine=False has no jaxformer counterpart")
    if tuple(norm.normalized_shape) != (d_model,):
        raise BadValue(
            f"{where}: normalized_shape={tuple(norm.normalized_shape)}, expected ({d_model},)"
        )


def _check_final_norm(norm, where: str, layer_options: dict) -> None:
    """A stack's final norm must match its layers' norms in eps and bias."""
    _check_layer_norm(norm, where, layer_options["d_model"])
    if norm.eps != layer_options["layer_norm_eps"]:
        raise BadValue(
            f"{where}.eps={norm.eps} differs from the layers' layer_norm_eps="
            f"{layer_options['layer_norm_eps']}: jaxformer has one norm_eps"
        )
    if (norm.bias is not None) != layer_options["bias"]:
        raise BadValue(
            f"{where}.bias: the final norm has bias={norm.bias is not None}, the layers "
            f"bias={layer_options['bias']}: jaxformer has one norm_bias"
        )


# --- jaxformer side --------------------------------------------------------------------


def _jax_attention_options(mha: jnn.MultiHeadAttention, where: str) -> dict:
    E, H, Dk = mha.wq.shape
    K, Dv = mha.wk.shape[1], mha.wv.shape[2]
    if K != H:
        raise BadValue(
            f"{where}num_kv_heads={K} differs from num_heads={H}: torch's MultiheadAttention "
            "has no grouped key/value heads"
        )
    if E % H or Dk != E // H:
        raise BadValue(f"{where}d_k={Dk}: torch's head dim is d_model / num_heads = {E / H:g}")
    if Dv != E // H:
        raise BadValue(f"{where}d_v={Dv}: torch's head dim is d_model / num_heads = {E // H}")
    return dict(d_model=E, num_heads=H, bias=mha.use_bias)


def _jax_layer_options(layer, where: str) -> dict:
    if isinstance(layer, jnn.DecoderLayer) and not layer.cross_attention:
        raise BadValue(
            f"{where}cross_attention=False (a decoder-only layer): torch's "
            "TransformerDecoderLayer always has cross-attention"
        )
    o = _jax_attention_options(layer.self_attn, f"{where}self_attn.")
    opts = layer.opts
    if opts.norm != "layer":
        raise BadValue(f"{where}norm={opts.norm!r}: torch's layers use LayerNorm")
    if opts.activation not in ("relu", "gelu"):
        raise BadValue(f"{where}activation={opts.activation!r}: torch's layers take relu or gelu")
    norms = [getattr(layer, n) for n in ("norm1", "norm2", "norm3") if hasattr(layer, n)]
    biases = {
        "attention_bias": layer.self_attn.use_bias,
        "ffn_bias": layer.ffn.use_bias,
        "norm_bias": all(n.use_bias for n in norms),
    }
    if len(set(biases.values())) > 1:
        raise BadValue(
            f"{where}bias: torch's one bias flag covers attention, feed-forward and norms; "
            f"got {biases}"
        )
    return dict(
        d_model=o["d_model"],
        nhead=o["num_heads"],
        dim_feedforward=layer.ffn.w1.shape[1],
        dropout=opts.dropout_rate,
        activation=opts.activation,
        layer_norm_eps=opts.norm_eps,
        norm_first=opts.norm_placement == "pre",
        bias=o["bias"],
    )


def _build_torch(module, batch_first: bool, dropout: float | None, dtype):
    """An empty torch module with `module`'s architecture."""
    tnn = _import_torch().nn

    def kwargs(layer, where):
        kw = _jax_layer_options(layer, where)
        if dropout is not None:
            kw["dropout"] = dropout
        return kw | dict(batch_first=batch_first, dtype=dtype)

    def stack(jstack, name, where):
        if jstack.scan:
            raise BadValue(
                f"{where}layers are stacked (scan_layers=True); to_torch converts a model "
                "built with scan_layers=False"
            )
        if len(jstack.layers) == 0:
            raise BadValue(f"{where}num_{name}_layers=0: torch's stacks need at least one layer")
        kw, n = kwargs(jstack.layers[0], f"{where}layers.0."), len(jstack.layers)
        norm = None
        if jstack.final_norm is not None:
            norm = tnn.LayerNorm(
                kw["d_model"], eps=kw["layer_norm_eps"], bias=kw["bias"], dtype=dtype
            )
        if name == "encoder":
            layer = tnn.TransformerEncoderLayer(**kw)
            return tnn.TransformerEncoder(layer, n, norm, enable_nested_tensor=False), kw
        return tnn.TransformerDecoder(tnn.TransformerDecoderLayer(**kw), n, norm), kw

    if isinstance(module, jnn.EncoderLayer):
        return tnn.TransformerEncoderLayer(**kwargs(module, ""))
    if isinstance(module, jnn.DecoderLayer):
        return tnn.TransformerDecoderLayer(**kwargs(module, ""))
    if isinstance(module, jnn.EncoderStack):
        return stack(module, "encoder", "")[0]
    if isinstance(module, jnn.DecoderStack):
        return stack(module, "decoder", "")[0]
    if isinstance(module, jnn.EncoderDecoder):
        encoder, kw = stack(module.encoder, "encoder", "encoder.")
        decoder, _ = stack(module.decoder, "decoder", "decoder.")
        return tnn.Transformer(
            kw["d_model"],
            kw["nhead"],
            custom_encoder=encoder,
            custom_decoder=decoder,
            batch_first=batch_first,
            dtype=dtype,
        )
    raise BadType(
        "to_torch converts jaxformer.nn.MultiHeadAttention, EncoderLayer, DecoderLayer, "
        f"EncoderStack, DecoderStack and EncoderDecoder, got {type(module).__name__}"
    )


# --- one link table, used in both directions ------------------------------------------


def _links(module) -> list[Link]:
    """The link table of a torch module of the classes above, read from its structure:
    torch's state-dict names <-> jaxformer parameter paths."""
    if type(module) is _import_torch().nn.MultiheadAttention:
        return _attention_links(module, "", ())
    links = []
    for _, where, stack in _stacks(module):
        path = (where[:-1],) if where else ()  # "encoder." -> ("encoder",)
        if stack is None:  # a single layer
            links += _layer_links(module, "", ())
            continue
        for i, layer in enumerate(stack.layers):
            links += _layer_links(layer, f"{where}layers.{i}.", (*path, "layers", i))
        if stack.norm is not None:
            bias = stack.norm.bias is not None
            links += layer_norm(f"{where}norm", (*path, "final_norm"), bias=bias)
    return links


def _layer_links(layer, where: str, path: tuple) -> list[Link]:
    """An encoder or decoder layer: attention, cross-attention (multihead_attn), the
    feed-forward linear1/linear2 and the norms."""
    links = _attention_links(layer.self_attn, f"{where}self_attn.", (*path, "self_attn"))
    if hasattr(layer, "multihead_attn"):
        cross = (*path, "cross_attn")
        links += _attention_links(layer.multihead_attn, f"{where}multihead_attn.", cross)
    for i in (1, 2):
        bias = getattr(layer, f"linear{i}").bias is not None
        links += dense(
            f"{where}linear{i}", (*path, "ffn"), f"w{i}", f"b{i}", out_in=True, bias=bias
        )
    for name, child in layer.named_children():
        if name.startswith("norm"):
            links += layer_norm(f"{where}{name}", (*path, name), bias=child.bias is not None)
    return links


def _attention_links(mha, where: str, path: tuple) -> list[Link]:
    """A MultiheadAttention: in_proj packs q, k, v [3E, E]; out_proj is a Linear."""
    bias = mha.in_proj_bias is not None
    in_bias = f"{where}in_proj_bias" if bias else None
    return [
        *packed_attention(f"{where}in_proj_weight", in_bias, path, mha.num_heads, out_in=True),
        *heads_out(f"{where}out_proj", path, mha.num_heads, out_in=True, bias=bias),
    ]


def _allowed(name: str, mask) -> np.ndarray:
    """A torch mask as a NumPy bool array, True = may attend."""
    if hasattr(mask, "detach"):
        mask = mask.detach().cpu().numpy()
    mask = np.asarray(mask)
    if mask.dtype == np.bool_:
        return ~mask
    if not np.issubdtype(mask.dtype, np.floating):
        raise BadType(f"{name} must be boolean or float (0 / -inf), got dtype {mask.dtype}")
    other = mask[(mask != 0) & ~np.isneginf(mask)]
    if other.size:
        raise BadValue(
            f"{name} holds additive values other than 0 and -inf (e.g. {other.flat[0]}): "
            "jaxformer masks are boolean"
        )
    return mask == 0
