"""Running experiments: ``simulate``, ``run_grid``, ``sweep`` (Ray Tune), results, tables and plots.

The names below are imported on first use (PEP 562), so the name registry
(:mod:`~torchbandits.experiments.registry`) can be read without importing torch or matplotlib.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_attributes

if TYPE_CHECKING:  # the lazy names, for type checkers and documentation tools
    from .batch import can_batch, run_grid_batched, simulate_batch
    from .registry import ENVIRONMENTS, POLICIES, make_env, make_policy
    from .report import markdown_table, plot_diagnostic, plot_regret, plot_time, write_report
    from .results import RunResult, load_results, summarize
    from .runner import run_grid, simulate
    from .sweeps import run_trial, sweep

_LAZY: dict[str, str] = {
    "can_batch": "batch", "run_grid_batched": "batch", "simulate_batch": "batch",
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
    "can_batch",
    "load_results",
    "make_env",
    "make_policy",
    "markdown_table",
    "plot_diagnostic",
    "plot_regret",
    "plot_time",
    "run_grid",
    "run_grid_batched",
    "run_trial",
    "simulate",
    "simulate_batch",
    "summarize",
    "sweep",
    "write_report",
]

__getattr__, __dir__ = lazy_attributes(__name__, globals(), _LAZY)
