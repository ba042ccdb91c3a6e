"""Sweep specifications: parse and validate a SPEC, expand it into trials.

A SPEC (YAML or JSON) is environments × policies × parameter grids × seeds at one horizon::

    name: quick
    horizon: 60
    seeds: [0, 1]
    environments:
      - {name: rkhs, kwargs: {dim: 2}}            # registry name + keyword arguments
    policies:
      - name: kucb                                 # registry name
        kwargs: {beta: 1.0}                        # fixed keyword arguments
        grid: {lam: [0.1, 1.0]}                    # swept: a list is a grid ...
      - name: gpucb
        grid: {lam: {loguniform: [0.01, 1.0]}}     # ... a one-key dict a Tune-style search space
    search: {num_samples: 2, seed: 0}              # draws per grid point of the sampled spaces
    resources: {cpus_per_trial: 1, gpus_per_trial: 0, run_threads_per_trial: 1}
    tuning: {...}                                  # optional, see ``TuningSpec``
    quick: {horizon: 20}                           # overrides applied by ``--quick``

Search spaces (``grid``, ``choice``, ``uniform``, ``loguniform``, ``randint``) follow Ray Tune's
``BasicVariantGenerator``: grid values are crossed, sampled parameters are drawn ``num_samples``
times per grid point. The draws are made here, once, from ``search.seed``, so that every trial is
known (and named) before the first one starts — which is what makes ``--resume`` exact.

Validation happens before any trial starts and raises one :class:`SpecError` naming every bad
entry: unknown keys, unknown environments / policies / parameters (checked against the factory's
signature; factories taking ``**kwargs`` are checked by building them once per swept value on the
first environment), values of the wrong type, empty grids.
"""

from __future__ import annotations

import copy
import inspect
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .registry import ENVIRONMENTS, POLICIES, make_env, make_policy, resolve

__all__ = ["RESOURCE_KEYS", "SpecError", "SweepSpec", "TuningSpec", "factory_signature",
           "load_spec", "parse_spec"]

#: a SPEC's ``resources`` keys: where and how a trial runs, not what it computes (a sweep's
#: identity for ``--resume`` leaves them out)
RESOURCE_KEYS = ("cpus_per_trial", "gpus_per_trial", "run_threads_per_trial")

METRICS = ("final_regret_mean", "final_regret_std", "half_regret_mean", "agent_seconds_mean")
SPACES = ("grid", "choice", "uniform", "loguniform", "randint")
_TOP = {"name", "horizon", "seeds", "device", "environments", "policies", "search", "resources",
        "tuning", "quick", "batch"}


class SpecError(ValueError):
    """A malformed sweep specification; the message names every bad entry."""


@dataclass
class TuningSpec:
    """Select a configuration by ``metric`` (``mode`` ``min``/``max``) on ``tune_seeds`` of the
    ``tune_on`` environments (metric averaged over them), then run it on ``eval_seeds`` of the
    ``evaluate_on`` environments (labels; default: all)."""

    metric: str = "final_regret_mean"
    mode: str = "min"
    tune_seeds: list[int] = field(default_factory=list)
    eval_seeds: list[int] = field(default_factory=list)
    tune_on: list[str] = field(default_factory=list)
    evaluate_on: list[str] = field(default_factory=list)


@dataclass
class SweepSpec:
    """A validated SPEC. ``policies[i]["grid"]`` maps parameter → list (grid) or
    ``{space: args}`` (sampled)."""

    name: str
    horizon: int
    seeds: list[int]
    environments: list[dict[str, Any]]
    policies: list[dict[str, Any]]
    device: str = "cpu"
    num_samples: int = 1
    search_seed: int = 0
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    run_threads_per_trial: int = 1
    batch: bool = True
    tuning: TuningSpec | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the sweep's fields (inverse: ``SweepSpec(**d)``)."""
        return asdict(self)


