"""torchbandits GP-UCB with marginal-likelihood refits vs BoTorch's standard BO loop.

Problems: BoTorch's Branin, Hartmann-6 and Ackley-6 as
:class:`~torchbandits.envs.test_functions.TestFunctionEnv` (2,000 fixed scrambled-Sobol
candidates in [0, 1]^d, reward ``−g``, noise σ = 0.05 × range).
All methods share, per seed, the candidate set, the noise sequence and the initial design (the
same ``2d + 1`` random candidates played first), and then choose ``T − (2d + 1)`` points:

* ``botorch`` — every round: ``SingleTaskGP`` (default: RBF ARD kernel with the dim-scaled
  LogNormal priors of Hvarfner et al. 2024, LogNormal(−4, 1) noise prior, constant mean,
  ``Standardize``) refit from scratch by ``fit_gpytorch_mll``, then ``UpperConfidenceBound``
  (``μ + sqrt(beta)·σ``, σ the posterior sd of f, noise excluded) over the candidates, argmax;
* ``tb-refit1`` / ``tb-refit20`` — :class:`~torchbandits.policies.GPUCB` with the same model (RBF
  ARD template, the same priors and lower bounds: lengthscale ≥ 0.025, noise ≥ 1e-4 relative,
  fitted constant mean, standardised fit) refit by :func:`~torchbandits.fitting.fit_kernel`
  every 1 / 20 rounds (warm-started, SciPy's L-BFGS-B on the closed-form gradient), and
  ``β = sqrt(beta)`` on the **GP** sd — the same UCB as
  BoTorch's. Between refits the posterior is updated incrementally.

Reported per function: cumulative pseudo-regret at T (against the candidate set's best), simple
regret at T (best ``g(x_s) − g*`` so far, against the known optimum), agent process time
(``time.process_time``; the machine is shared, so ratios of process times are the meaningful
number). Each run is saved as JSON under ``OUT/runs`` as soon as it ends (a rerun skips finished
runs), then ``bench.md``, ``bench.json``, ``regret_simple.png`` and ``regret_cumulative.png``
over the seeds that every requested method has finished (per function).

    python benchmarks/bench_bo.py                 # T = 300, 10 seeds, 3 functions (long)
    python benchmarks/bench_bo.py --quick         # T = 20, 1 seed, Branin (the test)
    python benchmarks/bench_bo.py --report-only   # tables and plots from the saved runs
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from torchbandits.envs.test_functions import TestFunctionEnv  # noqa: E402
from torchbandits.kernels import make_kernel  # noqa: E402
from torchbandits.policies import GPUCB  # noqa: E402

METHODS = ("botorch", "tb-refit1", "tb-refit20")
FIT_OPTIONS = {"lengthscale_bounds": (0.025, 100.0), "noise_bounds": (1e-4, 4.0)}


def initial_design(env: TestFunctionEnv, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(10_000 + seed)
    return torch.randperm(env.n_arms, generator=g)[: 2 * env.dim + 1].tolist()


def botorch_select(x: torch.Tensor, y: torch.Tensor, cand: torch.Tensor, beta: float) -> int:
    from botorch.acquisition import UpperConfidenceBound
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from gpytorch.mlls import ExactMarginalLogLikelihood

    model = SingleTaskGP(x, y[:, None])
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit_gpytorch_mll(mll)
    acq = UpperConfidenceBound(model, beta=beta)
    with torch.no_grad():
        scores = acq(cand[:, None, :])
    return int(torch.argmax(scores))


def run_one(fn: str, seed: int, method: str, horizon: int, n_arms: int, beta: float) -> dict:
    env = TestFunctionEnv(fn, n_arms=n_arms, fixed_arms=True, noise_frac=0.05)
    env.reset(seed)
    cand = env.candidates()
    means = env.mean_rewards()
    best = float(means.max())
    init = initial_design(env, seed)
    policy = None
    if method != "botorch":
        every = int(method.split("refit")[1])
        template = make_kernel("rbf", [math.exp(math.sqrt(2.0) + 0.5 * math.log(env.dim) - 3.0)]
                               * env.dim)  # BoTorch's initial value: the prior mode
        policy = GPUCB(template, lam=1e-2, beta=math.sqrt(beta), refit_every=every,
                       refit_warmup=len(init), refit_options=dict(FIT_OPTIONS), n_warmup=0,
                       seed=seed)
    xs, ys, regret, opt_regret, seconds, select_s = [], [], [], [], [], []
    for t in range(horizon):
        c0 = time.process_time()
        if t < len(init):
            idx = init[t]
        elif policy is not None:
            idx = policy.select(cand)
        else:
            idx = botorch_select(cand[torch.tensor(xs)], torch.tensor(ys, dtype=torch.float64),
                                 cand, beta)
        c1 = time.process_time()
        reward = env.pull(idx)
        c2 = time.process_time()
        if policy is not None:
            policy.update(cand[idx], reward)
        c3 = time.process_time()
        seconds.append((c1 - c0) + (c3 - c2))
        select_s.append(c1 - c0)
        xs.append(idx)
        ys.append(reward)
        regret.append(best - float(means[idx]))
        opt_regret.append(env.optimum_regret[-1])
    out = {"function": fn, "seed": seed, "method": method, "horizon": horizon,
           "n_arms": n_arms, "beta_botorch": beta, "regret": regret,
           "optimum_regret": opt_regret, "seconds": seconds, "select_seconds": select_s,
           "actions": xs,
           "candidate_gap": env.candidate_gap()}
    if policy is not None:
        out["diagnostics"] = policy.diagnostics()
    return out


def summarize(runs: list[dict]) -> tuple[str, dict]:
    table = ["| function | method | seeds | simple regret at T (mean ± std) | cum. regret at T "
             "(mean ± std) | agent CPU s / run (mean ± std) | of which scoring (select) | "
             "CPU time ratio botorch / method |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    summary: dict = {}
    for fn in sorted({r["function"] for r in runs}):
        by = {m: [r for r in runs if r["function"] == fn and r["method"] == m] for m in METHODS}
        bt_time = np.mean([sum(r["seconds"]) for r in by["botorch"]]) if by["botorch"] else math.nan
        for m, rs in by.items():
            if not rs:
                continue
            cum = np.array([sum(r["regret"]) for r in rs])
            simple = np.array([min(r["optimum_regret"]) for r in rs])
            cpus = np.array([sum(r["seconds"]) for r in rs])
            cpu = float(cpus.mean())
            sel = float(np.mean([sum(r.get("select_seconds", [math.nan])) for r in rs]))
            ratio = bt_time / cpu if cpu > 0 else math.nan
            summary.setdefault(fn, {})[m] = {
                "seeds": sorted(r["seed"] for r in rs), "cum_mean": float(cum.mean()),
                "cum_std": float(cum.std()), "simple_mean": float(simple.mean()),
                "simple_std": float(simple.std()), "simple_median": float(np.median(simple)),
                "cpu_mean": cpu, "cpu_std": float(cpus.std()), "select_cpu_mean": sel,
                "ratio_vs_botorch": float(ratio)}
            table.append(f"| {fn} | {m} | {len(rs)} | {simple.mean():.3g} ± {simple.std():.2g} | "
                         f"{cum.mean():.3g} ± {cum.std():.2g} | {cpu:.3g} ± {cpus.std():.2g} | "
                         f"{sel:.3g} | {ratio:.1f}× |")
    return "\n".join(table), summary


def per_seed_ratios(runs: list[dict]) -> str:
    """Markdown table: per function and seed, BoTorch's agent CPU seconds and each of our
    methods' CPU seconds with the ratio ``botorch / method`` (runs of one seed share the
    candidates, noise and initial design; on a shared machine the per-seed ratio shows how much
    the load moved the means)."""
    ours = [m for m in METHODS if m != "botorch"]
    table = ["| function | seed | botorch CPU s | " + " | ".join(f"{m} CPU s (ratio)" for m in ours)
             + " |", "|---|---:|---:|" + "---:|" * len(ours)]
    cpu = {(r["function"], r["seed"], r["method"]): sum(r["seconds"]) for r in runs}
    for fn, seed in sorted({(r["function"], r["seed"]) for r in runs}):
        bt = cpu.get((fn, seed, "botorch"))
        if bt is None:
            continue
        cells = [f"{cpu[(fn, seed, m)]:.2f} ({bt / cpu[(fn, seed, m)]:.1f}×)"
                 if (fn, seed, m) in cpu else "–" for m in ours]
        table.append(f"| {fn} | {seed} | {bt:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(table)


def plot(runs: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fns = sorted({r["function"] for r in runs})
    for kind in ("simple", "cumulative"):
        fig, axes = plt.subplots(1, len(fns), figsize=(max(7.0, 4.6 * len(fns)), 3.8), squeeze=False)
        for ax, fn in zip(axes[0], fns):
            for m in METHODS:
                rs = [r for r in runs if r["function"] == fn and r["method"] == m]
                if not rs:
                    continue
                if kind == "simple":
                    curves = np.array([np.minimum.accumulate(r["optimum_regret"]) for r in rs])
                else:
                    curves = np.array([np.cumsum(r["regret"]) for r in rs])
                mean, std = curves.mean(0), curves.std(0)
                t = np.arange(1, curves.shape[1] + 1)
                ax.plot(t, mean, label=f"{m} ({len(rs)} seeds)")
                ax.fill_between(t, mean - std, mean + std, alpha=0.2)
            ax.set_title(fn)
            ax.set_xlabel("round t")
            if kind == "simple":
                ax.set_yscale("log")
                ax.set_ylabel("simple regret  min_s≤t g(x_s) − g*")
            else:
                ax.set_ylabel("cumulative regret vs candidate best")
            ax.legend(fontsize=8)
        fig.suptitle(f"{kind} regret: mean over seeds, band = ± 1 std across seeds")
        fig.tight_layout()
        fig.savefig(out / f"regret_{kind}.png", dpi=110)
        plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="T = 20, 1 seed, Branin, 200 arms")
    ap.add_argument("--functions", nargs="+", default=["branin", "hartmann6", "ackley"])
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    ap.add_argument("--horizon", type=int, default=300)
    ap.add_argument("--n-arms", type=int, default=2000)
    ap.add_argument("--beta", type=float, default=4.0, help="BoTorch's beta (ours: sqrt(beta))")
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    ap.add_argument("--out", default="results/bench_bo")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.functions, args.seeds, args.horizon, args.n_arms = ["branin"], [0], 20, 200
    torch.set_num_threads(1)
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        for seed in args.seeds:  # seeds outermost: partial results cover every function
            for fn in args.functions:
                for m in args.methods:
                    path = out / "runs" / f"{fn}__{m}__seed{seed}.json"
                    if path.exists():
                        continue
                    res = run_one(fn, seed, m, args.horizon, args.n_arms, args.beta)
                    path.write_text(json.dumps(res))
                    print(f"{fn} {m} seed {seed}: cum regret {sum(res['regret']):.3g}, "
                          f"CPU {sum(res['seconds']):.2f} s", flush=True)
    runs = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]
    runs = [r for r in runs if r["horizon"] == args.horizon and r["function"] in args.functions
            and r["seed"] in args.seeds and r["method"] in args.methods]
    done = {(r["function"], r["seed"], r["method"]) for r in runs}  # seeds every method finished
    runs = [r for r in runs if all((r["function"], r["seed"], m) in done for m in args.methods)]
    table, summary = summarize(runs)
    table += "\n\nPer seed:\n\n" + per_seed_ratios(runs)
    (out / "bench.md").write_text(table + "\n")
    (out / "bench.json").write_text(json.dumps(summary, indent=1))
    plot(runs, out)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
