"""A griffe extension for the API reference: the names a package's `__init__.py` imports
are that package's public API (jaxformer's convention), so mkdocstrings documents them
on the package's page. Griffe's own default treats imported names as private unless the
package lists them in `__all__`; a package that has `__all__` keeps it."""

from __future__ import annotations

from typing import Any

import griffe


class PublicPackageImports(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._mark(pkg)

    def _mark(self, module: griffe.Module) -> None:
        if module.is_init_module and not module.exports:
            for name, member in module.members.items():
                if member.is_alias and not name.startswith("_"):
                    member.public = True
        for member in module.modules.values():
            if not member.is_alias:
                self._mark(member)
