"""Per-step agent time of SW-GP-UCB (Zhou & Shroff 2021, Algorithm 2) vs t at a fixed window w.

Four policies play the same fixed arm set **in lockstep** (each round their ``select`` + ``update``
are timed back to back, so machine load hits all alike), fed the same rewards (noisy values of a
random RKHS function at the action SW-GP-UCB chose — timing only, not regret):

* ``SW carry``      — :class:`~torchbandits.policies.time_varying.SWGPUCB` (default): Cholesky
  rank-one removal of the oldest point, O(w²), and the candidate cache ``L⁻¹K_SC`` carried
  through it in O(wA) (:class:`~torchbandits.models.window.SlidingWindowKernelRidge`);
* ``SW remove``     — the same with the plain :class:`ExactKernelRidge`: rank-one removal, cache
  re-solved, O(w²A);
* ``SW refactorise`` — the window refactorised from scratch after every removal, O(w³ + w²A)
  (``SWGPUCB(model=ExactKernelRidge(kernel, lam, removal="refactorise"))``, the baseline);
* ``GP-UCB``        — all data, no window (O(tA + t²) per round: grows with t).

Reports the median ms/step over blocks of rounds (so the curve vs t is visible), the ratios to
``SW carry`` in the same run, and writes ``bench.json``, ``bench.md`` and ``time_vs_t.png``.

    python benchmarks/bench_tvbo.py            # T = 1500, w ∈ {100, 400, 1000}, A = 200
    python benchmarks/bench_tvbo.py --quick    # T = 120, w = 30, A = 50 (used by the tests)
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

from torchbandits.envs.time_varying import StationaryRKHSEnv  # noqa: E402
from torchbandits.experiments.figures import AGENT_MS, figure_grid, mark_times, save_figure  # noqa: E402
from torchbandits.models import ExactKernelRidge  # noqa: E402
from torchbandits.policies.time_varying import RGPUCB, SWGPUCB  # noqa: E402


def _policies(kernel, lam: float, window: int) -> dict:
    refactorising = ExactKernelRidge(kernel, lam, removal="refactorise")  # O(w³) per removal
    return {
        "SW carry": SWGPUCB(kernel, lam, window, 1.0, carry_cache=True, tie_break="first"),
        "SW remove": SWGPUCB(kernel, lam, window, 1.0, carry_cache=False, tie_break="first"),
        "SW refactorise": SWGPUCB(kernel, lam, window, 1.0, tie_break="first", model=refactorising),
        "GP-UCB": RGPUCB(kernel, lam, None, 1.0, tie_break="first"),
    }


def run(horizon: int, window: int, n_arms: int, lam: float, seed: int = 0) -> dict:
    env = StationaryRKHSEnv(horizon=max(horizon, 2), n_arms=n_arms, lengthscale=0.1)
    env.reset(seed)
    cand = env.candidates()
    pols = _policies(env.kernel, lam, window)
    times: dict[str, list[float]] = {k: [] for k in pols}
    gen = torch.Generator().manual_seed(seed)
    max_gap = 0.0
    for t in range(horizon):
        idx = None
        for name, pol in pols.items():
            t0 = time.perf_counter()
            i = pol.select(cand)
            t1 = time.perf_counter()
            if idx is None:
                idx = i
                y = float(env.mean_rewards()[idx]) + 0.1 * float(torch.randn((), generator=gen,
                                                                             dtype=torch.float64))
            t2 = time.perf_counter()
            pol.update(cand[idx], y)
            times[name].append((t1 - t0) + (time.perf_counter() - t2))
        if t % 50 == 49:  # the three windowed posteriors agree
            ref = pols["SW refactorise"](cand)
            max_gap = max(max_gap, float((pols["SW carry"](cand) - ref).abs().max()),
                          float((pols["SW remove"](cand) - ref).abs().max()))
    n_blocks = 10
    size = max(horizon // n_blocks, 1)
    blocks = [(b * size, min((b + 1) * size, horizon)) for b in range(n_blocks) if b * size < horizon]
    med = {k: [1e3 * statistics.median(v[a:b]) for a, b in blocks] for k, v in times.items()}
    full = [i for i, (a, _) in enumerate(blocks) if a >= window]
    after = {k: statistics.median([v[i] for i in full]) if full else float("nan") for k, v in med.items()}
    return {"horizon": horizon, "window": window, "n_arms": n_arms, "lam": lam,
            "block_starts": [a for a, _ in blocks], "median_ms": med, "median_ms_full_window": after,
            "max_score_gap": max_gap}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--horizon", type=int, default=None)
    parser.add_argument("--windows", type=int, nargs="+", default=None)
    parser.add_argument("--arms", type=int, default=None)
    parser.add_argument("--lam", type=float, default=0.1)
    parser.add_argument("--out", default="results/bench_tvbo")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    T = args.horizon or (120 if args.quick else 1500)
    windows = args.windows or ([30] if args.quick else [100, 400, 1000])
    arms = args.arms or (50 if args.quick else 200)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = [run(T, w, arms, args.lam) for w in windows]
    lines = [f"# SW-GP-UCB per-step agent time (ms, median), T = {T}, A = {arms}, λ = {args.lam}", "",
             "| w | policy | first block | last block | median once the window is full | × SW carry |",
             "|---:|---|---:|---:|---:|---:|"]
    for r in results:
        base = r["median_ms_full_window"]["SW carry"]
        for name, ms in r["median_ms"].items():
            full = r["median_ms_full_window"][name]
            lines.append(f"| {r['window']} | {name} | {ms[0]:.3f} | {ms[-1]:.3f} | {full:.3f} | "
                         f"{full / base:.2f} |")
    lines.append("")
    lines.append("max |score difference| between the windowed posteriors: "
                 + ", ".join(f"w={r['window']}: {r['max_score_gap']:.1e}" for r in results))
    table = "\n".join(lines)
    (out / "bench.md").write_text(table + "\n")
    (out / "bench.json").write_text(json.dumps(results, indent=2))
    fig, axes = figure_grid(1, len(results), figsize=(5.2 * len(results), 4.6), squeeze=False)
    for ax, r in zip(axes[0], results):
        for name, ms in r["median_ms"].items():
            ax.plot(r["block_starts"], ms, marker="o", label=name)
        mark_times(ax, [r["window"]], "window full (t = w)")
        ax.set_yscale("log")
        ax.set_xlabel("round t (start of a block of T/10 rounds)")
        ax.set_ylabel(AGENT_MS + ", block median")
        ax.set_title(f"w = {r['window']}, A = {r['n_arms']}")
    save_figure(fig, out / "time_vs_t.png", ncol=3,
                title=f"SW-GP-UCB per-round agent time — stationary RKHS function, d = 1, T = {T}, "
                      f"A = {arms}, λ = {args.lam:g}, one seed, one thread")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
