"""One weight-mapping scheme for every converter: a link table.

A `Link` joins another framework's named weights to jaxformer parameter paths, with one
function per direction; converters build links from the architecture, and `to_jax` /
`from_jax` move the arrays:

    links = [*layer_norm("ln_f", ("decoder", "final_norm")), ...]
    fill_params(target, to_jax(links, weights, "from_hf"), "from_hf")

Dense weights are stored either [out, in] (torch's Linear, y = x W^T + b: `out_in=True`)
or [in, out] (GPT-2's Conv1D, and jaxformer's own). Attention projections split their
output axis into heads h * D + d: wq, wk, wv [E, H, D], wo [H, D, E], biases [H, D]."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.checks import BadValue

Path = tuple[str | int, ...]
Arrays = list[np.ndarray]


class Link(NamedTuple):
    """Weights `names` of another framework <-> jaxformer parameters at `paths`."""

    names: tuple[str, ...]
    paths: tuple[Path, ...]
    to_jax: Callable[[Arrays], Arrays]  # the arrays of `names` -> those of `paths`
    from_jax: Callable[[Arrays], Arrays]  # and back


# --- builders ---------------------------------------------------------------------------


def same(name: str, path: Path) -> Link:
    """One array, unchanged."""
    return Link((name,), (path,), list, list)


def layer_norm(prefix: str, path: Path, *, bias: bool = True) -> list[Link]:
    """A LayerNorm: prefix.weight -> scale, prefix.bias -> bias."""
    links = [same(f"{prefix}.weight", (*path, "scale"))]
    return links + [same(f"{prefix}.bias", (*path, "bias"))] if bias else links


def dense(prefix: str, path: Path, w: str, b: str, *, out_in: bool, bias: bool = True):
    """A dense layer: prefix.weight -> [in, out] at path + (w,), prefix.bias -> (b,)."""
    flip = _transpose if out_in else list
    links = [Link((f"{prefix}.weight",), ((*path, w),), flip, flip)]
    return links + [same(f"{prefix}.bias", (*path, b))] if bias else links


def attention(prefix: str, path: Path, H: int, *, bias: bool = True) -> list[Link]:
    """Separate [out, in] projections prefix.{q,k,v,out}_proj (Hugging Face's BART and
    Marian) <-> wq, wk, wv, wo and their biases."""
    links = []
    for name, w, b in (("q_proj", "wq", "bq"), ("k_proj", "wk", "bk"), ("v_proj", "wv", "bv")):
        links.append(Link((f"{prefix}.{name}.weight",), ((*path, w),), *_heads_in(H, True, 1)))
        if bias:
            links.append(_bias_in(f"{prefix}.{name}.bias", ((*path, b),), H, 1))
    return links + heads_out(f"{prefix}.out_proj", path, H, out_in=True, bias=bias)


def packed_attention(weight: str, bias: str | None, path: Path, H: int, *, out_in: bool):
    """q, k and v in one matrix, side by side along the output axis (torch's in_proj
    [3E, E], GPT-2's c_attn [E, 3E]) <-> wq, wk, wv and, unless bias is None, bq, bk, bv."""
    qkv = tuple((*path, n) for n in ("wq", "wk", "wv"))
    links = [Link((weight,), qkv, *_heads_in(H, out_in, 3))]
    if bias is not None:
        links.append(_bias_in(bias, tuple((*path, n) for n in ("bq", "bk", "bv")), H, 3))
    return links


def heads_out(prefix: str, path: Path, H: int, *, out_in: bool, bias: bool = True):
    """The output projection prefix.weight ([E, H * D] or [H * D, E]) <-> wo [H, D, E],
    prefix.bias <-> bo."""

    def to_jax(a):
        w = a[0].T if out_in else a[0]
        return [w.reshape(H, -1, w.shape[-1])]

    def from_jax(a):
        w = a[0].reshape(-1, a[0].shape[-1])
        return [w.T if out_in else w]

    links = [Link((f"{prefix}.weight",), ((*path, "wo"),), to_jax, from_jax)]
    return links + [same(f"{prefix}.bias", (*path, "bo"))] if bias else links


def _heads_in(H: int, out_in: bool, parts: int):
    """(to_jax, from_jax) of `parts` input projections side by side in one matrix."""

    def to_jax(a):
        w = a[0].T if out_in else a[0]  # [E, parts * H * D]
        return [p.reshape(w.shape[0], H, -1) for p in np.split(w, parts, axis=1)]

    def from_jax(ws):
        w = np.concatenate([p.reshape(p.shape[0], -1) for p in ws], axis=1)
        return [w.T if out_in else w]

    return to_jax, from_jax


def _bias_in(name: str, paths: tuple[Path, ...], H: int, parts: int) -> Link:
    """`parts` biases side by side [parts * H * D] <-> [H, D] each."""
    return Link(
        (name,),
        paths,
        lambda a: [b.reshape(H, -1) for b in np.split(a[0], parts)],
        lambda bs: [np.concatenate([b.reshape(-1) for b in bs])],
    )


def _transpose(a: Arrays) -> Arrays:
    return [a[0].T]


# --- moving the arrays ------------------------------------------------------------------


def to_jax(links: list[Link], weights: dict[str, np.ndarray], source: str):
    """The jaxformer arrays by path from the other framework's `weights` by name; a name
    the links need and `weights` lacks is an error naming `source`."""
    arrays: dict[Path, np.ndarray] = {}
    for link in links:
        missing = [n for n in link.names if n not in weights]
        if missing:
            raise BadValue(f"{source}: the checkpoint has no weight {missing[0]!r}")
        arrays.update(zip(link.paths, link.to_jax([weights[n] for n in link.names]), strict=True))
    return arrays


def from_jax(links: list[Link], params: dict[Path, np.ndarray], target: str):
    """The other framework's weights by name from jaxformer `params` by path; a parameter
    the links need and `params` lacks, or one no link takes, is an error naming `target`."""
    weights: dict[str, np.ndarray] = {}
    for link in links:
        missing = [p for p in link.paths if p not in params]
        if missing:
            raise BadValue(f"{target} needs the parameter {dotted(missing[0])}, which is missing")
        weights.update(zip(link.names, link.from_jax([params[p] for p in link.paths]), strict=True))
    unused = sorted(dotted(p) for p in set(params) - {p for link in links for p in link.paths})
    if unused:
        raise BadValue(f"{target} has no place for the parameters {unused}")
    return weights


# --- jaxformer modules ------------------------------------------------------------------


def fill_params(target: nnx.Module, arrays: dict[Path, np.ndarray], source: str) -> None:
    """Set every parameter of the abstract `target` (from nnx.eval_shape) from `arrays`,
    which must hold exactly its parameters with their shapes; errors name the `source`."""
    state = nnx.state(target, nnx.Param)
    flat = list(nnx.to_flat_state(state))
    missing = [dotted(p) for p, _ in flat if p not in arrays]
    extra = sorted(dotted(p) for p in set(arrays) - {p for p, _ in flat})
    if missing or extra:
        raise BadValue(f"{source}: no weight for {missing}; no place for {extra}")
    for path, var in flat:
        array = arrays[path]
        if array.shape != var.shape:
            raise BadValue(
                f"{source}: {dotted(path)} has shape {array.shape}, expected {var.shape}"
            )
        var.set_value(jnp.asarray(array, var.dtype))
    nnx.update(target, state)


def params_of(module: nnx.Module) -> dict[Path, np.ndarray]:
    """Every parameter of `module` as a float32 NumPy array, by path."""
    flat = nnx.to_flat_state(nnx.state(module, nnx.Param))
    return {path: np.asarray(var[...], np.float32) for path, var in flat}


def dotted(path: Path) -> str:
    return ".".join(map(str, path))
