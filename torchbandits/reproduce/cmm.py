"""Reproduce seed 002 (Flynn & Reeb 2024, "Tighter confidence bounds for sequential kernel
regression"): Table 1, Figures 1, 2, 4, 5/6 and 7 (spec §5).

Parts (``--parts``, default all):

* ``table1`` — d = 3, RBF / Matérn-5/2 / Matérn-3/2 × ℓ ∈ {0.5, 0.2}, T = 1000, DMM, AMM, AY, IGP,
  Random over T rounds and CMM (1-D dual) over ``--cmm-horizon`` rounds; the table puts the
  paper's numbers beside ours; Figure 2 (regret curves) comes from the same runs.
* ``fig1`` — confidence bands of the five bounds, 1-D Matérn-3/2 (settings of spec §5.3).
* ``fig4`` — agent time per step vs t, Matérn-5/2 ℓ = 0.5, d = 3, every method, CMM both ways
  (dual and the CVXPY SOCP, the latter over ``--socp-horizon`` rounds).
* ``fig56`` — the Table-1 grid at d = 2 and d = 4 (Figures 5 and 6).
* ``fig7`` — loose σ and B: (σ, B) ∈ {0.1, 0.2} × {10, 20} given to each algorithm.

Environment: :class:`~torchbandits.envs.rkhs.RKHSFunctionEnv` (spec §5.1); one seed per
repetition gives every algorithm the same ``f*``, arm sets and noise sequence. Every policy's β
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

from ..confidence import AYBeta, IGPBeta
from ..confidence.mixture import AMMBound, CMMBound, DMMBound, default_c
from ..envs.rkhs import RKHSFunctionEnv
from ..experiments import simulate
from ..experiments.report import figure_grid, markdown_table, plot_time
from ..experiments.results import RunResult, resumable_run, summarize
from ..experiments.runner import tqdm
from ..kernels import kernel_matrix, make_kernel
from ..models import ExactKernelRidge
from ..policies import AMMUCB, AYGPUCB, CMMUCB, DMMUCB, IGPUCB, Policy, RandomPolicy

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
    """Factories of the seed-002 policies with the experimental constants (spec §5.1).

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


def _run(out: Path, env_name: str, env: RKHSFunctionEnv, policies: dict[str, Callable[[], Policy]],
         horizons: dict[str, int], seeds: Sequence[int], bar_desc: str,
         extra: dict[str, Any] | None = None) -> list[RunResult]:
    results = []
    total = sum(horizons[m] for m in policies) * len(seeds)
    with tqdm(total=total, desc=bar_desc, leave=False) as bar:
        for seed in seeds:
            for name, factory in policies.items():
                path = out / "runs" / f"{env_name}__{name}__seed{seed}.json"

                def compute(name=name, factory=factory, seed=seed) -> RunResult:
                    return simulate(factory(), env, horizons[name], seed, policy_name=name,
                                    env_name=env_name, progress=bar, diagnostics_every=0, config=extra)

                # resume an interrupted run: a finished file (atomic writes) is read back
                res, reused = resumable_run(path, compute, horizon=horizons[name], match=extra)
                if reused:
                    bar.update(horizons[name])
                results.append(res)
    return results


def _fmt(m: float, s: float) -> str:
    return f"{m:.1f} ± {s:.1f}"


def _grid(args: argparse.Namespace, out: Path, d: int, title: str) -> tuple[list[RunResult], list[str]]:
    results, columns = [], []
    for ls in LENGTHSCALES:
        for kname, label in KERNELS:
            env = RKHSFunctionEnv(kname, d, ls, n_arms=args.arms, device=args.device)
            pols = make_policies(kname, ls, d, args.horizon, device=args.device, methods=args.methods)
            horizons = {m: (args.cmm_horizon if m == "CMM" else args.horizon) for m in pols}
            env_name = f"d{d}_{kname}_l{ls}"
            columns.append(env_name)
            results += _run(out, env_name, env, pols, horizons, args.seeds, f"{title} {label} ℓ={ls}")
    return results, columns


