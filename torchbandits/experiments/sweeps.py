"""Sweeps of configurations × seeds on Ray Tune, resumable, with tuning.

``sweep(spec, out)`` (and ``torchbandits sweep SPEC --out DIR``) expands a SPEC
(:mod:`~torchbandits.experiments.sweep_spec`) into trials — one configuration (environment,
policy, parameters) over its seeds — and runs them as Ray Tune trials: a local Ray cluster by
default (``ray.init`` in this process), an existing one with ``address``. Ray is imported only
here, inside the functions (``pip install torchbandits[sweep]``).

On disk, under ``out``::

    sweep.json                       the validated SPEC and its hash (checked by --resume)
    trials/<id>/runs/seed<k>.json    each run's RunResult, written atomically as it finishes
    trials/<id>/done.json            completion marker: metrics, start/finish times, pid, host
    trials/<id>/attempts.log         one line per start of the trial (a counter for resume)
    table.md, trials.csv, trials.json, regret_vs_*.png, selection.json (tuning), regret_eval.png
    tune/<phase>-<time>/             Ray Tune's own logs (result.json, progress.csv, TensorBoard)

A trial is finished iff its ``done.json`` exists. ``resume=True`` runs only the unfinished trials
(a partial one is redone from its first seed); finished trials are never recomputed, so the final
tables equal an uninterrupted sweep's (all columns but agent time are functions of the actions).

Tuning (SPEC ``tuning:``): phase ``tune`` runs every configuration on ``tune_seeds`` of the
``tune_on`` environments; per policy the configuration with the best ``metric`` (mean over those
environments) is selected; phase ``eval`` runs it on the held-out ``eval_seeds`` of the
``evaluate_on`` environments — the protocol of Hong, Li & Tewari (2023, Sec. 6 "Algorithm
Tuning"), who tune SW-GP-UCB and W-GP-UCB on the one-switch environment and run the tuned values
on the two-switch one.

Grid folding: pending trials that differ only in ``lam`` and/or ``beta`` of a batchable policy
(same environment, policy entry, seeds, horizon, device) run as one Tune trial and one batch of
``trials × seeds`` runs with per-run λ/β (:mod:`~torchbandits.experiments.sweep_fold`); each
trial still gets its own runs and completion marker, with the runs of the unfolded trial.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..validation import check_int
from .results import RunResult, atomic_write_text
from .sweep_report import params_text, plot_vs_param, select_best, trial_metrics, write_tables
from .sweep_spec import RESOURCE_KEYS, SpecError, SweepSpec, load_spec, parse_spec
from .sweep_trials import TrialSpec, expand_trials, make_trial

__all__ = ["INSTALL_HINT", "SweepOutcome", "finish_trial", "run_saver", "run_trial", "start_trial",
           "sweep"]

INSTALL_HINT = ("`torchbandits sweep` needs Ray Tune and PyYAML: pip install 'torchbandits[sweep]' "
                "(or pip install 'ray[tune]>=2.9' pyyaml)")


@dataclass
class SweepOutcome:
    """What a sweep produced: one row per trial (SPEC order, tuning then evaluation), the markdown
    table, the tuning selection (``None`` without tuning) and which trials ran in this call."""

    out: Path
    rows: list[dict[str, Any]]
    table: str
    selection: dict[str, dict[str, Any]] | None = None
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def trial_dir(out: str | Path, trial_id: str) -> Path:
    return Path(out) / "trials" / trial_id


def _marker(out: str | Path, trial_id: str) -> Path:
    return trial_dir(out, trial_id) / "done.json"


def _build(trial: TrialSpec) -> tuple[Any, Any]:
    """A fresh environment and policy of the trial (on ``trial.device`` when not the CPU)."""
    from .registry import ENVIRONMENTS, make_env, make_policy, resolve
    from .sweep_spec import factory_signature

    env_kwargs, pol_kwargs = dict(trial.env_kwargs), {**trial.policy_kwargs, **trial.params}
    if trial.device != "cpu":
        named, var = factory_signature(resolve(ENVIRONMENTS[trial.env]))
        if "device" in named or var:
            env_kwargs.setdefault("device", trial.device)
        pol_kwargs.setdefault("device", trial.device)
    env = make_env(trial.env, **env_kwargs)
    return env, make_policy(trial.policy, env, **pol_kwargs)


def run_seeds(trial: TrialSpec, save: Callable[[RunResult], None]) -> list[RunResult]:
    """The runs of one trial, ``save``-d as they finish.

    One batch through ``experiments.simulate_batch(policy, env, horizon, seeds)`` where the
    policy and environment can be batched (``experiments.can_batch``; run r equals the sequential
    run with seed r), else ``simulate`` seed after seed with a fresh environment and policy each
    (as ``run_grid``).
    """
    from .. import experiments

    name = f"{trial.policy_label}({params_text(trial.params)})" if trial.params else trial.policy_label
    cfg = {"trial_id": trial.trial_id, "policy_name": trial.policy, "env_name": trial.env,
           "params": dict(trial.params), "policy_kwargs": dict(trial.policy_kwargs),
           "env_kwargs": dict(trial.env_kwargs)}
    if trial.batch and len(trial.seeds) > 1:
        env, policy = _build(trial)
        if experiments.can_batch(policy, env):
            runs = experiments.simulate_batch(policy, env, trial.horizon, list(trial.seeds))
            for r in runs:
                r.policy, r.env = name, trial.env_label
                r.config.update(cfg, batched=True)
                save(r)
            return runs
    runs = []
    for seed in trial.seeds:
        env, policy = _build(trial)
        r = experiments.simulate(policy, env, trial.horizon, seed, policy_name=name,
                                 env_name=trial.env_label, config=cfg)
        save(r)
        runs.append(r)
    return runs


def run_trial(trial: TrialSpec | Mapping[str, Any], out: str | Path) -> dict[str, Any]:
    """Run one trial into ``out/trials/<id>/`` and write its completion marker; return the
    marker's record. A finished trial (marker present) is returned as it is, never recomputed; a
    partial one (runs but no marker) is redone from scratch."""
    trial = trial if isinstance(trial, TrialSpec) else TrialSpec.from_dict(trial)
    marker = _marker(out, trial.trial_id)
    if marker.is_file():
        return json.loads(marker.read_text())
    started = start_trial(trial, out)
    t0, c0 = time.perf_counter(), time.process_time()
    results = run_seeds(trial, run_saver(trial, out))
    return finish_trial(trial, out, results, started=started, seconds=time.perf_counter() - t0,
                        cpu_seconds=time.process_time() - c0)


def start_trial(trial: TrialSpec, out: str | Path) -> float:
    """Log a start of ``trial`` in its ``attempts.log`` and clear its partial runs; the time."""
    tdir = trial_dir(out, trial.trial_id)
    tdir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with (tdir / "attempts.log").open("a") as f:
        f.write(json.dumps({"started": started, "pid": os.getpid(), "host": socket.gethostname()}) + "\n")
    if (tdir / "runs").exists():
        shutil.rmtree(tdir / "runs")
    return started


def run_saver(trial: TrialSpec, out: str | Path) -> Callable[[RunResult], Path]:
    """Saves a run of ``trial`` as ``trials/<id>/runs/seed<k>.json`` (atomically)."""
    runs_dir = trial_dir(out, trial.trial_id) / "runs"
    return lambda r: atomic_write_text(runs_dir / f"seed{r.seed}.json",
                                       json.dumps(r.to_dict(), allow_nan=True))


def finish_trial(trial: TrialSpec, out: str | Path, results: list[RunResult], *, started: float,
                 seconds: float, cpu_seconds: float, **extra: Any) -> dict[str, Any]:
    """Write ``trial``'s completion marker (metrics, times, host, the threads it ran on —
    torch's and the compiled calls' over a batch's runs — and ``extra``); its record."""
    import torch

    from ..native import threads

    record = {"trial": trial.to_dict(), "metrics": trial_metrics(results), "started": started,
              "finished": time.time(), "seconds": seconds, "cpu_seconds": cpu_seconds,
              "pid": os.getpid(), "host": socket.gethostname(),
              "threads": {"torch": torch.get_num_threads(), "runs": threads()},
              "batched": bool(results[0].config.get("batched", False)), **extra}
    atomic_write_text(_marker(out, trial.trial_id), json.dumps(record, indent=1))
    return record


