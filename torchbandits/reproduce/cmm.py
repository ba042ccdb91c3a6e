"""Reproduce Flynn & Reeb (2024), "Tighter confidence bounds for sequential kernel regression",
arXiv 2403.12732: Table 1, Figures 1, 2, 4, 5/6 and 7 (their Section 7 and Appendix F).

Parts (``--parts``, default all):

* ``table1`` — d = 3, RBF / Matérn-5/2 / Matérn-3/2 × ℓ ∈ {0.5, 0.2}, T = 1000, DMM, AMM, AY, IGP,
  Random over T rounds and CMM (1-D dual) over ``--cmm-horizon`` rounds; the table puts the
  paper's numbers beside ours; Figure 2 (regret curves) comes from the same runs.
* ``fig1`` — confidence bands of the five bounds, 1-D Matérn-3/2 (the authors' Figure-1 settings).
* ``fig4`` — agent time per step vs t, Matérn-5/2 ℓ = 0.5, d = 3, every method, CMM both ways
  (dual and the CVXPY SOCP, the latter over ``--socp-horizon`` rounds).
* ``fig56`` — the Table-1 grid at d = 2 and d = 4 (Figures 5 and 6).
* ``fig7`` — loose σ and B: (σ, B) ∈ {0.1, 0.2} × {10, 20} given to each algorithm.

Environment: :class:`~torchbandits.envs.rkhs.RKHSFunctionEnv` (Section 7, "Experimental Setup");
one seed per repetition gives every algorithm the same ``f*``, arm sets and noise. Every β
multiplies the GP posterior sd; ``c = default_c(kernel, d, T)``; IGP: η = 2/T with the constant 2.
Writes ``--out`` (default ``results/cmm/``): raw JSON per run, ``table1.md``, ``*.png``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure

from ..confidence import AMMBound, AYBeta, CMMBound, DMMBound, IGPBeta, default_c
from ..envs.rkhs import RKHSFunctionEnv
from ..experiments.batch import BatchMode, Job, run_jobs_batched
from ..experiments.figures import (
    CUM_REGRET,
    ROUND,
    band_label,
    figure_grid,
    plot_band,
    save_figure,
    setting_title,
)
from ..experiments.report import markdown_table, plot_time
from ..experiments.results import RunResult, summarize
from ..kernels import kernel_matrix, make_kernel
from ..models import ExactKernelRidge
from ..policies import AMMUCB, AYGPUCB, CMMUCB, DMMUCB, IGPUCB, Policy, RandomPolicy
from .common import QUICK_NOTE, quick_banner, reproduction_parser, start

__all__ = ["PAPER_TABLE1", "figure1_data", "main", "make_policies", "plot_figure1"]

METHODS = ("CMM", "DMM", "AMM", "AY", "IGP", "Random")
KERNELS = (("rbf", "RBF"), ("matern52", "Matérn-5/2"), ("matern32", "Matérn-3/2"))
LENGTHSCALES = (0.5, 0.2)

# Table 1 of the paper: cumulative regret at T = 1000 (mean, std over 10 reps), columns in the
# order RBF 0.5, RBF 0.2, M5/2 0.5, M5/2 0.2, M3/2 0.5, M3/2 0.2.
PAPER_TABLE1: dict[str, list[tuple[float, float]]] = {
    "DMM": [(32.2, 20.9), (491.4, 117.1), (129.5, 45.6), (795.1, 206.0), (195.6, 78.0), (814.1, 344.4)],
    "AMM": [(88.8, 6.1), (1206.2, 20.8), (197.0, 24.4), (1661.5, 90.1), (316.1, 51.1), (1741.2, 351.2)],
    "AY": [(136.9, 12.7), (1518.4, 38.9), (331.7, 45.2), (2382.4, 135.4), (546.0, 70.0), (2421.3, 568.5)],
    "IGP": [(314.1, 110.5), (1433.0, 122.8), (553.3, 67.5), (1853.1, 105.7), (655.6, 67.4),
            (1707.5, 375.5)],
    "Random": [(4282.4, 1015.4), (3872.4, 783.7), (4264.7, 778.0), (3677.5, 559.2), (4175.1, 681.0),
               (3442.0, 1080.4)],
}


def make_policies(kernel: str, lengthscale: float, d: int, horizon: int, *, noise_std: float = 0.1,
                  norm_bound: float = 10.0, delta: float = 0.01, device: str = "cpu",
                  methods: Sequence[str] = METHODS) -> dict[str, Callable[[], Policy]]:
    """Factories of the policies with the constants of Flynn & Reeb (2024), Section 7.

    ``noise_std``/``norm_bound`` are the values *given to the algorithms* (Fig. 7 loosens them);
    ``c = default_c(kernel, d, horizon)`` is unchanged by a loose σ, so ``α₀ = σ²/c`` moves.
    """
    c = default_c(kernel, d, horizon)
    kw = dict(noise_std=noise_std, norm_bound=norm_bound, delta=delta, device=device)

    def k():
        return make_kernel(kernel, lengthscale)

    table: dict[str, Callable[[], Policy]] = {
        "CMM": lambda: CMMUCB(k(), c=c, **kw),
        "CMM-SOCP": lambda: CMMUCB(k(), c=c, method="socp", **kw),
        "DMM": lambda: DMMUCB(k(), c=c, **kw),
        "AMM": lambda: AMMUCB(k(), c=c, **kw),
        "AY": lambda: AYGPUCB(k(), c=c, **kw),
        "IGP": lambda: IGPUCB(k(), eta=2.0 / horizon, **kw),
        "Random": lambda: RandomPolicy(device=device),
    }
    return {m: table[m] for m in methods}


def _run(out: Path, env_name: str, make_env: Callable[[], RKHSFunctionEnv],
         policies: dict[str, Callable[[], Policy]], horizons: dict[str, int], seeds: Sequence[int],
         desc: str, progress: bool = True, extra: dict[str, Any] | None = None,
         batch: BatchMode = "auto") -> list[RunResult]:
    """Every seed × policy through the runner (``batch``: the ``--batch`` mode), one JSON per run
    under ``out/runs/``, finished runs read back; a seed gives every policy the same f*, arms, noise."""
    jobs = [Job(env_name, name, seed, horizons[name], make_env, lambda env, f=factory: f(), extra)
            for seed in seeds for name, factory in policies.items()]
    return run_jobs_batched(jobs, batch=batch, out=out, progress=progress, diagnostics_every=0, desc=desc)


def _env(kernel: str, d: int, ls: float, args: argparse.Namespace) -> Callable[[], RKHSFunctionEnv]:
    return lambda: RKHSFunctionEnv(kernel, d, ls, n_arms=args.arms, device=args.device)


def _fmt(m: float, s: float) -> str:
    return f"{m:.1f} ± {s:.1f}"


def _grid(args: argparse.Namespace, out: Path, d: int, title: str) -> tuple[list[RunResult], list[str]]:
    results, columns = [], []
    for ls in LENGTHSCALES:
        for kname, label in KERNELS:
            pols = make_policies(kname, ls, d, args.horizon, device=args.device, methods=args.methods)
            horizons = {m: (args.cmm_horizon if m == "CMM" else args.horizon) for m in pols}
            env_name = f"d{d}_{kname}_l{ls}"
            columns.append(env_name)
            results += _run(out, env_name, _env(kname, d, ls, args), pols, horizons, args.seeds,
                            f"{title} {label} ℓ={ls}", not args.no_progress, batch=args.batch)
    return results, columns


def _table(results: list[RunResult], d: int, with_paper: bool) -> str:
    """Markdown table: rows = methods, columns = kernel × ℓ; final cumulative regret mean ± std
    (population std over seeds), the paper's value beside it (``with_paper``: full-size runs
    only), then the regret of CMM, DMM and AMM at t = min(200, T) (CMM's horizon in the paper)."""
    order = [(k, lab, ls) for k, lab in KERNELS for ls in LENGTHSCALES]  # paper's column order
    head = "| algorithm | " + " | ".join(f"{lab} ℓ={ls}" for _, lab, ls in order) + " |"
    lines = [head, "|---|" + "---:|" * len(order)]
    for m in METHODS:
        cells = []
        for j, (k, _, ls) in enumerate(order):
            runs = [r for r in results if r.policy == m and r.env == f"d{d}_{k}_l{ls}"]
            if not runs:
                cells.append("—")
                continue
            fin = np.array([r.final_regret for r in runs])
            cell = _fmt(float(fin.mean()), float(fin.std()))
            if m == "CMM":
                cell += f" (T={runs[0].horizon})"
            if with_paper and m in PAPER_TABLE1:
                pm, ps = PAPER_TABLE1[m][j]
                cell += f" [paper {_fmt(pm, ps)}]"
            cells.append(cell)
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    runs200 = [r for r in results if r.policy in ("CMM", "DMM")]
    if runs200:
        t_eval = min(200, min(r.horizon for r in runs200))
        lines += ["", f"Cumulative regret at t = {t_eval} (the paper runs CMM for 200 rounds):", "",
                  head, "|---|" + "---:|" * len(order)]
        for m in ("CMM", "DMM", "AMM"):
            cells = []
            for k, _, ls in order:
                runs = [r for r in results if r.policy == m and r.env == f"d{d}_{k}_l{ls}"]
                vals = np.array([r.cumulative_regret[t_eval - 1] for r in runs])
                cells.append(_fmt(float(vals.mean()), float(vals.std())) if runs else "—")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _setting(args: argparse.Namespace, what: str, d: int | None, seeds: int, cmm: bool = True) -> str:
    extra = f"{args.arms} fresh arms per round, ‖f*‖ = 10, σ = 0.1"
    if cmm and args.cmm_horizon != args.horizon:
        extra += f", CMM to T = {args.cmm_horizon}"
    return setting_title(what, env="RKHS function", d=d, T=args.horizon, seeds=seeds, extra=extra,
                         quick=args.quick)


def _plot_grid(results: list[RunResult], d: int, path: Path, title: str) -> Path:
    """Figure 2 layout: rows ℓ = 0.5 / 0.2, columns RBF, Matérn-5/2, Matérn-3/2."""

    fig, axes = figure_grid(2, 3, figsize=(15, 8.6), squeeze=False)
    seeds = 1
    for i, ls in enumerate(LENGTHSCALES):
        for j, (k, lab) in enumerate(KERNELS):
            ax = axes[i, j]
            for m in METHODS:
                runs = [r for r in results if r.policy == m and r.env == f"d{d}_{k}_l{ls}"]
                if runs:
                    seeds = max(seeds, len(runs))
                    plot_band(ax, np.stack([r.cumulative_regret for r in runs]), label=m)
            ax.set_title(f"{lab}, ℓ = {ls}")
            ax.set_xlabel(ROUND)
            ax.set_ylabel(CUM_REGRET)
    return save_figure(fig, path, title=title, band=band_label(seeds), ncol=7)


def figure1_data(seed: int = 0, n_obs: int = 50, n_grid: int = 101, device: str = "cpu") -> dict[str, Any]:
    """Bands of CMM, DMM, AMM, AY and IGP on the 1-D setup of Flynn & Reeb (2024), Figure 1.

    Matérn-3/2, ℓ = 0.5 on [−1, 1]; f* from 20 inducing points in [−1, 1] scaled to ‖f*‖ = B = 10;
    σ = 0.1, δ = 0.01; n/2 observations uniform in [−0.8, −0.2] and n/2 in [0.2, 0.8];
    ``c = n^{−1/5}``; IGP η = 2/n. Returns the grid, f*, data and each method's (UCB, LCB).
    """
    sigma, b, delta = 0.1, 10.0, 0.01
    g = torch.Generator().manual_seed(seed)
    kernel = make_kernel("matern32", 0.5)
    z = torch.rand(20, 1, generator=g, dtype=torch.float64) * 2 - 1
    w = torch.randn(20, generator=g, dtype=torch.float64)
    kzz = kernel_matrix(kernel, z, z)
    coef = w * (b / torch.sqrt(w @ kzz @ w))

    def f(x: torch.Tensor) -> torch.Tensor:
        return kernel_matrix(kernel, x, z) @ coef

    half = n_obs // 2
    x = torch.cat([torch.rand(half, 1, generator=g, dtype=torch.float64) * 0.6 - 0.8,
                   torch.rand(n_obs - half, 1, generator=g, dtype=torch.float64) * 0.6 + 0.2])
    y = f(x) + sigma * torch.randn(n_obs, generator=g, dtype=torch.float64)
    grid = torch.linspace(-1, 1, n_grid, dtype=torch.float64)[:, None]
    c = default_c("matern32", 1, n_obs)
    a0 = sigma**2 / c
    eta = 2.0 / n_obs
    model = ExactKernelRidge(kernel, a0, [1.0 + eta], device=device)
    model.extend(x.to(device), y.to(device))
    gq = grid.to(device)
    rules = {"CMM": CMMBound(sigma, b, delta, c), "DMM": DMMBound(sigma, b, delta, c),
             "AMM": AMMBound(sigma, b, delta, c), "AY": AYBeta(b, sigma, lam=a0, delta=delta),
             "IGP": IGPBeta(b, sigma, delta=delta, eta=eta)}
    bands = {name: tuple(v.cpu() for v in rule.bounds(model, gq, n_obs + 1)) for name, rule in rules.items()}
    fstar = f(grid)
    excess = {name: float((u - fstar).mean()) for name, (u, _) in bands.items()}
    return {"grid": grid[:, 0], "f": fstar, "x": x[:, 0], "y": y, "bands": bands, "excess": excess,
            "c": c}


def plot_figure1(data: dict[str, Any], path: str | Path | None = None, *,
                 title: str | None = None) -> Figure:
    """Five panels (CMM, DMM, AMM, AY, IGP): f*, data and the band [LCB, UCB] of each bound.
    Returns the (detached) Figure; with ``path`` it is also saved there (PNG)."""
    names = list(data["bands"])
    fig, axes = figure_grid(1, len(names), figsize=(3.6 * len(names), 3.9), sharey=True)
    for ax, name in zip(axes, names):
        u, lcb = data["bands"][name]
        ax.fill_between(data["grid"], lcb, u, alpha=0.3, color="tab:blue",
                        label="confidence band [LCB, UCB] of the panel's bound")
        ax.plot(data["grid"], data["f"], "k-", lw=1, label="f*")
        ax.plot(data["x"], data["y"], "r.", ms=3, label="observations")
        ax.set_title(f"{name} (mean UCB − f* = {data['excess'][name]:.2f})", fontsize=9)
        ax.set_xlabel("x (1-D input)")
        ax.set_ylabel("f(x) (reward units)")
    n = len(data["x"])
    title = title or (f"Figure 1: confidence bands — Matérn-3/2 ℓ = 0.5, d = 1, {n} observations, "
                      f"σ = 0.1, B = 10, δ = 0.01, c = {data['c']:.3g}")
    if path is None:
        fig.suptitle(title, fontsize=10)
        return fig
    save_figure(fig, path, title=title)
    return fig


def _parser() -> argparse.ArgumentParser:
    p = reproduction_parser("cmm", __doc__, quick="T = 25 (CMM too), 20 arms, first 2 seeds, "
                            "SOCP to T = 4: seconds, for tests", out="results/cmm", threads=1)
    p.add_argument("--parts", default="table1,fig1,fig4,fig56,fig7",
                   help="comma-separated subset of table1,fig1,fig4,fig56,fig7")
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    p.add_argument("--seeds-extra", type=int, nargs="+", default=None,
                   help="seeds of fig56/fig7 (default: --seeds)")
    p.add_argument("--horizon", type=int, default=1000)
    p.add_argument("--cmm-horizon", type=int, default=1000,
                   help="rounds of CMM-UCB (the paper: 200; the dual makes 1000 affordable)")
    p.add_argument("--socp-horizon", type=int, default=100, help="rounds of CMM by CVXPY in fig4")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS),
                   help="methods of the table1/fig56 grids")
    p.add_argument("--arms", type=int, default=100)
    return p


