"""ADA-OPKB on the switching kernel bandits of Hong, Li & Tewari (AISTATS 2023, §6): regret and
restarts over seeds.

Env 1 (one sign flip after round 3000) and Env 2 (flips after rounds 1500 and 5000), N = 100 arms
on the unit sphere of R¹⁰, RBF ℓ = 0.2, T = 10⁴, truncated N(0, 0.1²) noise. ADA-OPKB runs with
nature's kernel and the preset ``"aistats2023_code"`` (the released configuration) unless
``--preset`` / ``--set`` say otherwise. Reported per environment:

* final dynamic regret, mean ± standard deviation over the seeds;
* **early** restarts: restarts before the first switch (nothing has changed yet);
* **false alarms**: restarts more than ``--late`` (1000) rounds after the last switch (a late first
  detection counts too);
* **extra** restarts: after a switch, every restart that follows the first one (its detection)
  and comes before the next switch; **missed** switches; the median detection delay;
* restarts in all, process CPU seconds per run (environment included).

A restart "at s" is the round whose update triggered it (the new epoch starts at s + 1). The
environment seed is the run index; the policy seed is the same index.

    python benchmarks/bench_adaopkb.py                    # 10 seeds, T = 10 000 (≈ 1 min here)
    python benchmarks/bench_adaopkb.py --set test_full_block=True --set j_star=0
    python benchmarks/bench_adaopkb.py --quick            # N = 16, T = 600, 2 seeds (the tests)

Writes ``bench.json`` and ``bench.md`` to ``--out`` when given.
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
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ENVS: dict[str, tuple[int, ...]] = {"Env 1": (3000,), "Env 2": (1500, 5000)}


def _parse_value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``["j_star=0", "test_full_block=True"]`` → ``{"j_star": 0, "test_full_block": True}``."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects NAME=VALUE, got {item!r}")
        out[key.strip()] = _parse_value(value.strip())
    return out


def run_one(switches: tuple[int, ...], seed: int, horizon: int, n_arms: int, preset: str,
            overrides: dict[str, Any], noise: str = "truncated") -> dict[str, Any]:
    """One run through :func:`~torchbandits.experiments.runner.simulate`: final regret, restart
    rounds, agent seconds (``select`` + ``update``), the run's process CPU seconds, and the
    cumulative regret every ``T/20`` rounds (``curve``)."""
    from torchbandits.envs import SwitchingKernelEnv
    from torchbandits.experiments.runner import simulate
    from torchbandits.policies import ADAOPKB

    env = SwitchingKernelEnv(n_arms, 10, 0.2, switches=switches, noise=noise)
    policy = ADAOPKB(copy.deepcopy(env.kernel), horizon, preset=preset, seed=seed, **overrides)
    c0 = time.process_time()
    res = simulate(policy, env, horizon, seed, diagnostics_every=horizon)
    cpu = time.process_time() - c0
    every = max(1, horizon // 20)
    curve = [float(v) for v in res.cumulative_regret[every - 1::every]]
    return {"seed": seed, "regret": res.final_regret, "restarts": list(policy.restart_times),
            "agent_s": res.total_agent_seconds, "cpu_s": cpu, "curve_every": every, "curve": curve}


def classify(restarts: Sequence[int], switches: tuple[int, ...]) -> dict[str, list[int]]:
    """Sort one run's restart rounds: ``early`` (at or before the first switch), ``detections``
    (the first restart after each switch and before the next, as a delay in rounds; a switch with
    none is ``missed``), ``extra`` (every further restart after a detection)."""
    out: dict[str, list[int]] = {"early": [], "detections": [], "missed": [], "extra": []}
    bounds = [*switches, float("inf")]
    for i, s in enumerate(switches):
        inside = sorted(t for t in restarts if s < t <= bounds[i + 1])
        if inside:
            out["detections"].append(inside[0] - s)
            out["extra"].extend(inside[1:])
        else:
            out["missed"].append(s)
    out["early"] = [t for t in restarts if t <= switches[0]]
    return out


def summarise(runs: Sequence[dict[str, Any]], switches: tuple[int, ...], late: int) -> dict[str, Any]:
    """Mean ± sd regret and the restart counts (totals over the runs): ``early`` (before the first
    switch), ``false_alarms`` (``> late`` rounds after the last switch, whatever they are),
    ``extra`` (restarts after a switch that follow its first detection), ``missed`` switches, and
    the median detection delay."""
    regrets = [r["regret"] for r in runs]
    times = [t for r in runs for t in r["restarts"]]
    parts = [classify(r["restarts"], switches) for r in runs]
    delays = [d for p in parts for d in p["detections"]]
    return {
        "seeds": len(runs),
        "regret_mean": statistics.fmean(regrets),
        "regret_sd": statistics.stdev(regrets) if len(regrets) > 1 else 0.0,
        "restarts": len(times),
        "early": sum(len(p["early"]) for p in parts),
        "false_alarms": sum(1 for t in times if t > switches[-1] + late),
        "extra": sum(len(p["extra"]) for p in parts),
        "missed": sum(len(p["missed"]) for p in parts),
        "delay_median": statistics.median(delays) if delays else float("nan"),
        "cpu_s_median": statistics.median(r["cpu_s"] for r in runs),
    }


def table(summary: dict[str, dict[str, Any]], late: int) -> str:
    lines = ["| env | seeds | regret (mean ± sd) | restarts | before 1st switch | "
             f"> {late} after last switch | extra (after a detection) | missed switches | "
             "detection delay (median) | CPU s / run (median) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in summary.items():
        lines.append(f"| {name} | {s['seeds']} | {s['regret_mean']:.0f} ± {s['regret_sd']:.0f} | "
                     f"{s['restarts']} | {s['early']} | {s['false_alarms']} | {s['extra']} | "
                     f"{s['missed']} | {s['delay_median']:.0f} | {s['cpu_s_median']:.2f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N = 16, T = 600, 2 seeds")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--horizon", type=int, default=10_000)
    ap.add_argument("--preset", default="aistats2023_code")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="an OPConstants override (repeatable), e.g. j_star=0")
    ap.add_argument("--noise", default="truncated", choices=("truncated", "rejected", "gaussian"),
                    help="the environment's noise law")
    ap.add_argument("--late", type=int, default=1000,
                    help="a restart this many rounds after the last switch is a false alarm")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    n_arms, horizon, seeds = 100, args.horizon, args.seeds
    if args.quick:
        n_arms, horizon, seeds = 16, 600, min(seeds, 2)
    scale = horizon / 10_000
    overrides = parse_overrides(args.set)
    runs: dict[str, list[dict[str, Any]]] = {}
    summary: dict[str, dict[str, Any]] = {}
    for name, base in ENVS.items():
        switches = tuple(max(1, round(s * scale)) for s in base)
        late = max(1, round(args.late * scale))
        runs[name] = [run_one(switches, s, horizon, n_arms, args.preset, overrides, args.noise)
                      for s in range(seeds)]
        summary[name] = summarise(runs[name], switches, late)
        summary[name]["switches"] = list(switches)
    md = table(summary, args.late)
    print(f"ADA-OPKB, preset {args.preset!r}, overrides {overrides}, T = {horizon}, N = {n_arms}, "
          f"noise {args.noise!r}")
    print(md)
    for name, rs in runs.items():
        print(name, "restart rounds (first 8 per seed):", {r["seed"]: r["restarts"][:8] for r in rs})
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench.json").write_text(json.dumps(
            {"preset": args.preset, "overrides": overrides, "noise": args.noise, "horizon": horizon,
             "n_arms": n_arms, "summary": summary, "runs": runs}, indent=1))
        (args.out / "bench.md").write_text(md + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