def _tune_trainable(config: dict[str, Any]) -> None:
    """The Ray Tune function trainable: one trial, its metrics reported to Tune once."""
    from ray import tune

    from ..native import use_threads
    from .sweep_fold import run_group

    # a batched trial's runs over ``run_threads`` compiled threads (torch then on one), else
    # torch's own threads over the trial's CPUs
    run_threads = int(config.get("run_threads", 1))
    use_threads(0 if run_threads > 1 else int(config["threads"]), run_threads)
    records = run_group(config["trials"], config["out"])
    tune.report({**records[0]["metrics"], "trial_seconds": sum(r["seconds"] for r in records),
                 "trials": len(records)})


def _import_ray() -> Any:
    try:
        import ray
        from ray import tune  # noqa: F401
    except ImportError:
        raise SystemExit(INSTALL_HINT) from None
    return ray


def _group_name(t: Any) -> str:
    """A Tune trial's name: its first sweep trial's id (+ how many more were folded in)."""
    trials = t.config["trials"]
    return trials[0]["trial_id"] + (f"+{len(trials) - 1}" if len(trials) > 1 else "")


def _run_on_ray(trials: list[TrialSpec], out: Path, phase: str, *, spec: SweepSpec,
                workers: int | None, address: str | None, num_cpus: int | None,
                ray_tmp_dir: str | None, verbose: bool) -> None:
    ray = _import_ray()
    from ray import tune

    from .sweep_fold import fold_trials

    started_here = False
    if not ray.is_initialized():
        kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address:
            ray.init(address=address, **kw)
        else:
            ray.init(num_cpus=num_cpus, _temp_dir=ray_tmp_dir, **kw)
        started_here = True

    class _Progress(tune.Callback):
        def __init__(self) -> None:
            self.done = 0

        def on_trial_result(self, iteration, trials, trial, result, **info):
            self.done += 1
            if verbose:
                tid = "+".join(t["trial_id"] for t in trial.config["trials"])
                print(f"[{phase} {self.done}/{len(trials_)}] {tid}: regret at T "
                      f"{result['final_regret_mean']:.4g} ± {result['final_regret_std']:.3g} "
                      f"({result['trial_seconds']:.1f} s)", flush=True)

    trials_ = trials
    trainable = tune.with_resources(_tune_trainable, {"cpu": spec.cpus_per_trial,
                                                      "gpu": spec.gpus_per_trial})
    tuner = tune.Tuner(
        trainable,
        param_space={"trials": tune.grid_search([[t.to_dict() for t in g]
                                                  for g in fold_trials(trials)]),
                     "out": str(out), "threads": max(1, int(spec.cpus_per_trial)),
                     "run_threads": spec.run_threads_per_trial},
        tune_config=tune.TuneConfig(max_concurrent_trials=workers, reuse_actors=True,
                                    trial_dirname_creator=_group_name,
                                    trial_name_creator=_group_name),
        run_config=tune.RunConfig(storage_path=str(out / "tune"),
                                  name=f"{phase}-{time.strftime('%Y%m%d-%H%M%S')}", verbose=0,
                                  callbacks=[_Progress()],
                                  failure_config=tune.FailureConfig(max_failures=1)),
    )
    try:
        grid = tuner.fit()
        errors = [str(r.error).splitlines()[0] for r in grid if r.error is not None]
    finally:
        if started_here:
            ray.shutdown()
    missing = [t.trial_id for t in trials if not _marker(out, t.trial_id).is_file()]
    if missing:
        raise RuntimeError(f"{len(missing)} trial(s) did not finish ({', '.join(missing[:5])}...): "
                           f"{'; '.join(errors[:3])}. Fix the cause and rerun with --resume.")


