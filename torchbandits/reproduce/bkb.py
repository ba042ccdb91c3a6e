"""Reproduce BKB (Calandriello, Carratino, Lazaric, Valko & Rosasco 2019, "Gaussian Process
Optimization with Adaptive Sketching: Scalable and No Regret", COLT): ``torchbandits reproduce bkb``.

The paper has no regret or runtime experiment; its only figure (Fig. 2) illustrates variance
starvation. This script makes both:

1. **Bandit runs** on RKHS test functions with a fixed finite arm set
   (:class:`~torchbandits.envs.RKHSFunctionEnv` with ``fixed_arms=True``, ``‖f‖_H = 1``,
   noise ξ = 0.1): BKB vs exact GP-UCB vs Random, several ``(kernel, d, A)`` settings, T up to
   2000, 5 seeds. **β convention:** both BKB and GP-UCB use the same constant β on the **ridge**
   sd ``sqrt(var_GP/λ)`` with λ = ξ² (``--beta``, default 0.3); GP-UCB is the foundation's
   incremental exact :class:`~torchbandits.policies.KernelUCB` (``variance="ridge"``).
   ``--theory-beta`` adds BKB with the paper's β̃_t; ``--ablations`` adds the SoR-variance
   ablation and a uniformly sampled dictionary (``q̄`` points in expectation). Writes per-run
   JSON, ``table.md`` (final regret mean ± std, time), ``bkb_table.md`` (+ regret ratio to GP-UCB
   and dictionary size), ``regret.png``, ``time.png``, ``dictionary_size.png``.
2. **Fig. 2** (``fig2_variance_starvation.png``): a GP sample on [0, 1] with
   ``k(x,x') = exp(−100 (x−x')²)`` (ℓ = 1/√200: the paper's "bandwidth σ² = 100" read as the
   coefficient, since ``exp(−(x−x')²/200)`` is almost constant on [0, 1]), t ∈ {6, 63, 215}
   noisy observations
   uniform in [0, 0.5] fed to BKB (q̄ = 5, λ = ξ² = 0.01), bands ``μ ± 3·sd_GP`` of the exact GP,
   of BKB's DTC posterior and of the SoR ablation; the dictionary sizes are in the titles.

    torchbandits reproduce bkb            # full (several minutes on one core)
    torchbandits reproduce bkb --quick    # seconds (used by the tests)
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..envs.rkhs import RKHSFunctionEnv
from ..experiments.batch import run_grid_batched
from ..experiments.figures import figure_grid, save_figure, setting_title
from ..experiments.report import plot_diagnostic, write_report
from ..experiments.results import RunResult
from ..kernels import kernel_matrix, make_kernel
from ..models import ExactKernelRidge
from ..policies import BKB, RandomPolicy
from ..presets.calandriello2019 import bkb as bkb_policy
from ..presets.calandriello2019 import bkb_sor
from ..presets.calandriello2019 import gpucb_ridge as gpucb_same_beta
from .common import QUICK_NOTE, quick_banner, reproduction_parser, start

__all__ = ["ENV_SETTINGS", "FULL_SETTINGS", "figure2", "main"]

NOISE = 0.1
NORM = 1.0
LAM = NOISE**2

# (name, kernel, d, lengthscale, A)
ENV_SETTINGS: list[tuple[str, str, int, float, int]] = [
    ("rbf-d1-A100", "rbf", 1, 0.1, 100),
    ("matern52-d1-A1000", "matern52", 1, 0.1, 1000),
    ("rbf-d2-A1000", "rbf", 2, 0.2, 1000),
    ("matern52-d2-A1000", "matern52", 2, 0.2, 1000),
    ("rbf-d2-A4096", "rbf", 2, 0.2, 4096),
]
# the whole grid: A ∈ {100, 1000, 4096} × d ∈ {1, 2} × {RBF, Matérn-5/2} (``--grid full``)
FULL_SETTINGS: list[tuple[str, str, int, float, int]] = [
    (f"{k}-d{d}-A{a}", k, d, 0.1 if d == 1 else 0.2, a)
    for k in ("rbf", "matern52") for d in (1, 2) for a in (100, 1000, 4096)
]
QUICK_SETTINGS = [("rbf-d1-A100", "rbf", 1, 0.1, 100), ("matern52-d2-A100", "matern52", 2, 0.2, 100)]


# ------------------------------------------------------------------------------ Fig. 2
def _band(ax, x: np.ndarray, mean: np.ndarray, sd: np.ndarray, color: str, label: str) -> None:
    ax.plot(x, mean, color=color, lw=1.2, label=f"{label}: posterior mean")
    ax.fill_between(x, mean - 3 * sd, mean + 3 * sd, color=color, alpha=0.18)


def figure2(out: Path, *, n_grid: int = 1000, ts: Sequence[int] = (6, 63, 215), qbar: float = 5.0,
            seed: int = 0, device: str = "cpu", quick: bool = False) -> dict[str, Any]:
    """Fig. 2 of the paper (variance starvation): exact GP vs BKB (DTC) vs SoR bands.

    Returns the dictionary sizes and, for each t, the mean ratio of the approximate to the exact
    GP variance on [0.7, 1] (far from the data)."""

    dt = torch.float64
    kern = make_kernel("rbf", 1.0 / math.sqrt(200.0))  # exp(−100 (x − x')²): see the module doc
    gen = torch.Generator().manual_seed(seed)
    grid = torch.linspace(0, 1, n_grid, dtype=dt)[:, None]
    kgg = kernel_matrix(kern, grid, grid)
    chol = torch.linalg.cholesky(kgg + 1e-8 * torch.eye(n_grid, dtype=dt))
    f = chol @ torch.randn(n_grid, generator=gen, dtype=dt)
    t_max = max(ts)
    xs = 0.5 * torch.rand(t_max, 1, generator=gen, dtype=dt)
    idx = torch.clamp((xs[:, 0] * (n_grid - 1)).round().long(), 0, n_grid - 1)
    xs = grid[idx]  # observations on grid points, so f is known there exactly
    ys = f[idx] + NOISE * torch.randn(t_max, generator=gen, dtype=dt)
    dtc = BKB(copy.deepcopy(kern), lam=LAM, noise_std=NOISE, qbar=qbar, seed=seed, device=device)
    sor = BKB(copy.deepcopy(kern), lam=LAM, noise_std=NOISE, qbar=qbar, seed=seed, variance="sor",
              device=device)
    exact = ExactKernelRidge(copy.deepcopy(kern), LAM, device=device)
    fig, axes = figure_grid(2, len(ts), figsize=(max(4.6 * len(ts), 8.0), 7.2), sharex=True,
                            sharey=True)
    far = grid[:, 0] >= 0.7
    stats: dict[str, Any] = {"t": list(ts), "dictionary_size": [], "far_var_ratio_dtc": [],
                             "far_var_ratio_sor": [], "kernel": "exp(-100 (x-x')^2)",
                             "lam": LAM, "noise_std": NOISE, "qbar": qbar}
    xg = grid[:, 0].numpy()
    done = 0
    for col, t in enumerate(sorted(ts)):
        for i in range(done, t):
            dtc.update(xs[i], float(ys[i]))
            sor.update(xs[i], float(ys[i]))
            exact.append(xs[i], float(ys[i]))
        done = t
        me, ve = exact.mean_var(grid.to(device))
        md, _, vd = dtc.posterior(grid)
        ms, _, vs = sor.posterior(grid)
        stats["dictionary_size"].append(dtc.dictionary_size)
        stats["far_var_ratio_dtc"].append(float((vd[far] / ve[far]).mean()))
        stats["far_var_ratio_sor"].append(float((vs[far] / ve[far]).mean()))
        for row, (name, mean, var, color) in enumerate(
            [("BKB (DTC)", md, vd, "tab:blue"), ("SoR", ms, vs, "tab:red")]
        ):
            ax = axes[row, col]
            _band(ax, xg, me.cpu().numpy(), ve.sqrt().cpu().numpy(), "0.55", "exact GP")
            _band(ax, xg, mean.cpu().numpy(), var.sqrt().cpu().numpy(), color, name)
            ax.plot(xg, f.numpy(), "k--", lw=0.8, label="f (the GP sample)")
            ax.plot(xs[:t, 0].numpy(), ys[:t].numpy(), "k.", ms=3, label="observations")
            ax.axvline(0.5, color="0.7", lw=0.6, label="end of the observed region x = 0.5")
            ax.set_title(f"{name}: t = {t}, |S_t| = {dtc.dictionary_size}", fontsize=9)
            ax.set_xlabel("x (1-D input)")
            ax.set_ylabel("f(x) (reward units)")
    save_figure(fig, out / "fig2_variance_starvation.png", band="shaded: posterior mean ± 3 sd",
                title=setting_title("Fig. 2 of Calandriello et al. (2019), variance starvation",
                                    env="exp(−100 (x−x')²)", d=1, quick=quick,
                                    extra=f"{n_grid}-point grid, data uniform in [0, 0.5], "
                                          f"λ = {LAM:g}, q̄ = {qbar:g}, one GP sample"))
    (out / "fig2_stats.json").write_text(json.dumps(stats, indent=2))
    return stats


# ------------------------------------------------------------------------------ bandit runs
def bkb_table(results: Sequence[RunResult]) -> str:
    """Final regret (mean ± std), ratio to GP-UCB, ms/step at the end, dictionary size at T."""
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.env, r.policy), []).append(r)
    lines = ["| env | policy | T | seeds | regret at T | / GP-UCB | ms/step at end | dict. size | m_theory |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (env, pol), runs in groups.items():
        reg = np.array([r.final_regret for r in runs])
        base = groups.get((env, "GP-UCB"))
        ratio = reg.mean() / np.mean([r.final_regret for r in base]) if base else float("nan")
        tail = np.mean([np.median(r.agent_seconds[-max(r.horizon // 10, 1):]) for r in runs]) * 1e3
        dsz = [r.diagnostics["dictionary_size"][-1] for r in runs if "dictionary_size" in r.diagnostics]
        mth = [r.diagnostics["m_theory"][-1] for r in runs if "m_theory" in r.diagnostics]
        lines.append(
            f"| {env} | {pol} | {runs[0].horizon} | {len(runs)} | {reg.mean():.2f} ± {reg.std():.2f} | "
            f"{ratio:.2f} | {tail:.2f} | {np.mean(dsz) if dsz else float('nan'):.1f} | "
            f"{np.mean(mth) if mth else float('nan'):.1f} |"
        )
    return "\n".join(lines)


def _env_factory(kernel: str, dim: int, ls: float, arms: int, device: str):
    def make() -> RKHSFunctionEnv:
        return RKHSFunctionEnv(kernel, dim=dim, lengthscale=ls, n_arms=arms, fixed_arms=True,
                               noise_std=NOISE, norm=NORM, device=device)
    return make


def _nums(values: Sequence[float], digits: int) -> str:
    return ", ".join(f"{v:.{digits}f}" for v in values)


def main(argv: Sequence[str] | None = None) -> int:
    """``torchbandits reproduce bkb [options]`` (see the module docstring); returns the exit code."""
    parser = reproduction_parser("bkb", __doc__, quick="two small settings (A = 100), T = 60, "
                                 "2 seeds, a 200-point Fig. 2", out="results/bkb", threads=1)
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds (5; quick: 2)")
    parser.add_argument("--horizon", type=int, default=None, help="T (2000; quick: 60)")
    parser.add_argument("--envs", default=None,
                        help="comma-separated subset of " + ",".join(s[0] for s in ENV_SETTINGS))
    parser.add_argument("--beta", type=float, default=0.3, help="shared constant β (ridge sd)")
    parser.add_argument("--qbar", type=float, default=5.0)
    parser.add_argument("--theory-beta", action="store_true", help="also run BKB with β̃_t")
    parser.add_argument("--ablations", action="store_true",
                        help="also run the SoR-variance ablation and uniformly sampled dictionaries")
    parser.add_argument("--grid", choices=("default", "full"), default="default",
                        help="full: all 12 (kernel, d, A) combinations of the issue")
    parser.add_argument("--skip-figure", action="store_true")
    args = parser.parse_args(list(argv) if argv is not None else None)
    start(args)
    out = Path(args.out)
    full = args.grid == "full"
    settings = QUICK_SETTINGS if args.quick else (FULL_SETTINGS if full else ENV_SETTINGS)
    if args.envs:
        wanted = set(args.envs.split(","))
        known = {s[0]: s for s in FULL_SETTINGS + ENV_SETTINGS + QUICK_SETTINGS}
        settings = [known[name] for name in known if name in wanted]
        if not settings:
            raise SystemExit(f"--envs matched nothing; choose from {sorted(known)}")
    horizon = args.horizon or (60 if args.quick else 2000)
    seeds = list(range(args.seeds or (2 if args.quick else 5)))
    if args.quick:
        print(quick_banner(f"T = {horizon}, {len(seeds)} seeds, A = 100"))
    beta, qbar, dev = args.beta, args.qbar, args.device
    policies = {
        "BKB": lambda env: bkb_policy(env, qbar=qbar, beta_rule="constant", beta=beta, device=dev),
        "GP-UCB": lambda env: gpucb_same_beta(env, beta=beta, device=dev),
        "Random": lambda env: RandomPolicy(device=dev),
    }
    if args.theory_beta:
        policies["BKB (β̃ paper)"] = lambda env: bkb_policy(env, qbar=qbar, beta_rule="paper",
                                                           device=dev)
    if args.ablations:
        policies["BKB-SoR"] = lambda env: bkb_sor(env, beta=beta, qbar=qbar, device=dev)
        policies["BKB-uniform"] = lambda env: bkb_policy(env, qbar=qbar, beta_rule="constant", beta=beta,
                                                         sampler="uniform", device=dev)
    envs = {name: _env_factory(k, d, ls, a, dev) for name, k, d, ls, a in settings}
    config = {"beta": beta, "beta_variance": "ridge", "lam": LAM, "qbar": qbar, "noise_std": NOISE,
              "norm": NORM}
    results = run_grid_batched(policies, envs, seeds, horizon, out=out, config=config,
                               progress=not args.no_progress, batch=args.batch)
    title = setting_title("BKB vs exact GP-UCB vs Random (RKHS functions, fixed arms, ‖f‖ = 1, "
                          f"ξ = {NOISE}, constant β = {beta} on the ridge sd)", quick=args.quick)
    table = write_report(results, out, title=title)
    plot_diagnostic(results, "dictionary_size", out / "dictionary_size.png", title=title,
                    ylabel="BKB dictionary size |S_t| (points)")
    extra = bkb_table(results)
    quick_note = f"*{QUICK_NOTE}.*\n\n" if args.quick else ""
    (out / "bkb_table.md").write_text(
        "# BKB vs exact GP-UCB (same constant β on the ridge sd, λ = ξ²)\n\n" + quick_note + extra + "\n")
    print(table)
    print()
    print(extra)
    if not args.skip_figure:
        stats = figure2(out, n_grid=200 if args.quick else 1000, seed=0, device=dev,
                        ts=(6, 30) if args.quick else (6, 63, 215), quick=args.quick)
        print(f"\nFig. 2: dictionary sizes {_nums(stats['dictionary_size'], 0)} at t = "
              f"{_nums(stats['t'], 0)}; mean "
              f"approx/exact GP variance on [0.7, 1]: DTC {_nums(stats['far_var_ratio_dtc'], 3)}, "
              f"SoR {_nums(stats['far_var_ratio_sor'], 4)}")
    print(f"\nwrote runs, table.md, bkb_table.md, regret.png, time.png, dictionary_size.png"
          f"{'' if args.skip_figure else ', fig2_variance_starvation.png'} to {out}/")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
