"""Batched confidence rules: run ``r`` of a batch is the sequential run with seed ``r``.

GP-UCB with the radii of Srinivas et al. (2010, Thm 1 and Thm 3) and Abbasi-Yadkori (2012,
Thm 3.11), and the martingale-mixture bounds of Flynn & Reeb (2024) — AMM (§5.5), DMM (§5.4, the
grid by a companion model) and CMM by its 1-D dual (§5.3, Eq. 12) — stepped as one batch on the
RKHS environment of Flynn & Reeb (2024, §7): the same actions as the sequential runs and the
same regrets, UCBs, LCBs and diagnostics to 1e-10 (float64); per-run λ; bad input changes
nothing; a ``state_dict`` round trip mid-batch continues identically. Sizes: R = 8 seeds and
200 rounds through ``simulate_batch``, R = 4 for CMM (an ``eigh`` per run per round); the
lockstep UCB checks run 40 rounds.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from torchbandits.confidence import AMMBound, SrinivasBeta
from torchbandits.confidence.batched import BATCHED_RULES, batched_dual_ucb, batched_radius_sq
from torchbandits.confidence.cmm_dual import dual_bounds, spectrum
from torchbandits.envs.batched import BatchedEnv
from torchbandits.experiments import simulate, simulate_batch
from torchbandits.experiments.batch import can_batch
from torchbandits.experiments.registry import make_env, make_policy
from torchbandits.kernels import kernel_diag, kernel_matrix, make_kernel
from torchbandits.models import ExactKernelRidge
from torchbandits.models.batched_exact import BatchedExactKernelRidge
from torchbandits.policies import AMMUCB, DMMUCB, GPUCB, KernelUCB
from torchbandits.policies import kernel_ucb as kernel_ucb_module

from ..batch_checks import cli_runs_on_off, lockstep, play, refuses_bad_input, reloaded, seeded_runs, started

NEW = ["gpucb-srinivas", "ay-gpucb", "aygp-ucb", "amm-ucb", "dmm-ucb", "cmm-ucb"]
TOL = {"atol": 1e-10, "rtol": 0.0}
# CMM's dual search (a log-grid, then 3 safeguarded Newton steps) is not converged where the
# minimum sits at a kink (R̃²_α or ρ²_α clamped at 0): there the sequential bound itself moves by
# up to ~1e-7 when its kernel columns move by one ulp (checked below), so batched and
# sequential CMM bounds, computed with BLAS calls of other shapes, agree to that, not to 1e-10
CMM_TOL = {"atol": 2e-7, "rtol": 0.0}


def _env(fixed: bool = False):  # type: ignore[no-untyped-def]
    return make_env("rkhs", dim=2, n_arms=30, fixed_arms=fixed)


def _make(name: str, env):  # type: ignore[no-untyped-def]
    if name == "srinivas-rkhs":
        return GPUCB(make_kernel("matern52", 0.2), lam=0.01,
                     beta=SrinivasBeta(delta=0.1, mode="rkhs", norm_bound=2.0))
    return make_policy(name, env, **({"horizon": 200} if name.endswith("-ucb") else {}))


@pytest.mark.parametrize("name", [*NEW, "srinivas-rkhs"])
def test_simulate_batch_equals_simulate(name: str) -> None:
    env = _env()
    seeds = [0, 1, 2, 3] if name == "cmm-ucb" else [0, 1, 2, 3, 5, 8, 13, 21]
    policy = _make(name, env)
    assert policy.why_not_batched() is None and can_batch(policy, env)
    runs = simulate_batch(policy, env, 200, seeds)
    for res in runs:
        seq = simulate(_make(name, env), env, 200, res.seed)
        assert res.actions == seq.actions, (name, res.seed)
        assert res.regret == pytest.approx(seq.regret, abs=1e-10, rel=0)
        assert sorted(res.diagnostics) == sorted(seq.diagnostics)
        for key, values in seq.diagnostics.items():
            # CMM's log α at the dual minimum: where h is flat, rounding moves the minimiser by
            # about sqrt(machine ε) while the bound moves by ε; the bound is checked to 1e-10
            tol = 1e-6 if key == "log_alpha_ratio" else 1e-10
            assert res.diagnostics[key] == pytest.approx(values, abs=tol, rel=0, nan_ok=True), key


def _bounds(policy, cand: torch.Tensor):  # type: ignore[no-untyped-def]
    """``(ucb, lcb)``: ``[R, A]`` each for a batch, ``[A]`` for one run."""
    return policy.bounds(cand)


def _ucb(policy, cand: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return policy.bounds(cand)[0]


def _lockstep(env, make, seeds, horizon: int, batch=None, tol=TOL):  # type: ignore[no-untyped-def]
    """Batched and sequential policies (``make(None)`` unless ``batch`` is given, ``make(r)``) on
    the batched env's rounds: the same choice and the same UCB and LCB (``tol``) every round;
    returns the batched policy's actions ``[T, R]``."""
    batch = batch if batch is not None else started(make(None), seeds)
    return lockstep(env, seeds, horizon, batch, seeded_runs(make, seeds), atol=tol["atol"],
                    score=_bounds)


