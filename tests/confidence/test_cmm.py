"""Kernel CMM (Flynn & Reeb 2024): the CVXPY SOCP of Eq. (10) against the 1-D dual of Eq. (12)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from torchbandits.confidence.cmm_socp import CMMSocp
from torchbandits.confidence.mixture import CMMBound, DMMBound, default_c
from torchbandits.envs.rkhs import RKHSFunctionEnv
from torchbandits.kernels import kernel_matrix, make_kernel
from torchbandits.models import ExactKernelRidge
from torchbandits.policies import CMMUCB

F64 = torch.float64
X = torch.tensor([0.0, 0.2, 0.45, 0.7, 1.0], dtype=F64)[:, None]
Y = torch.tensor([0.5, 1.2, 0.8, -0.3, 0.1], dtype=F64)
Q = torch.tensor([0.1, 0.6, 1.5], dtype=F64)[:, None]


def _golden_model() -> ExactKernelRidge:
    m = ExactKernelRidge(make_kernel("rbf", 0.5), 0.01)
    m.extend(X, Y)
    return m


def test_socp_golden_values():
    m = _golden_model()
    dual_u, dual_l = CMMBound(0.1, 10.0, 0.01, 1.0).bounds(m, Q, 6)
    for factor in ("chol", "eigh"):  # the exact factor by default (no jitter): both equal the dual
        u, lcb = CMMBound(0.1, 10.0, 0.01, 1.0, method="socp", factor=factor).bounds(m, Q, 6)
        assert torch.allclose(u, torch.tensor([1.573077, 0.693866, 7.733671], dtype=F64), atol=1e-5)
        assert float((u - dual_u).abs().max()) < 1e-6 and float((lcb - dual_l).abs().max()) < 1e-6


def test_socp_jitter_only_when_the_factorisation_fails():
    m = _golden_model()
    socp = CMMSocp()
    gram = kernel_matrix(m.kernel, X, X)
    kq, kd = kernel_matrix(m.kernel, X, Q), torch.ones(3, dtype=F64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        socp.bounds(gram, Y, 0.67, 10.0, kq, kd)
    assert socp.jitter_used == 0.0
    # a repeated point makes K_t exactly singular: the exact Cholesky fails, ε = 1e-6 is added
    x2 = torch.cat([X, X[:1]])
    gram2 = kernel_matrix(m.kernel, x2, x2)
    with pytest.warns(RuntimeWarning, match="singular"):
        u, lcb, ok = socp.bounds(gram2, torch.cat([Y, Y[:1]]), 0.67, 10.0, kernel_matrix(m.kernel, x2, Q), kd)
    assert socp.jitter_used == 1e-6 and bool(ok.all()) and bool((u >= lcb).all())
    with pytest.raises(np.linalg.LinAlgError):  # no fallback asked for: the failure is reported
        CMMSocp(jitter=0.0).bounds(gram2, torch.cat([Y, Y[:1]]), 0.67, 10.0,
                                   kernel_matrix(m.kernel, x2, Q), kd)


@pytest.mark.parametrize("kernel, ls, d, seed", [("matern52", 0.5, 3, 0), ("rbf", 0.3, 2, 1),
                                                  ("matern32", 0.2, 1, 2)])
def test_dual_equals_socp(kernel, ls, d, seed):
    gen = torch.Generator().manual_seed(seed)
    env = RKHSFunctionEnv(kernel, d, ls)
    env.reset(seed)
    x = torch.rand(25, d, generator=gen, dtype=F64)
    y = env.f(x) + 0.1 * torch.randn(25, generator=gen, dtype=F64)
    cand = torch.rand(6, d, generator=gen, dtype=F64)
    c = default_c(kernel, d, 100)
    m = ExactKernelRidge(env.kernel, 0.01 / c)
    m.extend(x, y)
    du, dl = CMMBound(0.1, 10.0, 0.01, c).bounds(m, cand, 26)
    for factor in ("chol", "eigh"):  # the SOCP reference equals the dual to 1e-6 (exact factors)
        su, sl = CMMBound(0.1, 10.0, 0.01, c, method="socp", factor=factor).bounds(m, cand, 26)
        assert float((du - su).abs().max()) < 1e-6
        assert float((dl - sl).abs().max()) < 1e-6


def test_socp_builds_once_per_round_and_fallback_warns():
    m = _golden_model()
    socp = CMMSocp()
    gram = torch.exp(-((X - X.mT) ** 2) / 0.5)
    kq = torch.exp(-((X - Q.mT) ** 2) / 0.5)
    kd = torch.ones(3, dtype=F64)
    socp.bounds(gram, Y, 0.67, 10.0, kq, kd)
    problem = socp._problem
    socp.bounds(gram, Y, 0.67, 10.0, kq[:, :2], kd[:, None][:2, 0])
    assert socp._problem is problem  # same data: compiled program reused
    assert socp.statuses == {"optimal": 10}
    # data that no f with ‖f‖ ≤ B fits: infeasible → DMM value and a warning
    rule = CMMBound(0.1, 0.05, 0.01, 1.0, method="socp")
    with pytest.warns(RuntimeWarning, match="DMM"):
        u, lcb = rule.bounds(m, Q, 6)
    du, dl = DMMBound(0.1, 0.05, 0.01, 1.0).bounds(m, Q, 6)
    assert torch.allclose(u, du) and torch.allclose(lcb, dl)
    assert rule.diagnostics()["socp_failures"] == 3.0


def test_cmm_policy_dual_and_socp_agree():
    env = RKHSFunctionEnv("matern52", 2, 0.5, n_arms=8)
    pols = [CMMUCB(env.kernel, 0.1, 10.0, 0.01, 0.2, method=mth,
                   rule_kwargs={"factor": "eigh"} if mth == "socp" else None) for mth in ("dual", "socp")]
    env.reset(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(6):
            cand = env.candidates()
            scores = [p(cand) for p in pols]
            assert torch.allclose(scores[0], scores[1], rtol=1e-4, atol=1e-5)
            i = pols[0].select(cand)
            r = env.pull(i)
            for p in pols:
                p.update(cand[i], r)
    # state_dict round trip keeps the rule's answers
    clone = CMMUCB(env.kernel, 0.1, 10.0, 0.01, 0.2)
    clone.load_state_dict(pols[0].state_dict())
    cand = env.candidates()
    assert torch.allclose(clone(cand), pols[0](cand), rtol=1e-12)


def test_reproduce_quick(tmp_path):
    """``--quick`` of the reproduction writes the table and readable figures, says it is a quick
    run, and sets no paper value beside its numbers (a full-size table does)."""
    import subprocess
    import sys
    from pathlib import Path

    from torchbandits.experiments.results import load_results
    from torchbandits.reproduce.cmm import _table

    from ..figure_checks import assert_readable_figures

    script = Path(__file__).resolve().parents[2] / "scripts" / "reproduce_confidence_bounds.py"
    out = tmp_path / "cmm"
    proc = subprocess.run([sys.executable, str(script), "--quick", "--seeds", "0", "--out", str(out),
                           "--no-progress"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = (out / "table1.md").read_text()
    assert "| CMM |" in table and "[paper" not in table and "quick run" in table
    assert proc.stdout.startswith("QUICK RUN (T = 25")
    assert "{'method'" not in proc.stdout and "| CMM-SOCP |" in proc.stdout   # Figure 4: a table
    assert "regret at t = 25 " in proc.stdout and "t = 200" not in proc.stdout
    for name in ("figure1_bands.png", "figure2_regret.png", "figure4_time.png", "figure5_regret_d2.png",
                 "figure6_regret_d4.png", "figure7_loose.png", "summary.json"):
        assert (out / name).stat().st_size > 0, name
    assert_readable_figures(out, at_least=6)
    runs = load_results(out / "table1" / "runs")
    assert len(runs) == 6 * 6  # 6 columns × (CMM, DMM, AMM, AY, IGP, Random) × 1 seed
    assert "[paper 32.2 ± 20.9]" in _table(runs, 3, with_paper=True)


def test_border_path_equals_fresh_eigh_along_a_run():
    """Refreshing the eigenbasis every few rounds (exact Schur border) = eigh every round."""
    env = RKHSFunctionEnv("matern52", 3, 0.5, n_arms=40)
    c = default_c("matern52", 3, 200)
    fresh = CMMBound(0.1, 10.0, 0.01, c, refresh_every=0)
    border = CMMBound(0.1, 10.0, 0.01, c, refresh_every=5, border_min_n=10)
    pol = CMMUCB(env.kernel, 0.1, 10.0, 0.01, c, rule_kwargs={"refresh_every": 4, "border_min_n": 8})
    env.reset(1)
    queries = torch.rand(30, 3, generator=torch.Generator().manual_seed(0), dtype=F64)
    borders = set()
    for t in range(45):
        cand = env.candidates()
        i = pol.select(cand)
        pol.update(cand[i], env.pull(i))
        fu, fl = fresh.bounds(pol.model, queries, t + 2)
        bu, bl = border.bounds(pol.model, queries, t + 2)
        borders.add(border.diagnostics().get("border", 0.0))
        assert torch.allclose(bu, fu, rtol=1e-8, atol=1e-9) and torch.allclose(bl, fl, rtol=1e-8, atol=1e-9)
    assert borders >= {0.0, 1.0, 5.0}  # refreshes and borders of every size were exercised
    assert pol.rule.diagnostics().get("border", 0.0) <= 4
