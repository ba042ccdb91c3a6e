"""The batched UCB argmax in one compiled call (``tb_batch_select`` of ``native/exact_batch.c``:
the scoring, the rule's closed-form bound ``min_g (sqrt(ρ²_g/div_g)·β_g + μ_g)`` and its argmax
for every run) and the append that reads the chosen candidate's pieces from it.

A batch that selects this way (no forward call before ``select``: a fresh set every round) plays
what the sequential runs play — K-UCB (Zenati et al. 2022, Algorithm 3), GP-UCB with IGP-UCB's
radius (Chowdhury & Gopalan 2017), AMM and DMM (Flynn & Reeb 2024, §5.5 / §5.4) on the RKHS
environment of Flynn & Reeb (2024, §7) — and what the torch path plays, with the same
diagnostics; its argmax is torch's on ties (first index) for per-run β and ridge divisors; an
append from the select's pieces writes the bits of an append that computes them; a point other
than the chosen one, a deep copy or a state load between select and update compute their own; a
pivot that is not positive changes nothing.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from torchbandits import native
from torchbandits.experiments import simulate, simulate_batch
from torchbandits.experiments.registry import make_env, make_policy
from torchbandits.kernels import make_kernel
from torchbandits.models.batched_exact import BatchedExactKernelRidge
from torchbandits.native import exact_batch as nb

pytestmark = pytest.mark.skipif(nb.available() is None, reason="no compiled library (no C compiler)")

SEEDS = [0, 3, 7]


class _Selects:
    """Counts the compiled select calls and the appends that found their pieces."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.select = self.pending = 0
        select, append = nb.select, nb.append

        def counted_select(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.select += 1
            return select(*args, **kwargs)

        def counted_append(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.pending += (args[9] if len(args) > 9 else kwargs.get("pending")) is not None
            return append(*args, **kwargs)

        monkeypatch.setattr(nb, "select", counted_select)
        monkeypatch.setattr(nb, "append", counted_append)


def _maybe_off(compiled: bool):  # type: ignore[no-untyped-def]
    return contextlib.nullcontext() if compiled else native.disabled()


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "torch"])
@pytest.mark.parametrize("name", ["kucb", "gpucb", "amm-ucb", "dmm-ucb", "igp-ucb"])
def test_simulate_batch_equals_sequential_runs(name: str, compiled: bool,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_env("rkhs", dim=3, n_arms=100)
    extra = {"horizon": 200} if name.endswith("-ucb") else {}
    calls = _Selects(monkeypatch)
    with _maybe_off(compiled):
        runs = simulate_batch(make_policy(name, env, **extra), env, 200, SEEDS)
    for run in runs:
        ref = simulate(make_policy(name, env, **extra), env, 200, run.seed)
        assert run.actions == ref.actions
        assert run.regret == pytest.approx(ref.regret, abs=1e-10, rel=0)
        for key, values in ref.diagnostics.items():
            if key in run.diagnostics and key != "n":
                assert run.diagnostics[key][1:] == pytest.approx(values[1:], abs=1e-9), key
    if compiled:   # every round after the warm-up in one call; the model's appends (and DMM's
        assert calls.select >= 198   # companion's) from the select's pieces
        assert calls.pending >= 197
    else:
        assert calls.select == calls.pending == 0


def test_per_run_beta_and_the_torch_path_choose_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_env("rkhs", dim=3, n_arms=100)
    betas = [0.1, 1.0, 10.0]
    calls = _Selects(monkeypatch)
    runs = {}
    for compiled in (True, False):
        policy = make_policy("kucb", env)   # a ridge width: div = λ per run
        policy.set_per_run(beta=torch.tensor(betas, dtype=torch.float64))
        with _maybe_off(compiled):
            runs[compiled] = simulate_batch(policy, env, 120, SEEDS)
    assert calls.select >= 119
    for a, b, beta in zip(runs[True], runs[False], betas, strict=True):
        assert a.actions == b.actions
        ref = simulate(make_policy("kucb", env, beta=beta), env, 120, a.seed)
        assert a.actions == ref.actions


def _model(lam: float | torch.Tensor = 0.05, runs: int = 3, n: int = 12, cache: bool = True
           ) -> BatchedExactKernelRidge:
    gen = torch.Generator().manual_seed(3)
    model = BatchedExactKernelRidge(make_kernel("matern52", 0.4), lam, runs,
                                    cache_candidates=cache)
    for _ in range(n):
        model.append(torch.rand(runs, 2, dtype=torch.float64, generator=gen),
                     torch.randn(runs, dtype=torch.float64, generator=gen))
    return model


def _torch_argmax(model: BatchedExactKernelRidge, cand: torch.Tensor, beta: torch.Tensor,
                  div: torch.Tensor) -> torch.Tensor:
    twin = copy.deepcopy(model)
    with native.disabled():
        mean, var = twin.mean_var(cand)
    return torch.argmax(mean + beta[:, None] * torch.sqrt(var / div[:, None]), dim=1)


def test_ties_take_the_first_index_as_torch_argmax() -> None:
    """Candidates far from every stored point (``k = 0`` exactly: ``μ = 0``, ``ρ² = k(x, x)``)
    tie exactly on both paths; run ``r``'s first far candidate is at index ``r + 2``, before it
    stored points (``ρ²`` small: a lower bound at this β)."""
    model = _model()
    stored = model.x
    far = 1e3 + torch.arange(9, dtype=torch.float64)[:, None].expand(9, 2)
    beta = torch.tensor([1e6, 2e6, 1e6], dtype=torch.float64)
    for k, div in enumerate((torch.ones(3, dtype=torch.float64), model.lam.clone())):
        cand = (far + 50.0 * k).expand(3, 9, 2).clone()   # (a new set: not the cached one)
        for r in range(3):
            cand[r, : r + 2] = stored[r, : r + 2]
        want = _torch_argmax(model, cand, beta, div)
        got = model.ucb_argmax(cand, beta, div)
        assert got is not None and got[1] is None
        assert want.tolist() == [2, 3, 4] and torch.equal(got[0], want)
    every = far.expand(3, 9, 2).contiguous()   # all candidates tie: index 0
    out = model.ucb_argmax(every, beta, beta)
    assert out is not None and out[0].tolist() == [0, 0, 0]


def test_per_run_beta_changes_the_choice_as_torch() -> None:
    model = _model(lam=torch.tensor([1e-3, 0.05, 1.0], dtype=torch.float64), cache=False)
    cand = torch.rand(3, 40, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    picks = set()
    for beta_value in (0.0, 0.3, 3.0, 30.0):   # (no candidate cache: the same set each time)
        beta = torch.tensor([beta_value, 2 * beta_value, 0.5], dtype=torch.float64)
        for div in (torch.ones(3, dtype=torch.float64), model.lam.clone()):
            got = model.ucb_argmax(cand, beta, div)
            assert got is not None
            assert torch.equal(got[0], _torch_argmax(model, cand, beta, div))
            picks.add(int(got[0][0]))
    assert len(picks) > 1   # β moved run 0's choice


def _states_equal(a: BatchedExactKernelRidge, b: BatchedExactKernelRidge) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(
        not torch.is_tensor(sa[k]) or torch.equal(sa[k], sb[k]) for k in sa)


def test_append_from_the_pieces_writes_the_bits_of_a_computed_append(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _Selects(monkeypatch)
    model = _model()
    gen = torch.Generator().manual_seed(4)
    rows = torch.arange(3)
    for step in range(6):
        cand = torch.rand(3, 30, 2, dtype=torch.float64, generator=gen)
        got = model.ucb_argmax(cand, torch.full((3,), 1.5, dtype=torch.float64),
                               torch.ones(3, dtype=torch.float64))
        assert got is not None
        x = cand[rows, got[0]].contiguous()
        if step == 3:
            x[1] += 0.25   # run 1 plays another point: its pieces are computed
        y = torch.randn(3, dtype=torch.float64, generator=gen)
        twin = copy.deepcopy(model)   # a copy's buffers live elsewhere: it computes its own
        model.append(x, y)
        twin.append(x, y)
        assert _states_equal(model, twin)
    assert calls.pending == 6 and calls.select == 6   # the copies' appends found no pieces


def test_a_state_load_between_select_and_update_goes_on_alike() -> None:
    model = _model()
    gen = torch.Generator().manual_seed(8)
    cand = torch.rand(3, 25, 2, dtype=torch.float64, generator=gen)
    ones = torch.ones(3, dtype=torch.float64)
    got = model.ucb_argmax(cand, ones, ones)
    assert got is not None
    twin = BatchedExactKernelRidge(model.kernel, 0.05, 3)
    twin.load_state_dict(copy.deepcopy(model.state_dict()))
    x = cand[torch.arange(3), got[0]].contiguous()
    y = torch.randn(3, dtype=torch.float64, generator=gen)
    model.append(x, y)
    twin.append(x, y)
    assert _states_equal(model, twin)
    nxt = torch.rand(3, 25, 2, dtype=torch.float64, generator=gen)
    a, b = model.ucb_argmax(nxt, ones, ones), twin.ucb_argmax(nxt, ones, ones)
    assert a is not None and b is not None and torch.equal(a[0], b[0])


def test_a_pivot_not_positive_after_a_select_changes_nothing() -> None:
    model = BatchedExactKernelRidge(make_kernel("matern52", 0.5), 1e-300, 2)
    x = torch.tensor([[0.2, 0.3], [0.5, 0.1]], dtype=torch.float64)
    model.append(x, torch.ones(2, dtype=torch.float64))
    cand = torch.stack([x, x + 0.3], dim=1)   # [2, 2, 2]: the stored point and another
    ones = torch.ones(2, dtype=torch.float64)
    got = model.ucb_argmax(cand, torch.zeros(2, dtype=torch.float64), ones)  # μ: the stored one
    assert got is not None
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="pivot"):   # k(x,x) + λ − ‖l‖² = 0
        model.append(x.clone(), torch.ones(2, dtype=torch.float64))
    assert model.n == 1
    for key, value in model.state_dict().items():
        if torch.is_tensor(value):
            assert torch.equal(value, before[key]), key


def test_a_fixed_set_goes_to_the_candidate_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model()
    calls = _Selects(monkeypatch)
    arms = torch.rand(3, 20, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ones = torch.ones(3, dtype=torch.float64)
    assert model.ucb_argmax(arms, ones, ones) is not None   # first call: in C, remembered
    assert model.ucb_argmax(arms, ones, ones) is None       # again: the caches serve it
    assert model.ucb_argmax(arms.clone(), ones, ones) is None   # the same values too
    assert calls.select == 1


def test_sets_with_a_run_stride_are_read_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run's ``[A, d]`` contiguous at any run stride (a batched environment's rounds are
    views of a block drawn ahead) is scored and selected from its own memory, with the numbers
    of a contiguous copy."""
    model, twin = _model(cache=False), _model(cache=False)
    block = torch.rand(3, 4, 30, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    ones = torch.ones(3, dtype=torch.float64)
    copies = []
    real = torch.Tensor.contiguous

    def counted(t: torch.Tensor, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not t.is_contiguous():
            copies.append(t.shape)
        return real(t, *args, **kwargs)

    for k in range(4):
        view = block[:, k]                      # [3, 30, 2], run stride 4·30·2
        dense = view.clone()
        monkeypatch.setattr(torch.Tensor, "contiguous", counted)
        got, scores = model.ucb_argmax(view, 2 * ones, ones), model.mean_var(view)
        monkeypatch.undo()
        want = twin.ucb_argmax(dense, 2 * ones, ones)
        assert got is not None and want is not None and torch.equal(got[0], want[0])
        for a, b in zip(scores, twin.mean_var(dense), strict=True):
            assert torch.equal(a, b)
    assert copies == []


@pytest.mark.parametrize("name", ["amm-ucb", "dmm-ucb"])
def test_a_copy_or_a_load_mid_batch_goes_on_identically(name: str) -> None:
    """A deep copy taken between ``select`` and ``update`` and a policy loaded from the
    ``state_dict`` between rounds play on as the original (the compiled select's pieces are not
    carried into the copy's own buffers: it computes them)."""
    from torchbandits.envs.batched import BatchedEnv

    env = make_env("rkhs", dim=3, n_arms=100)
    policy = make_policy(name, env, horizon=200)
    policy.reset(seed=SEEDS)
    benv = BatchedEnv(env, SEEDS)
    rows = torch.arange(len(SEEDS))
    twins = []
    for t in range(45):
        cand = benv.candidates()
        idx = policy.select(cand)
        if t == 20:
            twins.append(copy.deepcopy(policy))        # mid-round: after select, before update
        for twin in twins:
            if t > 20:
                assert torch.equal(twin.select(cand), idx)
        reward, _ = benv.pull(idx)
        for p in (policy, *twins):
            p.update(cand[rows, idx], reward)
        if t == 30:
            fresh = make_policy(name, env, horizon=200)
            fresh.load_state_dict(copy.deepcopy(policy.state_dict()))
            twins.append(fresh)
    assert len(twins) == 2


@pytest.mark.parametrize("name", ["amm-ucb", "dmm-ucb", "igp-ucb"])
def test_a_fixed_set_computes_the_widths_once_a_round(name: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """On a fixed arm set the compiled select declines (the caches serve the set) after it has
    computed the widths' terms; the torch program then reuses them: the radius is computed once
    per round, and the run still equals the sequential runs."""
    from torchbandits.confidence import batched as cb

    env = make_env("rkhs", dim=2, n_arms=20, fixed_arms=True)
    calls = {"n": 0}

    def counted(fn):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls["n"] += 1
            return fn(*args, **kwargs)
        return call

    # the radius rules' β (AMM, IGP) or DMM's terms (which hold R_t²): once a round
    monkeypatch.setattr(cb, "batched_radius", counted(cb.batched_radius))
    monkeypatch.setattr(cb, "_dmm_terms", counted(cb._dmm_terms))
    policy = make_policy(name, env)
    batch = simulate_batch(policy, env, 30, [0, 1, 2], progress=False)
    assert calls["n"] == 30 - 1   # one per round after the warm-up round
    for r, res in enumerate(batch):
        seq = simulate(make_policy(name, env), env, 30, seed=r, progress=False)
        assert res.actions == seq.actions


@pytest.mark.parametrize("n_arms", [4, 16, 100, 130])
def test_dmm_minimising_grid_points_as_the_torch_path(n_arms: int) -> None:
    """DMM (Flynn & Reeb 2024, §5.4) through the compiled select and through the torch path on
    the same fresh sets: the same arms and the same mean ``log(α/α₀)`` of the minimising grid
    points (the argmin over the grid per candidate, ``[R, A]``), exactly; 4, 16, 100, 130 arms
    cut the columns into panels 4; 8 + 8; 12·7 + 8 + 8; 12·10 + 12 (padded) and the bound's
    candidates into chunks of 64."""
    env = make_env("rkhs", dim=3, n_arms=n_arms)
    pols = [make_policy("dmm-ucb", env, horizon=200) for _ in range(2)]
    for p in pols:
        p.reset(seed=SEEDS)
    gen = torch.Generator().manual_seed(n_arms)
    runs = torch.arange(len(SEEDS))
    for step in range(40):
        cand = torch.rand(len(SEEDS), n_arms, 3, dtype=torch.float64, generator=gen)
        got = pols[0].select(cand)
        with native.disabled():
            want = pols[1].select(cand.clone())
        assert torch.equal(got, want)
        if step > 0:   # (after the first point: the prior round has no grid)
            assert torch.equal(pols[0].diagnostics()["log_alpha_ratio"],
                               pols[1].diagnostics()["log_alpha_ratio"])
        reward = torch.randn(len(SEEDS), dtype=torch.float64, generator=gen)
        pols[0].update(cand[runs, got], reward)
        with native.disabled():
            pols[1].update(cand[runs, want], reward)


@pytest.mark.parametrize("n_arms", [4, 16, 100, 130])
def test_grouped_bound_argmin_and_argmax_as_torch(n_arms: int) -> None:
    """A companion of 5 regularisers per run: the compiled bound's minimising member per
    candidate ``[R, A]`` and argmax ``[R]`` are torch's ``min`` (first smallest) and ``argmax``
    of ``μ_g + β_g·sqrt(ρ²_g/div_g)``, exactly; the multipliers spread so that several members
    are the minimum somewhere (the first one included)."""
    model = _model(runs=3, n=20)
    comp = model.at_regularisers((0.1, 0.3, 1.0, 3.0, 10.0))
    gen = torch.Generator().manual_seed(n_arms)
    cand = torch.rand(3, n_arms, 2, dtype=torch.float64, generator=gen)
    beta = 0.05 + 3.0 * torch.rand(15, dtype=torch.float64, generator=gen)
    div = 0.5 + torch.rand(15, dtype=torch.float64, generator=gen)
    twin = copy.deepcopy(comp)
    got = comp.ucb_argmax(cand, beta, div, 5, want_arg=True)
    assert got is not None and got[1] is not None
    with native.disabled():
        mean, var = twin.mean_var_groups(cand.clone(), 5)
    bound = (mean + beta[:, None] * torch.sqrt(var / div[:, None])).reshape(3, 5, n_arms)
    low, arg = bound.min(1)
    want = torch.argmax(low, dim=1)
    assert torch.equal(got[0], want) and torch.equal(got[1], arg.gather(1, want[:, None])[:, 0])
    if n_arms >= 100:
        assert 0 in arg and len(set(arg.flatten().tolist())) >= 3


def _select(comp: BatchedExactKernelRidge, cand: torch.Tensor, beta: torch.Tensor,
            div: torch.Tensor, hint: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """One compiled select of a 5-member companion, pruned (``hint``) or full (``None``):
    ``(best, argmin g there, pieces, points)``."""
    got = comp._native_scoring(cand, 5)
    assert got is not None
    lib, cand, kern = got
    b, r, n = comp._buffers, cand.shape[0], comp.n
    best, arg = torch.empty(r, dtype=torch.int64), torch.empty(r, dtype=torch.int64)
    pieces = torch.full((r * 5, n + 2), float("nan"), dtype=torch.float64)
    points = torch.full((r, cand.shape[2]), float("nan"), dtype=torch.float64)
    nb.select(lib, 5, n, b["_x"], cand, kern, b["_L"], b["_z"], (beta, div), best, arg,
              (pieces, points), hint)
    return best, arg, pieces, points


@pytest.mark.parametrize("n_arms", [1, 5, 16, 17, 40, 100, 130])
def test_the_pruned_select_is_the_full_select(n_arms: int) -> None:
    """DMM's pruned select (one member on every candidate, the others on the candidates whose
    bound can still be the largest, 16 at a time) chooses as the full select, with the same
    minimising member and the same pending pieces, bit for bit, whatever member it starts
    from: random multipliers (several members minimal somewhere), duplicated candidates (ties:
    the first index), and a run whose member has a NaN target (the full select there)."""
    model = _model(runs=4, n=30)
    comp = model.at_regularisers((0.1, 0.3, 1.0, 3.0, 10.0))
    gen = torch.Generator().manual_seed(100 + n_arms)
    for trial in range(12):
        cand = torch.rand(4, n_arms, 2, dtype=torch.float64, generator=gen)
        if n_arms > 3:
            cand[:, n_arms // 2] = cand[:, 1]              # a tie with an earlier index
        beta = 0.05 + 3.0 * torch.rand(20, dtype=torch.float64, generator=gen)
        div = 0.5 + torch.rand(20, dtype=torch.float64, generator=gen)
        full = _select(comp, cand, beta, div, None)
        for start in range(-1, 6):   # every member first (-1 and 5: out of range, G // 2)
            hint = torch.full((4,), start, dtype=torch.int64)
            pruned = _select(comp, cand, beta, div, hint)
            for a, b in zip(full, pruned, strict=True):
                assert torch.equal(a, b), (trial, start)
            assert torch.equal(hint, full[1])           # the hint becomes the chosen's member
    z = comp._buffers["_z"]
    z[2 * 5 + 3, 4] = float("nan")                    # run 2, member 3: no pruning there
    cand = torch.rand(4, n_arms, 2, dtype=torch.float64, generator=gen)
    beta = 0.05 + 3.0 * torch.rand(20, dtype=torch.float64, generator=gen)
    div = 0.5 + torch.rand(20, dtype=torch.float64, generator=gen)
    full = _select(comp, cand, beta, div, None)
    pruned = _select(comp, cand, beta, div, torch.zeros(4, dtype=torch.int64))
    for a, b in zip(full, pruned, strict=True):
        assert torch.equal(a, b) or (torch.equal(a.isnan(), b.isnan()) and torch.equal(
            a.nan_to_num(), b.nan_to_num()))