@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("name", ["ay-gpucb", "amm-ucb", "dmm-ucb", "cmm-ucb"])
def test_ucb_and_lcb_equal_the_sequential_rule(name: str, fixed: bool) -> None:
    env = _env(fixed)
    _lockstep(env, lambda r: _make(name, env), [0, 1, 2], 40,
              tol=CMM_TOL if name == "cmm-ucb" else TOL)


def test_sequential_cmm_dual_moves_by_more_than_1e10_under_one_ulp() -> None:
    """Why CMM is compared to 2e-7: the sequential dual itself, fed kernel columns one ulp
    off, moves by more than 1e-10 on the fixed-arm run where batched and sequential differ."""
    env = _env(fixed=True)
    policy = _make("cmm-ucb", env)
    policy.reset(seed=1)
    benv = BatchedEnv(env, [1])
    moved = 0.0
    for _ in range(8):
        cand = benv.candidates()[0]
        if policy.t >= 1:
            m, rule = policy.model, policy.rule
            kq, kd = kernel_matrix(m.kernel, m.x, cand), kernel_diag(m.kernel, cand)
            args = (kd, rule.radius_sq(m), rule.norm_bound, rule.alpha0)
            base = dual_bounds(spectrum(m), kq, *args)[0]
            off = dual_bounds(spectrum(m), kq * (1 + 2e-16), *args)[0]
            moved = max(moved, float((base - off).abs().max()))
        i = policy.select(cand)
        reward, _ = benv.pull(torch.tensor([i]))
        policy.update(cand[i], float(reward[0]))
    assert 1e-10 < moved < CMM_TOL["atol"]


def test_per_run_lambda_equals_sequential_runs() -> None:
    env = _env()
    lams = [0.1, 1.0, 10.0]
    kernel = make_kernel("matern52", 0.2)

    def make(r):  # type: ignore[no-untyped-def]
        return GPUCB(kernel, lam=1.0 if r is None else lams[r], beta=SrinivasBeta(delta=0.1))

    batch = make(None)
    batch.set_per_run(lam=lams)
    batch.reset(seed=[0, 1, 2])
    acts = _lockstep(env, make, [0, 1, 2], 40, batch=batch)
    assert acts.shape == (40, 3)


@pytest.mark.parametrize("cls", [AMMUCB, DMMUCB])
def test_per_run_lambda_is_a_per_run_mixture_scale(cls) -> None:  # type: ignore[no-untyped-def]
    """AMM and DMM (Flynn & Reeb 2024, §5.5 and §5.4) with per-run λ = σ²/c_r: run r is the
    policy built with c_r."""
    env = _env()
    sigma, cs = 0.1, [0.2, 1.0, 5.0]
    kernel = make_kernel("matern52", 0.2)

    def make(r):  # type: ignore[no-untyped-def]
        return cls(kernel, noise_std=sigma, norm_bound=2.0, c=1.0 if r is None else cs[r])

    batch = make(None)
    batch.set_per_run(lam=[sigma**2 / c for c in cs])
    batch.reset(seed=[0, 1, 2])
    _lockstep(env, make, [0, 1, 2], 40, batch=batch)


def test_per_run_lambda_is_refused_with_cmm() -> None:
    policy = make_policy("cmm-ucb", _env())
    policy.set_per_run(lam=[0.1, 1.0])
    with pytest.raises(ValueError, match="lam"):
        policy.reset(seed=[0, 1])
    assert policy.n_runs is None