def load_spec(path: str | Path, *, quick: bool = False) -> SweepSpec:
    """Read a YAML (``.yaml``/``.yml``) or JSON SPEC file and :func:`parse_spec` it."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"SPEC file {str(path)!r} does not exist")
    text = path.read_text()
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise SpecError(f"{path}: not valid YAML: {err}") from None
    else:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as err:
            raise SpecError(f"{path}: not valid JSON: {err}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: the SPEC must be a mapping, got {type(raw).__name__}")
    raw.setdefault("name", path.stem)
    return parse_spec(raw, quick=quick)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _seed_list(errors: list[str], where: str, v: Any) -> list[int]:
    if not isinstance(v, list) or not v or not all(_is_int(s) for s in v):
        errors.append(f"{where}: expected a non-empty list of integer seeds, got {v!r}")
        return []
    if len(set(v)) != len(v):
        errors.append(f"{where}: repeated seeds {v!r}")
    return list(v)


def _check_value(errors: list[str], where: str, default: Any, value: Any) -> None:
    """Type of ``value`` against the factory's default (int → int, float → number, str → str)."""
    if default is inspect.Parameter.empty or default is None or value is None:
        return
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = _is_int(value)
    elif isinstance(default, float):
        ok = _is_num(value)
    elif isinstance(default, str):
        ok = isinstance(value, str)
    else:
        return
    if not ok:
        errors.append(f"{where}: {value!r} has the wrong type: expected {type(default).__name__} "
                      f"(the default is {default!r})")


def _space_values(errors: list[str], where: str, spec: Any) -> list[Any] | dict[str, Any] | None:
    """A grid (list) or a sampled space ``{kind: args}``; ``None`` after recording an error."""
    if isinstance(spec, list):
        spec = {"grid": spec}
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in SPACES:
        errors.append(f"{where}: expected a list of values or one of {{{', '.join(SPACES)}: ...}}, "
                      f"got {spec!r}")
        return None
    kind, args = next(iter(spec.items()))
    if kind in ("grid", "choice"):
        if not isinstance(args, list) or not args:
            errors.append(f"{where}: empty {kind} (give at least one value)")
            return None
        return list(args) if kind == "grid" else {"choice": list(args)}
    if (not isinstance(args, list) or len(args) != 2 or not all(_is_num(a) for a in args)
            or not args[0] < args[1] or (kind == "loguniform" and args[0] <= 0)
            or (kind == "randint" and not all(_is_int(a) for a in args))):
        errors.append(f"{where}: {kind} expects [low, high] with low < high"
                      f"{' > 0' if kind == 'loguniform' else ''}, got {args!r}")
        return None
    return {kind: list(args)}


