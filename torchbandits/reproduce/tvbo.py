"""A benchmark for Zhou & Shroff (2021), "No-Regret Algorithms for Time-Varying Bayesian
Optimization": ``torchbandits reproduce tvbo``.

The paper has no experiments; this runs a benchmark of our own that fits its model exactly —
time-varying RKHS functions with an exactly known variation budget ``P_T`` (their Section 2) —
and reports the **dynamic regret** ``Σ_t max_x f_t(x) − f_t(x_t)`` of their Section 2.

* **Environments** (:mod:`torchbandits.envs.time_varying`, d = 1, 200-point grid, SE kernel
  ℓ = 0.1, B = 1, R = 0.1): rotation with ``P_T ∈ --budgets`` (default 1, 5, 20), moving bump
  (``P_T = 20``), abrupt switches (4 switches, independent segments, realised ``P_T`` ≈ 4–6),
  stationary control (``P_T = 0``).
* **Policies** (all λ = ``--lam`` = 1, widths on the **GP** sd): R-GP-UCB and SW-GP-UCB with the
  paper's widths (Lemma 1: ``B + (R/√λ)sqrt(2γ_{t−t0} + 2ln(1/δ))``; Lemma 2:
  ``B + (R/√λ)sqrt(2γ_{min(t,w)} + 2ln(T/δ))``; δ = 0.01; γ from greedy max-variance on the arms,
  ÷(1 − 1/e)) and the known-``P_T`` rule ``H = w = c·γ_T^{1/4}(T/P_T)^{1/2}`` with ``c = --c``
  (default 4; the paper fixes no constant — the sweep below shows where c = 1 lies);
  TV-GP-UCB and W-GP-UCB with the same memory (``√(1−ε) = 1 − 1/w``, discount ``1 − 1/w``) and
  SW-GP-UCB's full-window width as a constant (W-GP-UCB keeps the ≤ 300 newest points of
  weight ≥ 0.01, since it refactorises every round); stationary GP-UCB (R-GP-UCB with H = ∞, Lemma 1
  width); Random. ``--beta X`` replaces every width by the constant X.
* **Sweep** (``sweep.png``): R-GP-UCB and SW-GP-UCB with
  ``H = w ∈ {T^{1/4}, T^{1/3}, T^{1/2}, T^{2/3}, T}`` on the rotation with the largest budget,
  the tuned values for c = 1 and c = ``--c`` marked.

Writes per-run JSON under ``runs/``, ``table.md`` (final regret mean ± std over seeds and agent
time), ``tvbo_table.md`` (+ ``P_T`` declared and realised, ``γ_T``, H/w, R(T)/T), ``regret.png``,
``time.png``, ``regret_vs_budget.png``, ``sweep.png`` and ``summary.json``; prints the tables.

    torchbandits reproduce tvbo            # T = 2000, 5 seeds (tens of minutes on one core)
    torchbandits reproduce tvbo --quick    # seconds (used by the tests)
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..envs.time_varying import (
    MovingBumpEnv,
    RotatingRKHSEnv,
    StationaryRKHSEnv,
    SwitchingRKHSEnv,
    TimeVaryingRKHSEnv,
)
from ..experiments.batch import run_grid_batched
from ..experiments.figures import figure_grid, mark_times, save_figure, setting_title
from ..experiments.report import write_report
from ..experiments.results import RunResult
from ..presets import zhou2021 as F
from ..presets.baselines import random as random_policy
from .common import QUICK_NOTE, quick_banner, reproduction_parser, start

__all__ = ["build_envs", "build_policies", "main"]

POLICY_ORDER = ["R-GP-UCB", "R-GP-UCB (P_T unknown)", "SW-GP-UCB", "TV-GP-UCB", "W-GP-UCB", "GP-UCB",
                "Random"]


def build_envs(horizon: int, budgets: Sequence[float], *, n_arms: int = 200, lengthscale: float = 0.1,
               noise_std: float = 0.1, device: str = "cpu", extra: bool = True
               ) -> dict[str, Callable[[], TimeVaryingRKHSEnv]]:
    """Environment factories of the benchmark (names carry the budget)."""
    kw: dict[str, Any] = dict(horizon=horizon, n_arms=n_arms, lengthscale=lengthscale,
                              noise_std=noise_std, device=device)
    envs: dict[str, Callable[[], TimeVaryingRKHSEnv]] = {}
    for p in budgets:
        envs[f"rotation-P{p:g}"] = lambda p=p: RotatingRKHSEnv(budget=float(p), **kw)
    if extra:
        envs["bump-P20"] = lambda: MovingBumpEnv(budget=20.0, **kw)
        envs["switch-S4"] = lambda: SwitchingRKHSEnv(n_switches=4, budget=None, **kw)
        envs["stationary-P0"] = lambda: StationaryRKHSEnv(**kw)
    return envs


def build_policies(*, lam: float = 1.0, c: float = 4.0, beta: float | None = None,
                   device: str = "cpu", w_max_points: int | None = 300
                   ) -> dict[str, Callable[[Any], Any]]:
    """Policy factories ``f(env)`` of the six methods, plus R-GP-UCB with the unknown-``P_T`` rule
    ``H = c·γ_T^{1/4}T^{1/2}`` (W-GP-UCB keeps at most ``w_max_points``
    points of weight ≥ 0.01: its per-round cost is a refactorisation, O(n³ + n²A))."""
    kw = dict(device=device)
    return {
        "R-GP-UCB": lambda env: F.rgpucb(env, "known", lam, beta, c=c, **kw),
        "R-GP-UCB (P_T unknown)": lambda env: F.rgpucb(env, "unknown", lam, beta, c=c, **kw),
        "SW-GP-UCB": lambda env: F.swgpucb(env, "known", lam, beta, c=c, **kw),
        "TV-GP-UCB": lambda env: F.tvgpucb(env, None, lam, beta, c=c, **kw),
        "W-GP-UCB": lambda env: F.wgpucb(env, None, lam, beta, c=c, max_points=w_max_points, **kw),
        "GP-UCB": lambda env: F.gpucb_static(env, lam, beta, **kw),
        "Random": lambda env: random_policy(env, **kw),
    }


def _env_info(make_env: Callable[[], TimeVaryingRKHSEnv], seeds: Sequence[int], lam: float,
              c: float) -> dict[str, Any]:
    env = make_env()
    declared, realised = [], []
    for s in seeds:
        env.reset(s)
        declared.append(env.budget)
        realised.append(env.realised_budget())
    T = env.horizon
    gamma = F.env_gamma(env, lam)
    return {"P_T_declared": float(np.mean(declared)), "P_T_realised": float(np.mean(realised)),
            "P_T_max_abs_diff": float(np.max(np.abs(np.array(declared) - np.array(realised)))),
            "gamma_T": gamma(T), "H_known_c": F.forgetting_length(env, "known", lam, c=c),
            "H_known_c1": F.forgetting_length(env, "known", lam, c=1.0),
            "H_unknown_c": F.forgetting_length(env, "unknown", lam, c=c)}


def _tvbo_table(results: Sequence[RunResult], info: dict[str, dict[str, Any]]) -> str:
    lines = ["| env | P_T (declared / realised) | γ_T | H = w | policy | R(T) mean ± std | R(T)/T | "
             "agent s |", "|---|---|---:|---:|---|---:|---:|---:|"]
    by: dict[tuple[str, str], list[RunResult]] = {}
    for r in results:
        by.setdefault((r.env, r.policy), []).append(r)
    for env in info:
        i = info[env]
        for pol in POLICY_ORDER:
            runs = by.get((env, pol))
            if not runs:
                continue
            fin = np.array([r.final_regret for r in runs])
            T = runs[0].horizon
            secs = np.mean([r.total_agent_seconds for r in runs])
            length = i["H_unknown_c"] if "unknown" in pol else i["H_known_c"]
            lines.append(
                f"| {env} | {i['P_T_declared']:.4g} / {i['P_T_realised']:.4g} | {i['gamma_T']:.1f} | "
                f"{length} | {pol} | {fin.mean():.1f} ± {fin.std():.1f} | "
                f"{fin.mean() / T:.3f} | {secs:.2f} |")
    return "\n".join(lines)


def _plot_vs_budget(results: Sequence[RunResult], info: dict[str, dict[str, Any]], path: Path,
                    title: str) -> None:
    fig, ax = figure_grid(figsize=(6.4, 5.4))
    rot = [e for e in info if e.startswith("rotation")]
    budgets = [info[e]["P_T_declared"] for e in rot]
    for pol in POLICY_ORDER:
        means, stds = [], []
        for e in rot:
            fin = [r.final_regret / r.horizon for r in results if r.env == e and r.policy == pol]
            means.append(np.mean(fin) if fin else np.nan)
            stds.append(np.std(fin) if fin else np.nan)
        ax.errorbar(budgets, means, yerr=stds, marker="o", capsize=3, label=pol)
    ax.set_xscale("log")
    ax.set_xlabel("variation budget P_T of the rotation (RKHS norm units, log scale)")
    ax.set_ylabel("dynamic regret per round R(T)/T (reward units)")
    ax.set_title("rotating RKHS function: regret vs budget")
    seeds = max((len({r.seed for r in results if r.env == e}) for e in info), default=1)
    save_figure(fig, path, title=title, band=f"error bars: ± 1 std over {seeds} seeds"
                if seeds > 1 else None, ncol=3)


def _sweep(make_env: Callable[[], TimeVaryingRKHSEnv], seeds: Sequence[int], horizon: int,
           lam: float, c: float, beta: float | None, out: Path, device: str, title: str,
           progress: bool = True) -> dict[str, Any]:
    T = horizon
    lengths = sorted({max(1, round(T**a)) for a in (0.25, 1 / 3, 0.5, 2 / 3)} | {T})
    env = make_env()
    marks = {"c=1": F.forgetting_length(env, "known", lam, c=1.0),
             f"c={c:g}": F.forgetting_length(env, "known", lam, c=c)}
    policies = {}
    for h in lengths:
        policies[f"R-GP-UCB H={h}"] = lambda e, h=h: F.rgpucb(e, h, lam, beta, device=device)
        policies[f"SW-GP-UCB w={h}"] = lambda e, h=h: F.swgpucb(e, h, lam, beta, device=device)
    res = run_grid_batched(policies, {"sweep": make_env}, seeds, T, out=out / "sweep_runs",
                           diagnostics_every=0, progress=progress,
                           config={"lam": lam, "beta": beta, "env": repr(env)})
    table = {}
    fig, ax = figure_grid(figsize=(6.4, 5.4))
    for kind in ("R-GP-UCB H", "SW-GP-UCB w"):
        ys, es = [], []
        for h in lengths:
            fin = [r.final_regret for r in res if r.policy == f"{kind}={h}"]
            ys.append(float(np.mean(fin)))
            es.append(float(np.std(fin)))
            table[f"{kind}={h}"] = (ys[-1], es[-1])
        ax.errorbar(lengths, ys, yerr=es, marker="o", capsize=3, label=kind.split()[0])
    for name, h in marks.items():
        mark_times(ax, [h], f"tuned H = w for {name} ({h})",
                   color="grey" if name == "c=1" else "black")
    ax.set_xscale("log")
    ax.set_xlabel("restart period H / window w (rounds, log scale)")
    ax.set_ylabel(f"dynamic regret R({T}) (reward units)")
    ax.set_title("R-GP-UCB and SW-GP-UCB: regret vs H / w")
    save_figure(fig, out / "sweep.png", title=title, ncol=2,
                band=f"error bars: ± 1 std over {len(seeds)} seeds" if len(seeds) > 1 else None)
    return {"lengths": lengths, "marks": marks, "final_regret": table}


def _rate(horizons: Sequence[int], budget: float, seeds: Sequence[int], lam: float, c: float,
          beta: float | None, out: Path, device: str, n_arms: int = 200, quick: bool = False,
          progress: bool = True) -> dict[str, Any]:
    """R(T) vs T at a fixed P_T under the tuned H / w; the log–log slope should stay below the
    rate of Zhou & Shroff (2021), Theorems 1–2 (≲ 0.75 for the SE kernel)."""
    finals: dict[str, list[float]] = {"R-GP-UCB": [], "SW-GP-UCB": []}
    for T in horizons:
        pols = {"R-GP-UCB": lambda e: F.rgpucb(e, "known", lam, beta, c=c, device=device),
                "SW-GP-UCB": lambda e: F.swgpucb(e, "known", lam, beta, c=c, device=device)}
        env = {f"rate-T{T}": lambda T=T: RotatingRKHSEnv(horizon=T, budget=budget, n_arms=n_arms,
                                                          device=device)}
        res = run_grid_batched(pols, env, seeds, T, out=out / "rate_runs", diagnostics_every=0,
                               progress=progress, config={"lam": lam, "c": c, "beta": beta,
                                                          "budget": budget, "n_arms": n_arms})
        for name in finals:
            finals[name].append(float(np.mean([r.final_regret for r in res if r.policy == name])))
    logt = np.log(np.asarray(horizons, dtype=float))
    slopes = {k: float(np.polyfit(logt, np.log(v), 1)[0]) for k, v in finals.items()}
    fig, ax = figure_grid(figsize=(6.0, 5.0))
    for k, v in finals.items():
        ax.loglog(horizons, v, marker="o", label=f"{k} (log-log slope {slopes[k]:.2f})")
    ax.set_xlabel("horizon T (rounds, log scale)")
    ax.set_ylabel(f"dynamic regret R(T) (reward units), P_T = {budget:g}")
    ax.set_title("regret growth with the tuned H / w (mean over seeds)")
    save_figure(fig, out / "rate.png", ncol=1, title=setting_title(
        "Rate check", env=f"rotating RKHS function (P_T = {budget:g})", d=1,
        seeds=len(seeds), extra=f"{n_arms} arms, T ∈ {list(horizons)}", quick=quick))
    return {"horizons": list(horizons), "budget": budget, "final_regret": finals, "slopes": slopes}


def main(argv: Sequence[str] | None = None) -> int:
    """``torchbandits reproduce tvbo [options]`` (see the module docstring); returns the exit code."""
    parser = reproduction_parser("tvbo", __doc__, quick="T = 120, seed 0, budgets 2 and 10, "
                                 "60 arms, rate check at T = 40 and 80", out="results/tvbo",
                                 threads=1)
    parser.add_argument("--horizon", type=int, default=None, help="T (default 2000; quick 120)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0..4; quick 0")
    parser.add_argument("--budgets", type=float, nargs="+", default=None,
                        help="rotation budgets P_T (default 1 5 20)")
    parser.add_argument("--lam", type=float, default=1.0, help="λ of every policy (default 1)")
    parser.add_argument("--c", type=float, default=4.0, help="constant of the H/w rule (default 4)")
    parser.add_argument("--beta", type=float, default=None,
                        help="constant width for every policy (default: the theory widths)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the H/w sweep")
    parser.add_argument("--no-rate", action="store_true", help="skip the R(T)-vs-T rate check")
    args = parser.parse_args(list(argv) if argv is not None else None)
    start(args)
    T = args.horizon or (120 if args.quick else 2000)
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2, 3, 4])
    budgets = args.budgets or ([2.0, 10.0] if args.quick else [1.0, 5.0, 20.0])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n_arms = 60 if args.quick else 200
    progress = not args.no_progress
    if args.quick:
        print(quick_banner(f"T = {T}, seeds {seeds}, budgets {budgets}, {n_arms} arms"))
    envs = build_envs(T, budgets, n_arms=60 if args.quick else 200, device=args.device,
                      extra=True)
    policies = build_policies(lam=args.lam, c=args.c, beta=args.beta, device=args.device)
    info = {name: _env_info(make, seeds, args.lam, args.c) for name, make in envs.items()}
    config = {"lam": args.lam, "c": args.c, "beta": args.beta, "budgets": budgets,
              "quick": args.quick}
    results = run_grid_batched(policies, envs, seeds, T, out=out, config=config,
                               diagnostics_every=max(T // 100, 1), progress=progress,
                               batch=args.batch)
    where = f"d = 1, {n_arms} arms, λ = {args.lam:g}, c = {args.c:g}"
    table = write_report(results, out, title=setting_title(
        "Time-varying kernel bandits (Zhou & Shroff 2021)", extra=where, quick=args.quick))
    tv_table = _tvbo_table(results, info)
    (out / "tvbo_table.md").write_text(
        f"# Dynamic regret, T = {T}, seeds {seeds}, λ = {args.lam}, c = {args.c:g}, "
        f"β = {'theory' if args.beta is None else args.beta}\n\n"
        + (f"*{QUICK_NOTE}.*\n\n" if args.quick else "") + f"{tv_table}\n")
    _plot_vs_budget(results, info, out / "regret_vs_budget.png", setting_title(
        "Dynamic regret vs variation budget", env="rotating RKHS function", d=1, T=T,
        seeds=len(seeds), extra=where, quick=args.quick))
    sweep = None
    if not args.no_sweep:
        big = max(budgets)
        sweep = _sweep(lambda: RotatingRKHSEnv(horizon=T, budget=big, n_arms=n_arms,
                                               device=args.device),
                       seeds[:3], T, args.lam, args.c, args.beta, out, args.device,
                       setting_title("Sweep of H and w", env=f"rotating RKHS function (P_T = {big:g})",
                                     d=1, T=T, seeds=len(seeds[:3]), extra=where, quick=args.quick),
                       progress)
    rate = None
    if not args.no_rate:
        horizons = [40, 80] if args.quick else [250, 500, 1000, 2000]
        rate = _rate(horizons, 5.0, seeds[:3], args.lam, args.c, args.beta, out, args.device,
                     n_arms=n_arms, quick=args.quick, progress=progress)
    (out / "tvbo_summary.json").write_text(json.dumps({"env_info": info, "sweep": sweep, "rate": rate,
                                                       "config": config}, indent=2))
    print(table)
    print()
    print(tv_table)
    if sweep is not None:
        print(f"\nsweep (rotation, P_T = {max(budgets):g}): final regret by H / w")
        for k, (m, s) in sweep["final_regret"].items():
            print(f"  {k:>22}: {m:8.1f} ± {s:.1f}")
        print("  tuned H = w: " + ", ".join(f"{k}: {v}" for k, v in sweep["marks"].items()))
    if rate is not None:
        print(f"\nrate check (rotation, P_T = 5, tuned H/w): R(T) at T = {rate['horizons']}: "
              + "; ".join(f"{k}: {[round(x, 1) for x in v]} (log-log slope {rate['slopes'][k]:.2f})"
                          for k, v in rate["final_regret"].items()))
    print(f"\nwrote runs, table.md, tvbo_table.md, regret.png, time.png, regret_vs_budget.png"
          f"{', sweep.png' if sweep else ''} to {out}/")
    if not all(math.isfinite(r.final_regret) for r in results):
        return 1
    return 0