@pytest.mark.parametrize("name", ["dmm-ucb", "cmm-ucb"])
def test_bad_input_raises_and_changes_nothing(name: str) -> None:
    env = _env()
    seeds = [3, 4, 5]
    policy = started(_make(name, env), seeds)
    benv = BatchedEnv(env, seeds)
    play(policy, benv, 6)
    twin = copy.deepcopy(policy)
    cand = benv.candidates()
    refuses_bad_input(policy, cand)
    assert policy.t == twin.t and policy.batch_model.n == twin.batch_model.n
    assert torch.equal(policy.batch_model.y, twin.batch_model.y)
    torch.testing.assert_close(policy.bounds(cand)[0], twin.bounds(cand)[0], atol=0, rtol=0)
    assert torch.equal(policy.select(cand), twin.select(cand))


@pytest.mark.parametrize("name", ["amm-ucb", "dmm-ucb", "cmm-ucb"])
def test_state_dict_round_trip_mid_batch(name: str) -> None:
    env = _env(fixed=name == "dmm-ucb")   # DMM: the companion's candidate cache too
    seeds = [4, 7, 1]
    policy = started(_make(name, env), seeds)
    benv = BatchedEnv(env, seeds)
    play(policy, benv, 12)
    fresh = reloaded(policy, _make(name, env))     # sequential until it loads
    assert fresh.n_runs == 3 and fresh.batch_model.n == 12
    # to rounding: a reloaded fixed-arm cache is rebuilt in one solve, not row by row
    play(policy, benv, 15, twin=fresh, atol=TOL["atol"], score=_ucb)


def test_reset_in_batch_mode_drops_the_companions() -> None:
    env = _env()
    seeds = [0, 1]
    policy = started(_make("dmm-ucb", env), seeds)
    first = _lockstep(env, lambda r: _make("dmm-ucb", env), seeds, 15, batch=policy)
    policy.reset()                                 # the same batch, back to the prior
    assert policy.n_runs == 2 and policy.batch_model.n == 0
    policy.reset(seed=seeds)
    again = _lockstep(env, lambda r: _make("dmm-ucb", env), seeds, 15, batch=policy)
    assert torch.equal(first, again)


def test_companion_model_equals_sequential_models_at_the_grid() -> None:
    kernel = make_kernel("matern52", 0.3)
    torch.manual_seed(0)
    x = torch.rand(3, 9, 2, dtype=torch.float64)
    y = torch.randn(3, 9, dtype=torch.float64)
    cand = torch.rand(3, 7, 2, dtype=torch.float64)
    lam = torch.tensor([0.05, 0.5, 2.0], dtype=torch.float64)
    grid = (0.1, 1.0, 10.0)
    model = BatchedExactKernelRidge(kernel, lam, 3)
    for i in range(5):
        model.append(x[:, i], y[:, i])
    comp = model.at_regularisers(grid)               # built after 5 points, caught up
    for i in range(5, 9):
        model.append(x[:, i], y[:, i])
    comp = model.at_regularisers(grid)               # catches up the 4 newer points
    assert comp.n == 9 and comp.n_runs == 9
    mean, var = comp.mean_var_groups(cand, 3)        # one kernel evaluation per run
    # seen twice: through mean_var and its fixed-set cache; the repeated candidates alike
    for got_mean, got_var in (comp.mean_var_groups(cand, 3),
                              comp.mean_var(model.repeat_candidates(cand, 3))):
        torch.testing.assert_close(got_mean, mean, atol=1e-12, rtol=0)
        torch.testing.assert_close(got_var, var, atol=1e-12, rtol=0)
    for r in range(3):
        for g, m in enumerate(grid):
            seq = ExactKernelRidge(kernel, float(m * lam[r]))
            seq.extend(x[r], y[r])
            sm, sv = seq.mean_var(cand[r])
            torch.testing.assert_close(mean[3 * r + g], sm, atol=1e-12, rtol=0)
            torch.testing.assert_close(var[3 * r + g], sv, atol=1e-12, rtol=0)
            torch.testing.assert_close(comp.quad_y()[3 * r + g], seq.quad_y(), atol=1e-11, rtol=0)
            torch.testing.assert_close(comp.log_det()[3 * r + g], seq.log_det(), atol=1e-11, rtol=0)
    model.reset()
    assert model.at_regularisers(grid).n == 0        # a reset drops the companion


