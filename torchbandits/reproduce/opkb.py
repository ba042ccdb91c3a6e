"""Reproduce Hong, Li & Tewari (2023), "An Optimization-based Algorithm for Non-stationary Kernel
Bandits without Prior Knowledge", AISTATS: Figures 1 (a, b) and 2 (a, b) (their Section 6 and
Appendix J).

``torchbandits reproduce opkb`` / ``python scripts/reproduce_opkb.py``.

* **fig1a** — Env 1 (Section 6; d = 10 from the authors' configs): N = 100 arms on the unit
  sphere of R¹⁰, r ~ N(0, K_RBF(ℓ=0.2)) scaled to max|r| = 0.8, sign flip after round 3000,
  truncated N(0, 0.1²) noise; SW-GP-UCB, WGP-UCB, ADA-OPKB, ADA-OPNN with the tuned values.
* **fig1b** — Env 2: switches after rounds 1500 and 5000; the same (Env-1) tuned values.
* **fig2a** — stationary cosine bandit (App. J.2: N = 256, d = 8): OPNN, OPNN0, GP-UCB, OPKB.
* **fig2b** — slowly varying cosine bandit (App. J.3: N = 100, d = 10): SW-GP-UCB (w = 3000 and
  the re-tuned w = 1000), WGP-UCB, ADA-OPKB, ADA-OPNN.

Tuned values (Section 6, "Algorithm Tuning"; the text's values where the text and the authors'
configs differ): SW-GP-UCB λ = 0.05 (the authors' code writes the reciprocal ridge, 20), UCB
scale 0.01 in the code's convention (radius × 1/λ, ``convention="aistats2023_code"``: the code's
width is the GP sd divided by the ridge), window 3000; WGP-UCB λ = 0.01, UCB scale 0.5, discount
0.9995; GP-UCB as SW-GP-UCB without a window; ADA-OPKB / OPKB: preset ``"aistats2023_code"``
with nature's kernel (RBF ℓ = 0.2); ADA-OPNN / OPNN / OPNN0: preset ``"aistats2023_code"``
(family ``opnn``; stationary values for Fig. 2a), width m = 2048 (``--nn-width``), L = 3 square
layers, η = 1e-8, J = 100, λ = 10. β of the GP baselines multiplies the **GP** sd.

Every algorithm faces the same instance and noise per seed (env seed = run index; the authors'
code drives both from one global generator); the policy seed is separate. T = 10 000
(``--horizon``); mean ± standard error over ``--seeds`` (default 5; the paper used 25 and 50).
Outputs under ``--out`` (default ``results/opkb``), one folder per figure: ``runs/*.json``
(restart times in each run's config), ``table.md`` (final dynamic regret mean ± s.e., restarts,
agent seconds), ``regret.png`` (mean ± s.e., restart times marked as ticks, switches as dashed
lines), ``time.png``, ``summary.json``. ``--quick``: N = 16 arms, T = 600, 2 seeds, width 32,
switch times scaled with T (seconds; used by the tests).
"""

from __future__ import annotations

import argparse
import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.lines import Line2D

from ..envs.nonstationary import CosineBandit, SwitchingKernelEnv, slow_phase
from ..experiments.figures import (
    CUM_REGRET,
    ROUND,
    band_label,
    figure_grid,
    mark_times,
    plot_band,
    save_figure,
    setting_title,
)
from ..experiments.report import write_report
from ..experiments.results import RunResult
from ..experiments.runner import Job, run_jobs
from ..policies.op_baselines import gp_ucb, sw_gp_ucb, wgp_ucb
from ..policies.opkb import ADAOPKB, OPKB
from ..policies.opnn import ADAOPNN, OPNN, OPNN0
from .common import QUICK_NOTE, quick_banner, reproduction_parser, start

__all__ = ["FIGURES", "TUNED", "main", "make_env", "make_policy", "summarize_runs"]

