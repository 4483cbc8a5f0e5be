"""Named variants of the parts a researcher swaps, each a pure function: activations, norms,
attention kernels and fixed position tables. Built-ins register here like any other; the
config, layers and command look names up in these registries only.

    @F.ACTIVATIONS.register("squared_relu")          # So et al. (2021), Primer
    def squared_relu(h):
        return jnp.square(jax.nn.relu(h))

    config = TransformerConfig.tiny(259, activation="squared_relu")

Importing a file registers its variants (`--variants FILE.py`); restoring a model whose
variant is not registered is an error naming it."""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
from collections.abc import Callable
from typing import Any, NamedTuple

from jaxformer.checks import BadType, BadValue, MissingFile, as_given


class Variant(NamedTuple):
    fn: Callable
    options: dict[str, Any]  # what the layers need to know, e.g. {"gated": True}


class Registry:
    """Variants of one kind by name. `register(name, fn, **options)` (also a decorator)
    adds one; `[name]` returns its Variant; `check(name)` names the registered ones."""

    def __init__(self, kind: str, where: str, contract: str):
        self.kind, self.where, self.contract = kind, where, contract
        self._variants: dict[str, Variant] = {}

    def register(self, name: str, fn: Callable | None = None, **options):
        if fn is None:
            return lambda fn: self.register(name, fn, **options)
        if not isinstance(name, str) or not name.isidentifier():
            raise BadValue(f"a {self.kind} name must be a Python identifier, got {name!r}")
        if not callable(fn):
            raise BadType(f"{self.kind} {name!r} must be a function, got {type(fn).__name__}")
        known = self._variants.get(name)
        if known is not None and not _same_definition(known.fn, fn):
            raise BadValue(f"{self.kind} {name!r} is already registered; choose another name")
        self._variants[name] = Variant(fn, options)
        return fn

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._variants)

    def check(self, name, *, what: str | None = None, also: tuple[str, ...] = ()) -> None:
        """Raise unless `name` is registered (or one of `also`), listing what is; `what`
        is the argument's name in the error (default the registry's kind)."""
        what = what or self.kind
        if not isinstance(name, str):
            raise BadType(f"{as_given(what)} must be a string, got {name!r}")
        if name not in self._variants and name not in also:
            raise BadValue(
                f"{as_given(what)} must be one of {also + self.names}, got {name!r} (a variant of "
                f"your own: {self.where}.register({name!r}, fn) in a module imported before "
                "the model is built or restored; the jaxformer command: --variants FILE.py)"
            )

    def __getitem__(self, name: str) -> Variant:
        self.check(name)
        return self._variants[name]


def _same_definition(a: Callable, b: Callable) -> bool:
    """The same function, or the same source lines run again (a file imported twice)."""
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    if a is b or code_a is None or code_b is None:
        return a is b
    where = lambda c: (c.co_filename, c.co_firstlineno, c.co_name)  # noqa: E731
    return where(code_a) == where(code_b)


ACTIVATIONS = Registry(
    "activation",
    "jaxformer.functional.ACTIVATIONS",
    "fn(h [..., F]) -> [..., F], elementwise; with gated=True, fn(h, gate) where gate = x W_gate",
)
NORMS = Registry(
    "norm",
    "jaxformer.functional.NORMS",
    "fn(x [..., E], params: NormParams, eps) -> [..., E]; bias=False: params.bias is None",
)
POSITIONS = Registry(
    "position_embedding",
    "jaxformer.functional.POSITIONS",
    "fn(length, d_model) -> [length, d_model] float32 table, added to the embeddings (a "
    "compile-time constant); 'learned', 'rope' and 'none' are built into the model instead",
)
ATTENTION = Registry(
    "implementation",
    "jaxformer.functional.ATTENTION",
    "fn(q [B,T,H,D], k [B,S,K,D], v [B,S,K,Dv], *, mask (bool, True = may attend, or None), "
    "bias, scale, dropout_rate, dropout_rng) -> [B,T,H,Dv]; with raw_masks=True it also gets "
    "q_valid, k_valid, k_lengths ([B] int, right padding), q_segments, k_segments ([B,T], "
    "[B,S] int ids of packed documents, or None) and causal (a flag), not folded into mask",
)

DEVICE_CHECKS = Registry(
    "device check",
    "jaxformer.functional.DEVICE_CHECKS",
    "fn(device) -> (error type, reason) or None: why the ATTENTION kernel of the same name "
    "cannot run on `device` (a jax Device or a stand-in with platform and device_kind), "
    "whatever its inputs; jaxformer.accelerators registers the built-in checks",
)


def import_variants(sources: list[str]) -> None:
    """Run each file (FILE.py) or import each module that registers variants: the
    command's --variants, a sweep's variant_files."""
    for source in sources:
        path = pathlib.Path(source)
        if path.suffix != ".py":
            _import_module(source)
            continue
        if not path.is_file():
            raise MissingFile(f"--variants {source}: no such file")
        spec = importlib.util.spec_from_file_location(f"jaxformer_variants_{path.stem}", path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def _import_module(name: str) -> None:
    """Import the module `name`; one that is not there is a missing file (a module it
    imports that is not there is the module's own error)."""
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is None or not (name == e.name or name.startswith(e.name + ".")):
            raise
        raise MissingFile(f"--variants {name}: no such file or module") from None
