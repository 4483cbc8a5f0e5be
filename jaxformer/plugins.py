"""Packages that extend jaxformer without the library importing them: each names a module
under the entry point group "jaxformer.plugins" (or in $JAXFORMER_PLUGINS, comma-separated,
for a checkout used without installing). Importing a plugin registers what it adds (a
dataset family: `jaxformer.data.registry`). A plugin adds commands to the `jaxformer`
command with `COMMANDS` (name -> one-line help), `add_commands(sub)` (their parsers, built
only when one of them runs) and `run(args)`: import it cheaply, since every `jaxformer`
command imports it."""

from __future__ import annotations

import functools
import importlib
import os
from importlib import metadata
from types import ModuleType

GROUP = "jaxformer.plugins"


@functools.cache
def load() -> tuple[ModuleType, ...]:
    """The plugin modules, imported once, in a stable order (each once)."""
    names = [e.value for e in metadata.entry_points(group=GROUP)]
    names += [n.strip() for n in os.environ.get("JAXFORMER_PLUGINS", "").split(",") if n.strip()]
    return tuple(importlib.import_module(name) for name in dict.fromkeys(names))
