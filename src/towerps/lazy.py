"""Package exports that load on first use.

    __getattr__, __all__ = lazy_exports(__name__, {"Shard": "shard", ...})

`towerps.ps.Shard` then imports `towerps.ps.shard` only when first asked
for: a shard process, or the command line reading its flags, imports a
package without dragging in what its other exports need (TensorFlow is about
300 MB). Each value is a module path relative to the package, or an
absolute one (starting with "towerps.").
"""

from __future__ import annotations

import importlib


def lazy_exports(package: str, exports: dict[str, str]):
    """A module-level `__getattr__` that loads each name of `exports` from
    its module, and the sorted `__all__` that lists them."""

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        path = module if module.startswith("towerps.") else f"{package}.{module}"
        return getattr(importlib.import_module(path), name)

    return __getattr__, sorted(exports)
