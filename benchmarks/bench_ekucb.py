"""Benchmark of the claim of Zenati et al. (2022, Section 5): EK-UCB is much faster than K-UCB at
equal regret.

``python benchmarks/bench_ekucb.py [--quick] [--out results/ekucb_bench]``

At λ = μ = 10, β = 0.1 (ridge sd), on Bump, Chessboard and Step Diagonal, seeds 0–2, T = 2000:

1. final regret and total agent time of K-UCB and EK-UCB (speed-up = time ratio);
2. the K-UCB / EK-UCB time ratio at t = 500, 1000, 2000 (read off the same runs: a policy does not
   know T, so the first t steps of a T = 2000 run are a T = t run);
3. EK-UCB against CBBKB for every C_b ∈ {3, 10, 30};
4. dictionary sizes, and EK-UCB's per-step time at the end as a multiple of its dominant matrix
   product alone (``L⁻¹ K_Z,cand``, ``[m, m] × [m, 10]``): the overhead ratio.

Agent time is select + update only, timed by the library's runner (``simulate``). The machine is
shared, so times are reported both as **CPU time of the running thread** (``time.thread_time``;
what the policy itself consumed, robust to other processes) and wall time; ratios are taken
within the same run of this script. Threads are pinned to 1. EK-UCB's KORS budget γ is set per
environment (``--kors-gamma``; the authors' code uses γ = b·λ with b in a small grid, far from
the theory's γ of their Section 4.2).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from torchbandits.envs.contextual import BumpEnv, ChessboardEnv, StepDiagonalEnv
from torchbandits.experiments import RunResult, simulate
from torchbandits.kernels import make_kernel
from torchbandits.policies import CBBKB, EKUCB, KernelUCB

ENVS = {"bump": BumpEnv, "chessboard": ChessboardEnv, "step-diagonal": StepDiagonalEnv}
DEFAULT_GAMMA = {"bump": 0.2, "chessboard": 10.0, "step-diagonal": 10.0}


def run(policy, env, horizon: int, seed: int, name: str, env_name: str, bar=None,
        budget: float | None = None) -> RunResult:
    """The library's runner with the thread-CPU clock (``config["agent_cpu_seconds"]``); with a
    ``budget`` (CPU seconds) the run stops once the agent has used it (the result is shorter).
    Diagnostics are taken once, at the last round run."""
    return simulate(policy, env, horizon, seed, policy_name=name, env_name=env_name,
                    diagnostics_every=horizon, progress=bar if bar is not None else False,
                    cpu_clock=True, cpu_budget=budget)


def dominant_product_seconds(policy: EKUCB, cand: torch.Tensor, reps: int = 300) -> float:
    """Median thread-CPU time of the scoring's dominant product ``L⁻¹ K_Z,cand`` alone: an
    ``[m, m]`` by ``[m, A]`` product (its values do not change its cost) at the policy's final
    dictionary size ``m``."""
    m, n_cand = policy.model.m, cand.shape[0]
    gen = torch.Generator().manual_seed(0)
    linv = torch.rand(m, m, generator=gen, dtype=cand.dtype).tril()
    kz = torch.rand(m, n_cand, generator=gen, dtype=cand.dtype)
    times = []
    for _ in range(reps):
        c0 = time.thread_time()
        linv @ kz
        times.append(time.thread_time() - c0)
    return statistics.median(times)


def _ms(x: float) -> str:
    return f"{1e3 * x:.3g}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="T = 150, one seed, C_b = 10 only")
    p.add_argument("--horizon", type=int, default=2000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    p.add_argument("--lam", type=float, default=10.0)
    p.add_argument("--kors-gamma", nargs="*", default=[],
                   help="per-env γ as env=value (defaults: " +
                        ", ".join(f"{k}={v}" for k, v in DEFAULT_GAMMA.items()) + ")")
    p.add_argument("--cbs", type=float, nargs="*", default=[3.0, 10.0, 30.0])
    p.add_argument("--checkpoints", type=int, nargs="+", default=[500, 1000, 2000])
    p.add_argument("--cbbkb-budget", type=float, default=15.0,
                   help="CPU seconds after which a CBBKB run is stopped (at least 20× EK-UCB's)")
    p.add_argument("--out", default="results/ekucb_bench")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.horizon, args.seeds, args.cbs = min(args.horizon, 150), args.seeds[:1], [10.0]
        args.checkpoints = [50, 100, 150]
    gammas = dict(DEFAULT_GAMMA)
    for item in args.kors_gamma:
        k, _, v = item.partition("=")
        gammas[k] = float(v)
    torch.set_num_threads(1)
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    lam, horizon = args.lam, args.horizon
    kernel = make_kernel("rbf", 0.1)
    n_pol = 2 + len(args.cbs)
    bar = tqdm(total=n_pol * horizon * len(args.seeds) * len(args.envs), disable=args.no_progress,
               desc="bench ekucb")
    res: dict[tuple[str, str], list[RunResult]] = {}
    overhead: dict[str, list[tuple[int, float, float]]] = {}
    # phase 1: K-UCB and EK-UCB on every env and seed; phase 2: CBBKB (slow: its dictionary is
    # the whole history here, rebuilt from scratch at every resparsification), with a CPU budget
    for env_name in args.envs:
        for seed in args.seeds:
            pols = {"K-UCB": KernelUCB(kernel, lam=lam, beta=0.1),
                    "EK-UCB": EKUCB(kernel, lam=lam, beta=0.1, kors_gamma=gammas[env_name])}
            for name, pol in pols.items():
                env = ENVS[env_name]()
                bar.set_postfix_str(f"{env_name} / {name} / seed {seed}")
                r = run(pol, env, horizon, seed, name, env_name, bar)
                r.save(out / "runs" / f"{env_name}__{name}__seed{seed}.json")
                res.setdefault((env_name, name), []).append(r)
                if name == "EK-UCB":
                    step = float(np.median(r.config["agent_cpu_seconds"][-max(horizon // 10, 1):]))
                    prod = dominant_product_seconds(pol, env.candidates())
                    overhead.setdefault(env_name, []).append((pol.model.m, step, prod))
    write_report(args, gammas, res, overhead, [], out)
    for env_name in args.envs:
        ek_cpu = float(np.mean([sum(r.config["agent_cpu_seconds"]) for r in res[(env_name, "EK-UCB")]]))
        budget = max(args.cbbkb_budget, 20.0 * ek_cpu)
        for seed in args.seeds:
            for cb in args.cbs:
                name = f"CBBKB(Cb={cb:g})"
                pol = CBBKB(kernel, lam=lam, beta=0.1, batch_threshold=cb)
                bar.set_postfix_str(f"{env_name} / {name} / seed {seed}")
                r = run(pol, ENVS[env_name](), horizon, seed, name, env_name, bar, budget=budget)
                r.save(out / "runs" / f"{env_name}__{name}__seed{seed}.json")
                res.setdefault((env_name, name), []).append(r)
    bar.close()
    print(write_report(args, gammas, res, overhead, args.cbs, out))
    return 0


def write_report(args: argparse.Namespace, gammas: dict[str, float],
                 res: dict[tuple[str, str], list[RunResult]],
                 overhead: dict[str, list[tuple[int, float, float]]], cbs: list[float], out: Path) -> str:
    """Markdown tables (``bench.md``) and numbers (``bench.json``) of the runs so far."""
    lam, horizon = args.lam, args.horizon

    def tot(rs: list[RunResult], upto: int | None = None, cpu: bool = True) -> float:
        key = (lambda r: r.config["agent_cpu_seconds"]) if cpu else (lambda r: r.agent_seconds)
        return float(np.mean([sum(key(r)[:upto]) for r in rs]))

    def reg(rs: list[RunResult]) -> tuple[float, float]:
        v = [r.final_regret for r in rs]
        return float(np.mean(v)), float(np.std(v))

    lines = [f"# EK-UCB benchmark (Zenati et al. 2022): λ = μ = {lam:g}, β = 0.1, T = {horizon}, "
             f"seeds {args.seeds}, KORS γ {', '.join(f'{e}={gammas[e]:g}' for e in args.envs)}", "",
             "## K-UCB vs EK-UCB (agent time = select + update; CPU = thread CPU time)", "",
             "| env | K-UCB regret | EK-UCB regret | regret ratio | K-UCB CPU s | EK-UCB CPU s | "
             "speed-up (CPU) | speed-up (wall) | EK-UCB m_T |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    summary: dict[str, dict] = {}
    for e in args.envs:
        k, ek = res[(e, "K-UCB")], res[(e, "EK-UCB")]
        (km, ks), (em, es) = reg(k), reg(ek)
        m_t = float(np.mean([r.diagnostics["dict_size"][-1] for r in ek]))
        sp_cpu, sp_wall = tot(k) / tot(ek), tot(k, cpu=False) / tot(ek, cpu=False)
        summary[e] = {"kucb_regret": km, "ekucb_regret": em, "kucb_cpu": tot(k), "ekucb_cpu": tot(ek),
                      "speedup_cpu": sp_cpu, "speedup_wall": sp_wall, "m": m_t}
        lines.append(f"| {e} | {km:.1f} ± {ks:.1f} | {em:.1f} ± {es:.1f} | {em / max(km, 1e-9):.2f} | "
                     f"{tot(k):.2f} | {tot(ek):.2f} | {sp_cpu:.1f}× | {sp_wall:.1f}× | {m_t:.0f} |")
    lines += ["", "## Scaling: K-UCB / EK-UCB time ratio at t (CPU; wall in parentheses)", "",
              "| env | " + " | ".join(f"t = {c}" for c in args.checkpoints) + " |",
              "|---|" + "---:|" * len(args.checkpoints)]
    for e in args.envs:
        k, ek = res[(e, "K-UCB")], res[(e, "EK-UCB")]
        cells = [f"{tot(k, c) / tot(ek, c):.1f}× ({tot(k, c, False) / tot(ek, c, False):.1f}×)"
                 for c in args.checkpoints]
        summary[e]["scaling_cpu"] = {c: tot(k, c) / tot(ek, c) for c in args.checkpoints}
        lines.append(f"| {e} | " + " | ".join(cells) + " |")
    if cbs:
        lines += ["", "## EK-UCB vs CBBKB (q̄ = 10·C_b)", "",
                  "CBBKB runs stop once they have used a CPU budget (max(--cbbkb-budget, 20 × EK-UCB's "
                  "time)): *steps* < T means the run was stopped there, and its time is a lower bound. "
                  "Regret is over the steps run.", "",
                  "| env | policy | steps | regret | CPU s | wall s | final m | resparsifications |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for e in args.envs:
            for name in ["EK-UCB"] + [f"CBBKB(Cb={cb:g})" for cb in cbs]:
                rs = res[(e, name)]
                mm, ss = reg(rs)
                m_t = float(np.mean([r.diagnostics["dict_size"][-1] for r in rs]))
                rsp = (f"{np.mean([r.diagnostics['resparsifications'][-1] for r in rs]):.0f}"
                       if "resparsifications" in rs[0].diagnostics else "–")
                steps = min(r.horizon for r in rs)
                lines.append(f"| {e} | {name} | {steps} | {mm:.1f} ± {ss:.1f} | {tot(rs):.2f} | "
                             f"{tot(rs, cpu=False):.2f} | {m_t:.0f} | {rsp} |")
                summary[e][f"{name}_cpu"] = tot(rs)
                summary[e][f"{name}_steps"] = steps
    lines += ["", "## EK-UCB overhead: per-step time at the end vs its dominant product alone", "",
              "| env | m_T | EK-UCB ms / step (CPU, median of last 10%) | "
              "L⁻¹ K_Z,cand alone (ms) | overhead ratio |", "|---|---:|---:|---:|---:|"]
    for e in args.envs:
        rows = overhead[e]
        m_t = np.mean([r[0] for r in rows])
        step, prod = float(np.mean([r[1] for r in rows])), float(np.mean([r[2] for r in rows]))
        summary[e]["overhead_ratio"] = step / max(prod, 1e-12)
        lines.append(f"| {e} | {m_t:.0f} | {_ms(step)} | {_ms(prod)} | {step / max(prod, 1e-12):.1f} |")
    text = "\n".join(lines) + "\n"
    (out / "bench.md").write_text(text)
    (out / "bench.json").write_text(json.dumps(summary, indent=2, default=str))
    return text


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
