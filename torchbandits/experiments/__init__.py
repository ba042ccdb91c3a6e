"""Running experiments: ``simulate``, ``run_grid``, ``sweep`` (Ray Tune), results, tables and plots.

The names below are imported on first use (PEP 562), so the name registry
(:mod:`~torchbandits.experiments.registry`) can be read without importing torch or matplotlib.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the lazy names, for type checkers and documentation tools
    from .registry import ENVIRONMENTS, POLICIES, make_env, make_policy
    from .report import markdown_table, plot_diagnostic, plot_regret, plot_time, write_report
    from .results import RunResult, load_results, summarize
    from .runner import run_grid, simulate
    from .sweeps import run_trial, sweep

_LAZY: dict[str, str] = {
    "ENVIRONMENTS": "registry", "POLICIES": "registry", "make_env": "registry",
    "make_policy": "registry",
    "markdown_table": "report", "plot_diagnostic": "report", "plot_regret": "report",
    "plot_time": "report", "write_report": "report",
    "RunResult": "results", "load_results": "results", "summarize": "results",
    "run_grid": "runner", "simulate": "runner",
    "run_trial": "sweeps", "sweep": "sweeps",
}

__all__ = [
    "ENVIRONMENTS",
    "POLICIES",
    "RunResult",
    "load_results",
    "make_env",
    "make_policy",
    "markdown_table",
    "plot_diagnostic",
    "plot_regret",
    "plot_time",
    "run_grid",
    "run_trial",
    "simulate",
    "summarize",
    "sweep",
    "write_report",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
