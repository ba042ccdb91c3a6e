"""The fused single-run step of the exact model (models.exact_fused: one compiled call per select
and one per update on a table of the model's addresses) against the torch path: the same actions,
bounds to 1e-10 and the same state, also when the table goes stale between calls (copies,
pickles, state loads, moves, appends through another path, regrown buffers, kernel changes)."""

from __future__ import annotations

import contextlib
import copy
import io
import math

import pytest
import torch

from torchbandits import native
from torchbandits.confidence.base import UCBForm
from torchbandits.kernels import make_kernel
from torchbandits.models import ExactKernelRidge
from torchbandits.native import exact as nx
from torchbandits.policies import AMMUCB, DMMUCB, GPUCB, KernelUCB

pytestmark = pytest.mark.skipif(nx.available() is None, reason="no compiled library (no C compiler)")

SIGMA, NORM, DELTA, C = 0.1, 10.0, 0.01, 0.3


def _policy(method: str):
    k = make_kernel("matern52", 0.5)
    kw = dict(noise_std=SIGMA, norm_bound=NORM, delta=DELTA)
    return {"AMM": lambda: AMMUCB(k, c=C, **kw), "DMM": lambda: DMMUCB(k, c=C, **kw),
            "CONST": lambda: GPUCB(k, lam=SIGMA**2 / C, beta=2.0)}[method]()


class _Spy:
    """Counts the fused selects and appends that answered."""

    def __init__(self, monkeypatch):
        self.selects = self.appends = 0
        sel, app = ExactKernelRidge.fused_select, ExactKernelRidge.fused_append

        def select(*args, **kwargs):
            out = sel(*args, **kwargs)
            self.selects += out is not None
            return out

        def append(*args, **kwargs):
            out = app(*args, **kwargs)
            self.appends += bool(out)
            return out

        monkeypatch.setattr(ExactKernelRidge, "fused_select", select)
        monkeypatch.setattr(ExactKernelRidge, "fused_append", append)


def _run(method: str, rounds: int = 150, hook=None, fixed: bool = False):
    """Actions, a few UCBs (on copies) and the policy; ``hook(policy, t)`` runs before round t
    and may return a replacement policy."""
    gen = torch.Generator().manual_seed(5)
    policy = _policy(method)
    policy.reset(seed=0)
    arms = torch.rand(100, 3, generator=gen, dtype=torch.float64)
    actions, ucbs = [], []
    for t in range(rounds):
        if hook is not None:
            policy = hook(policy, t) or policy
        cand = arms if fixed else torch.rand(100, 3, generator=gen, dtype=torch.float64)
        if t in (2, 70, rounds - 1):
            ucbs.append(copy.deepcopy(policy)(cand))
        i = policy.select(cand)
        actions.append(i)
        reward = math.sin(3.0 * float(cand[i].sum())) + SIGMA * float(torch.randn(1, generator=gen))
        policy.update(cand[i], torch.tensor(reward, dtype=torch.float64))
    return actions, ucbs, policy


def _same(run_a, run_b) -> None:
    (a1, u1, p1), (a2, u2, p2) = run_a, run_b
    assert a1 == a2
    for x, y in zip(u1, u2):
        torch.testing.assert_close(x, y, rtol=0.0, atol=1e-10)
    sa, sb = p1.model.state_dict(), p2.model.state_dict()
    for key in sa:
        if torch.is_tensor(sa[key]):
            assert sa[key].shape == sb[key].shape, key
            torch.testing.assert_close(sa[key], sb[key], rtol=0.0, atol=1e-10, msg=key)
    for reg in p1.model.regularisers:
        assert p1.model.log_det_value(reg) == pytest.approx(p2.model.log_det_value(reg), abs=1e-9)
        assert p1.model.quad_y_value(reg) == pytest.approx(p2.model.quad_y_value(reg), abs=1e-9)


def _torch_run(method: str, **kwargs):
    with native.disabled():
        return _run(method, **kwargs)


@pytest.mark.parametrize("method", ["AMM", "DMM", "CONST"])
def test_every_step_is_fused_and_matches_the_torch_path(method, monkeypatch):
    spy = _Spy(monkeypatch)
    fused = _run(method)  # 150 rounds: the buffers regrow (16, 32, 64, 128) and tails fold (64, 128)
    assert spy.selects == spy.appends == 149  # every round after the warm-up
    _same(fused, _torch_run(method))


