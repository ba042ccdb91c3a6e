"""Lazy package attributes (PEP 562): a name is imported from its submodule on first access.

Used by the packages whose ``__init__`` must stay cheap (``torchbandits``, ``torchbandits.experiments``),
so that reading the name registry imports neither torch nor matplotlib.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(package: str, namespace: dict[str, Any],
                    names: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose module dict is ``namespace``.

    ``names`` maps an attribute to the submodule (relative to ``package``) that defines it; the
    first access imports it and caches the value in ``namespace``.
    """

    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(f".{names[name]}", package), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__
