"""Reproduce the experiments of Zenati, Bietti, Diemert, Mairal, Martin & Gaillard (2022),
"Efficient Kernel UCB for Contextual Bandits", AISTATS: Figures 1–12 (their Section 5 and App. F).

Environments (Section 5): Bump, Chessboard, Step Diagonal, 10-action grid, RBF σ_k = 0.1, noise
0.1. Policies: K-UCB, EK-UCB (μ = λ; on Bump at λ = 10 also μ ∈ {1, 100}), CBKB, CBBKB
(C_b ∈ {3, 10, 30}, q̄ = 10·C_b), SupK-UCB; β = 0.1 on the ridge sd for every UCB agent (the
grids of the authors' run scripts).

* Fig. 1 — Bump, λ = 10, EK-UCB with μ ∈ {1, 10, 100} against the baselines (C_b = 10).
* Fig. 2 — Chessboard, λ ∈ {1, 10, 100}, C_b = 10.
* Figs. 3–5 / 7–9 / 10–12 — Bump / Chessboard / Step Diagonal, λ ∈ {1, 10, 100}, C_b = 3, 10, 30.
* Fig. 6 — pictures of the Chessboard and Step Diagonal mean functions.

Each figure has one column per λ: cumulative pseudo-regret vs t (top) and cumulative agent seconds
vs t (bottom), mean ± std over seeds. Also ``dict_size_<env>.png`` (dictionary size vs t) and
``table.md`` (final regret mean ± std, regret at T/2 — Fig. 1's caption says T = 1000, the text
and the authors' scripts T = 2000 —, agent seconds, final dictionary size). Runs shared by
several figures are run once.

EK-UCB's KORS budget is ``γ = b·λ`` (the theory's γ = 12 log(T/δ) of Section 4.2 and the text's
"γ ≈ λ" differ by orders of magnitude from the authors' code, which uses the b-grid
{0.001, 0.02, 0.05, 0.1}); ``--kors-b`` defaults to 1 on the 1-D environments (γ = λ, the advice
of App. F.1) and 0.02 on Bump (Bump states are nearly orthogonal, so p̃ ≈ γ(1+ε)/(1+μ) and a
larger γ fills the dictionary). CBKB resamples its dictionary from the whole history every
round, O(n m² + m³) with m ≈ n here, so it is run to ``--cbkb-horizon`` (default 500) only.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..envs.contextual import BumpEnv, ChessboardEnv, ContextualGridEnv, StepDiagonalEnv
from ..experiments.batch import run_jobs_batched
from ..experiments.figures import (
    CUM_REGRET,
    CUM_SECONDS,
    ROUND,
    band_label,
    figure_grid,
    plot_band,
    save_figure,
    setting_title,
)
from ..experiments.report import markdown_table
from ..experiments.results import RunResult, load_results, summarize
from ..experiments.runner import Job
from ..policies import KernelUCB, Policy
from ..presets.zenati2022 import BETA, DEFAULT_KORS_B
from ..presets.zenati2022 import cbbkb as cbbkb_policy
from ..presets.zenati2022 import cbkb as cbkb_policy
from ..presets.zenati2022 import ekucb as ekucb_policy
from ..presets.zenati2022 import paper_kernel as _kernel
from ..presets.zenati2022 import supkernel as supkernel_policy
from .common import QUICK_NOTE, quick_banner, reproduction_parser, start

__all__ = ["ENVS", "RunSpec", "build_policy", "main", "plan_runs"]

ENV_TITLES = {"bump": "Bump (d_x = 5)", "chessboard": "Chessboard (d_x = 1)",
              "step-diagonal": "Step Diagonal (d_x = 1)"}
ENVS: dict[str, type[ContextualGridEnv]] = {
    "bump": BumpEnv, "chessboard": ChessboardEnv, "step-diagonal": StepDiagonalEnv,
}


@dataclass(frozen=True)
class RunSpec:
    """One (environment, policy configuration) pair, run for every seed."""

    env: str
    family: str  # kucb | ekucb | cbkb | cbbkb | supk
    lam: float
    mu: float | None = None
    cb: float | None = None
    horizon: int = 2000

    @property
    def label(self) -> str:
        """Legend label of the run, e.g. ``EK-UCB λ=1 μ=0.1``."""
        base = {"kucb": "K-UCB", "ekucb": "EK-UCB", "cbkb": "CBKB", "cbbkb": "CBBKB",
                "supk": "SupK-UCB"}[self.family]
        if self.family == "ekucb" and self.mu is not None and self.mu != self.lam:
            base += f"(mu={self.mu:g})"
        if self.family == "cbbkb":
            base += f"(Cb={self.cb:g})"
        return f"{base} lam={self.lam:g}"

    def filename(self, seed: int) -> str:
        """File-system-safe JSON stem of this run for ``seed``."""
        return re.sub(r"[^A-Za-z0-9_.=-]+", "_", f"{self.env}__{self.label}__T{self.horizon}__seed{seed}")


#: the reference code's first action: its agents draw it with ``RandomState(123).choice(10)`` for
#: every seed (action 0.82 on Bump's grid, 0.01 below the best)
REFERENCE_WARMUP_INDEX = 2


def build_policy(spec: RunSpec, env: Any, *, kors_b: float, kors_score: str = "correct",
                 eta: float = 0.1, device: str = "cpu", warmup: str = "random") -> Policy:
    """The policy of one run of the EK-UCB experiments (Zenati et al. 2022, Section 6).

    ``spec.family`` picks K-UCB, EK-UCB (KORS dictionary with sampling constant ``kors_b`` and the
    ``kors_score`` variant), CBKB, CBBKB (batch constant ``eta``) or SupK-UCB; ``warmup`` is
    ``"random"`` (a uniformly drawn first action) or ``"reference"`` (the authors' fixed first
    action, :data:`REFERENCE_WARMUP_INDEX`).
    """
    if spec.family == "kucb":
        pol: Policy = KernelUCB(_kernel(env), lam=spec.lam, beta=BETA)
    elif spec.family == "ekucb":
        pol = ekucb_policy(env, lam=spec.lam, kors_b=kors_b, kors_mu=spec.mu, kors_score=kors_score)
    elif spec.family == "cbkb":
        pol = cbkb_policy(env, lam=spec.lam)
    elif spec.family == "cbbkb":
        pol = cbbkb_policy(env, lam=spec.lam, batch_threshold=float(spec.cb or 10.0))
    elif spec.family == "supk":
        pol = supkernel_policy(env, lam=spec.lam, eta=eta, horizon=spec.horizon)
    else:  # pragma: no cover - guarded by plan_runs
        raise ValueError(f"unknown policy family {spec.family!r}")
    if warmup == "reference":
        pol.warmup_index = REFERENCE_WARMUP_INDEX
    elif warmup != "random":
        raise ValueError(f"warmup must be 'random' or 'reference', got {warmup!r}")
    return pol.to(device)


# ---------------------------------------------------------------------- the plan
FIGURES: dict[int, tuple[str, Sequence[float] | None, float, bool]] = {
    # number: (env, lambdas (None = all), C_b, μ sweep on Bump)
    1: ("bump", (10.0,), 10.0, True),
    2: ("chessboard", None, 10.0, False),
    3: ("bump", None, 3.0, False), 4: ("bump", None, 10.0, False), 5: ("bump", None, 30.0, False),
    7: ("chessboard", None, 3.0, False), 8: ("chessboard", None, 10.0, False),
    9: ("chessboard", None, 30.0, False),
    10: ("step-diagonal", None, 3.0, False), 11: ("step-diagonal", None, 10.0, False),
    12: ("step-diagonal", None, 30.0, False),
}


def figure_specs(fig: int, lams: Sequence[float], horizon: int, cbkb_horizon: int,
                 mus: Sequence[float]) -> list[RunSpec]:
    env, fig_lams, cb, mu_sweep = FIGURES[fig]
    use = [lam for lam in (fig_lams or lams) if lam in lams] or list(lams)[:1]
    specs: list[RunSpec] = []
    for lam in use:
        specs.append(RunSpec(env, "kucb", lam, horizon=horizon))
        specs.append(RunSpec(env, "ekucb", lam, mu=lam, horizon=horizon))
        if mu_sweep:
            specs += [RunSpec(env, "ekucb", lam, mu=mu, horizon=horizon) for mu in mus if mu != lam]
        specs.append(RunSpec(env, "cbbkb", lam, cb=cb, horizon=horizon))
        specs.append(RunSpec(env, "cbkb", lam, horizon=min(horizon, cbkb_horizon)))
        specs.append(RunSpec(env, "supk", lam, horizon=horizon))
    return specs


def plan_runs(figures: Sequence[int], envs: Sequence[str], lams: Sequence[float], horizon: int,
              cbkb_horizon: int, mus: Sequence[float]) -> dict[int, list[RunSpec]]:
    """The runs of each requested figure: ``{figure number: [RunSpec, ...]}`` over the environments
    ``envs`` and regularisers ``lams`` (CB(B)KB runs use the shorter ``cbkb_horizon``)."""
    plan = {}
    for fig in figures:
        if fig == 6 or FIGURES[fig][0] not in envs:
            continue
        plan[fig] = figure_specs(fig, lams, horizon, cbkb_horizon, mus)
    return plan


# ---------------------------------------------------------------------- running
def run_job(spec: RunSpec, seed: int, args: argparse.Namespace,
            settings: dict[str, Any]) -> Job:
    """The runner's job of one (spec, seed): its environment, policy, configuration and file."""
    kors_b = args.kors_b if args.kors_b is not None else DEFAULT_KORS_B[spec.env]

    def make_policy(env: Any) -> Policy:
        return build_policy(spec, env, kors_b=kors_b, kors_score=args.kors_score, eta=args.eta,
                            device=args.device, warmup=args.warmup)

    def annotate(policy: Policy, env: Any, res: RunResult) -> None:
        if args.regret_mode == "reference":
            res.config["reference_regret"] = env.reference_regret

    config = {"family": spec.family, "lam": spec.lam, "mu": spec.mu, "cb": spec.cb,
              "kors_b": kors_b, "kors_score": args.kors_score, "beta": BETA, "warmup": args.warmup,
              "settings": settings}
    return Job(spec.env, spec.label, seed, spec.horizon,
               lambda: ENVS[spec.env](regret_mode=args.regret_mode), make_policy, config,
               file=spec.filename(seed) + ".json",
               annotate=annotate if args.regret_mode == "reference" else None)


