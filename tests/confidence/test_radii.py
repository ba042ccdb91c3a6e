"""Foundation radius rules: formulas and golden values (computed for the bounds of Flynn & Reeb 2024
by an independent numpy/CVXPY check, not taken from the paper)."""

from __future__ import annotations

import math

import pytest
import torch

from torchbandits.confidence import AYBeta, ConstantBeta, IGPBeta, KernelUCBTheoryBeta, SrinivasBeta
from torchbandits.kernels import kernel_matrix, make_kernel
from torchbandits.models import ExactKernelRidge

X = torch.tensor([0.0, 0.2, 0.45, 0.7, 1.0], dtype=torch.float64)[:, None]
Y = torch.tensor([0.5, 1.2, 0.8, -0.3, 0.1], dtype=torch.float64)
Q = torch.tensor([0.1, 0.6, 1.5], dtype=torch.float64)[:, None]


def _model(lam: float) -> ExactKernelRidge:
    m = ExactKernelRidge(make_kernel("rbf", 0.5), lam)
    m.extend(X, Y)
    return m


@pytest.mark.parametrize(
    "rule, lam, expected",
    [
        (IGPBeta(10.0, 0.1, delta=0.01, eta=0.002), 1.002, [6.229695, 5.711549, 9.317140]),
        (IGPBeta(10.0, 0.1, delta=0.01, eta=0.002, use_t_eta=True), 1.002,
         [6.214522, 5.697031, 9.292007]),
        (AYBeta(10.0, 0.1, lam=0.01, delta=0.01), 0.01, [2.039949, 1.345510, 11.026216]),
    ],
)
def test_golden_ucbs_flynn_reeb(rule, lam, expected):
    ucb, lcb = rule.bounds(_model(lam), Q, t=6)
    assert torch.allclose(ucb, torch.tensor(expected, dtype=torch.float64), atol=1e-6)
    mean = _model(lam).mean_var(Q)[0]
    assert torch.allclose(ucb - mean, mean - lcb, atol=1e-12)  # symmetric


def test_kucb_theory_radius_formula():
    lam, b, delta, sigma = 0.5, 3.0, 0.05, 0.2
    m = _model(lam)
    gram = kernel_matrix(m.kernel, X, X)
    logdet = torch.logdet(torch.eye(5, dtype=torch.float64) + gram / lam)
    expected = math.sqrt(lam) * b + sigma * math.sqrt(2 * math.log(1 / delta) + float(logdet))
    rule = KernelUCBTheoryBeta(b, delta=delta, noise_scale=sigma)
    assert float(rule.radius(m, 3, 6)) == pytest.approx(expected, rel=1e-12)
    ucb, _ = rule.bounds(m, Q, 6)
    mean, var = m.mean_var(Q)
    assert torch.allclose(ucb, mean + expected * torch.sqrt(var / lam), rtol=1e-12)  # ridge sd


def test_srinivas_finite_and_rkhs():
    m = _model(0.01)
    rule = SrinivasBeta(delta=0.1)
    t, n_arms = 6, 3
    beta = 2 * math.log(n_arms * t**2 * math.pi**2 / (6 * 0.1))
    assert float(rule.radius(m, n_arms, t)) == pytest.approx(math.sqrt(beta), rel=1e-12)
    rk = SrinivasBeta(delta=0.1, mode="rkhs", norm_bound=2.0)
    gamma = 0.5 * float(m.log_det())
    expected = math.sqrt(2 * 4.0 + 300 * gamma * math.log(t / 0.1) ** 3)
    assert float(rk.radius(m, n_arms, t)) == pytest.approx(expected, rel=1e-12)


def test_constant_beta_conventions():
    m = _model(4.0)
    mean, var = m.mean_var(Q)
    ucb_gp, _ = ConstantBeta(2.0, "gp").bounds(m, Q, 6)
    ucb_ridge, _ = ConstantBeta(2.0, "ridge").bounds(m, Q, 6)
    assert torch.allclose(ucb_gp - mean, 2.0 * var.sqrt())
    assert torch.allclose(ucb_ridge - mean, 2.0 * (var / 4.0).sqrt())
    with pytest.raises(ValueError, match="beta"):
        ConstantBeta(-1.0)
    with pytest.raises(ValueError, match="variance"):
        ConstantBeta(1.0, "std")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="delta"):
        SrinivasBeta(delta=1.5)


@pytest.mark.parametrize("variance", ["gp", "ridge"])
def test_ucb_form_is_the_rules_ucb(variance):
    """A radius rule's closed form ``μ_reg + β·sqrt(ρ²_reg / div)`` evaluated by hand from the
    model's posterior equals the rule's own ``ucb``; a subclass with its own ``ucb`` and a rule
    without a closed form give none."""
    from torchbandits.confidence.base import ConfidenceRule
    from torchbandits.confidence.radii import ucb_form

    def make(cls):
        return cls(10.0, delta=0.01, noise_scale=0.1) if variance == "ridge" else \
            cls(10.0, 0.1, delta=0.01, eta=0.002)

    rule = make(KernelUCBTheoryBeta if variance == "ridge" else IGPBeta)
    model = _model(0.3)
    form = ucb_form(rule, model, Q.shape[0], 6)
    assert form is not None and form.regs == ((0.3,) if rule.reg is None else (rule.reg,))
    assert form.divisors == ((0.3,) if variance == "ridge" else (1.0,))
    mean, var = model.mean_var(Q, reg=form.regs[0])
    by_hand = mean + form.betas[0] * torch.sqrt(var / form.divisors[0])
    assert torch.allclose(by_hand, rule.ucb(model, Q, t=6), atol=1e-12, rtol=0)

    class Shifted(type(rule)):
        def ucb(self, model, candidates, t):
            return super().ucb(model, candidates, t) + 1.0

    shifted = make(Shifted)
    assert ucb_form(shifted, model, Q.shape[0], 6) is None
    assert ucb_form(ConfidenceRule(), model, Q.shape[0], 6) is None