@pytest.mark.parametrize("method", ["AMM", "DMM"])
def test_a_declined_rebuild_at_a_full_buffer_leaves_the_general_append_a_sound_model(
        method, monkeypatch):
    """At a full buffer or tail the fused append makes room (regrows the buffers, folds a full
    tail) and rebuilds its table; if that rebuild declines, the general append runs on the room
    made: the run must still equal the torch path's (no row counted twice, none lost)."""
    lib = nx.available()
    real = lib.tb_exact_fused_append
    full = {"hits": 0, "decline": False}

    def append(*args):
        rc = real(*args)
        if rc == -2:
            full["hits"] += 1
            full["decline"] = True
        return rc

    build = ExactKernelRidge._fused_build

    def declining_build(self):
        if full["decline"]:
            full["decline"] = False
            return None
        return build(self)

    monkeypatch.setattr(lib, "tb_exact_fused_append", append)
    monkeypatch.setattr(ExactKernelRidge, "_fused_build", declining_build)
    spy = _Spy(monkeypatch)
    declined = _run(method)
    assert full["hits"] >= 3   # the buffers regrow at 16, 32, 64, 128 and the tails fold
    assert spy.appends == 149 - full["hits"]   # each declined round took the general append
    _same(declined, _torch_run(method))


def _deepcopy_at_40(policy, t):
    return copy.deepcopy(policy) if t == 40 else None