def plot_figure(fig: int, specs: list[RunSpec], results: dict[RunSpec, list[RunResult]],
                path: Path, *, quick: bool = False) -> Path:
    lams = sorted({s.lam for s in specs})
    fig_, axes = figure_grid(2, len(lams), figsize=(max(5.0 * len(lams), 7.5), 8.0),
                              squeeze=False)
    env = specs[0].env
    seeds, horizon = 1, max(s.horizon for s in specs)
    for j, lam in enumerate(lams):
        for spec in (s for s in specs if s.lam == lam):
            runs = results.get(spec, [])
            if not runs:
                continue
            seeds = max(seeds, len(runs))
            label = spec.label.rsplit(" lam=", 1)[0]
            h = min(r.horizon for r in runs)
            plot_band(axes[0, j], np.stack([r.cumulative_regret[:h] for r in runs]), label=label)
            axes[1, j].plot(np.arange(1, h + 1),
                            np.stack([np.cumsum(r.agent_seconds)[:h] for r in runs]).mean(0),
                            label=label)
        axes[0, j].set_title(f"λ = {lam:g}: cumulative regret")
        axes[1, j].set_title(f"λ = {lam:g}: agent time (mean over seeds)")
        axes[0, j].set_ylabel(CUM_REGRET)
        axes[1, j].set_ylabel(CUM_SECONDS)
        axes[1, j].set_yscale("log")
        for ax in axes[:, j]:
            ax.set_xlabel(ROUND)
    cbkb = min(s.horizon for s in specs)
    title = setting_title(f"Fig. {fig}", env=ENV_TITLES[env], T=horizon, seeds=seeds,
                          extra=f"C_b = {FIGURES[fig][2]:g}, β = {BETA}"
                          + (f", CBKB to T = {cbkb}" if cbkb < horizon else ""), quick=quick)
    return save_figure(fig_, path, title=title, band=band_label(seeds))


