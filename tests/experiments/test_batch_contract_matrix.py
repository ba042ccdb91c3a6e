"""The batching contract for every batched policy × environment (R = 8 runs).

Run ``r`` of a batch of ``R = 8`` is the sequential run with seed ``r``: the same action every
round, scores (UCBs) to 1e-10 in float64. Covered here, for every batched policy — Random,
K-UCB (constant β and the radius of Zenati et al. 2022, Lemma 3.1), GP-UCB with the IGP radius
(Chowdhury & Gopalan 2017, Thm 2), CGP-UCB, GP-UCB with the radii of Srinivas et al. (2010,
Thm 1) and Abbasi-Yadkori (2012, Thm 3.11), the mixture bounds AMM, DMM and CMM by its dual of
Flynn & Reeb (2024, §5.3–5.5), EK-UCB (Zenati et al. 2022, Algorithms 2 and 4), R-GP-UCB and
SW-GP-UCB (Zhou & Shroff 2021, Algorithms 1 and 2):

* 200 rounds in lockstep with the scores compared every round, for the policies without such a
  test elsewhere (the rules of ``tests/confidence/test_batched_rules.py``, EK-UCB in
  ``tests/policies/test_batched_ekucb.py`` and the window policies in
  ``tests/policies/test_batched_time_varying.py`` have theirs);
* every policy on every environment of the batching issue it can batch on — RKHS functions with
  fresh and fixed arm sets, Bump, Chessboard, Step Diagonal, the time-varying and the switching
  environments — through ``simulate_batch`` against ``simulate`` (short horizons: the 200-round
  cases above and in the files named cover the long runs of every policy);
* ``torchbandits run --batch on`` against ``--batch off`` (the same ``actions`` in the JSON);
* per-run β and λ grids against the three sequential runs;
* bad input (a leading dimension that is not R, rewards of the wrong shape, NaN in one run's
  reward) raises ``ValueError`` naming the argument and changes no run's state;
* a ``state_dict`` round trip mid-batch continues identically; ``.to(dtype)`` and ``.to(device)``
  mid-batch.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from torchbandits.cli import main
from torchbandits.envs.batched import BatchedEnv
from torchbandits.experiments import simulate, simulate_batch
from torchbandits.experiments.batch import why_not_batch
from torchbandits.experiments.registry import make_env, make_policy

SEEDS = list(range(8))
TOL = {"atol": 1e-10, "rtol": 0.0}
# CMM's dual search moves by ~1e-7 under one-ulp input changes (tests/confidence/test_batched_rules.py);
# EK-UCB on Chessboard has cond(K_ZZ) ≈ 1e12 (tests/policies/test_batched_ekucb.py)
LOOSE = {"cmm-ucb": {"atol": 2e-7, "rtol": 0.0}}

#: registry name → keyword arguments of the batched policies (short windows and periods, so that
#: removals and restarts happen within the short horizons)
POLICIES: dict[str, dict[str, Any]] = {
    "random": {}, "kucb": {}, "kucb-theory": {}, "gpucb": {}, "cgpucb": {},
    "gpucb-srinivas": {}, "ay-gpucb": {}, "aygp-ucb": {"horizon": 200},
    "amm-ucb": {"horizon": 200}, "dmm-ucb": {"horizon": 200}, "cmm-ucb": {"horizon": 200},
    "ekucb": {}, "r-gpucb": {"period": 7}, "sw-gpucb": {"window": 6, "horizon": 200},
}
STATIONARY = ["random", "kucb", "kucb-theory", "gpucb", "cgpucb", "gpucb-srinivas", "ay-gpucb",
              "aygp-ucb", "amm-ucb", "dmm-ucb", "cmm-ucb", "ekucb"]
WINDOWED = ["r-gpucb", "sw-gpucb"]
#: name → (registry name, keyword arguments), small sizes
ENVS: dict[str, tuple[str, dict[str, Any]]] = {
    "rkhs": ("rkhs", {"dim": 2, "n_arms": 20}),
    "rkhs-fixed": ("rkhs", {"dim": 2, "n_arms": 20, "fixed_arms": True}),
    "bump": ("bump", {}), "chessboard": ("chessboard", {}), "step-diagonal": ("step-diagonal", {}),
    "switching-kernel": ("switching-kernel", {"n_arms": 20, "dim": 3, "switches": (6, 12)}),
    "cosine": ("cosine", {"n_arms": 20, "dim": 2}),
    "tv-rotation": ("tv-rotation", {"horizon": 200}), "tv-bump": ("tv-bump", {"horizon": 200}),
    "tv-switch": ("tv-switch", {"horizon": 200}),
    "tv-stationary": ("tv-stationary", {"horizon": 200}),
    "tv-linear": ("tv-linear", {"horizon": 200}),
}
#: the mixture presets need an RBF or Matérn kernel (the linear environment's is linear); the
#: moving bump's sequential rounds are slow (a kernel per round): its 200-round cases are in
#: tests/policies/test_batched_time_varying.py, here only a few policies
#: the confidence rules differ from GP-UCB only in the width: they run on the environments
#: whose candidates take different paths (fresh and fixed arm sets, joint context features, a
#: moving function), the others on all
RULES = ["gpucb-srinivas", "ay-gpucb", "aygp-ucb", "amm-ucb", "dmm-ucb", "cmm-ucb"]
SKIPPED = {(p, e) for p in RULES for e in ("step-diagonal", "cosine", "switching-kernel",
                                           "tv-stationary", "tv-linear", "tv-rotation")}
SKIPPED |= {(p, "tv-bump") for p in STATIONARY if p not in ("random", "kucb", "ekucb")}


def _env(name: str) -> Any:
    registry, kwargs = ENVS[name]
    return make_env(registry, **kwargs)


def _policy(name: str, env: Any, **extra: Any) -> Any:
    return make_policy(name, env, **{**POLICIES[name], **extra})


def _seeded(policy: Any, seed: Any) -> Any:
    policy.reset(seed=seed)
    return policy


def _scored(policy: Any) -> bool:
    return not type(policy).__name__.startswith("Random")


def _lockstep(env: Any, batch: Any, seqs: list[Any], seeds: list[int], horizon: int,
              tol: dict[str, float], ties: float = 0.0) -> list[list[int]]:
    """Step ``batch`` (already reset with ``seeds``) and the sequential ``seqs`` on the batched
    environment's rounds: the same scores (``tol``) and the same choice every round — where
    ``ties > 0``, a different choice is allowed only between candidates whose sequential scores
    tie to ``ties`` (relative), and both sides then play the batch's choice."""
    benv = BatchedEnv(env, seeds)
    rows = torch.arange(len(seeds))
    actions = []
    for _ in range(horizon):
        cand = benv.candidates()
        scores = None
        if _scored(batch) and batch.t >= batch.n_warmup:
            ucb = batch(cand)
            assert ucb.shape == cand.shape[:2]
            scores = [pol(cand[r]) for r, pol in enumerate(seqs)]
            for r in range(len(seqs)):
                torch.testing.assert_close(ucb[r], scores[r], **tol)
        idx = batch.select(cand)
        assert idx.dtype == torch.long and idx.shape == (len(seeds),)
        for r, pol in enumerate(seqs):
            mine, theirs = int(idx[r]), pol.select(cand[r])
            if mine != theirs:
                assert ties > 0 and scores is not None, (r, mine, theirs)
                a, b = scores[r][mine], scores[r][theirs]
                assert abs(a - b) <= ties * max(1.0, abs(float(b))), (r, mine, theirs)
        reward, _ = benv.pull(idx)
        batch.update(cand[rows, idx], reward)
        for r, pol in enumerate(seqs):
            pol.update(cand[r, int(idx[r])], float(reward[r]))
        actions.append(idx.tolist())
    return actions