def factory_signature(fn: Any) -> tuple[dict[str, Any], bool]:
    """Named keyword parameters of ``fn`` with their defaults, and whether it takes ``**kwargs``."""
    params = inspect.signature(fn).parameters
    named = {k: p.default for k, p in params.items()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return named, any(p.kind is p.VAR_KEYWORD for p in params.values())


def _check_entry(errors: list[str], where: str, entry: Any, table: Mapping[str, Any], kind: str,
                 allowed: set[str]) -> bool:
    if not isinstance(entry, dict) or "name" not in entry:
        errors.append(f"{where}: expected a mapping with a 'name', got {entry!r}")
        return False
    extra = set(entry) - allowed
    if extra:
        errors.append(f"{where} ({entry['name']!r}): unknown keys {sorted(extra)}; allowed {sorted(allowed)}")
    if entry["name"] not in table:
        errors.append(f"{where}: unknown {kind} {entry['name']!r}; see `torchbandits list`")
        return False
    for key in ("kwargs", "grid"):
        if key in entry and not isinstance(entry[key], dict):
            errors.append(f"{where} ({entry['name']!r}): '{key}' must be a mapping, got {entry[key]!r}")
            return False
    return True


def _merge_quick(raw: dict[str, Any]) -> dict[str, Any]:
    quick = raw.get("quick") or {}
    if not isinstance(quick, dict):
        raise SpecError(f"quick: expected a mapping of overrides, got {quick!r}")
    out = copy.deepcopy(raw)
    for k, v in quick.items():
        if k == "tuning" and isinstance(v, dict) and isinstance(out.get("tuning"), dict):
            out["tuning"] = {**out["tuning"], **copy.deepcopy(v)}
        else:
            out[k] = copy.deepcopy(v)
    return out


def parse_spec(raw: Mapping[str, Any], *, quick: bool = False) -> SweepSpec:
    """Validate a SPEC mapping (see the module docstring); raise one :class:`SpecError` listing
    every problem, before anything runs. ``quick`` applies the SPEC's ``quick`` overrides (top-level
    keys replaced; ``tuning`` keys merged)."""
    raw = _merge_quick(dict(raw)) if quick else dict(raw)
    errors: list[str] = []
    for k in sorted(set(raw) - _TOP):
        errors.append(f"unknown top-level key {k!r}; allowed {sorted(_TOP)}")
    horizon = raw.get("horizon")
    if not _is_int(horizon) or horizon < 1:
        errors.append(f"horizon: expected a positive integer, got {horizon!r}")
    tuning = None
    if raw.get("tuning") is not None:
        tuning = _parse_tuning(errors, raw["tuning"])
        seeds = list(raw.get("seeds") or [])
    else:
        seeds = _seed_list(errors, "seeds", raw.get("seeds"))
    envs: list[dict[str, Any]] = []
    raw_envs = raw.get("environments")
    if not isinstance(raw_envs, list) or not raw_envs:
        errors.append(f"environments: expected a non-empty list, got {raw_envs!r}")
        raw_envs = []
    for i, e in enumerate(raw_envs):
        where = f"environments[{i}]"
        if not _check_entry(errors, where, e, ENVIRONMENTS, "environment", {"name", "label", "kwargs"}):
            continue
        named, var = factory_signature(resolve(ENVIRONMENTS[e["name"]]))
        kwargs = dict(e.get("kwargs") or {})
        for k, v in kwargs.items():
            if k not in named and not var:
                errors.append(f"{where} ({e['name']!r}): unknown parameter {k!r}; accepted: {sorted(named)}")
            else:
                _check_value(errors, f"{where} ({e['name']!r}).kwargs.{k}", named.get(k), v)
        envs.append({"name": e["name"], "label": str(e.get("label", e["name"])), "kwargs": kwargs})
    pols: list[dict[str, Any]] = []
    raw_pols = raw.get("policies")
    if not isinstance(raw_pols, list) or not raw_pols:
        errors.append(f"policies: expected a non-empty list, got {raw_pols!r}")
        raw_pols = []
    for i, p in enumerate(raw_pols):
        where = f"policies[{i}]"
        if not _check_entry(errors, where, p, POLICIES, "policy", {"name", "label", "kwargs", "grid"}):
            continue
        named, var = factory_signature(resolve(POLICIES[p["name"]]))
        kwargs, grid = dict(p.get("kwargs") or {}), {}
        for k, v in {**kwargs, **(p.get("grid") or {})}.items():
            w = f"{where} ({p['name']!r}).{'grid' if k in (p.get('grid') or {}) else 'kwargs'}.{k}"
            if k not in named and not var:
                accepted = sorted(set(named) - {"env"})
                errors.append(f"{w}: unknown parameter {k!r}; {p['name']} accepts {accepted}")
                continue
            if k in kwargs and k in (p.get("grid") or {}):
                errors.append(f"{w}: {k!r} is both fixed (kwargs) and swept (grid)")
            if k in (p.get("grid") or {}):
                space = _space_values(errors, w, v)
                if space is not None:
                    grid[k] = space
                    values = space if isinstance(space, list) else space.get("choice", [])
                    for val in values:
                        _check_value(errors, w, named.get(k), val)
                    if isinstance(space, dict) and set(space) & {"uniform", "loguniform"}:
                        _check_value(errors, w, named.get(k), 0.5)
            else:
                _check_value(errors, w, named.get(k), v)
        pols.append({"name": p["name"], "label": str(p.get("label", p["name"])), "kwargs": kwargs,
                     "grid": grid, "var_keyword": var})
    for kind, items in (("environments", envs), ("policies", pols)):
        labels = [x["label"] for x in items]
        dup = sorted({lab for lab in labels if labels.count(lab) > 1})
        if dup:
            errors.append(f"{kind}: repeated labels {dup}; give each entry a distinct 'label'")
    search = raw.get("search") or {}
    resources = raw.get("resources") or {}
    num_samples, search_seed = search.get("num_samples", 1), search.get("seed", 0)
    if not isinstance(search, dict) or set(search) - {"num_samples", "seed"} or not _is_int(num_samples) \
            or num_samples < 1 or not _is_int(search_seed):
        errors.append(f"search: expected {{num_samples: int >= 1, seed: int}}, got {search!r}")
    cpus, gpus = resources.get("cpus_per_trial", 1), resources.get("gpus_per_trial", 0)
    run_threads = resources.get("run_threads_per_trial", 1)
    if not isinstance(resources, dict) or set(resources) - set(RESOURCE_KEYS) \
            or not _is_num(cpus) or cpus <= 0 or not _is_num(gpus) or gpus < 0 \
            or not _is_int(run_threads) or run_threads < 1:
        errors.append("resources: expected {cpus_per_trial: > 0, gpus_per_trial: >= 0, "
                      f"run_threads_per_trial: int >= 1}}, got {resources!r}")
    if tuning is not None:
        for key in ("tune_on", "evaluate_on"):
            bad = [lab for lab in getattr(tuning, key) if lab not in {e["label"] for e in envs}]
            if bad:
                errors.append(f"tuning.{key}: unknown environment labels {bad}")
            if not getattr(tuning, key):
                setattr(tuning, key, [e["label"] for e in envs])
    if errors:
        raise SpecError("invalid sweep SPEC:\n  " + "\n  ".join(errors))
    spec = SweepSpec(name=str(raw.get("name", "sweep")), horizon=int(horizon), seeds=seeds,
                     environments=envs, policies=pols, device=str(raw.get("device", "cpu")),
                     num_samples=int(num_samples), search_seed=int(search_seed),
                     cpus_per_trial=float(cpus), gpus_per_trial=float(gpus),
                     run_threads_per_trial=int(run_threads),
                     batch=bool(raw.get("batch", True)), tuning=tuning)
    _dry_build(spec)
    return spec


def _parse_tuning(errors: list[str], raw: Any) -> TuningSpec | None:
    allowed = {"metric", "mode", "tune_seeds", "eval_seeds", "tune_on", "evaluate_on"}
    if not isinstance(raw, dict) or set(raw) - allowed:
        errors.append(f"tuning: expected a mapping with keys among {sorted(allowed)}, got {raw!r}")
        return None
    t = TuningSpec(metric=raw.get("metric", "final_regret_mean"), mode=raw.get("mode", "min"),
                   tune_seeds=_seed_list(errors, "tuning.tune_seeds", raw.get("tune_seeds")),
                   eval_seeds=_seed_list(errors, "tuning.eval_seeds", raw.get("eval_seeds")),
                   tune_on=list(raw.get("tune_on") or []), evaluate_on=list(raw.get("evaluate_on") or []))
    if t.metric not in METRICS:
        errors.append(f"tuning.metric: {t.metric!r} is not one of {list(METRICS)}")
    if t.mode not in ("min", "max"):
        errors.append(f"tuning.mode: expected 'min' or 'max', got {t.mode!r}")
    overlap = sorted(set(t.tune_seeds) & set(t.eval_seeds))
    if overlap:
        errors.append(f"tuning: held-out eval_seeds overlap tune_seeds: {overlap}")
    return t


def _dry_build(spec: SweepSpec) -> None:
    """Build every environment once, and each policy whose factory takes ``**kwargs`` once per
    swept value (others at their first value) on the first environment: a bad keyword or value
    fails here, naming the entry, and not in the middle of a sweep."""
    errors: list[str] = []
    built = []
    for i, e in enumerate(spec.environments):
        try:
            built.append(make_env(e["name"], **e["kwargs"]))
        except Exception as err:
            errors.append(f"environments[{i}] ({e['name']!r}): building it failed: "
                          f"{type(err).__name__}: {err}")
    if not errors:
        for i, p in enumerate(spec.policies):
            base = {k: (v[0] if isinstance(v, list) else _probe(v)) for k, v in p["grid"].items()}
            trials = [base] + [{**base, k: val} for k, v in p["grid"].items()
                               if isinstance(v, list) and p["var_keyword"] for val in v[1:]]
            for params in trials:
                try:
                    make_policy(p["name"], built[0], **p["kwargs"], **params)
                except Exception as err:
                    errors.append(f"policies[{i}] ({p['name']!r}) with {params}: building it failed: "
                                  f"{type(err).__name__}: {err}")
                    break
    if errors:
        raise SpecError("invalid sweep SPEC:\n  " + "\n  ".join(errors))


def _probe(space: dict[str, Any]) -> Any:
    kind, args = next(iter(space.items()))
    if kind == "choice":
        return args[0]
    if kind == "loguniform":
        return math.sqrt(args[0] * args[1])
    return args[0] if kind == "randint" else 0.5 * (args[0] + args[1])