def _phase(trials: list[TrialSpec], out: Path, phase: str, outcome: SweepOutcome,
           **ray_kw: Any) -> list[dict[str, Any]]:
    pending = [t for t in trials if not _marker(out, t.trial_id).is_file()]
    outcome.skipped += [t.trial_id for t in trials if t not in pending]
    outcome.ran += [t.trial_id for t in pending]
    if pending:
        _run_on_ray(pending, out, phase, **ray_kw)
    rows = []
    for t in trials:
        rec = json.loads(_marker(out, t.trial_id).read_text())
        rows.append({"trial_id": t.trial_id, "phase": t.phase, "env": t.env_label,
                     "policy": t.policy_label, "params": dict(t.params), "seeds": len(t.seeds),
                     "horizon": t.horizon, **rec["metrics"], "trial_seconds": rec["seconds"]})
    return rows


def _load_runs(out: Path, rows: list[dict[str, Any]]) -> list[RunResult]:
    runs = []
    for r in rows:
        runs += [RunResult.load(p) for p in sorted((trial_dir(out, r["trial_id"]) / "runs").glob("*.json"))]
    return runs


def sweep(spec: str | Path | Mapping[str, Any] | SweepSpec, out: str | Path, *, resume: bool = False,
          quick: bool = False, workers: int | None = None, address: str | None = None,
          num_cpus: int | None = None, cpus_per_trial: float | None = None,
          gpus_per_trial: float | None = None, run_threads_per_trial: int | None = None,
          ray_tmp_dir: str | None = None, verbose: bool = True) -> SweepOutcome:
    """Run (or with ``resume`` continue) the sweep ``spec`` into ``out`` on Ray Tune.

    Args:
        spec: a SPEC file (YAML/JSON), a SPEC mapping, or a parsed :class:`SweepSpec`.
        out: output folder (module docstring). It must not hold another sweep unless ``resume``.
        resume: run only the trials without a completion marker; the SPEC must be unchanged.
        quick: apply the SPEC's ``quick`` overrides.
        workers: at most this many trials at once (Tune's ``max_concurrent_trials``).
        address: join this Ray cluster (``"auto"``, ``"host:port"``) instead of starting one.
        num_cpus: CPUs of the local cluster (default: all of this machine's).
        cpus_per_trial, gpus_per_trial: per-trial resources (override the SPEC's ``resources``;
            fractional GPUs share one device between trials).
        run_threads_per_trial: threads over a batched trial's runs in the compiled CPU calls
            (:func:`~torchbandits.native.use_threads`; torch then on one thread), overriding the
            SPEC's ``resources``; ``ValueError`` below 1.
        ray_tmp_dir: Ray's session folder for a local cluster (default Ray's, under /tmp).
    """
    if run_threads_per_trial is not None:
        check_int("run_threads_per_trial", run_threads_per_trial, 1)
    if isinstance(spec, SweepSpec):
        parsed = spec
    elif isinstance(spec, Mapping):
        parsed = parse_spec(spec, quick=quick)
    else:
        parsed = load_spec(spec, quick=quick)
    if cpus_per_trial is not None:
        parsed.cpus_per_trial = float(cpus_per_trial)
    if gpus_per_trial is not None:
        parsed.gpus_per_trial = float(gpus_per_trial)
    if run_threads_per_trial is not None:
        parsed.run_threads_per_trial = run_threads_per_trial
    out = Path(out).resolve()
    manifest = out / "sweep.json"
    identity = {k: v for k, v in parsed.to_dict().items() if k not in RESOURCE_KEYS}
    digest = hashlib.sha1(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()
    if manifest.is_file():
        old = json.loads(manifest.read_text())
        if not resume:
            raise FileExistsError(f"{out} already holds a sweep ({old.get('name')!r}); pass --resume "
                                  "to continue it or choose another --out")
        if old.get("hash") != digest:
            raise SpecError(f"the SPEC differs from the one {out} was started with; resume needs the "
                            "same SPEC (and the same --quick)")
    else:
        atomic_write_text(manifest, json.dumps({"name": parsed.name, "hash": digest, "quick": quick,
                                            "spec": identity}, indent=1, default=str))
    ray_kw = {"spec": parsed, "workers": workers, "address": address, "num_cpus": num_cpus,
              "ray_tmp_dir": ray_tmp_dir, "verbose": verbose}
    outcome = SweepOutcome(out=out, rows=[], table="")
    tuning = parsed.tuning
    if tuning is None:
        outcome.rows = _phase(expand_trials(parsed), out, "run", outcome, **ray_kw)
    else:
        tune_rows = _phase(expand_trials(parsed, "tune", seeds=tuning.tune_seeds, env_labels=tuning.tune_on),
                           out, "tune", outcome, **ray_kw)
        outcome.selection = select_best(tune_rows, tuning.metric, tuning.mode, tuning.tune_on)
        envs = [e for e in parsed.environments if e["label"] in tuning.evaluate_on]
        evals = [make_trial(parsed, "eval", e, p, outcome.selection[p["label"]]["params"], tuning.eval_seeds)
                 for e in envs for p in parsed.policies]
        outcome.rows = tune_rows + _phase(evals, out, "eval", outcome, **ray_kw)
        atomic_write_text(out / "selection.json", json.dumps(outcome.selection, indent=1, default=str))
    _write_outputs(parsed, out, outcome)
    return outcome


def _write_outputs(spec: SweepSpec, out: Path, outcome: SweepOutcome) -> None:
    title = f"sweep {spec.name!r}: T = {spec.horizon}"
    outcome.table = write_tables(outcome.rows, out, title)
    for phase in dict.fromkeys(r["phase"] for r in outcome.rows):
        plot_vs_param(outcome.rows, out, phase)
    if outcome.selection is not None:
        from .report import plot_regret

        lines = ["| policy | chosen parameters | tuning metric | candidates |", "|---|---|---:|---:|"]
        for pol, sel in outcome.selection.items():
            metric = next(k for k in sel if k not in ("params", "candidates"))
            lines.append(f"| {pol} | {params_text(sel['params'])} | {sel[metric]:.4g} ({metric}) | "
                         f"{sel['candidates']} |")
        eval_rows = [r for r in outcome.rows if r["phase"] == "eval"]
        from .sweep_report import markdown_table

        text = "\n".join(lines) + "\n\nHeld-out evaluation:\n\n" + markdown_table(eval_rows) + "\n"
        (out / "selection.md").write_text(f"# {title}: tuning\n\n{text}")
        plot_regret(_load_runs(out, eval_rows), out / "regret_eval.png")
        outcome.table += "\n\n" + text