# ------------------------------------------------------------------- 200 rounds, scores
@pytest.mark.parametrize(("name", "env_name"), [
    ("random", "step-diagonal"), ("kucb", "rkhs"), ("kucb-theory", "rkhs-fixed"),
    ("gpucb", "bump"), ("cgpucb", "chessboard")])
def test_two_hundred_rounds_in_lockstep(name: str, env_name: str) -> None:
    env = _env(env_name)
    batch = _seeded(_policy(name, env), SEEDS)
    seqs = [_seeded(_policy(name, env), s) for s in SEEDS]
    actions = _lockstep(env, batch, seqs, SEEDS, 200, TOL)
    assert len({tuple(a) for a in actions}) > 20          # the runs explore and differ


# ------------------------------------------------------------------- every policy × env
MATRIX = [(p, e) for p in STATIONARY for e in ENVS if (p, e) not in SKIPPED]
MATRIX += [(p, e) for p in WINDOWED for e in ENVS]


@pytest.mark.parametrize(("name", "env_name"), MATRIX)
def test_every_policy_on_every_environment(name: str, env_name: str) -> None:
    env = _env(env_name)
    policy = _policy(name, env)
    assert why_not_batch(policy, env) is None
    horizon = 14
    runs = simulate_batch(policy, env, horizon, SEEDS)
    seqs = [simulate(_policy(name, env), env, horizon, s) for s in SEEDS]
    if any(res.actions != seq.actions for res, seq in zip(runs, seqs, strict=True)):
        # symmetric arm sets (the moving bump's grid, Bump's flat top) tie exactly in exact
        # arithmetic: batched and sequential scores, equal to 1e-16, may then pick different
        # members of the tie; in lockstep every difference must be such a tie
        batch = _seeded(_policy(name, env), SEEDS)
        _lockstep(env, batch, [_seeded(_policy(name, env), s) for s in SEEDS], SEEDS, horizon,
                  LOOSE.get(name, TOL), ties=1e-12)
        return
    for res, seq in zip(runs, seqs, strict=True):
        assert res.regret == pytest.approx(seq.regret, abs=1e-10, rel=0)
        assert res.rewards == pytest.approx(seq.rewards, abs=1e-10, rel=0)
        assert sorted(res.diagnostics) == sorted(seq.diagnostics)
    assert len({tuple(r.actions) for r in runs}) > 1