def test_batched_dual_equals_the_sequential_dual() -> None:
    """The vectorised α search of the CMM dual (Flynn & Reeb 2024, Eq. 12) for R problems at
    once gives each problem's sequential bounds; R_t² (Eq. 8) too."""
    kernel = make_kernel("rbf", 0.25)
    torch.manual_seed(1)
    x = torch.rand(4, 12, 2, dtype=torch.float64)
    y = torch.randn(4, 12, dtype=torch.float64)
    cand = torch.rand(4, 25, 2, dtype=torch.float64)
    rule = AMMBound(noise_std=0.1, norm_bound=2.0, c=0.5)
    model = BatchedExactKernelRidge(kernel, rule.alpha0, 4)
    for i in range(12):
        model.append(x[:, i], y[:, i])
    r2 = batched_radius_sq(model, rule.noise_std, rule.c, rule.delta)
    evals, evecs, ytil = model.spectrum()
    kq = kernel_matrix(kernel, x, cand)
    kd = kernel_diag(kernel, cand.reshape(-1, 2)).reshape(4, 25)
    ucb, lcb, _ = batched_dual_ucb(evals, evecs, ytil, kq, kd, r2, rule.norm_bound, rule.alpha0)
    for r in range(4):
        seq = ExactKernelRidge(kernel, rule.alpha0)
        seq.extend(x[r], y[r])
        torch.testing.assert_close(r2[r], rule.radius_sq(seq), atol=1e-12, rtol=0)
        su, sl, _ = dual_bounds(spectrum(seq), kq[r], kd[r], rule.radius_sq(seq), rule.norm_bound,
                                 rule.alpha0)
        torch.testing.assert_close(ucb[r], su, **TOL)
        torch.testing.assert_close(lcb[r], sl, **TOL)



def test_why_not_batched_names_what_stays_sequential() -> None:
    env = _env()
    assert all(make_policy(n, env).why_not_batched() is None for n in NEW)
    assert "socp" in make_policy("cmm-ucb", env, method="socp").why_not_batched()
    other = KernelUCB(make_kernel("rbf", 0.5), lam=1.0, beta=AMMBound(0.1, 1.0, c=1.0))
    assert "σ²/c" in other.why_not_batched()             # AMM on a model at λ ≠ σ²/c
    assert kernel_ucb_module.BATCHED_RULES is BATCHED_RULES


def test_cli_batch_on_runs_amm_batched(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", "--env", "rkhs", "--policy", "amm-ucb,dmm-ucb", "--seeds", "0", "1", "2",
            "--horizon", "12", "--no-progress"]
    on, off = cli_runs_on_off(args, tmp_path)
    assert len(on) == 6
    for name in on:
        assert on[name]["regret"] == pytest.approx(off[name]["regret"], abs=1e-10, rel=0)
    capsys.readouterr()


def test_forward_of_batched_mixture_policies_scores_every_run() -> None:
    """``policy(candidates [R, A, d])`` of a batched AMM/DMM/CMM policy returns ``[R, A]``, the
    UCB of each run as its sequential twin computes it."""
    from torchbandits.policies import AMMUCB, CMMUCB, DMMUCB

    gen = torch.Generator().manual_seed(3)
    x = torch.rand(4, 6, 2, generator=gen, dtype=torch.float64)
    y = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    cand = torch.rand(4, 9, 2, generator=gen, dtype=torch.float64)
    for cls in (AMMUCB, DMMUCB, CMMUCB):
        batch = cls(make_kernel("rbf", 0.5), noise_std=0.1, norm_bound=1.0)
        batch.reset(seed=[0, 1, 2, 3])
        seqs = [cls(make_kernel("rbf", 0.5), noise_std=0.1, norm_bound=1.0) for _ in range(4)]
        for t in range(6):
            batch.update(x[:, t], y[:, t])
            for r, p in enumerate(seqs):
                p.update(x[r, t], float(y[r, t]))
        ucb = batch(cand)
        assert ucb.shape == (4, 9)
        for r, p in enumerate(seqs):
            assert float((ucb[r] - p(cand[r])).abs().max()) < 1e-6
