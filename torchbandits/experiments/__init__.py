"""Running experiments: ``simulate``, ``run_grid``, ``sweep`` (Ray Tune), results, tables and plots."""

from .registry import ENVIRONMENTS, POLICIES, REPRODUCTIONS, make_env, make_policy
from .report import markdown_table, plot_diagnostic, plot_regret, plot_time, write_report
from .results import RunResult, load_results, summarize
from .runner import run_grid, simulate
from .sweeps import run_trial, sweep

__all__ = [
    "ENVIRONMENTS",
    "POLICIES",
    "REPRODUCTIONS",
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