def _table(results: list[RunResult], d: int, with_paper: bool) -> str:
    """Markdown table: rows = methods, columns = kernel × ℓ; final cumulative regret mean ± std
    (population std over seeds), the paper's value beside it."""
    cols = [(k, lab, ls) for ls in (0.5, 0.2) for k, lab in KERNELS]
    order = [(k, lab, ls) for k, lab in KERNELS for ls in (0.5, 0.2)]  # paper's column order
    head = "| algorithm | " + " | ".join(f"{lab} ℓ={ls}" for _, lab, ls in order) + " |"
    lines = [head, "|---|" + "---:|" * len(cols)]
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
        lines.append("")
        lines.append("Cumulative regret at t = 200 (CMM runs 200 rounds in the paper):")
        lines.append("")
        lines.append("| algorithm | " + " | ".join(f"{lab} ℓ={ls}" for _, lab, ls in order) + " |")
        lines.append("|---|" + "---:|" * len(cols))
        for m in ("CMM", "DMM", "AMM"):
            cells = []
            for k, _, ls in order:
                runs = [r for r in results if r.policy == m and r.env == f"d{d}_{k}_l{ls}"]
                vals = np.array([r.cumulative_regret[min(199, r.horizon - 1)] for r in runs])
                cells.append(_fmt(float(vals.mean()), float(vals.std())) if runs else "—")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plot_grid(results: list[RunResult], d: int, path: Path, title: str) -> None:
    """Figure 2 layout: rows ℓ = 0.5 / 0.2, columns RBF, Matérn-5/2, Matérn-3/2."""

    fig, axes = figure_grid(2, 3, figsize=(15, 8), squeeze=False)
    for i, ls in enumerate(LENGTHSCALES):
        for j, (k, lab) in enumerate(KERNELS):
            ax = axes[i, j]
            for m in METHODS:
                runs = [r for r in results if r.policy == m and r.env == f"d{d}_{k}_l{ls}"]
                if not runs:
                    continue
                cum = np.stack([r.cumulative_regret for r in runs])
                t = np.arange(1, cum.shape[1] + 1)
                ax.plot(t, cum.mean(0), label=m)
                ax.fill_between(t, cum.mean(0) - cum.std(0), cum.mean(0) + cum.std(0), alpha=0.2)
            ax.set_title(f"{lab}, ℓ = {ls}")
            ax.set_xlabel("t")
            ax.set_ylabel("cumulative regret")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