def _ms_table(res: list[RunResult]) -> tuple[list[dict[str, Any]], str]:
    """Figure 4's numbers: agent ms/step, median of the 5 steps before each t ≤ T."""
    ts = [t for t in (50, 100, 200, 1000) if any(t <= r.horizon for r in res)] or \
        [max(r.horizon for r in res)]
    rows, lines = [], ["| method | " + " | ".join(f"t = {t}" for t in ts) + " |",
                       "|---|" + "---:|" * len(ts)]
    for r in res:
        s = np.asarray(r.agent_seconds)
        vals = {t: float(np.median(s[max(0, t - 5):t]) * 1e3) for t in ts if t <= len(s)}
        rows.append({"method": r.policy, **{f"t={t}": v for t, v in vals.items()}})
        lines.append(f"| {r.policy} | " + " | ".join(f"{vals[t]:.2f}" if t in vals else "—"
                                                    for t in ts) + " |")
    return rows, "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``torchbandits reproduce cmm [options]`` (see the module docstring); returns the exit code."""
    args = _parser().parse_args(list(argv) if argv is not None else None)
    if args.quick:
        args.horizon, args.cmm_horizon, args.socp_horizon, args.arms = 25, 25, 4, 20
        args.seeds = args.seeds[:2]
    start(args)
    extra = args.seeds_extra or args.seeds
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    unknown = parts - {"table1", "fig1", "fig4", "fig56", "fig7"}
    if unknown:
        raise SystemExit(f"unknown parts {sorted(unknown)}")
    summary: dict[str, Any] = {"args": vars(args)}
    quick_head = ""
    if args.quick:
        print(quick_banner(f"T = {args.horizon}, {args.arms} arms, seeds {args.seeds}"))
        quick_head = f"*{QUICK_NOTE}.*\n\n"
    progress = not args.no_progress

    if "fig1" in parts:
        data = figure1_data(n_obs=50, n_grid=41 if args.quick else 101, device=args.device)
        plot_figure1(data, out / "figure1_bands.png")
        summary["figure1_excess"] = data["excess"]
        print("Figure 1 (50 observations), mean excess of UCB over f*:",
              ", ".join(f"{k} {v:.2f}" for k, v in data["excess"].items()))

    if "table1" in parts:
        t0 = time.time()
        results, _ = _grid(args, out / "table1", 3, "Table 1")
        text = _table(results, 3, with_paper=not args.quick)
        paper = "" if args.quick else " [paper]"
        (out / "table1.md").write_text(
            f"# Table 1 (d = 3, T = {args.horizon}, seeds {args.seeds}): cumulative regret, "
            f"mean ± std (ours){paper}\n\n{quick_head}{text}\n")
        _plot_grid(results, 3, out / "figure2_regret.png",
                   _setting(args, "Figure 2: cumulative regret", 3, len(args.seeds)))
        (out / "table1_runs.md").write_text(quick_head + markdown_table(summarize(results)) + "\n")
        print(f"\nTable 1, d = 3, T = {args.horizon}, {len(args.seeds)} seeds "
              f"({time.time() - t0:.0f} s){' — quick run, no paper values beside it' if args.quick else ''}"
              f"\n{text}\n")

    if "fig4" in parts:
        pols = make_policies("matern52", 0.5, 3, args.horizon, device=args.device,
                             methods=("CMM", "CMM-SOCP", "DMM", "AMM", "AY", "IGP"))
        horizons = {m: (args.socp_horizon if m == "CMM-SOCP" else args.horizon) for m in pols}
        res = _run(out / "fig4", "d3_matern52_l0.5", _env("matern52", 3, 0.5, args), pols, horizons,
                   args.seeds[:1], "Figure 4", progress, batch=args.batch)
        plot_time(res, out / "figure4_time.png",
                  _setting(args, "Figure 4: agent time per round", 3, 1, cmm=False)
                  + f", CMM-SOCP to T = {args.socp_horizon}, Matérn-5/2 ℓ = 0.5")
        rows, text = _ms_table(res)
        summary["figure4_ms_per_step"] = rows
        print(f"\nFigure 4 (Matérn-5/2 ℓ = 0.5, d = 3, T = {args.horizon}, seed {args.seeds[0]}), "
              f"agent ms per step (median of the 5 steps before t):\n{text}")

    if "fig56" in parts:
        for d in (2, 4):
            sub = argparse.Namespace(**{**vars(args), "seeds": extra})
            res, _ = _grid(sub, out / f"fig_d{d}", d, f"d={d}")
            text = _table(res, d, with_paper=False)
            (out / f"table_d{d}.md").write_text(
                f"# d = {d}, T = {args.horizon}, seeds {extra}\n\n{quick_head}{text}\n")
            num = 5 if d == 2 else 6
            _plot_grid(res, d, out / f"figure{num}_regret_d{d}.png",
                       _setting(args, f"Figure {num}: cumulative regret", d, len(extra)))
            print(f"\nd = {d}, T = {args.horizon}, {len(extra)} seeds\n{text}\n")

    if "fig7" in parts:
        res = []
        for s_used in (0.1, 0.2):
            for b_used in (10.0, 20.0):
                pols = make_policies("matern52", 0.5, 3, args.horizon, noise_std=s_used, norm_bound=b_used,
                                     device=args.device, methods=("CMM", "DMM", "AMM", "AY", "IGP"))
                pols = {f"{m} σ={s_used} B={b_used:g}": f for m, f in pols.items()}
                horizons = {m: (args.cmm_horizon if m.startswith("CMM") else args.horizon) for m in pols}
                res += _run(out / "fig7", "d3_matern52_l0.5", _env("matern52", 3, 0.5, args), pols,
                            horizons, extra, f"Figure 7 σ={s_used} B={b_used:g}", progress, batch=args.batch)
        rows = summarize(res)
        (out / "figure7_table.md").write_text(quick_head + markdown_table(rows) + "\n")
        _plot_loose(res, out / "figure7_loose.png",
                    _setting(args, "Figure 7: loose σ and B given to the algorithms (true σ = 0.1, "
                             "B = 10), Matérn-5/2 ℓ = 0.5", 3, len(extra)))
        print(f"\nFigure 7 (loose σ, B; d = 3, T = {args.horizon}, {len(extra)} seeds)\n"
              + markdown_table(rows))

    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"\nwrote {out}/" + (" (quick run)" if args.quick else ""))
    return 0


def _plot_loose(results: list[RunResult], path: Path, title: str) -> Path:
    methods = ("CMM", "DMM", "AMM", "AY", "IGP")
    fig, axes = figure_grid(1, len(methods), figsize=(4 * len(methods), 4.2), squeeze=False)
    seeds = 1
    for ax, m in zip(axes[0], methods):
        for cfg in sorted({r.policy for r in results if r.policy.split(" ")[0] == m}):
            runs = [r for r in results if r.policy == cfg]
            seeds = max(seeds, len(runs))
            plot_band(ax, np.stack([r.cumulative_regret for r in runs]), label=cfg.split(" ", 1)[1])
        ax.set_title(m)
        ax.set_xlabel(ROUND)
        ax.set_ylabel(CUM_REGRET)
    return save_figure(fig, path, title=title, band=band_label(seeds), ncol=5)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
