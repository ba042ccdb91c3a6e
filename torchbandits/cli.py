"""The ``torchbandits`` command: ``list``, ``run``, ``plot``, ``reproduce``, ``sweep``.

Examples::

    torchbandits list
    torchbandits run --env rkhs --policy kucb,gpucb,random --horizon 300 --seeds 0 1 2 \\
        --set env.dim=2 --out results/demo
    torchbandits run --env rkhs --policy kucb --set kucb.beta=0.5 --out results/beta
    torchbandits run --env rkhs --policy random --seeds 0 1 2 3 --batch on --out results/batch
    torchbandits plot results/demo
    torchbandits reproduce NAME --quick
    torchbandits reproduce NAME --help
    torchbandits sweep examples/sweeps/quick.yaml --out results/sweep [--resume]
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["count_arg", "main"]


def count_arg(text: str, minimum: int = 0) -> int:
    """An ``argparse`` type for a thread count: an int >= ``minimum`` (0: leave the setting as it
    is, where 0 is allowed)."""
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected an int >= {minimum}, got {text!r}")
    return value


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _parse_sets(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``["env.dim=2", "kucb.lam=0.1"]`` → ``{"env": {"dim": 2}, "kucb": {"lam": 0.1}}``."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        scope, dot, name = key.partition(".")
        if not sep or not dot or not name:
            raise SystemExit(f"--set expects SCOPE.NAME=VALUE (e.g. env.dim=2), got {item!r}")
        out.setdefault(scope, {})[name] = _parse_value(value)
    return out


def _accepts(fn: Any, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _cmd_list(args: argparse.Namespace) -> int:
    from .experiments.registry import ENVIRONMENTS, POLICIES
    from .reproduce import REPRODUCTIONS

    for title, table in (("environments", ENVIRONMENTS), ("policies", POLICIES),
                         ("reproductions", REPRODUCTIONS)):
        print(f"{title}:")
        if not table:
            print("  (none yet)")
        width = max((len(k) for k in table), default=0)
        for name, entry in table.items():
            print(f"  {name.ljust(width)}  {entry.description}")
    return 0


def _bad_set(name: str, scope: str, given: dict[str, Any], err: Exception) -> int:
    """Print one line naming the offending ``--set`` key(s) and the reason; return 2."""
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    named = [k for k in given if k in text]
    keys = named or list(given)
    where = ", ".join(f"{scope}.{k}={json.dumps(given[k])}" for k in keys) or f"{name} defaults"
    print(f"torchbandits run: error: --set {where}: {text}", file=sys.stderr)
    return 2


def _cmd_run(args: argparse.Namespace) -> int:
    import torch

    from .experiments.batch import run_grid_batched
    from .experiments.registry import ENVIRONMENTS, POLICIES, make_env, make_policy, resolve
    from .experiments.report import write_report

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda requested but CUDA is not available on this machine")
    from .native import use_threads

    use_threads(args.threads, args.run_threads)
    sets = _parse_sets(args.set)
    env_names = [e for e in args.env.split(",") if e]
    pol_names = [p for p in args.policy.split(",") if p]
    for e in env_names:
        if e not in ENVIRONMENTS:
            raise SystemExit(f"unknown environment {e!r}; see `torchbandits list`")
    for p in pol_names:
        if p not in POLICIES:
            raise SystemExit(f"unknown policy {p!r}; see `torchbandits list`")
    unknown = set(sets) - {"env", *pol_names}
    if unknown:
        raise SystemExit(f"--set scopes {sorted(unknown)} match no policy or 'env'")

    def env_factory(name: str):
        kwargs = dict(sets.get("env", {}))
        if _accepts(resolve(ENVIRONMENTS[name]), "device"):
            kwargs.setdefault("device", args.device)
        return lambda: make_env(name, **kwargs)

    def policy_factory(name: str):
        kwargs = dict(sets.get(name, {}))
        kwargs.setdefault("device", args.device)
        return lambda env: make_policy(name, env, **kwargs)

    envs = {e: env_factory(e) for e in env_names}
    policies = {p: policy_factory(p) for p in pol_names}
    # build every environment and policy once before the grid: a bad --set value fails here
    # with one line naming the key (exit status 2, as argparse's usage errors), not a traceback
    for e in env_names:
        try:
            env = envs[e]()
        except (TypeError, ValueError) as err:
            return _bad_set(e, "env", sets.get("env", {}), err)
        for p in pol_names:
            try:
                policies[p](env)
            except (TypeError, ValueError) as err:
                return _bad_set(p, p, sets.get(p, {}), err)
    out = Path(args.out)
    config = {"argv": sys.argv[1:], "sets": sets}
    results = run_grid_batched(policies, envs, args.seeds, args.horizon, batch=args.batch,
                               out=out, progress=not args.no_progress, config=config)
    table = write_report(results, out, title=f"torchbandits run: {', '.join(env_names)}")
    print(table)
    print(f"\nwrote {len(results)} runs (JSON), table.md, regret.png, time.png to {out}/")
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from .experiments.report import write_report
    from .experiments.results import load_results

    results = load_results(args.directory)
    if not results:
        raise SystemExit(f"no run JSON files found under {args.directory}")
    print(write_report(results, args.directory))
    print(f"\nwrote table.md, regret.png, time.png to {args.directory}/")
    return 0


def _cmd_reproduce(args: argparse.Namespace, rest: list[str]) -> int:
    from .experiments.registry import resolve
    from .reproduce import REPRODUCTIONS

    if args.name not in REPRODUCTIONS:
        raise SystemExit(f"unknown reproduction {args.name!r}; choose one of {sorted(REPRODUCTIONS)}")
    return int(resolve(REPRODUCTIONS[args.name])(rest) or 0)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from .experiments.sweep_spec import SpecError
    from .experiments.sweeps import INSTALL_HINT, sweep

    try:
        import ray  # noqa: F401
        import yaml  # noqa: F401
    except ImportError:
        raise SystemExit(INSTALL_HINT) from None
    try:
        outcome = sweep(args.spec, args.out, resume=args.resume, quick=args.quick,
                        workers=args.workers, address=args.address, num_cpus=args.num_cpus,
                        cpus_per_trial=args.cpus_per_trial, gpus_per_trial=args.gpus_per_trial,
                        run_threads_per_trial=args.run_threads_per_trial,
                        ray_tmp_dir=args.ray_tmp_dir)
    except (SpecError, FileExistsError, RuntimeError) as err:  # RuntimeError: trials that failed
        raise SystemExit(str(err)) from None
    print(outcome.table)
    print(f"\n{len(outcome.ran)} trial(s) run, {len(outcome.skipped)} already finished; "
          f"table.md, trials.csv, trials.json, plots and Tune logs (tune/) in {outcome.out}/")
    return 0


def _add_sweep_parser(sub: Any) -> None:
    sw = sub.add_parser("sweep", help="configurations × seeds on Ray Tune from a YAML/JSON SPEC "
                                      "(docs/sweeps.md)")
    sw.add_argument("spec", help="SPEC file (.yaml, .yml or .json)")
    sw.add_argument("--out", default="results/sweep", help="output folder (trials, tables, plots)")
    sw.add_argument("--resume", action="store_true", help="run only the unfinished trials of --out")
    sw.add_argument("--quick", action="store_true", help="apply the SPEC's `quick` overrides")
    sw.add_argument("--workers", type=int, default=None, help="at most this many trials at once")
    sw.add_argument("--address", default=None, help="join this Ray cluster ('auto', 'host:port')")
    sw.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray cluster")
    sw.add_argument("--cpus-per-trial", type=float, default=None)
    sw.add_argument("--gpus-per-trial", type=float, default=None, help="fractions share a GPU")
    sw.add_argument("--run-threads-per-trial", type=lambda text: count_arg(text, 1), default=None,
                    help="threads over a batched trial's runs in the compiled CPU calls")
    sw.add_argument("--ray-tmp-dir", default=None, help="Ray's session folder (local cluster)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchbandits", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list environments, policies and reproductions")
    run = sub.add_parser("run", help="run policies × environments × seeds")
    run.add_argument("--env", default="rkhs", help="comma-separated environment names")
    run.add_argument("--policy", default="kucb,gpucb,random", help="comma-separated policy names")
    run.add_argument("--horizon", type=int, default=300)
    run.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    run.add_argument("--device", default="cpu")
    run.add_argument("--out", default="results/run")
    run.add_argument("--set", action="append", default=[], metavar="SCOPE.NAME=VALUE",
                     help="keyword argument for the env (env.dim=2) or a policy (kucb.lam=0.1)")
    run.add_argument("--threads", type=count_arg, default=0,
                     help="torch's intra-op threads (0: torch's default, or 1 with --run-threads)")
    run.add_argument("--run-threads", type=count_arg, default=0,
                     help="threads over a CPU batch's runs in the compiled calls (exact-posterior "
                          "families and BKB; 0: $TORCHBANDITS_THREADS or 1); torch then runs on "
                          "one thread unless --threads says otherwise (docs/batch.md)")
    run.add_argument("--batch", choices=("auto", "on", "off"), default="auto",
                     help="run the seeds of a policy as one batch (docs/batch.md): auto = when "
                          "the policy and env can and the seeds reach the policy family's measured "
                          "crossover (CPU: 2-4 seeds by family; CUDA: 2); on = whenever they can; "
                          "off = one run at a time")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    plot = sub.add_parser("plot", help="re-draw table and plots of a results directory")
    plot.add_argument("directory")
    rep = sub.add_parser("reproduce", help="reproduce a paper's experiment (see `list`)",
                         description="Run a paper reproduction; `torchbandits reproduce NAME "
                                     "--help` lists that reproduction's own options (--quick, "
                                     "--seeds, ...).")
    rep.add_argument("name", help="reproduction name (see `torchbandits list`)")
    _add_sweep_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``torchbandits`` command (``list``, ``run``, ``reproduce``, ``sweep``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if len(argv) >= 2 and argv[0] == "reproduce" and not argv[1].startswith("-"):
        # everything after NAME (``--help`` included) goes to that reproduction's own parser
        return _cmd_reproduce(argparse.Namespace(name=argv[1]), argv[2:])
    args = parser.parse_args(argv)
    if args.command == "list":
        return _cmd_list(args)
    if args.command == "run":
        return _cmd_run(args)
    if args.command == "sweep":
        return _cmd_sweep(args)
    return _cmd_plot(args)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
