"""Per-step agent time and regret of BKB (Calandriello et al. 2019) against exact GP-UCB on a
fixed arm set.

Both policies play the same RKHS function (``RKHSFunctionEnv(fixed_arms=True)``, common random
numbers) **in lockstep**: each round, BKB's and GP-UCB's ``select`` + ``update`` are timed back to
back, so machine load hits both alike. Same β convention for both: a constant β on the **ridge**
sd ``sqrt(var_GP/λ)``, λ = ξ² = 0.01.

* GP-UCB = the foundation's incremental exact :class:`~torchbandits.policies.KernelUCB`, whose
  model caches the fixed candidate set: O(n·A) scoring + O(n²) append per round.
* "exact, no candidate cache" = the same model re-whitening the candidates every round,
  O(n²·A) (what the paper counts as GP-UCB's Ω(A t²) round); timed at the checkpoints only
  (``select`` does not change state).
* BKB: O((A + n_distinct) m² + m³) per round.

Reports the median ms/step over the 10% of rounds before each checkpoint, the ratios, final
regret (mean ± std over seeds) and the dictionary size; writes JSON + markdown to ``--out``.

    python benchmarks/bench_bkb.py            # A = 1000, d = 2, T = 2000, 5 seeds
    python benchmarks/bench_bkb.py --quick    # A = 200, T = 200, 1 seed (used by the tests)
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from torchbandits.envs.rkhs import RKHSFunctionEnv  # noqa: E402
from torchbandits.policies import BKB, KernelUCB  # noqa: E402


def _timed_step(policy, env, cand, means) -> tuple[float, float]:
    t0 = time.perf_counter()
    i = policy.select(cand)
    t1 = time.perf_counter()
    r = env.pull(i)
    t2 = time.perf_counter()
    policy.update(cand[i], r)
    t3 = time.perf_counter()
    return (t1 - t0) + (t3 - t2), float(means.max() - means[i])


def _uncached_ms(policy: KernelUCB, cand: torch.Tensor, repeats: int) -> tuple[float, float]:
    """Median ms of one exact round without the candidate cache (select; update adds O(n²)),
    and the max difference between the cached and the re-whitened scores (a correctness check).
    With ``cache_candidates`` off the model neither reads nor writes its cache, so the cache is
    still the one of the current data when it is switched back on (``select`` changes nothing)."""
    model = policy.model
    with torch.no_grad():
        cached = policy(cand)
    model.cache_candidates = False
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        policy.select(cand)
        times.append(time.perf_counter() - t0)
    with torch.no_grad():
        fresh = policy(cand)
    model.cache_candidates = True
    return 1e3 * statistics.median(times), float((cached - fresh).abs().max())


def run_seed(args: argparse.Namespace, seed: int, checkpoints: list[int]) -> dict:
    mk = dict(dim=args.dim, lengthscale=args.lengthscale, n_arms=args.arms, fixed_arms=True,
              noise_std=0.1, norm=1.0)
    env_b = RKHSFunctionEnv(args.kernel, **mk)
    env_g = RKHSFunctionEnv(args.kernel, **mk)
    env_b.reset(seed)
    env_g.reset(seed)
    bkb = BKB(copy.deepcopy(env_b.kernel), lam=0.01, noise_std=0.1, norm_bound=1.0, qbar=args.qbar,
              beta_rule="constant", beta=args.beta, seed=seed)
    gp = KernelUCB(copy.deepcopy(env_g.kernel), lam=0.01, beta=args.beta, variance="ridge", seed=seed)
    cand = env_b.candidates()
    means = env_b.mean_rewards()
    sec_b, sec_g, reg_b, reg_g, dsz = [], [], [], [], []
    uncached: dict[int, float] = {}
    score_diff: dict[int, float] = {}
    for t in tqdm(range(1, args.horizon + 1), desc=f"seed {seed}", leave=False,
                  disable=args.no_progress):
        s, r = _timed_step(bkb, env_b, cand, means)
        sec_b.append(s)
        reg_b.append(r)
        s, r = _timed_step(gp, env_g, cand, means)
        sec_g.append(s)
        reg_g.append(r)
        dsz.append(bkb.dictionary_size)
        if t in checkpoints and seed == 0 and not args.skip_uncached:
            uncached[t], score_diff[t] = _uncached_ms(gp, cand, args.uncached_repeats)
    return {"seed": seed, "bkb_seconds": sec_b, "gp_seconds": sec_g, "bkb_regret": reg_b,
            "gp_regret": reg_g, "dictionary_size": dsz, "m_theory": bkb.diagnostics()["m_theory"],
            "uncached_ms": uncached, "score_diff": score_diff}


def _window_ms(seconds: list[float], t: int) -> float:
    w = max(t // 10, 1)
    return 1e3 * float(np.median(seconds[t - w: t]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--arms", type=int, default=None)
    p.add_argument("--dim", type=int, default=2)
    p.add_argument("--kernel", default="rbf")
    p.add_argument("--lengthscale", type=float, default=0.2)
    p.add_argument("--horizon", type=int, default=None)
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--beta", type=float, default=0.3)
    p.add_argument("--qbar", type=float, default=5.0)
    p.add_argument("--uncached-repeats", type=int, default=3)
    p.add_argument("--skip-uncached", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--out", default="results/bench_bkb")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    args.arms = args.arms or (200 if args.quick else 1000)
    args.horizon = args.horizon or (200 if args.quick else 2000)
    n_seeds = args.seeds or (1 if args.quick else 5)
    T = args.horizon
    checkpoints = sorted({max(T // 8, 1), T // 4, T // 2, 3 * T // 4, T} - {0})
    runs = [run_seed(args, s, checkpoints) for s in range(n_seeds)]

    rows = []
    for t in checkpoints:
        b = statistics.mean(_window_ms(r["bkb_seconds"], t) for r in runs)
        g = statistics.mean(_window_ms(r["gp_seconds"], t) for r in runs)
        u = runs[0]["uncached_ms"].get(t, float("nan"))
        m = statistics.mean(r["dictionary_size"][t - 1] for r in runs)
        rows.append({"t": t, "bkb_ms": b, "gpucb_ms": g, "uncached_ms": u, "dictionary_size": m,
                     "gpucb_over_bkb": g / b, "uncached_over_bkb": u / b})
    reg_b = np.array([sum(r["bkb_regret"]) for r in runs])
    reg_g = np.array([sum(r["gp_regret"]) for r in runs])
    lines = [
        f"A = {args.arms}, d = {args.dim}, {args.kernel} ℓ = {args.lengthscale}, T = {T}, "
        f"{n_seeds} seed(s), q̄ = {args.qbar}, constant β = {args.beta} on the ridge sd (both), "
        "one thread; ms/step = median over the 10% of rounds before t (mean over seeds).",
        "",
        "| t | BKB ms/step | GP-UCB (incremental, cached arms) ms/step | exact, no arm cache ms/step "
        "| GP-UCB / BKB | no-cache / BKB | BKB dict. size |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['t']} | {r['bkb_ms']:.2f} | {r['gpucb_ms']:.2f} | {r['uncached_ms']:.1f} | "
                     f"{r['gpucb_over_bkb']:.2f} | {r['uncached_over_bkb']:.1f} | "
                     f"{r['dictionary_size']:.1f} |")
    lines += [
        "",
        "| policy | regret at T (mean ± std) | ratio to GP-UCB |",
        "|---|---:|---:|",
        f"| BKB | {reg_b.mean():.2f} ± {reg_b.std():.2f} | {reg_b.mean() / reg_g.mean():.3f} |",
        f"| GP-UCB | {reg_g.mean():.2f} ± {reg_g.std():.2f} | 1 |",
    ]
    table = "\n".join(lines)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_bkb.md").write_text("# BKB vs exact GP-UCB: per-step time\n\n" + table + "\n")
    (out / "bench_bkb.json").write_text(json.dumps({"args": vars(args), "rows": rows,
                                                    "regret_bkb": reg_b.tolist(),
                                                    "regret_gpucb": reg_g.tolist(), "runs": runs}))
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