def plot_dictionaries(env: str, results: dict[RunSpec, list[RunResult]], path: Path, *,
                      quick: bool = False) -> Path | None:
    specs = [s for s in results if s.env == env and s.family in ("ekucb", "cbbkb", "cbkb")]
    if not specs:
        return None
    fig, ax = figure_grid(figsize=(6.5, 5.2))
    seeds, horizon = 1, max(s.horizon for s in specs)
    for spec in sorted(specs, key=lambda s: s.label):
        runs = [r for r in results[spec] if "dict_size" in r.diagnostics]
        if not runs:
            continue
        seeds = max(seeds, len(runs))
        n = min(len(r.diagnostics["dict_size"]) for r in runs)
        vals = np.stack([np.asarray(r.diagnostics["dict_size"][:n]) for r in runs]).mean(0)
        ax.plot(runs[0].diagnostic_steps[:n], vals, label=spec.label)
    ax.set_title("dictionary size (mean over seeds)")
    ax.set_xlabel(ROUND)
    ax.set_ylabel("dictionary size m_t (points)")
    ax.set_yscale("log")
    return save_figure(fig, path, ncol=3, title=setting_title(
        "Nyström dictionaries", env=ENV_TITLES[env], T=horizon, seeds=seeds, quick=quick))


def plot_environments(path: Path, *, quick: bool = False) -> Path:
    """Fig. 6: the Chessboard and Step Diagonal mean functions on [0, 1]² (context × action)."""
    grid = torch.linspace(0, 1, 201, dtype=torch.float64)
    fig, axes = figure_grid(1, 2, figsize=(9, 4.3), layout="constrained")  # before colour bars
    for ax, cls in zip(axes, (ChessboardEnv, StepDiagonalEnv)):
        env = cls()
        vals = env.f(grid[:, None], grid).numpy()
        im = ax.imshow(vals.T, origin="lower", extent=(0, 1, 0, 1), cmap="viridis", vmin=0, vmax=1)
        acts = env.actions.numpy()
        ax.hlines(acts, 0, 1, colors="w", linewidth=0.4, alpha=0.6)
        ax.set_title(cls.__name__.replace("Env", ""))
        ax.set_xlabel("context x (unitless, in [0, 1])")
        ax.set_ylabel("action a (white lines: the 10 arms)")
        fig.colorbar(im, ax=ax, fraction=0.046, label="mean reward f(x, a)")
    return save_figure(fig, path, title=setting_title(
        "Fig. 6: mean reward of the 1-D contextual environments", d=2, quick=quick,
        extra="context × action joint inputs"))