TUNED: dict[str, dict[str, Any]] = {
    "SW-GP-UCB": {"lam": 0.05, "ucb_scale": 0.01, "window": 3000},
    "SW-GP-UCB (w=1000)": {"lam": 0.05, "ucb_scale": 0.01, "window": 1000},
    "WGP-UCB": {"lam": 0.01, "ucb_scale": 0.5, "discount": 0.9995},
    "GP-UCB": {"lam": 0.05, "ucb_scale": 0.01},
    "NN": {"n_square_layers": 3, "eta": 1e-8, "train_steps": 100, "nn_lam": 10.0},
}

FIGURES: dict[str, dict[str, Any]] = {   # switch rounds are added to the title from the env
    "fig1a": {"env": "switch1", "algos": ["SW-GP-UCB", "WGP-UCB", "ADA-OPKB", "ADA-OPNN"],
              "title": "Figure 1(a): Env 1"},
    "fig1b": {"env": "switch2", "algos": ["SW-GP-UCB", "WGP-UCB", "ADA-OPKB", "ADA-OPNN"],
              "title": "Figure 1(b): Env 2"},
    "fig2a": {"env": "cos_stationary", "algos": ["OPNN", "OPNN0", "GP-UCB", "OPKB"],
              "title": "Figure 2(a): stationary cosine bandit"},
    "fig2b": {"env": "cos_slow", "algos": ["SW-GP-UCB", "SW-GP-UCB (w=1000)", "WGP-UCB", "ADA-OPKB",
                                           "ADA-OPNN"],
              "title": "Figure 2(b): slowly varying cosine bandit"},
}


def make_env(name: str, horizon: int, quick: bool, device: str = "cpu") -> Any:
    """The environment of a figure; switch times and the phase schedule scale with ``T/10⁴``."""
    scale = horizon / 10_000
    n = 16 if quick else None
    if name == "switch1":
        return SwitchingKernelEnv(n or 100, 10, 0.2, switches=(round(3000 * scale),), device=device)
    if name == "switch2":
        return SwitchingKernelEnv(n or 100, 10, 0.2, switches=(round(1500 * scale), round(5000 * scale)),
                                  device=device)
    if name == "cos_stationary":
        return CosineBandit(n or 256, 8, phase="stationary", device=device)
    if name == "cos_slow":
        return CosineBandit(n or 100, 10, phase=lambda t: slow_phase(int(t / scale)), device=device)
    raise ValueError(f"unknown environment {name!r}")


def make_policy(algo: str, env: Any, horizon: int, *, nn_width: int, seed: int,
                device: str = "cpu") -> Any:
    """The tuned policy ``algo`` for ``env`` (a private copy of nature's kernel)."""
    kernel = copy.deepcopy(env.kernel)
    kw = {"seed": seed, "device": device}
    if algo.startswith("SW-GP-UCB"):
        t = TUNED[algo]
        return sw_gp_ucb(kernel, t["lam"], t["ucb_scale"], window=min(t["window"], horizon),
                         convention="aistats2023_code", **kw)
    if algo == "WGP-UCB":
        t = TUNED[algo]
        return wgp_ucb(kernel, t["lam"], t["ucb_scale"], t["discount"], **kw)
    if algo == "GP-UCB":
        t = TUNED[algo]
        return gp_ucb(kernel, t["lam"], t["ucb_scale"], convention="aistats2023_code", **kw)
    if algo == "ADA-OPKB":
        return ADAOPKB(kernel, horizon, preset="aistats2023_code", **kw)
    if algo == "OPKB":
        return OPKB(kernel, horizon, preset="aistats2023_code", **kw)
    nn = dict(TUNED["NN"], width=nn_width, **kw)
    if algo == "ADA-OPNN":
        return ADAOPNN(horizon, preset="aistats2023_code", **nn)
    if algo == "OPNN":
        return OPNN(horizon, preset="aistats2023_code", stationary_preset=True, **nn)
    if algo == "OPNN0":
        return OPNN0(horizon, preset="aistats2023_code", stationary_preset=True, **nn)
    raise ValueError(f"unknown algorithm {algo!r}")