# ----------------------------------------------------------------------------- Figure 1
def figure1_data(seed: int = 0, n_obs: int = 50, n_grid: int = 101, device: str = "cpu") -> dict[str, Any]:
    """Bands of CMM, DMM, AMM, AY and IGP on the 1-D setup of Figure 1 (spec §5.3).

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


def plot_figure1(data: dict[str, Any], path: str | Path | None = None):
    """Five panels (CMM, DMM, AMM, AY, IGP): f*, data and the band of each bound."""
    import matplotlib.pyplot as plt

    # a pyplot figure for interactive use (the caller's backend shows it), a detached one to save
    new = plt.subplots if path is None else figure_grid
    names = list(data["bands"])
    fig, axes = new(1, len(names), figsize=(3.6 * len(names), 3.4), sharey=True)
    for ax, name in zip(axes, names):
        u, lcb = data["bands"][name]
        ax.fill_between(data["grid"], lcb, u, alpha=0.3, label=f"{name} band")
        ax.plot(data["grid"], data["f"], "k-", lw=1, label="f*")
        ax.plot(data["x"], data["y"], "r.", ms=3, label="data")
        ax.set_title(f"{name} (mean UCB − f* = {data['excess'][name]:.2f})", fontsize=9)
        ax.set_xlabel("x")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
    return fig


# ----------------------------------------------------------------------------- main
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="reproduce cmm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes (seconds), for tests")
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
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="results/cmm")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(argv) if argv is not None else None)
    if args.quick:
        args.horizon, args.cmm_horizon, args.socp_horizon, args.arms = 25, 25, 4, 20
        args.seeds = args.seeds[:2]
    if args.threads:
        torch.set_num_threads(args.threads)
    extra = args.seeds_extra or args.seeds
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    unknown = parts - {"table1", "fig1", "fig4", "fig56", "fig7"}
    if unknown:
        raise SystemExit(f"unknown parts {sorted(unknown)}")
    summary: dict[str, Any] = {"args": vars(args)}

    if "fig1" in parts:
        data = figure1_data(n_obs=50, n_grid=41 if args.quick else 101, device=args.device)
        plot_figure1(data, out / "figure1_bands.png")
        summary["figure1_excess"] = data["excess"]
        print("Figure 1, mean excess of UCB over f*:",
              ", ".join(f"{k} {v:.2f}" for k, v in data["excess"].items()))

    if "table1" in parts:
        t0 = time.time()
        results, _ = _grid(args, out / "table1", 3, "Table 1")
        text = _table(results, 3, with_paper=True)
        (out / "table1.md").write_text(
            f"# Table 1 (d = 3, T = {args.horizon}, seeds {args.seeds}): cumulative regret, "
            f"mean ± std (ours) [paper]\n\n{text}\n")
        _plot_grid(results, 3, out / "figure2_regret.png", "Figure 2: d = 3")
        (out / "table1_runs.md").write_text(markdown_table(summarize(results)) + "\n")
        print(f"\nTable 1 ({time.time() - t0:.0f} s)\n{text}\n")

    if "fig4" in parts:
        env = RKHSFunctionEnv("matern52", 3, 0.5, n_arms=args.arms, device=args.device)
        pols = make_policies("matern52", 0.5, 3, args.horizon, device=args.device,
                             methods=("CMM", "CMM-SOCP", "DMM", "AMM", "AY", "IGP"))
        horizons = {m: (args.socp_horizon if m == "CMM-SOCP" else args.horizon) for m in pols}
        res = _run(out / "fig4", "d3_matern52_l0.5", env, pols, horizons, args.seeds[:1], "Figure 4")
        plot_time(res, out / "figure4_time.png")
        rows = []
        for r in res:
            s = np.asarray(r.agent_seconds)
            rows.append({"method": r.policy, **{f"t={t}": float(np.median(s[max(0, t - 5):t]) * 1e3)
                                               for t in (50, 100, 200, 1000) if t <= len(s)}})
        summary["figure4_ms_per_step"] = rows
        print("Figure 4, agent ms/step (median of 5 steps before t):")
        for row in rows:
            print("  ", row)

    if "fig56" in parts:
        for d in (2, 4):
            sub = argparse.Namespace(**{**vars(args), "seeds": extra})
            res, _ = _grid(sub, out / f"fig_d{d}", d, f"d={d}")
            text = _table(res, d, with_paper=False)
            (out / f"table_d{d}.md").write_text(f"# d = {d}, T = {args.horizon}, seeds {extra}\n\n{text}\n")
            _plot_grid(res, d, out / f"figure{5 if d == 2 else 6}_regret_d{d}.png", f"d = {d}")
            print(f"\nd = {d}\n{text}\n")

    if "fig7" in parts:
        env = RKHSFunctionEnv("matern52", 3, 0.5, n_arms=args.arms, device=args.device)
        res = []
        for s_used in (0.1, 0.2):
            for b_used in (10.0, 20.0):
                pols = make_policies("matern52", 0.5, 3, args.horizon, noise_std=s_used, norm_bound=b_used,
                                     device=args.device, methods=("CMM", "DMM", "AMM", "AY", "IGP"))
                pols = {f"{m} σ={s_used} B={b_used:g}": f for m, f in pols.items()}
                horizons = {m: (args.cmm_horizon if m.startswith("CMM") else args.horizon) for m in pols}
                res += _run(out / "fig7", "d3_matern52_l0.5", env, pols, horizons, extra,
                            f"Figure 7 σ={s_used} B={b_used:g}")
        rows = summarize(res)
        (out / "figure7_table.md").write_text(markdown_table(rows) + "\n")
        _plot_loose(res, out / "figure7_loose.png")
        print("\nFigure 7 (loose σ, B)\n" + markdown_table(rows))

    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"\nwrote {out}/")
    return 0


def _plot_loose(results: list[RunResult], path: Path) -> None:

    methods = ("CMM", "DMM", "AMM", "AY", "IGP")
    fig, axes = figure_grid(1, len(methods), figsize=(4 * len(methods), 3.4), squeeze=False)
    for ax, m in zip(axes[0], methods):
        for cfg in sorted({r.policy for r in results if r.policy.split(" ")[0] == m}):
            cum = np.stack([r.cumulative_regret for r in results if r.policy == cfg])
            t = np.arange(1, cum.shape[1] + 1)
            ax.plot(t, cum.mean(0), label=cfg.split(" ", 1)[1])
            ax.fill_between(t, cum.mean(0) - cum.std(0), cum.mean(0) + cum.std(0), alpha=0.2)
        ax.set_title(m)
        ax.set_xlabel("t")
        ax.legend(fontsize=7)
    axes[0, 0].set_ylabel("cumulative regret")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
