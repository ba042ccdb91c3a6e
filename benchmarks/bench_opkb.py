"""Benchmark of Hong, Li & Tewari (2023): OP solves (their Algorithm 1), one ADA-OPKB run, one
ADA-OPNN run.

    python benchmarks/bench_opkb.py                 # OP solves (N = 100, 256) + ADA-OPKB run
    python benchmarks/bench_opkb.py --opnn          # + one ADA-OPNN run at m = 2048, L = 3 (minutes)
    python benchmarks/bench_opkb.py --quick         # seconds (N = 20, 40; T = 1000; no OPNN)

1. **OP** on the Env-1 instance (their Section 6: sphere arms in R¹⁰, RBF ℓ = 0.2, σ/T = 0.01), with
   the empirical gaps of the true reward vector and the ``aistats2023_code`` β_j of block 4:
   barrier-Newton median over ``--repeats`` cold solves (and warm-started solves), its KKT
   (Frank–Wolfe) gap, and CVXPY (Clarabel) on the same problem, once, for ``N ≤ --cvxpy-max-n``
   (Clarabel needs minutes at N = 100). The same for the optimal design π(X).
2. **ADA-OPKB**: one run on Env 1, T = 10 000, N = 100 — agent seconds (select + update).
3. **ADA-OPNN** (``--opnn``): one run on Env 1 at the paper's width (m = 2048, three square
   layers), in a child process — agent seconds and the child's peak resident memory.

Threads are pinned to one (``--threads``). Agent times are wall clock (select + update); the runs
also report their process CPU time, which is what to compare on a loaded machine. Writes
``bench.md`` and ``bench.json`` to ``--out``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from torchbandits.design import information_gain, solve_logdet_program  # noqa: E402
from torchbandits.envs.nonstationary import SwitchingKernelEnv  # noqa: E402
from torchbandits.experiments import simulate  # noqa: E402
from torchbandits.models.features import kernel_features  # noqa: E402
from torchbandits.policies.op_presets import op_preset  # noqa: E402
from torchbandits.policies.opkb import ADAOPKB  # noqa: E402
from torchbandits.policies.opnn import ADAOPNN  # noqa: E402

SIGMA, HORIZON = 100.0, 10_000


def op_problem(n: int, seed: int = 0):
    env = SwitchingKernelEnv(n_arms=n, dim=10, lengthscale=0.2, seed=seed)
    phi = kernel_features(env.kernel, env.arms)
    lam = SIGMA / HORIZON
    gamma_paper = information_gain(phi, HORIZON, SIGMA)
    c = op_preset("aistats2023_code")
    d = c.derived(gamma_paper, HORIZON, n)
    beta = c.beta(4, d["gamma"], d["alpha"])
    r = env.means_at(0)
    return phi, (r.max() - r), 2.0 / beta, lam


def bench_op(n: int, repeats: int, cvxpy_max_n: int) -> dict:
    phi, gaps, weight, lam = op_problem(n)
    out: dict = {"N": n, "weight_2_over_beta": weight}
    for name, c, w in (("OP", gaps, weight), ("design", torch.zeros_like(gaps), 1.0)):
        times, cpu_times, warm_times, gaps_kkt, steps = [], [], [], [], []
        sol = None
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            sol = solve_logdet_program(phi, c, w, lam)
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)
            gaps_kkt.append(sol.certificate.gap)
            steps.append(sol.newton_steps)
        for k in range(repeats):   # warm start from a nearby problem (gaps perturbed by 1%)
            prev = solve_logdet_program(phi, c * (1.0 + 0.01 * (k + 1)), w, lam).p
            t0 = time.perf_counter()
            solve_logdet_program(phi, c, w, lam, warm_start=prev)
            warm_times.append(time.perf_counter() - t0)
        row = {"newton_median_s": statistics.median(times),
               "newton_cpu_median_s": statistics.median(cpu_times), "newton_warm_median_s":
               statistics.median(warm_times), "kkt_gap_max": max(gaps_kkt),
               "newton_steps_median": statistics.median(steps), "objective": sol.certificate.objective}
        if n <= cvxpy_max_n:
            t0, c0 = time.perf_counter(), time.process_time()
            ref = solve_logdet_program(phi, c, w, lam, solver="cvxpy")
            row["cvxpy_s"] = time.perf_counter() - t0
            row["cvxpy_cpu_s"] = time.process_time() - c0
            row["cvxpy_kkt_gap"] = ref.certificate.gap
            row["objective_rel_diff"] = abs(ref.certificate.objective - sol.certificate.objective) / max(
                1.0, abs(ref.certificate.objective))
        out[name] = row
    return out


def bench_adaopkb(horizon: int, n: int) -> dict:
    env = SwitchingKernelEnv(n_arms=n, dim=10, lengthscale=0.2, switches=(round(0.3 * horizon),))
    pol = ADAOPKB(copy.deepcopy(env.kernel), horizon)
    c0 = time.process_time()
    res = simulate(pol, env, horizon, seed=0, diagnostics_every=0)
    return {"T": horizon, "N": n, "agent_seconds": res.total_agent_seconds,
            "run_cpu_seconds": time.process_time() - c0,
            "solver_seconds": pol.solver_seconds, "solves": pol.n_solves, "E": pol.E,
            "gamma_T": pol.gamma_paper, "restarts": pol.restart_times,
            "final_regret": res.final_regret}


def child_opnn(horizon: int, width: int, n: int) -> None:
    env = SwitchingKernelEnv(n_arms=n, dim=10, lengthscale=0.2, switches=(round(0.3 * horizon),))
    pol = ADAOPNN(horizon, width=width, n_square_layers=3)
    c0 = time.process_time()   # the runner times the agent and the loop's wall; this the CPU
    res = simulate(pol, env, horizon, seed=0, diagnostics_every=0)
    wall, cpu = res.config["wall_seconds"], time.process_time() - c0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"T": horizon, "N": n, "width": width, "n_params": pol.network.n_params,
                      "agent_seconds": res.total_agent_seconds, "wall_seconds": wall,
                      "run_cpu_seconds": cpu,
                      "train_seconds": pol.train_seconds, "trains": pol.n_trains,
                      "solver_seconds": pol.solver_seconds, "restarts": pol.restart_times,
                      "E": pol.E, "gamma_T": pol.gamma_paper, "final_regret": res.final_regret,
                      "peak_rss_mb": peak_mb}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="OP, ADA-OPKB and ADA-OPNN benchmark (Hong, Li & Tewari 2023)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--opnn", action="store_true", help="also one ADA-OPNN run at m = 2048")
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cvxpy-max-n", type=int, default=100)
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 256])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="results/opkb_bench")
    p.add_argument("--child-opnn", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--horizon", type=int, default=HORIZON)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.child_opnn:
        child_opnn(args.horizon, args.width, 100)
        return 0
    sizes, horizon, repeats = args.sizes, args.horizon, args.repeats
    if args.quick:
        sizes, horizon, repeats = [20, 40], 1000, 2
    report: dict = {"threads": args.threads, "op": [bench_op(n, repeats, args.cvxpy_max_n) for n in sizes]}
    report["adaopkb"] = bench_adaopkb(horizon, 100)
    if args.opnn and not args.quick:
        cmd = [sys.executable, __file__, "--child-opnn", "--width", str(args.width), "--horizon",
               str(horizon), "--threads", str(args.threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        report["adaopnn"] = json.loads(proc.stdout.strip().splitlines()[-1])
    lines = ["| program | N | Newton median wall (s) | Newton median CPU (s) | warm median wall (s) | "
             "Newton steps | KKT gap (max) | CVXPY wall (s) | CVXPY CPU (s) | CVXPY KKT gap | "
             "rel. objective diff |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in report["op"]:
        for name in ("OP", "design"):
            r = row[name]
            cv = f"{r['cvxpy_s']:.2f} | {r['cvxpy_cpu_s']:.2f}" if "cvxpy_s" in r else "not run | —"
            cg = f"{r['cvxpy_kkt_gap']:.1e}" if "cvxpy_kkt_gap" in r else "—"
            rd = f"{r['objective_rel_diff']:.1e}" if "objective_rel_diff" in r else "—"
            lines.append(f"| {name} | {row['N']} | {r['newton_median_s']:.4f} | "
                         f"{r['newton_cpu_median_s']:.4f} | {r['newton_warm_median_s']:.4f} | "
                         f"{r['newton_steps_median']:.0f} | "
                         f"{r['kkt_gap_max']:.1e} | {cv} | {cg} | {rd} |")
    a = report["adaopkb"]
    lines += ["", f"ADA-OPKB, T = {a['T']}, N = {a['N']}: agent {a['agent_seconds']:.2f} s wall "
              f"(whole run {a['run_cpu_seconds']:.2f} s CPU) "
              f"(solver {a['solver_seconds']:.2f} s, {a['solves']} solves), E = {a['E']}, "
              f"γ_T = {a['gamma_T']:.1f}, restarts at {a['restarts']}"]
    if "adaopnn" in report:
        o = report["adaopnn"]
        lines.append(f"ADA-OPNN, T = {o['T']}, m = {o['width']} ({o['n_params']} parameters): agent "
                     f"{o['agent_seconds']:.1f} s wall, whole run {o['run_cpu_seconds']:.1f} s CPU "
                     f"(training {o['train_seconds']:.1f} s over "
                     f"{o['trains']} retrains), peak RSS {o['peak_rss_mb']:.0f} MB, restarts at "
                     f"{o['restarts']}")
    text = "\n".join(lines)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.md").write_text(text + "\n")
    (out / "bench.json").write_text(json.dumps(report, indent=2, default=float))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