def _mean_se(values: Sequence[float]) -> tuple[float, float]:
    a = np.asarray(values, dtype=float)
    se = float(a.std(ddof=1) / np.sqrt(len(a))) if len(a) > 1 else 0.0
    return float(a.mean()), se


def summarize_runs(runs: Sequence[RunResult]) -> list[dict[str, Any]]:
    """Per policy: final dynamic regret mean ± s.e., regret at T/2, restarts, agent seconds."""
    by: dict[str, list[RunResult]] = {}
    for r in runs:
        by.setdefault(r.policy, []).append(r)
    rows = []
    for policy, rs in by.items():
        fin = _mean_se([r.final_regret for r in rs])
        half = _mean_se([float(r.cumulative_regret[r.horizon // 2 - 1]) for r in rs])
        restarts = [len(r.config.get("restart_times", [])) for r in rs]
        rows.append({"policy": policy, "seeds": len(rs), "horizon": rs[0].horizon,
                     "final_mean": fin[0], "final_se": fin[1], "half_mean": half[0],
                     "restarts_mean": float(np.mean(restarts)),
                     "agent_seconds_mean": float(np.mean([r.total_agent_seconds for r in rs]))})
    return rows


def _table(rows: Sequence[dict[str, Any]], title: str) -> str:
    lines = [f"### {title}", "",
             "| policy | seeds | T | dynamic regret at T (mean ± s.e.) | at T/2 | restarts | agent s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: r["final_mean"]):
        lines.append(f"| {r['policy']} | {r['seeds']} | {r['horizon']} | {r['final_mean']:.1f} ± "
                     f"{r['final_se']:.1f} | {r['half_mean']:.1f} | {r['restarts_mean']:.1f} | "
                     f"{r['agent_seconds_mean']:.1f} |")
    return "\n".join(lines)


def figure_title(fig: str, env: Any, horizon: int) -> str:
    """The figure's title with the environment's actual size and switch rounds (scaled with T)."""
    base = FIGURES[fig]["title"]
    sw = list(getattr(env, "switches", ()))
    where = ("" if not sw else f", switch after round {sw[0]}" if len(sw) == 1 else
             ", switches after rounds " + " and ".join(map(str, sw)))
    return f"{base} (N = {env.n_arms} arms, d = {env.dim}{where}, T = {horizon})"


def _plot(runs: Sequence[RunResult], path: Path, title: str, switches: Sequence[int]) -> Path:
    by: dict[str, list[RunResult]] = {}
    for r in runs:
        by.setdefault(r.policy, []).append(r)
    fig, ax = figure_grid(figsize=(7.0, 5.4))
    ymax = max(float(np.max(r.cumulative_regret)) for r in runs) or 1.0
    ticks = False
    for i, (policy, rs) in enumerate(by.items()):
        line = plot_band(ax, np.stack([r.cumulative_regret for r in rs]), label=policy, kind="se",
                         alpha=0.25)
        times = [s for r in rs for s in r.config.get("restart_times", [])]
        if times:   # restart times of all seeds as ticks at the bottom, one row per policy
            ticks = True
            y0 = -0.03 * ymax * (i + 1)
            ax.plot(times, [y0] * len(times), "|", color=line.get_color(), markersize=7)
    mark_times(ax, switches, "environment switch")
    ax.set_xlabel(ROUND)
    ax.set_ylabel("cumulative dynamic " + CUM_REGRET.split(" ", 1)[1])
    ax.set_title("cumulative dynamic regret")
    seeds = max(len(rs) for rs in by.values())
    proxy = [(Line2D([], [], ls="none", marker="|", color="k", markersize=8),
              "restart (tick below the axis, in the policy's colour; all seeds)")] if ticks else []
    return save_figure(fig, path, title=title, band=band_label(seeds, "se"), extra_legend=proxy,
                       ncol=3)


def run_figure(fig: str, *, horizon: int, seeds: Sequence[int], nn_width: int, quick: bool,
               out: Path, device: str = "cpu", algos: Sequence[str] | None = None,
               progress: bool = True) -> tuple[list[RunResult], str]:
    spec = FIGURES[fig]
    names = [a for a in spec["algos"] if not algos or a in algos]
    settings = {"quick": bool(quick), "nn_width": nn_width, "device": str(device)}

    def annotate(pol: Any, env: Any, res: RunResult) -> None:
        res.config["restart_times"] = list(getattr(pol, "restart_times", []))
        if hasattr(pol, "gamma_paper"):
            res.config["gamma_T"] = pol.gamma_paper
            res.config["E"] = pol.E
            res.config["solver_seconds"] = pol.solver_seconds

    def job(algo: str, seed: int) -> Job:
        return Job(fig, algo, seed, horizon, lambda: make_env(spec["env"], horizon, quick, device),
                   lambda env: make_policy(algo, env, horizon, nn_width=nn_width, seed=10_000 + seed,
                                           device=device),
                   {"algorithm_seed": 10_000 + seed, "settings": settings},
                   file=f"{algo.replace(' ', '_')}__seed{seed}.json", annotate=annotate)

    # a finished run already saved (atomically) is read back, not recomputed
    runs = run_jobs([job(a, s) for a in names for s in seeds], out=out / fig, progress=progress,
                    diagnostics_every=max(1, horizon // 200), match=["settings"], desc=fig)
    # the table and plots cover every run of this figure and horizon in the folder, so a figure
    # can be completed algorithm by algorithm (--algos)
    done = {(r.policy, r.seed) for r in runs}
    for path in sorted((out / fig / "runs").glob("*.json")):
        old = RunResult.load(path)
        if old.horizon == horizon and (old.policy, old.seed) not in done and old.seed in seeds:
            runs.append(old)
            done.add((old.policy, old.seed))
    env = make_env(spec["env"], horizon, quick, device)
    title = figure_title(fig, env, horizon)
    rows = summarize_runs(runs)
    table = _table(rows, title)
    (out / fig).mkdir(parents=True, exist_ok=True)
    write_report(runs, out / fig, setting_title(title, quick=quick))   # time plot, summary
    (out / fig / "table.md").write_text(table + "\n")
    (out / fig / "summary_se.json").write_text(json.dumps(rows, indent=2))
    _plot(runs, out / fig / "regret.png",
          setting_title(title, seeds=len(seeds), quick=quick), getattr(env, "switches", ()))
    return runs, table


def build_parser() -> argparse.ArgumentParser:
    p = reproduction_parser("opkb", __doc__, quick="N = 16 arms, T = 600, 2 seeds, width 32, "
                            "switch times scaled with T", out="results/opkb", threads=1)
    p.add_argument("--figures", nargs="+", default=list(FIGURES), choices=list(FIGURES))
    p.add_argument("--algos", nargs="+", default=None, help="restrict to these algorithms")
    p.add_argument("--seeds", type=int, default=5, help="number of seeds (paper: 25 / 50)")
    p.add_argument("--horizon", type=int, default=10_000)
    p.add_argument("--nn-width", type=int, default=2048)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``torchbandits reproduce opkb [options]`` (see the module docstring); returns the exit code."""
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    start(args)
    horizon, seeds, width = args.horizon, args.seeds, args.nn_width
    if args.quick:
        horizon, seeds, width = min(horizon, 600), min(seeds, 2), min(width, 32)
        print(quick_banner(f"N = 16 arms, T = {horizon}, {seeds} seeds, network width {width}"))
    out = Path(args.out)
    tables = []
    for fig in args.figures:
        _, table = run_figure(fig, horizon=horizon, seeds=list(range(seeds)), nn_width=width,
                              quick=args.quick, out=out, device=args.device, algos=args.algos,
                              progress=not args.no_progress)
        print(table + "\n", flush=True)
        tables.append(table)
    note = f"*{QUICK_NOTE}.*\n\n" if args.quick else ""
    (out / "tables.md").write_text(note + "\n\n".join(tables) + "\n")
    return 0
