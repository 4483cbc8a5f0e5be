"""Named sites in the forward pass, where a value can be read (captured) or replaced (an
intervention), marked with `site(name, value)` inside `scope`s: paths such as
`decoder/1/cross_attention/weights`. Outside `recording()` a site is a no-op.

Sites of every layer (`encoder/<i>/`, `decoder/<i>/`), per sub-layer `self_attention`,
`cross_attention` and `ffn`:
  <sub-layer>/in      the residual stream entering it [B, T, E]
  <sub-layer>/out     its output, before dropout and the residual sum [B, T, E]
  <attention>/heads   each head's output before W^O [B, T, H, Dv] (zero one to ablate it)
  <attention>/weights the attention probabilities [B, H, T, S] (computed when captured)
  ffn/hidden          the feed-forward activations [B, T, F]
and `out`, the layer's output [B, T, E]."""

from __future__ import annotations

import contextlib
import fnmatch
import threading
from collections.abc import Callable, Iterable

from jaxformer.checks import BadValue

_local = threading.local()


class Recording:
    """What one `recording()` captures (glob patterns of site paths) and changes
    ({site path: function of the value}); `values` holds the captured ones, `seen` every
    site the traced function passed."""

    def __init__(self, capture: Iterable[str], interventions: dict[str, Callable]):
        self.patterns = tuple(capture)
        self.interventions = dict(interventions)
        self.values: dict = {}
        self.seen: list[str] = []
        self.path: list[str] = []

    def full(self, name: str) -> str:
        return "/".join([*self.path, name])

    def captures(self, path: str) -> bool:
        return any(fnmatch.fnmatchcase(path, p) for p in self.patterns)

    def check(self) -> None:
        """Raise naming each asked-for site that the function never passed."""
        unknown = [
            p for p in self.patterns if not any(fnmatch.fnmatchcase(s, p) for s in self.seen)
        ]
        unknown += [p for p in self.interventions if p not in self.seen]
        if unknown:
            sites = list(dict.fromkeys(self.seen))  # in order, once each
            raise BadValue(f"no site {unknown[0]!r} in this forward pass; the sites are {sites}")


def _active() -> Recording | None:
    return getattr(_local, "recording", None)


@contextlib.contextmanager
def recording(capture: Iterable[str] = (), interventions: dict[str, Callable] | None = None):
    """Within it, sites matching `capture` are collected into the yielded Recording's
    `values` and `interventions` replace a site's value with f(value)."""
    if _active() is not None:
        raise RuntimeError("recordings do not nest")
    _local.recording = Recording(capture, interventions or {})
    try:
        yield _local.recording
    finally:
        _local.recording = None


@contextlib.contextmanager
def scope(name: str):
    """Sites marked within it are named `<name>/<site>` (scopes nest)."""
    rec = _active()
    if rec is None:
        yield
        return
    rec.path.append(str(name))
    try:
        yield
    finally:
        rec.path.pop()


def site(name: str, value):
    """Mark a site: its value, captured and/or replaced inside a recording."""
    rec = _active()
    if rec is None:
        return value
    path = rec.full(name)
    rec.seen.append(path)
    if path in rec.interventions:
        value = rec.interventions[path](value)
    if rec.captures(path):
        rec.values[path] = value
    return value


def wanted(name: str) -> bool:
    """Whether a recording captures or changes the site `name` here: for a value that
    costs something to compute or lay out (attention weights), made only then. Marks the
    site as seen; the caller then passes the value through `site`."""
    rec = _active()
    if rec is None:
        return False
    path = rec.full(name)
    rec.seen.append(path)
    return rec.captures(path) or path in rec.interventions


def active() -> bool:
    return _active() is not None
