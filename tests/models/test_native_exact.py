"""The compiled single-run step of the exact model (torchbandits.native.exact, models.exact_native)
against its torch path: the same actions, bounds to 1e-10 and the same model state."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel

from torchbandits import native
from torchbandits.confidence import KernelUCBTheoryBeta
from torchbandits.kernels import make_kernel
from torchbandits.models import ExactKernelRidge
from torchbandits.native import exact as nx
from torchbandits.policies import AMMUCB, AYGPUCB, DMMUCB, GPUCB, IGPUCB, KernelUCB

pytestmark = pytest.mark.skipif(nx.available() is None, reason="no compiled library (no C compiler)")

SIGMA, NORM, DELTA, C = 0.1, 10.0, 0.01, 0.3


def _policy(method: str, kernel: str):
    """The six rules of Flynn & Reeb 2024, §7 and Zenati et al. 2022 (Lemma 3.1) on one kernel."""
    k = make_kernel(kernel, 0.5)
    kw = dict(noise_std=SIGMA, norm_bound=NORM, delta=DELTA)
    return {"AMM": lambda: AMMUCB(k, c=C, **kw), "AY": lambda: AYGPUCB(k, c=C, **kw),
            "IGP": lambda: IGPUCB(k, eta=0.002, **kw), "DMM": lambda: DMMUCB(k, c=C, **kw),
            "CONST": lambda: GPUCB(k, lam=SIGMA**2 / C, beta=2.0),
            "KUCB": lambda: KernelUCB(k, lam=1.0, beta=KernelUCBTheoryBeta(
                NORM, delta=DELTA, noise_scale=SIGMA))}[method]()


class _Calls:
    """Counts the compiled scoring calls (to know the native path ran): the scoring of
    ``models.exact_native`` and the fused selects of ``models.exact_fused`` that answered."""

    def __init__(self, monkeypatch):
        self.n = 0
        orig, fused = nx.score, ExactKernelRidge.fused_select

        def counted(*args, **kwargs):
            self.n += 1
            return orig(*args, **kwargs)

        def counted_fused(*args, **kwargs):
            out = fused(*args, **kwargs)
            self.n += out is not None
            return out

        monkeypatch.setattr(nx, "score", counted)
        monkeypatch.setattr(ExactKernelRidge, "fused_select", counted_fused)


def _run(method: str, kernel: str, fixed: bool, rounds: int = 200):
    """Actions, UCBs of a few rounds (on copies, the run untouched), diagnostics and the model."""
    gen = torch.Generator().manual_seed(3)
    policy = _policy(method, kernel)
    policy.reset(seed=0)
    arms = torch.rand(100, 3, generator=gen, dtype=torch.float64)
    actions, ucbs, diags = [], [], []
    for t in range(rounds):
        cand = arms if fixed else torch.rand(100, 3, generator=gen, dtype=torch.float64)
        if t in (1, 2, 60, rounds - 1):
            ucbs.append(copy.deepcopy(policy)(cand))
        i = policy.select(cand)
        actions.append(i)
        diags.append(policy.rule.diagnostics())
        reward = math.sin(3.0 * float(cand[i].sum())) + SIGMA * float(torch.randn(1, generator=gen))
        policy.update(cand[i], reward)
    return actions, ucbs, diags, policy.model


def _same_state(a: ExactKernelRidge, b: ExactKernelRidge) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        if torch.is_tensor(sa[key]):
            assert sa[key].shape == sb[key].shape, key
            torch.testing.assert_close(sa[key], sb[key], rtol=0.0, atol=1e-10, msg=key)
        else:
            assert sa[key] == sb[key], key


@pytest.mark.parametrize("fixed", [False, True], ids=["fresh", "fixed"])
@pytest.mark.parametrize("kernel", ["matern52", "rbf"])
@pytest.mark.parametrize("method", ["AMM", "AY", "IGP", "DMM", "CONST", "KUCB"])
def test_runs_match_the_torch_path(method, kernel, fixed, monkeypatch):
    calls = _Calls(monkeypatch)
    a1, u1, d1, m1 = _run(method, kernel, fixed)
    if not fixed:  # fresh candidates: every round after the first is scored in C
        assert calls.n >= 190
    with native.disabled():
        a2, u2, d2, m2 = _run(method, kernel, fixed)
    assert a1 == a2
    for x, y in zip(u1, u2):
        torch.testing.assert_close(x, y, rtol=0.0, atol=1e-10)
    for x, y in zip(d1, d2):
        assert x.keys() == y.keys()
        assert all(x[k] == pytest.approx(y[k], abs=1e-10, nan_ok=True) for k in x)
    assert m1.n == m2.n == 200
    _same_state(m1, m2)
    for reg in m1.regularisers:  # running scalars (log-det, yᵀ(K+αI)⁻¹y) agree as well
        assert m1.log_det_value(reg) == pytest.approx(m2.log_det_value(reg), abs=1e-9)
        assert m1.quad_y_value(reg) == pytest.approx(m2.quad_y_value(reg), abs=1e-9)


KERNELS = {
    "rbf": lambda: RBFKernel(),
    "matern12": lambda: MaternKernel(nu=0.5),
    "matern32": lambda: MaternKernel(nu=1.5),
    "matern52_ard_scaled": lambda: ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=3)),
    "rbf_scaled": lambda: ScaleKernel(RBFKernel()),
}


def _kernel(name: str):
    k = KERNELS[name]()
    base = k.base_kernel if isinstance(k, ScaleKernel) else k
    base.lengthscale = torch.tensor([0.3, 0.5, 0.8])[: base.lengthscale.shape[-1]]
    if isinstance(k, ScaleKernel):
        k.outputscale = 1.7
    return k.requires_grad_(False)


def _model(kernel, n: int, regs=(0.01, 0.1, 1.0), dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    model = ExactKernelRidge(kernel, regs[0], regs[1:], dtype=dtype)
    x = torch.rand(n, 3, generator=gen, dtype=torch.float64).to(dtype)
    model.extend(x, torch.sin(3 * x.sum(1)))
    return model, gen


@pytest.mark.parametrize("name", list(KERNELS))
@pytest.mark.parametrize("n", [1, 5, 70, 131])
def test_scoring_matches_the_torch_path(name, n, monkeypatch):
    """Every closed form, one point (t = 2) to past a fold of the factor, one and several factors."""
    calls = _Calls(monkeypatch)
    model, gen = _model(_kernel(name), n)
    cand = torch.rand(37, 3, generator=gen, dtype=torch.float64) * 2.0
    other = torch.rand(37, 3, generator=gen, dtype=torch.float64)
    twin = copy.deepcopy(model)
    mean, var = model.mean_var(cand, reg=0.1)
    many = model.mean_var_many(other, (1.0, 0.01, 0.1))
    assert calls.n == 2
    with native.disabled():
        mean_t, var_t = twin.mean_var(cand, reg=0.1)
        many_t = twin.mean_var_many(other, (1.0, 0.01, 0.1))
    for got, want in ((mean, mean_t), (var, var_t), *zip(many, many_t)):
        torch.testing.assert_close(got, want, rtol=0.0, atol=1e-12)


def test_far_points_underflow_as_in_torch(monkeypatch):
    """exp of arguments below −708 (RBF at large scaled distances): libm's values, as torch."""
    kernel = RBFKernel().requires_grad_(False)
    kernel.lengthscale = 0.02
    model, gen = _model(kernel, 9)
    cand = torch.rand(50, 3, generator=gen, dtype=torch.float64)
    cand[:3] = model.x[:3] + 0.001
    twin = copy.deepcopy(model)
    got = model.mean_var(cand)
    with native.disabled():
        want = twin.mean_var(cand)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0.0, atol=1e-12)


