"""Soak benchmark: EK-UCB, BKB and SW-GP-UCB run for a long horizon (default T = 10⁵).

Along each run the script samples, at ``--samples`` evenly spaced rounds,

* the resident memory of the process (``/proc/self/statm``; ``resource.getrusage`` peak as a
  fallback off Linux), in MiB;
* the per-step agent time (``select`` + ``update``), as the median wall time and the mean process
  CPU time (``time.process_time``) of the steps of the block that ends at the sample;

and at the end compares the incremental posterior with one computed from scratch on the same data:

* EK-UCB (Zenati et al. 2022, Alg. 2) and BKB (Calandriello et al. 2019, Alg. 1): the Nyström
  posterior of the final dictionary ``Z`` (Zenati et al. 2022, Prop. 4.2) recomputed with explicit
  inverses from the stored points, counts and target sums (:func:`nystrom_posterior_reference`);
* SW-GP-UCB (Zhou & Shroff 2021, Alg. 2): the exact GP posterior of the last ``w`` observations by
  one fresh Cholesky factorisation (:func:`exact_posterior_reference`).

It writes ``soak.json`` (every sample, the final errors) and ``soak.png`` (memory and per-step time
against the round, one line per policy) into ``--out``. ``--quick`` runs ``T = 300`` (a test).
One thread is used (``torch.set_num_threads(1)`` and the BLAS variables, set by this script only).

Usage::

    python benchmarks/soak.py --horizon 100000 --out results/soak
    python benchmarks/soak.py --quick --out /tmp/soak
    python benchmarks/soak.py --merge a/soak.json b/soak.json --out results/soak
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from torchbandits.envs.contextual import BumpEnv, ChessboardEnv  # noqa: E402
from torchbandits.envs.rkhs import RKHSFunctionEnv  # noqa: E402
from torchbandits.envs.time_varying import RotatingRKHSEnv  # noqa: E402
from torchbandits.models.exact import exact_posterior_reference  # noqa: E402
from torchbandits.models.nystrom import nystrom_posterior_reference  # noqa: E402
from torchbandits.policies.bkb import BKB  # noqa: E402
from torchbandits.policies.ekucb import EKUCB  # noqa: E402
from torchbandits.policies.time_varying import SWGPUCB  # noqa: E402

POLICIES = ("ekucb", "bkb", "swgpucb")
_PAGE_MIB = (os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096) / 2**20


def rss_mib() -> float:
    """Resident set size of this process in MiB (current, from ``/proc/self/statm``; the peak
    from ``getrusage`` where ``/proc`` is absent)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * _PAGE_MIB
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 1024.0 if sys.platform != "darwin" else peak / 2**20


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _nystrom_check(p: Any, e: Any) -> dict:
    """EK-UCB / BKB: the incremental Nyström posterior on the final candidates against a
    from-scratch one in extended precision (``nystrom_posterior_reference(extended=True)``; the
    printed formula's explicit inverses are themselves off on an ill-conditioned ``K_ZZ``)."""
    m = p.model
    cand = e.candidates()
    mean, var = m.mean_var(cand)
    ref_m, ref_v = nystrom_posterior_reference(m.kernel, m.dictionary, m.x, m.target_sums,
                                               cand, m.lam, m.counts, extended=True)
    return {"mean_rel": _rel(mean, ref_m), "var_rel": _rel(var, ref_v), "m": m.m, "n": m.n}


def _make(name: str, horizon: int, window: int, ekucb_env: str = "chessboard"
          ) -> tuple[Any, Any, Callable[[Any, Any], dict]]:
    """(policy, environment, check) of one soak run; ``check(policy, env)`` returns the relative
    differences of the incremental posterior from a from-scratch one on the final candidates."""
    if name == "ekucb":
        # Chessboard (d_x = 1): the dictionary saturates (m ≈ 44), so a flat step time and memory
        # are what a leak-free implementation must show; on Bump (d_x = 5, a 6-D joint RBF with
        # ℓ = 0.1) m grows about t/8 and a step costs O(A m²) by design (docs/soak.md)
        env = ChessboardEnv() if ekucb_env == "chessboard" else BumpEnv()
        pol = EKUCB(env.kernel, lam=10.0, beta=0.1, kors_gamma=1.0)

        return pol, env, _nystrom_check
    if name == "bkb":
        env = RKHSFunctionEnv("rbf", dim=2, lengthscale=0.5, n_arms=100, fixed_arms=True)
        pol = BKB(env.kernel, noise_std=env.noise_std, norm_bound=env.norm,
                  beta_rule="constant", beta=0.3)

        return pol, env, _nystrom_check
    if name == "swgpucb":
        env = RotatingRKHSEnv("rbf", dim=1, lengthscale=0.1, horizon=max(horizon, 2), budget=5.0)
        pol = SWGPUCB(env.kernel, lam=env.noise_std**2, window=window, beta=2.0)

        def check(p: SWGPUCB, e: Any) -> dict:
            m = p.model
            cand = e.candidates()
            mean, var = m.mean_var(cand)
            ref_m, ref_v = exact_posterior_reference(m.kernel, m.x, m.y, cand, m.lam)
            return {"mean_rel": _rel(mean, ref_m), "var_rel": _rel(var, ref_v), "n": m.n}

        return pol, env, check
    raise ValueError(f"unknown policy {name!r}; choose from {POLICIES}")