# ------------------------------------------------------------------- the command line
def test_cli_batch_on_equals_batch_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every batched policy through ``torchbandits run`` with eight seeds: ``--batch on`` and
    ``--batch off`` write the same ``actions``."""
    seeds = [str(s) for s in SEEDS]
    groups = [("chessboard", ",".join(STATIONARY)), ("tv-switch", ",".join(WINDOWED))]
    for env_name, policies in groups:
        for mode in ("on", "off"):
            args = ["run", "--env", env_name, "--policy", policies, "--seeds", *seeds,
                    "--horizon", "10", "--no-progress", "--batch", mode,
                    "--out", str(tmp_path / env_name / mode)]
            assert main(args) == 0
        runs = {m: {p.name: json.loads(p.read_text())
                    for p in sorted((tmp_path / env_name / m / "runs").glob("*.json"))}
                for m in ("on", "off")}
        assert sorted(runs["on"]) == sorted(runs["off"])
        assert len(runs["on"]) == len(policies.split(",")) * len(SEEDS)
        for f, run in runs["on"].items():
            assert run["actions"] == runs["off"][f]["actions"], f
    capsys.readouterr()


# ------------------------------------------------------------------- per-run grids
BETA_GRID = [0.1, 1.0, 10.0]
LAM_GRID = [0.1, 1.0, 10.0]
#: policies that take a per-run β (a constant radius) and a per-run λ; the others refuse them
PER_RUN_BETA = ["kucb", "r-gpucb", "sw-gpucb"]
#: (AMM and DMM take a per-run λ as a per-run mixture scale c_r = σ²/λ_r, tested in
#: tests/confidence/test_batched_rules.py::test_per_run_lambda_is_a_per_run_mixture_scale)
PER_RUN_LAM = ["kucb", "kucb-theory", "gpucb-srinivas", "r-gpucb", "sw-gpucb"]


def _grid_env(name: str) -> Any:
    return _env("tv-rotation" if name in WINDOWED else "rkhs")


@pytest.mark.parametrize(("name", "setting"), [*((n, "beta") for n in PER_RUN_BETA),
                                               *((n, "lam") for n in PER_RUN_LAM)])
def test_per_run_grid_equals_the_three_sequential_runs(name: str, setting: str) -> None:
    env = _grid_env(name)
    grid = BETA_GRID if setting == "beta" else LAM_GRID
    extra = {"beta": 1.0} if name in WINDOWED else {}   # per-run values need a constant β
    batch = _policy(name, env, **extra)
    batch.set_per_run(**{setting: grid})
    seeds = [5, 6, 7]
    batch.reset(seed=seeds)
    seqs = [_seeded(_policy(name, env, **{**extra, setting: v}), s)
            for v, s in zip(grid, seeds, strict=True)]
    _lockstep(env, batch, seqs, seeds, 40, LOOSE.get(name, TOL))


@pytest.mark.parametrize("name", sorted(set(POLICIES) - {"random"}))
def test_per_run_settings_a_policy_cannot_take_are_refused(name: str) -> None:
    env = _grid_env(name)
    for setting, allowed in (("beta", PER_RUN_BETA), ("lam", PER_RUN_LAM)):
        if name in allowed or (setting == "lam" and name in ("amm-ucb", "dmm-ucb")):
            continue
        policy = _policy(name, env)
        with pytest.raises((ValueError, AttributeError)):
            policy.set_per_run(**{setting: BETA_GRID})
            policy.reset(seed=[0, 1, 2])


# ------------------------------------------------------------------- bad input
def _play(policy: Any, benv: BatchedEnv, rounds: int) -> None:
    rows = torch.arange(benv.n_runs)
    for _ in range(rounds):
        cand = benv.candidates()
        idx = policy.select(cand)
        reward, _ = benv.pull(idx)
        policy.update(cand[rows, idx], reward)


def _tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in state.items() if isinstance(v, torch.Tensor)}


def _env_for(name: str) -> Any:
    return _env("tv-switch" if name in WINDOWED else "rkhs-fixed")


def _started(name: str, rounds: int) -> tuple[Any, Any, BatchedEnv]:
    """The environment, the batched policy after ``rounds`` rounds, and its batched env."""
    env = _env_for(name)
    policy = _seeded(_policy(name, env), SEEDS)
    benv = BatchedEnv(env, SEEDS)
    _play(policy, benv, rounds)
    return env, policy, benv


@pytest.mark.parametrize("name", list(POLICIES))
def test_bad_input_raises_naming_the_argument_and_changes_no_run(name: str) -> None:
    _, policy, benv = _started(name, 9)
    twin = copy.deepcopy(policy)
    before = _tensors(policy.state_dict())
    cand = benv.candidates()
    x, y = cand[:, 0], torch.zeros(8, dtype=torch.float64)
    nan_one = y.clone()
    nan_one[3] = float("nan")
    bad = [("candidates", lambda: policy.select(cand[:7])),
           ("candidates", lambda: policy.select(cand[0])),
           ("x", lambda: policy.update(x[:7], y)),
           ("x", lambda: policy.update(torch.cat([x, x], dim=1), y)),
           ("reward", lambda: policy.update(x, y[:7])),
           ("reward", lambda: policy.update(x, y[:, None])),
           ("reward", lambda: policy.update(x, nan_one)),
           ("x", lambda: policy.update(torch.full_like(x, float("inf")), y))]
    for arg, call in bad:
        with pytest.raises(ValueError, match=arg):
            call()
    after = _tensors(policy.state_dict())
    assert sorted(after) == sorted(before)
    for k, v in before.items():
        assert torch.equal(v, after[k]), k
    assert policy.t == twin.t
    if _scored(policy):
        torch.testing.assert_close(policy(cand), twin(cand), atol=0, rtol=0)
    assert torch.equal(policy.select(cand), twin.select(cand))


# ------------------------------------------------------------------- state, dtype, device
@pytest.mark.parametrize("name", list(POLICIES))
def test_state_dict_round_trip_mid_batch_continues_identically(name: str) -> None:
    env, policy, benv = _started(name, 11)
    state = copy.deepcopy(policy.state_dict())
    fresh = _policy(name, env)                     # sequential mode until it loads
    fresh.load_state_dict(state)
    assert fresh.n_runs == 8 and fresh.t == policy.t
    rows = torch.arange(8)
    for _ in range(12):
        cand = benv.candidates()
        if _scored(policy):
            torch.testing.assert_close(fresh(cand), policy(cand), **LOOSE.get(name, TOL))
        a, b = policy.select(cand), fresh.select(cand)
        assert torch.equal(a, b)
        reward, _ = benv.pull(a)
        policy.update(cand[rows, a], reward)
        fresh.update(cand[rows, b], reward)


@pytest.mark.parametrize("name", list(POLICIES))
def test_to_dtype_mid_batch(name: str) -> None:
    """``.to(float32)`` mid-batch: the batch goes on in float32 (scores near the float64 ones,
    indices ``[R]``); ``.double()`` back gives the float64 scores again to float32 rounding."""
    _, policy, benv = _started(name, 8)
    cand = benv.candidates()
    before = policy(cand) if _scored(policy) else None
    policy.to(torch.float32)
    assert policy.dtype == torch.float32 and policy.n_runs == 8
    if before is not None:
        ucb = policy(cand)
        assert ucb.dtype == torch.float32
        torch.testing.assert_close(ucb.double(), before, atol=5e-3, rtol=1e-3)
    _play(policy, benv, 3)
    policy.to(torch.float64)
    idx = policy.select(benv.candidates())
    assert idx.dtype == torch.long and idx.shape == (8,)


@pytest.mark.parametrize("name", list(POLICIES))
def test_to_device_mid_batch(name: str) -> None:
    """``.to(device)`` mid-batch keeps the batch (CPU → CPU here; CPU → CUDA when present, where
    the rest of the batch must make the choices of the batch that stayed on the CPU)."""
    _, policy, benv = _started(name, 6)
    twin = copy.deepcopy(policy)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    policy.to(device)
    assert policy.n_runs == 8 and policy.device.type == device.type
    rows = torch.arange(8)
    for _ in range(8):
        cand = benv.candidates()
        a = policy.select(cand.to(device))
        assert a.device.type == device.type
        assert torch.equal(a.cpu(), twin.select(cand))
        reward, _ = benv.pull(a.cpu())
        policy.update(cand[rows, a.cpu()].to(device), reward.to(device))
        twin.update(cand[rows, a.cpu()], reward)