def _pickle_at_40(policy, t):
    if t != 40:
        return None
    buf = io.BytesIO()
    torch.save(policy, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert loaded.model._fused is None
    return loaded


def _state_load_at_40(policy, t):
    if t != 40:
        return None
    fresh = _policy("DMM")
    fresh.reset(seed=0)
    fresh.load_state_dict(policy.state_dict())
    return fresh


def _move_at_40(policy, t):
    if t == 40:
        policy.to(torch.float64)  # (Module._apply: every buffer re-assigned)
    return None


def _torch_append_at_40(policy, t):
    if t == 40:  # a point through the general append (the table's n is then behind)
        policy.model.append(torch.full((3,), 0.25, dtype=torch.float64), 0.5)
    return None


def _room_at_40(policy, t):
    if t == 40:  # every point buffer regrown, n unchanged
        policy.model.room_for(policy.model.n + 200)
    return None


def _refresh_at_40(policy, t):
    if t == 40:  # refactorised from scratch: new factor storage, n and point buffers unchanged
        policy.model.refresh()
    return None


_SNAPSHOT: dict = {}


def _earlier_state_at_40(policy, t):
    if t == 20:
        _SNAPSHOT["state"] = copy.deepcopy(policy.state_dict())
    if t == 40:  # back to round 20, into the same policy (buffers copied in place)
        policy.load_state_dict(_SNAPSHOT["state"])
    return None


@pytest.mark.parametrize("hook", [_deepcopy_at_40, _pickle_at_40, _state_load_at_40, _move_at_40,
                                  _torch_append_at_40, _room_at_40, _refresh_at_40,
                                  _earlier_state_at_40])
def test_a_stale_table_is_never_used(hook, monkeypatch):
    spy = _Spy(monkeypatch)
    fused = _run("DMM", rounds=90, hook=hook)
    assert spy.selects >= 85  # the step was fused again after the change
    _same(fused, _torch_run("DMM", rounds=90, hook=hook))


def test_a_copy_and_its_original_step_apart():
    """The copy's table is rebuilt on its own buffers: stepping the copy leaves the original's
    state untouched (a shared table would write the copy's rows into the original)."""
    _, _, policy = _run("AMM", rounds=30)
    before = copy.deepcopy(policy.model.state_dict())
    twin = copy.deepcopy(policy)
    assert twin.model._fused is None and policy.model._fused is not None
    gen = torch.Generator().manual_seed(9)
    for _ in range(20):
        cand = torch.rand(100, 3, generator=gen, dtype=torch.float64)
        i = twin.select(cand)
        twin.update(cand[i], 0.3)
    assert twin.model._fused is not None and twin.model.n == 50
    for key, value in policy.model.state_dict().items():
        if torch.is_tensor(value):
            assert torch.equal(value, before[key]), key


def test_repeated_candidates_go_to_the_candidate_caches(monkeypatch):
    spy = _Spy(monkeypatch)
    fused = _run("DMM", rounds=60, fixed=True)
    assert spy.selects == 1  # the first scoring; then the same tensor: the caches serve it
    _same(fused, _torch_run("DMM", rounds=60, fixed=True))


def test_equal_values_in_another_tensor_go_to_the_candidate_caches(monkeypatch):
    spy = _Spy(monkeypatch)
    policy = _policy("AMM")
    policy.reset(seed=0)
    arms = torch.rand(50, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for _ in range(30):
        cand = arms.clone()
        i = policy.select(cand)
        policy.update(cand[i], float(cand[i, 0]))
    assert spy.selects == 1  # compared in C with the last fused set: equal, not fused
    assert policy.model._caches  # (the general path built and served the caches)


def test_without_candidate_caches_repeated_sets_are_fused(monkeypatch):
    spy = _Spy(monkeypatch)
    policy = KernelUCB(make_kernel("rbf", 0.4), lam=0.5, beta=1.0)
    policy.model.cache_candidates = False
    policy.reset(seed=0)
    arms = torch.rand(40, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for _ in range(20):
        i = policy.select(arms)
        policy.update(arms[i], float(arms[i, 0]))
    assert spy.selects == spy.appends == 19


def test_non_finite_candidates_raise_and_change_nothing():
    _, _, policy = _run("AMM", rounds=20)
    cand = torch.rand(100, 3, dtype=torch.float64)
    cand[7, 1] = float("nan")
    state = copy.deepcopy(policy.model.state_dict())
    with pytest.raises(ValueError, match="finite"):
        policy.select(cand)
    assert policy.model.n == 20
    for key, value in policy.model.state_dict().items():
        if torch.is_tensor(value):
            assert torch.equal(value, state[key]), key


def test_a_bad_reward_raises_and_changes_nothing():
    _, _, policy = _run("DMM", rounds=20)
    cand = torch.rand(100, 3, dtype=torch.float64)
    i = policy.select(cand)
    with pytest.raises(ValueError, match="finite"):
        policy.update(cand[i], float("inf"))
    assert policy.model.n == 20 and policy.t == 20


def test_a_pivot_not_positive_raises_on_both_paths():
    """A point equal to a stored one with a regulariser far below the rounding of k(x, x): the
    pivot ``k + α − ‖L⁻¹k‖²`` is not positive; the fused append raises as the torch path does
    and changes nothing."""
    results = []
    for off in (False, True):
        policy = KernelUCB(make_kernel("rbf", 0.5), lam=1e-300, beta=1.0)
        policy.reset(seed=0)
        point = torch.tensor([[0.3, 0.6]], dtype=torch.float64)
        scope = native.disabled() if off else contextlib.nullcontext()
        with scope:
            i = policy.select(point)
            policy.update(point[i], 1.0)
            cand = point.repeat(4, 1)
            i = policy.select(cand)
            with pytest.raises(ValueError, match="pivot"):
                policy.update(cand[i], 1.0)
        results.append((policy.model.n, policy.t))
    assert results == [(1, 1), (1, 1)]


def test_terms_at_other_regularisers(monkeypatch):
    """A bound at a regulariser the model does not maintain is not fused; bounds over other
    terms rewrite the table's terms (each checked against the torch posterior)."""
    model = ExactKernelRidge(make_kernel("matern52", 0.5), 0.1, (0.3, 1.0))
    gen = torch.Generator().manual_seed(4)
    x = torch.rand(30, 3, generator=gen, dtype=torch.float64)
    model.extend(x, torch.sin(x.sum(1)))
    cand = torch.rand(60, 3, generator=gen, dtype=torch.float64)
    assert model.fused_select(cand, lambda: UCBForm((0.123,), (1.0,), (1.0,))) is None
    forms = [UCBForm((0.3,), (2.0,), (1.0,)), UCBForm((1.0, 0.1), (0.5, 3.0), (1.0, 0.1)),
             UCBForm((0.3,), (0.7,), (0.3,))]
    for form in forms + forms:
        cand = torch.rand(60, 3, generator=gen, dtype=torch.float64)
        got = model.fused_select(cand, lambda f=form: f)
        with native.disabled():
            assert got == _argmax(model, cand, form)


def test_above_max_n_the_general_step_runs(monkeypatch):
    monkeypatch.setattr(nx, "MAX_N", 30)
    spy = _Spy(monkeypatch)
    fused = _run("AMM", rounds=60)
    assert spy.selects == 30  # n = 1 .. 30 fused, then the torch path
    _same(fused, _torch_run("AMM", rounds=60))


@pytest.mark.parametrize("new_storage", [False, True], ids=["in_place", "new_storage"])
def test_a_kernel_changed_since_the_table_is_read_anew(new_storage):
    """The kernel's lengthscale changed after the table was built (in place, or on new storage
    of the parameter, then in place): the next fused select scores with the new kernel, as the
    torch path does (the factors are those of the old kernel on both)."""
    model = ExactKernelRidge(make_kernel("matern52", 0.5), 0.05, (0.2,))
    gen = torch.Generator().manual_seed(6)
    x = torch.rand(40, 3, generator=gen, dtype=torch.float64)
    model.extend(x, torch.sin(4.0 * x.sum(1)))
    form = UCBForm((0.05, 0.2), (2.0, 1.0), (1.0, 1.0))
    assert model.fused_select(torch.rand(80, 3, generator=gen, dtype=torch.float64),
                              lambda: form) is not None
    raw = model.kernel.raw_lengthscale
    old = raw.data  # (kept alive: its bytes still those the table was built from)
    if new_storage:
        raw.data = raw.data.clone()
    stale = copy.deepcopy(model)  # the model as the table describes it
    with torch.no_grad():
        raw.add_(1.5)
    moved = 0
    for _ in range(5):
        cand = torch.rand(80, 3, generator=gen, dtype=torch.float64)
        got = model.fused_select(cand, lambda: form)
        with native.disabled():
            want = _argmax(model, cand, form)
            moved += want != _argmax(stale, cand, form)
        assert got == want
    assert moved  # (the change moves the argmax: a stale table would be seen)
    assert old.data_ptr() != raw.data_ptr() or not new_storage


def _argmax(model, cand, form) -> int:
    parts = [model.mean_var(cand, r) for r in form.regs]
    ucb = torch.stack([torch.sqrt(v / dv) * b + m
                       for (m, v), b, dv in zip(parts, form.betas, form.divisors)]).min(0).values
    return int(torch.argmax(ucb))


@pytest.mark.parametrize("variant", ["copy_of_row", "float32", "non_contiguous", "list"])
def test_other_inputs_take_the_general_step(variant, monkeypatch):
    """A played point that is a copy of the chosen row, candidates in float32, a non-contiguous
    view or a nested list: not the fused step (the spy sees none), the same run as the torch
    path."""
    spy = _Spy(monkeypatch)

    def steps():
        policy = _policy("DMM")
        policy.reset(seed=0)
        gen = torch.Generator().manual_seed(8)
        acts = []
        for _ in range(25):
            base = torch.rand(3, 60, generator=gen, dtype=torch.float64)
            cand = {"float32": base.T.contiguous().float(), "non_contiguous": base.T,
                    "list": base.T.tolist()}.get(variant, base.T.contiguous())
            i = policy.select(cand)
            row = torch.as_tensor(cand, dtype=torch.float64)[i]
            played = row.clone() if variant == "copy_of_row" else (
                row if variant != "list" else cand[i])
            policy.update(played, float(row.sum()))
            acts.append(i)
        return acts, policy

    a1, p1 = steps()
    assert spy.appends == 0 and (spy.selects == 0 or variant == "copy_of_row")
    with native.disabled():
        a2, p2 = steps()
    assert a1 == a2
    for key, value in p1.model.state_dict().items():
        if torch.is_tensor(value):
            torch.testing.assert_close(value, p2.model.state_dict()[key], rtol=0.0, atol=1e-10)