def soak(name: str, horizon: int, samples: int, window: int, seed: int = 0,
         progress: Callable[[dict], None] | None = None, ekucb_env: str = "chessboard") -> dict:
    """Run one policy for ``horizon`` rounds; return its samples and final check.
    ``progress(partial)`` is called at every sample with the samples so far (``final`` absent)."""
    pol, env, check = _make(name, horizon, window, ekucb_env)
    env.reset(seed)
    pol.reset(seed=seed)
    every = max(horizon // samples, 1)
    rounds, rss, wall_ms, cpu_ms, size = [], [], [], [], []
    block_wall: list[float] = []
    block_cpu0 = time.process_time()
    start = time.perf_counter()
    rss0 = rss_mib()
    for t in range(1, horizon + 1):
        cand = env.candidates()
        t0 = time.perf_counter()
        i = pol.select(cand)
        x = cand[i]
        t1 = time.perf_counter()
        r = env.pull(i)
        t2 = time.perf_counter()
        pol.update(x, r)
        t3 = time.perf_counter()
        block_wall.append((t1 - t0) + (t3 - t2))
        if t % every == 0 or t == horizon:
            cpu = time.process_time()
            rounds.append(t)
            rss.append(rss_mib())
            wall_ms.append(1e3 * statistics.median(block_wall))
            cpu_ms.append(1e3 * (cpu - block_cpu0) / len(block_wall))  # includes the env's share
            model = pol.model
            size.append(int(model.m if hasattr(model, "m") else model.n))  # dictionary / window
            block_wall, block_cpu0 = [], cpu
            if progress is not None:
                progress({"policy": name, "horizon": horizon, "rounds": rounds, "rss_mib": rss,
                          "step_ms_median": wall_ms, "step_cpu_ms_mean": cpu_ms, "model_size": size,
                          "rss_start_mib": rss0, "seconds": time.perf_counter() - start})
    total = time.perf_counter() - start
    final = check(pol, env)
    return {"policy": name, "horizon": horizon, "rounds": rounds, "rss_mib": rss,
            "step_ms_median": wall_ms, "step_cpu_ms_mean": cpu_ms, "model_size": size,
            "rss_start_mib": rss0,
            "seconds": total, "final": final, "diagnostics": pol.diagnostics(),
            "env": type(env).__name__}


def plot(results: list[dict], path: Path) -> None:
    """Memory and per-step time against the round, on an explicit Figure (no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4))
    FigureCanvasAgg(fig)
    ax_mem, ax_time = fig.subplots(1, 2)
    for res in results:
        ax_mem.plot(res["rounds"], res["rss_mib"], label=res["policy"])
        ax_time.plot(res["rounds"], res["step_cpu_ms_mean"], label=res["policy"])
    ax_mem.set(xlabel="round t", ylabel="resident memory (MiB)", title="Resident memory")
    ax_mem.ticklabel_format(axis="y", useOffset=False, style="plain")
    ax_time.set(xlabel="round t", ylabel="process CPU time per step (ms)",
                title="Per-step CPU time (policy + environment)", yscale="log")
    for ax in (ax_mem, ax_time):
        ax.legend()
        ax.grid(alpha=0.3)
    horizon = max(r["horizon"] for r in results)
    fig.suptitle(f"Soak runs to T = {horizon} (1 thread per run)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_json(obj: Any, path: Path) -> None:
    """Write ``obj`` as JSON atomically (temporary file in the same folder, then rename)."""
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as fh:
        json.dump(obj, fh, indent=1)
    os.replace(fh.name, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--horizon", type=int, default=100_000, help="rounds T (default 1e5)")
    ap.add_argument("--quick", action="store_true", help="T = 300 (a smoke test)")
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    ap.add_argument("--samples", type=int, default=100, help="memory/time samples per run")
    ap.add_argument("--window", type=int, default=500, help="SW-GP-UCB window w")
    ap.add_argument("--ekucb-env", choices=("chessboard", "bump"), default="chessboard",
                    help="EK-UCB's environment (Chessboard: bounded dictionary; Bump: grows)")
    ap.add_argument("--out", type=Path, default=Path("results/soak"))
    ap.add_argument("--merge", type=Path, nargs="+", default=None, metavar="SOAK_JSON",
                    help="combine the results of earlier runs (e.g. one process per policy) into "
                         "--out/soak.json and soak.png instead of running")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    horizon = 300 if args.quick else int(args.horizon)
    if horizon < 1:
        ap.error("--horizon must be >= 1")
    args.out.mkdir(parents=True, exist_ok=True)
    results: list[dict] = []
    if args.merge:
        for path in args.merge:
            results += json.loads(path.read_text())["results"]
        write_json({"horizon": max(r["horizon"] for r in results), "threads": 1,
                    "results": results}, args.out / "soak.json")
        plot(results, args.out / "soak.png")
        return 0
    for name in args.policies:
        def partial(res: dict) -> None:
            # an interrupted soak still leaves its samples (soak_partial.json, atomic writes)
            write_json({"horizon": horizon, "threads": 1, "results": [*results, res]},
                       args.out / "soak_partial.json")

        res = soak(name, horizon, args.samples, args.window, progress=partial,
                   ekucb_env=args.ekucb_env)
        results.append(res)
        fin = res["final"]
        print(f"{name:8s} T={horizon} {res['seconds']:.1f}s  rss {res['rss_mib'][0]:.0f}→"
              f"{res['rss_mib'][-1]:.0f} MiB  step {res['step_ms_median'][0]:.3f}→"
              f"{res['step_ms_median'][-1]:.3f} ms  mean rel err {fin['mean_rel']:.2e}  "
              f"var rel err {fin['var_rel']:.2e}", flush=True)
        write_json({"horizon": horizon, "threads": 1, "results": results}, args.out / "soak.json")
    plot(results, args.out / "soak.png")
    bad = [r["policy"] for r in results
           if not (math.isfinite(r["final"]["mean_rel"]) and r["final"]["mean_rel"] < 1e-6
                   and r["final"]["var_rel"] < 1e-6)]
    if bad:
        print(f"incremental posterior differs from scratch for {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
