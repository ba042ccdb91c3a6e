"""OPKB / ADA-OPKB (Hong, Li & Tewari, AISTATS 2023, Algorithms 2–4): IPS moments (Def. 4.1),
schedule, block bookkeeping, change test (8), presets."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from torchbandits.design import information_gain, ips_matrix, leverages, optimal_design
from torchbandits.envs.nonstationary import SwitchingKernelEnv
from torchbandits.experiments import simulate
from torchbandits.models.features import kernel_features
from torchbandits.policies.op_presets import op_preset
from torchbandits.policies.opkb import ADAOPKB, OPKB
from torchbandits.policies.random import RandomPolicy
from torchbandits.policies.schedule import sample_schedule

D64 = torch.float64


# ------------------------------------------------------------------ presets (§3.10)
def test_code_preset_derived_values_match_the_released_config():
    c = op_preset("aistats2023_code")
    # K ≈ I, N = 100, σ = 100, T = 10⁴: γ_T = N log 2
    d = c.derived(100 * math.log(2), 10_000, 100)
    assert d["E"] == 39
    assert d["alpha"] == pytest.approx(0.903, abs=1e-3)
    assert d["c0"] == pytest.approx(55.2, abs=0.05)
    assert c.beta(0, d["gamma"], d["alpha"]) == pytest.approx(125.6, abs=0.1)
    assert c.a_threshold(0, d["alpha"]) == pytest.approx(1.25, abs=0.01)
    assert c.test_threshold(4, 4, d["c0"]) == pytest.approx(0.138, abs=1e-3)
    t = op_preset("theory")
    dt = t.derived(100 * math.log(2), 10_000, 100)
    assert dt["E"] == 7678
    # theory: β_j = c₂γ2^{j/2}, c₀β_jμ_j = 2γ, A-threshold 2αγ/β_j, test 4c₀μ_{m∧k}
    beta = t.beta(2, dt["gamma"], dt["alpha"])
    assert dt["c0"] * beta * t.mu(2) == pytest.approx(2 * dt["gamma"])
    assert t.a_threshold(2, dt["alpha"]) == pytest.approx(2 * dt["alpha"] * dt["gamma"] / beta)
    assert t.test_threshold(3, 1, dt["c0"]) == pytest.approx(4 * dt["c0"] * t.mu(1))
    assert op_preset("aistats2023_code", family="opnn").e_scale == 0.005
    with pytest.raises(ValueError, match="preset"):
        op_preset("nope")
    with pytest.raises(ValueError, match="design_mix"):
        op_preset("theory", design_mix=2.0)


# ------------------------------------------------------------------ item 7: IPS
def _small_problem(n: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g, dtype=D64)
    x = x / x.norm(dim=1, keepdim=True)
    from torchbandits.kernels import make_kernel
    phi = kernel_features(make_kernel("rbf", 0.8), x)
    theta = torch.randn(n, generator=g, dtype=D64) * 0.3
    return phi, theta


def test_ips_expectation_variance_and_bound():
    phi, theta = _small_problem()
    n, lam = phi.shape[0], 0.05
    r = phi @ theta
    pi = optimal_design(phi, lam).p
    q = torch.softmax(torch.randn(n, generator=torch.Generator().manual_seed(3), dtype=D64), 0)
    mu = 0.2
    p = (1 - mu) * q + mu * pi
    m = ips_matrix(phi, p, lam)
    mean = m @ (p * r)
    s = phi.T @ (p[:, None] * phi) + lam * torch.eye(n, dtype=D64)
    exact = r - lam * phi @ torch.linalg.solve(s, theta)
    assert torch.allclose(mean, exact, atol=1e-12)
    lev = leverages(phi, p, lam)
    bias_bound = math.sqrt(lam) * torch.sqrt(lev) * theta.norm()
    assert bool(((mean - r).abs() <= bias_bound + 1e-12).all())
    # conditional second moment Σ_a P(a) M[x,a]² ≤ ‖φ(x)‖²_{S⁻¹}
    assert bool(((m**2) @ p <= lev + 1e-12).all())
    gamma = information_gain(phi, 100, lam * 100)
    assert float(m.abs().max()) <= gamma / mu
    # Monte Carlo of the estimator: mean within 5 standard errors
    g = torch.Generator().manual_seed(5)
    draws = torch.multinomial(p, 40_000, replacement=True, generator=g)
    samples = m[:, draws] * r[draws]
    se = samples.std(1) / math.sqrt(draws.numel())
    assert bool(((samples.mean(1) - mean).abs() <= 5 * se + 1e-12).all())


# ------------------------------------------------------------------ item 8: schedule
def test_schedule_structure_and_frequencies():
    g = torch.Generator().manual_seed(0)
    j, e, start = 4, 3, 101
    counts = {m: 0 for m in range(j)}
    played = {m: 0 for m in range(j + 1)}
    reps = 4000
    for _ in range(reps):
        sch = sample_schedule(start, j, e, g)
        block = sch.replays[0]
        assert (block.index, block.start, block.end) == (j, start, start + 2**j * e - 1)
        for r in sch.replays[1:]:
            length = 2**r.index * e
            assert r.end - r.start + 1 == length
            assert (r.start - start) % length == 0            # aligned
            assert start <= r.start and r.end <= block.end     # nested in the block
            counts[r.index] += 1
        for s in range(start, block.end + 1):
            covering = [r.index for r in sch.replays if r.start <= s <= r.end]
            assert sch.active_index(s) == min(covering)
        for m, c in sch.counts().items():
            played[m] += c
    for m in range(j):
        freq = counts[m] / (reps * 2 ** (j - m))
        assert freq == pytest.approx(2 ** ((m - j) / 2), abs=0.02)
        assert played[m] / reps <= 2**m * e * 2 ** ((j - m) / 2) * 1.05
    sch = sample_schedule(1, 5, 2, g, min_index=4)
    assert all(r.index >= 4 for r in sch.replays)


# ------------------------------------------------------------------ item 9: blocks and restarts
def _env(switches=(), n=12, seed=0, **kw):
    return SwitchingKernelEnv(n_arms=n, dim=3, lengthscale=0.5, switches=switches, seed=seed, **kw)


def test_block_bookkeeping_and_history():
    env = _env()
    pol = OPKB(copy.deepcopy(env.kernel), 400, e_scale=0.02)
    env.reset(0)
    pol.reset(seed=1)
    starts = []
    for _ in range(400):
        i = pol.select(env.candidates())
        if pol.t + 1 == pol.schedule.start:
            starts.append((pol.j, pol.t + 1, pol.h_n))
        pol.update(env.candidates()[i], env.pull(i))
    e = pol.E
    assert e >= 1
    for j, s, h_n in starts:
        assert s == 1 + e * (2**j - 1)          # block j starts after 2^0E + … + 2^{j−1}E rounds
        assert h_n == s - 1                      # C(j−1) = everything played so far
    assert [j for j, _, _ in starts] == list(range(len(starts)))
    assert len(starts) >= 3
    # the IPS estimates of the policy equal the explicit per-step sum
    est = pol.interval_estimates(0, pol.h_n)
    explicit = torch.zeros(env.n_arms, dtype=D64)
    for t in range(pol.h_n):
        explicit += pol.ips[int(pol.h_m[t])][:, int(pol.h_arm[t])] * pol.h_y[t]
    assert torch.allclose(est, explicit / pol.h_n, atol=1e-12)
    assert pol.restart_times == []


def test_sign_flip_restarts_soon_after_first_eligible_replay():
    env = _env(switches=(600,), n=10)
    pol = ADAOPKB(copy.deepcopy(env.kernel), 3000, e_scale=0.02, j_star=2)
    res = simulate(pol, env, 3000, seed=0)
    assert pol.restart_times, "a sign flip of the rewards must trigger a restart"
    first = pol.restart_times[0]
    # the first restart comes after the switch, within a few blocks' worth of rounds
    assert 600 < first <= 600 + 8 * 2**2 * pol.E + 600
    # after the restart: new epoch, j = 0 at the restart, block 0 plays π(X)
    assert res.diagnostics["epoch"][first - 1] == 1.0
    assert res.diagnostics["block"][first - 1] == 0.0
    # the restarted policy beats uniform play after the switch
    rand = simulate(RandomPolicy(seed=0), env, 3000, seed=0)
    assert res.final_regret < 0.6 * rand.final_regret


def test_restart_state_is_clean():
    env = _env(switches=(600,), n=10)
    pol = ADAOPKB(copy.deepcopy(env.kernel), 3000, e_scale=0.02, j_star=2)
    env.reset(0)
    pol.reset(seed=0)
    while not pol.restart_times:
        i = pol.select(env.candidates())
        pol.update(env.candidates()[i], env.pull(i))
    assert pol.j == 0 and pol.h_n == 0 and pol.epoch == 1
    assert pol.epoch_start == pol.restart_times[0] + 1
    assert torch.equal(pol.distribution(), pol.pi_x)


def test_stationary_theory_constants_do_not_restart():
    env = _env(n=6, seed=3)
    horizon = 4000
    pol = ADAOPKB(copy.deepcopy(env.kernel), horizon, preset="theory", sigma=2000.0, delta=0.1)
    res = simulate(pol, env, horizon, seed=3)
    assert pol.restart_times == []
    assert pol.E < horizon / 8
    assert pol.n_tests > 20                       # the change tests did run
    assert res.diagnostics["block"][-1] >= 3


def test_opkb_stationary_sublinear_and_far_below_uniform():
    env = _env(n=20, seed=4)
    pol = OPKB(copy.deepcopy(env.kernel), 3000)
    res = simulate(pol, env, 3000, seed=4)
    rand = simulate(RandomPolicy(seed=4), env, 3000, seed=4)
    cum = res.cumulative_regret
    assert res.final_regret < 0.35 * rand.final_regret
    assert cum[-1] - cum[1999] < 0.7 * (cum[999] - cum[0])   # per-round regret decreases


# ------------------------------------------------------------------ contract
def test_distribution_select_state_dict_and_bad_input():
    env = _env(switches=(300,), n=10)
    pol = ADAOPKB(copy.deepcopy(env.kernel), 1000, e_scale=0.02, j_star=1)
    env.reset(0)
    pol.reset(seed=2)
    for _ in range(350):
        i = pol.select(env.candidates())
        pol.update(env.candidates()[i], env.pull(i))
    p = pol.distribution()
    assert p.shape == (10,) and float(p.sum()) == pytest.approx(1.0) and float(p.min()) >= 0
    assert torch.equal(pol(env.candidates()), p)
    clone = ADAOPKB(copy.deepcopy(env.kernel), 1000, e_scale=0.02, j_star=1)
    clone.load_state_dict(pol.state_dict())
    a, b = [], []
    env2 = copy.deepcopy(env)
    for e, pl, out in ((env, pol, a), (env2, clone, b)):
        for _ in range(200):
            i = pl.select(e.candidates())
            out.append(i)
            pl.update(e.candidates()[i], e.pull(i))
    assert a == b
    before = pol.state_dict()
    with pytest.raises(ValueError, match="one of the arms"):
        pol.update(torch.full((3,), 5.0, dtype=D64), 0.1)
    with pytest.raises(ValueError, match="reward"):
        pol.update(env.candidates()[0], float("nan"))
    after = pol.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if isinstance(before[k], torch.Tensor))
    with pytest.raises(ValueError, match="fixed arm set"):
        pol.select(env.candidates() + 1.0)
    with pytest.raises(ValueError, match="horizon"):
        OPKB(copy.deepcopy(env.kernel), 1)


def test_cvxpy_solver_option_agrees():
    env = _env(n=8, seed=6)
    a = OPKB(copy.deepcopy(env.kernel), 600, e_scale=0.05)
    b = OPKB(copy.deepcopy(env.kernel), 600, e_scale=0.05, solver="cvxpy")
    ra = simulate(a, env, 300, seed=6)
    rb = simulate(b, env, 300, seed=6)
    assert a.n_solves >= 3
    assert torch.allclose(a.strategies[: a.j + 1], b.strategies[: b.j + 1], atol=1e-4)
    assert abs(ra.final_regret - rb.final_regret) < 0.2 * ra.final_regret + 5


def test_reproduce_opkb_quick(tmp_path):
    import json

    from torchbandits.reproduce.opkb import main

    assert main(["--quick", "--figures", "fig1a", "fig2a", "--seeds", "1", "--horizon", "300",
                 "--out", str(tmp_path), "--no-progress"]) == 0
    for fig, algos in (("fig1a", 4), ("fig2a", 4)):
        table = (tmp_path / fig / "table.md").read_text()
        assert "mean ± s.e." in table and table.count("\n| ") == algos + 1
        assert (tmp_path / fig / "regret.png").stat().st_size > 1000
        runs = list((tmp_path / fig / "runs").glob("*.json"))
        assert len(runs) == algos
    run = json.loads((tmp_path / "fig1a" / "runs" / "ADA-OPKB__seed0.json").read_text())
    assert "restart_times" in run["config"] and len(run["regret"]) == 300
    assert (tmp_path / "tables.md").exists()
    from ..figure_checks import assert_readable_figures

    assert_readable_figures(tmp_path, quick=True, at_least=4)
    from PIL import Image

    with Image.open(tmp_path / "fig1a" / "regret.png") as im:     # the actual switch round
        assert "switch after round 90, T = 300" in im.text["Title"]


def test_notebook_runs_quick(monkeypatch):
    from pathlib import Path

    import nbformat
    from nbclient import NotebookClient

    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("TORCHBANDITS_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(root / "notebooks" / "nonstationary.ipynb", as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(root / "notebooks")}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []))
    assert "Lemma 4.4 slacks" in text and "restarts at" in text and "ADA-OPKB: regret" in text
