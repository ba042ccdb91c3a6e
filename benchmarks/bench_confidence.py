"""Time per step of the policies of Flynn & Reeb (2024): CMM, DMM, AMM-UCB, AY-GP-UCB, IGP-UCB.

Matérn-5/2, ℓ = 0.5, d = 3, 100 fresh candidates per step, ``c = default_c(kernel, 3, 1000)``.
For each t every policy is first fed the same t − 1 observations (untimed); then ``--repeats``
steps (``select`` on a fresh candidate set + ``update``) are timed, the methods interleaved
round-robin. Time is the **CPU time of the process** (``time.process_time``; ``--clock wall``
for wall-clock): on a loaded shared machine a wall-clock step is often pre-empted for a whole
scheduler slice (~20 ms), which says nothing about the method. The mean over the repeats is
reported (32 consecutive steps: it includes CMM's periodic ``eigh`` refresh, see
``confidence/cmm_border.py``), with the median and the best. One thread, every method timed in the
same run:

* CMM by the 1-D dual vs CMM by the CVXPY SOCP (target at t = 200: ≥ 100× faster);
* CMM dual vs AMM (target: within 10× at every t); DMM vs AMM (target: within 5×).

``python benchmarks/bench_confidence.py [--quick] [--ts 50 100 200 1000] [--out results/bench_confidence]``
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from torchbandits.envs.rkhs import RKHSFunctionEnv  # noqa: E402
from torchbandits.reproduce.cmm import make_policies  # noqa: E402

METHODS = ("AMM", "AY", "IGP", "DMM", "CMM", "CMM-SOCP")


def prefill(policy, env: RKHSFunctionEnv, t: int, seed: int):
    """Feed ``t − 1`` observations (untimed), the same for every method."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(t - 1, env.dim, generator=gen, dtype=torch.float64)
    y = env.f(x) + env.noise_std * torch.randn(t - 1, generator=gen, dtype=torch.float64)
    policy.reset(seed=0)
    for xi, yi in zip(x, y):
        policy.update(xi, float(yi))
    return policy


def step_seconds(policy, env: RKHSFunctionEnv, cand: torch.Tensor, clock=time.process_time) -> float:
    """One step: ``select`` on ``cand`` + ``update`` with the noiseless reward (reward computed
    outside the timed region)."""
    means = env.f(cand)  # untimed: the environment's side of the step
    t0 = clock()
    i = policy.select(cand)
    reward = means[i]
    policy.update(cand[i], reward)
    return clock() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ts", type=int, nargs="+", default=[50, 100, 200, 1000])
    p.add_argument("--repeats", type=int, default=32)
    p.add_argument("--socp-repeats", type=int, default=3)
    p.add_argument("--socp-max-t", type=int, default=200, help="skip CMM-SOCP above this t (too slow)")
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="results/bench_confidence")
    args = p.parse_args(argv)
    if args.quick:
        args.ts, args.repeats, args.socp_repeats, args.socp_max_t = [20, 50], 3, 1, 20
    torch.set_num_threads(1)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    env = RKHSFunctionEnv("matern52", 3, 0.5)
    env.reset(0)
    factories = make_policies("matern52", 0.5, 3, 1000, methods=METHODS)
    ms: dict[str, dict[int, float]] = {m: {} for m in METHODS}
    med: dict[str, dict[int, float]] = {m: {} for m in METHODS}
    for t in args.ts:
        # every method on the same data; steps interleaved round-robin so that load changes on a
        # shared machine hit all methods alike
        methods = [m for m in METHODS if not (m == "CMM-SOCP" and t > args.socp_max_t)]
        pols = {m: prefill(factories[m](), env, t, seed=t) for m in methods}
        times: dict[str, list[float]] = {m: [] for m in methods}
        gen = torch.Generator().manual_seed(10_000 + t)
        for r in range(args.repeats):
            cand = torch.rand(100, env.dim, generator=gen, dtype=torch.float64)
            for m in methods:
                if m == "CMM-SOCP" and r >= args.socp_repeats:
                    continue
                times[m].append(step_seconds(pols[m], env, cand, clock))
        for m in methods:
            ms[m][t] = 1e3 * statistics.fmean(times[m])
            med[m][t] = 1e3 * statistics.median(times[m])
            print(f"t={t:5d} {m:9s} {ms[m][t]:10.2f} ms/step (mean of {len(times[m])}), "
                  f"median {med[m][t]:.2f}, best {1e3 * min(times[m]):.2f}", flush=True)

    def cell(m: str, t: int) -> str:
        return f"{ms[m][t]:.2f}" if t in ms[m] else "—"

    lines = ["| method | " + " | ".join(f"t={t}" for t in args.ts) + " |",
             "|---|" + "---:|" * len(args.ts)]
    lines += [f"| {m} (ms/step) | " + " | ".join(cell(m, t) for t in args.ts) + " |" for m in METHODS]

    def ratio(a: str, b: str, t: int) -> str:
        return f"{ms[a][t] / ms[b][t]:.1f}×" if t in ms[a] and t in ms[b] else "—"

    lines.append("| CMM dual / AMM | " + " | ".join(ratio("CMM", "AMM", t) for t in args.ts) + " |")
    lines.append("| DMM / AMM | " + " | ".join(ratio("DMM", "AMM", t) for t in args.ts) + " |")
    lines.append("| CMM SOCP / CMM dual | " + " | ".join(ratio("CMM-SOCP", "CMM", t) for t in args.ts) + " |")
    table = "\n".join(lines)
    print("\n" + table)
    checks = {
        "socp_over_dual_at_200": (ms["CMM-SOCP"][200] / ms["CMM"][200]
                                  if 200 in ms["CMM-SOCP"] and 200 in ms["CMM"] else None),
        "cmm_over_amm_max": max(ms["CMM"][t] / ms["AMM"][t] for t in args.ts),
        "dmm_over_amm_max": max(ms["DMM"][t] / ms["AMM"][t] for t in args.ts),
    }
    print("\nchecks:", json.dumps(checks))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table + "\n")
    (out / "bench.json").write_text(json.dumps({"mean_ms_per_step": ms, "median_ms_per_step": med,
                                                "checks": checks}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