def results_table(results: dict[RunSpec, list[RunResult]], regret_mode: str) -> str:
    runs = [r for rs in results.values() for r in rs]
    rows = summarize(runs)
    table = markdown_table(rows)
    lines = ["", "| env | policy | T | final dictionary size (mean) |", "|---|---|---:|---:|"]
    for spec, rs in results.items():
        if rs and "dict_size" in rs[0].diagnostics:
            m = float(np.mean([r.diagnostics["dict_size"][-1] for r in rs]))
            lines.append(f"| {spec.env} | {spec.label} | {spec.horizon} | {m:.0f} |")
    out = table + "\n" + "\n".join(lines)
    if regret_mode == "reference":
        ref = ["", "| env | policy | reference regret (the authors' code, mean) |", "|---|---|---:|"]
        for spec, rs in results.items():
            vals = [sum(r.config.get("reference_regret", [])) for r in rs]
            if rs:
                ref.append(f"| {spec.env} | {spec.label} | {np.mean(vals):.1f} |")
        out += "\n" + "\n".join(ref)
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = reproduction_parser("ekucb", __doc__, quick="T = 60 (CBKB 30), first seed, λ = 10 only",
                            out="results/ekucb", threads=1)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--horizon", type=int, default=2000)
    p.add_argument("--cbkb-horizon", type=int, default=500)
    p.add_argument("--lams", type=float, nargs="+", default=[1.0, 10.0, 100.0])
    p.add_argument("--mus", type=float, nargs="+", default=[1.0, 10.0, 100.0])
    p.add_argument("--figures", type=int, nargs="+", default=list(range(1, 13)))
    p.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    p.add_argument("--kors-b", type=float, default=None, help="γ = b·λ (default per env)")
    p.add_argument("--kors-score", default="correct", choices=["correct", "reference"])
    p.add_argument("--eta", type=float, default=0.1, help="SupK-UCB width multiplier")
    p.add_argument("--regret-mode", default="pseudo", choices=["pseudo", "reference"])
    p.add_argument("--warmup", default="random", choices=["random", "reference"],
                   help="first action: uniform per seed, or the reference code's index 2 for every seed")
    p.add_argument("--diagnostics-every", type=int, default=10)
    args = p.parse_args(argv)
    if args.quick:
        args.horizon = min(args.horizon, 60)
        args.cbkb_horizon = min(args.cbkb_horizon, 30)
        args.seeds = args.seeds[:1]
        args.lams = [10.0]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """``torchbandits reproduce ekucb [options]`` (see the module docstring); returns the exit code."""
    args = parse_args(argv)
    start(args)
    out = Path(args.out)
    if args.quick:
        print(quick_banner(f"T = {args.horizon}, CBKB to {args.cbkb_horizon}, seeds {args.seeds}, "
                           "λ = 10"))
    plan = plan_runs(args.figures, args.envs, args.lams, args.horizon, args.cbkb_horizon, args.mus)
    unique: list[RunSpec] = list(dict.fromkeys(s for specs in plan.values() for s in specs))
    t0 = time.perf_counter()
    # options that change a run's numbers; a saved run with other values is recomputed
    settings = {k: getattr(args, k) for k in ("kors_b", "kors_score", "eta", "warmup", "device",
                                              "diagnostics_every")}
    jobs = [run_job(spec, seed, args, settings) for spec in unique for seed in args.seeds]
    runs = run_jobs_batched(jobs, batch=args.batch, out=out, progress=not args.no_progress,
                            match=["settings"], diagnostics_every=args.diagnostics_every,
                            desc="ekucb")
    results: dict[RunSpec, list[RunResult]] = {}
    for (spec, _), res in zip(((s, seed) for s in unique for seed in args.seeds), runs):
        results.setdefault(spec, []).append(res)
    figs = []
    for fig, specs in plan.items():
        figs.append(plot_figure(fig, specs, results, out / f"fig{fig:02d}.png", quick=args.quick))
    if 6 in args.figures:
        figs.append(plot_environments(out / "fig06.png", quick=args.quick))
    for env in args.envs:
        p = plot_dictionaries(env, results, out / f"dict_size_{env}.png", quick=args.quick)
        if p is not None:
            figs.append(p)
    table = results_table(results, args.regret_mode)
    header = (f"# EK-UCB reproduction (Zenati et al. 2022): T = {args.horizon}, seeds {args.seeds}, "
              f"CBKB to T = {min(args.horizon, args.cbkb_horizon)}, warm-up {args.warmup}\n\n"
              + (f"*{QUICK_NOTE}.*\n\n" if args.quick else ""))
    (out / "table.md").write_text(header + table + "\n")
    (out / "summary.json").write_text(json.dumps(summarize([r for rs in results.values() for r in rs]),
                                                 indent=2))
    print(f"T = {args.horizon}, {len(args.seeds)} seed(s)" + (" (quick run)" if args.quick else ""))
    print(table)
    print(f"\n{len(unique) * len(args.seeds)} runs in {time.perf_counter() - t0:.1f} s; "
          f"figures: {', '.join(p.name for p in figs)}; raw runs in {out / 'runs'}")
    return 0


def replot(out: str | Path) -> int:
    """Redraw the tables from saved runs (``results/ekucb/runs``)."""
    runs = load_results(Path(out) / "runs")
    print(markdown_table(summarize(runs)))
    return 0 if runs else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