def test_append_of_the_scored_candidate_matches(monkeypatch):
    """The O(n) append in C writes what the torch append writes (factor rows, z, data, scalars),
    also across a fold of the factor's tail (64 rows)."""
    model, gen = _model(make_kernel("matern52", 0.5), 3, regs=(0.02, 0.2))
    twin = copy.deepcopy(model)
    for _ in range(70):
        cand = torch.rand(20, 3, generator=gen, dtype=torch.float64)
        j = int(torch.randint(20, (1,), generator=gen))
        y = float(torch.randn(1, generator=gen))
        model.mean_var_many(cand, (0.2, 0.02))
        model.append(cand[j], y, column=(cand, j))
        with native.disabled():
            twin.mean_var_many(cand, (0.2, 0.02))
            twin.append(cand[j], y, column=(cand, j))
    _same_state(model, twin)
    for reg in (0.02, 0.2):
        assert model.log_det_value(reg) == pytest.approx(twin.log_det_value(reg), abs=1e-10)
        assert model.quad_y_value(reg) == pytest.approx(twin.quad_y_value(reg), abs=1e-10)
    x = torch.rand(5, 3, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(model.mean_var(x)[0], twin.mean_var(x)[0], rtol=0.0, atol=1e-10)


def _no_native_call(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the compiled step must not run here")

    monkeypatch.setattr(nx, "score", fail)
    monkeypatch.setattr(nx, "append", fail)


def test_float32_takes_the_torch_path(monkeypatch):
    model, gen = _model(make_kernel("rbf", 0.5), 12, dtype=torch.float32)
    cand = torch.rand(10, 3, generator=gen).float()
    _no_native_call(monkeypatch)
    mean, var = model.mean_var(cand)
    assert mean.dtype == torch.float32 and var.shape == (10,)
    model.append(cand[2], 0.5, column=(cand, 2))
    assert model.n == 13


def test_non_contiguous_candidates_take_the_torch_path(monkeypatch):
    model, gen = _model(make_kernel("matern52", 0.5), 12)
    wide = torch.rand(10, 6, generator=gen, dtype=torch.float64)
    cand = wide[:, ::2]
    assert not cand.is_contiguous()
    twin = copy.deepcopy(model)
    _no_native_call(monkeypatch)
    got = model.mean_var(cand)
    with native.disabled():
        want = twin.mean_var(cand.contiguous())
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0.0, atol=1e-14)


def test_large_models_take_the_torch_path(monkeypatch):
    model, gen = _model(make_kernel("rbf", 0.5), nx.MAX_N + 1, regs=(0.1,))
    _no_native_call(monkeypatch)
    mean, _ = model.mean_var(torch.rand(4, 3, generator=gen, dtype=torch.float64))
    assert mean.shape == (4,)


def test_empty_model_and_other_kernels_take_the_torch_path(monkeypatch):
    from gpytorch.kernels import LinearKernel

    _no_native_call(monkeypatch)
    empty = ExactKernelRidge(make_kernel("rbf", 0.5), 0.1)
    mean, var = empty.mean_var(torch.rand(4, 3, dtype=torch.float64))
    assert torch.equal(mean, torch.zeros(4, dtype=torch.float64))
    torch.testing.assert_close(var, torch.ones(4, dtype=torch.float64))
    linear, gen = _model(LinearKernel().requires_grad_(False), 6, regs=(0.1,))
    assert linear.mean_var(torch.rand(4, 3, generator=gen, dtype=torch.float64))[0].shape == (4,)


def test_an_unmaintained_regulariser_takes_the_torch_path(monkeypatch):
    model, gen = _model(make_kernel("rbf", 0.5), 8, regs=(0.1,))
    _no_native_call(monkeypatch)
    assert model.mean_var(torch.rand(4, 3, generator=gen, dtype=torch.float64), reg=0.5)[0].shape == (4,)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_takes_the_torch_path(monkeypatch):
    model, _ = _model(make_kernel("rbf", 0.5), 8, regs=(0.1,))
    model = model.to("cuda")
    _no_native_call(monkeypatch)
    assert model.mean_var(torch.rand(4, 3, dtype=torch.float64, device="cuda"))[0].is_cuda


def test_played_row_is_recognised_only_as_the_view_itself():
    """The lean update's O(n) append takes the chosen row only as that very view of the scored
    candidates, unmodified: a copy, another dtype or a row written in place since the choice is
    compared by value instead (the general update), with the same model state either way."""
    from torchbandits.validation import chosen_row, is_chosen_row

    cand = torch.rand(10, 3, dtype=torch.float64)
    rec = chosen_row(cand, 4)
    assert is_chosen_row(cand[4], rec)
    assert not is_chosen_row(cand[3], rec)
    assert not is_chosen_row(cand[4].clone(), rec)
    assert not is_chosen_row(cand[4].float(), rec)
    assert not is_chosen_row(cand[4].tolist(), rec)
    other = cand.clone()
    other[0, 0] = 0.5  # (a write into another tensor moves nothing of cand's)
    assert is_chosen_row(cand[4], rec)
    cand[0, 0] = 0.5   # a write into the scored tensor: the view is no longer trusted
    assert not is_chosen_row(cand[4], rec)


@pytest.mark.parametrize("played", ["view", "copy", "tensor_reward"])
def test_lean_update_paths_give_the_same_model(played, monkeypatch):
    """A run whose played point is the chosen view (native O(n) append), a copy of it (the
    general update, compared by value) or whose reward is a one-element tensor leaves the same
    model as the torch path (actions identical, state to 1e-10)."""
    gen = torch.Generator().manual_seed(5)
    policies = [_policy("AMM", "matern52") for _ in range(2)]
    for p in policies:
        p.reset(seed=0)
    for _ in range(40):
        cand = torch.rand(30, 3, generator=gen, dtype=torch.float64)
        reward = float(torch.randn(1, generator=gen))
        picks = []
        for k, p in enumerate(policies):
            if k == 1:
                with native.disabled():
                    i = p.select(cand)
            else:
                i = p.select(cand)
            picks.append(i)
            x = cand[i] if played == "view" else cand[i].clone()
            r = torch.tensor([reward], dtype=torch.float64) if played == "tensor_reward" else reward
            if k == 1:
                with native.disabled():
                    p.update(x, r)
            else:
                p.update(x, r)
        assert picks[0] == picks[1]
    _same_state(policies[0].model, policies[1].model)
    assert policies[0].t == policies[1].t == 40


def _run_with_a_kernel_change(method: str, rounds: int = 120):
    """A run whose kernel lengthscale is changed in place (``.data``: no version bump), the model
    refactorised (``refresh``), at round 60 and back at round 90; at those rounds the UCBs before
    the change and after it (the policy's own, its kernel plan to re-read, equal to a copy's,
    whose plan is read afresh)."""
    gen = torch.Generator().manual_seed(5)
    policy = _policy(method, "matern52")
    policy.reset(seed=0)
    raw = policy.model.kernel.raw_lengthscale
    first = raw.detach().clone()
    actions, ucbs = [], []
    for t in range(rounds):
        cand = torch.rand(100, 3, generator=gen, dtype=torch.float64)
        if t in (60, 90):
            before = copy.deepcopy(policy)(cand)
            raw.data.add_(0.4) if t == 60 else raw.data.copy_(first)
            policy.model.refresh()
            fresh = copy.deepcopy(policy)(cand)
            own = policy(cand)
            torch.testing.assert_close(own, fresh, rtol=0.0, atol=1e-10)
            ucbs.append((before, own))
        i = policy.select(cand)
        actions.append(i)
        policy.update(cand[i], math.sin(3.0 * float(cand[i].sum())))
    return actions, ucbs, policy.model


@pytest.mark.parametrize("method", ["AMM", "DMM"])
def test_a_kernel_changed_in_place_between_steps_is_seen(method, monkeypatch):
    calls = _Calls(monkeypatch)
    a1, u1, m1 = _run_with_a_kernel_change(method)
    assert calls.n >= 110
    with native.disabled():
        a2, u2, m2 = _run_with_a_kernel_change(method)
    assert a1 == a2
    for (b1, c1), (b2, c2) in zip(u1, u2):
        torch.testing.assert_close(b1, b2, rtol=0.0, atol=1e-10)
        torch.testing.assert_close(c1, c2, rtol=0.0, atol=1e-10)
        assert (b1 - c1).abs().max() > 1e-6  # the change reached the bound
    _same_state(m1, m2)


@pytest.mark.parametrize("regs", [(0.02,), (0.02, 0.2, 2.0)], ids=["one", "three"])
def test_a_copy_between_scoring_and_append_reads_its_own_scoring(regs, monkeypatch):
    """The compiled scoring records the addresses its append reads; a deep copy of the model
    (with its candidates) taken between the scoring and the append, the original then dropped,
    must not read the original's memory: its compiled append reads its own copy of the scoring
    and writes what the torch path writes."""
    model, gen = _model(make_kernel("matern52", 0.5), 3, regs=regs)
    twin = copy.deepcopy(model)
    appends = []
    orig = nx.append

    def counted(*args, **kwargs):
        appends.append(1)
        return orig(*args, **kwargs)

    monkeypatch.setattr(nx, "append", counted)
    for _ in range(30):
        cand = torch.rand(20, 3, generator=gen, dtype=torch.float64)
        j = int(torch.randint(20, (1,), generator=gen))
        y = float(torch.randn(1, generator=gen))
        model.mean_var_many(cand, regs)
        old, (model, cand) = model, copy.deepcopy((model, cand))
        rec = old._scored  # the original's scoring overwritten, then dropped
        for t in ([*rec.stack[:3]] if rec.stack is not None else
                  [t for col in rec.columns.values() for t in col]):
            t.fill_(math.nan)
        del old, rec
        model.append(cand[j], y, column=(cand, j))
        with native.disabled():
            twin.mean_var_many(cand, regs)
            twin.append(cand[j], y, column=(cand, j))
    assert len(appends) == 30  # the compiled append ran, from the copy's own scoring
    _same_state(model, twin)


def test_the_compiled_step_runs_with_autograd_on_and_records_no_graph(monkeypatch):
    """The single-run step calls the compiled scoring and append without ``torch.no_grad()``:
    the same actions and state as under ``no_grad`` and no tensor of the model needs grad."""
    calls = _Calls(monkeypatch)
    gen = torch.Generator().manual_seed(6)
    a, b = _policy("AMM", "matern52"), _policy("AMM", "matern52")
    for p in (a, b):
        p.reset(seed=0)
    assert torch.is_grad_enabled()
    for _ in range(30):
        cand = torch.rand(40, 3, generator=gen, dtype=torch.float64)
        reward = float(torch.randn(1, generator=gen))
        i = a.select(cand)
        a.update(cand[i], reward)
        with torch.no_grad():
            assert b.select(cand) == i
            b.update(cand[i], reward)
    assert calls.n >= 25
    _same_state(a.model, b.model)
    assert not any(t.requires_grad for t in a.model.buffers())
    plan = a.model.kernel_plan()
    assert plan.stationary is not None and not plan.stationary.weight.requires_grad
