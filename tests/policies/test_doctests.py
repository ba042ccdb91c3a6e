"""The docstring examples run as doctests: every module of ``torchbandits.policies`` and every other
module with a ``>>>`` line. The modules in ``WITH_EXAMPLES`` must keep at least one example, so an
``Examples`` section cannot vanish unnoticed."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

import torchbandits
import torchbandits.policies

#: policy modules whose classes carry an ``Examples`` section (each must run at least one example)
WITH_EXAMPLES = {
    "torchbandits.policies.bkb",
    "torchbandits.policies.cbbkb",
    "torchbandits.policies.confidence_presets",
    "torchbandits.policies.ekucb",
    "torchbandits.policies.kernel_ucb",
    "torchbandits.policies.master",
    "torchbandits.policies.opkb",
    "torchbandits.policies.opnn",
    "torchbandits.policies.random",
    "torchbandits.policies.supkernel",
    "torchbandits.policies.time_varying",
}


def _modules() -> list[str]:
    names = {m.name for m in pkgutil.walk_packages(torchbandits.policies.__path__,
                                                   "torchbandits.policies.")}
    root = Path(torchbandits.__file__).parent
    for path in root.rglob("*.py"):
        if ">>>" in path.read_text(encoding="utf-8"):
            rel = path.relative_to(root.parent).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            names.add(".".join(parts))
    return sorted(names | WITH_EXAMPLES)


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             verbose=False, report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} doctest(s) of {name} failed"
    if name in WITH_EXAMPLES:
        assert result.attempted > 0, f"{name} lost its Examples sections"


def test_every_listed_module_exists_and_is_a_policy_module() -> None:
    for name in WITH_EXAMPLES:
        assert name.startswith("torchbandits.policies.")
        importlib.import_module(name)
