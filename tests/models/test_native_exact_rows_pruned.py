"""The compiled select of a one-term bound with its rows pruned (``select_rows_pruned`` of
``native/exact_prune.h``: the radius rules — K-UCB, GP-UCB, IGP, AY — and AMM, Flynn & Reeb 2024,
§5.5), against the full select: the same choice and append pieces, bit for bit, whatever the
widths (β from 0 to 10³, ties, near-ties, candidates on the stored points), the number of points
(at and around the row checks) and of candidates; the full select where the pruning does not
apply (β < 0, a target that is not finite, fewer than 160 points, or 80 with 500 candidates or
more) or where the last two selects pruned too little (then for 16 selects); and whole runs,
single and batched, the same with and without it."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

from torchbandits.confidence.base import UCBForm
from torchbandits.experiments import simulate, simulate_batch
from torchbandits.experiments.registry import make_env, make_policy
from torchbandits.kernels import make_kernel
from torchbandits.models import ExactKernelRidge
from torchbandits.models.batched_exact import BatchedExactKernelRidge
from torchbandits.models.exact_fused import full_select, pruned_select
from torchbandits.native import exact as nx
from torchbandits.native import exact_batch as nb

pytestmark = pytest.mark.skipif(nx.available() is None or nb.available() is None,
                                reason="no compiled library (no C compiler)")

LAM = 0.1


def _model(n: int, seed: int) -> ExactKernelRidge:
    model = ExactKernelRidge(make_kernel("matern52", 0.4), LAM, cache_candidates=False)
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, generator=gen, dtype=torch.float64)
    model.extend(x, torch.sin(4.0 * x.sum(1)) + 0.1 * torch.randn(n, generator=gen,
                                                                  dtype=torch.float64))
    return model


def _candidates(model: ExactKernelRidge, n_arms: int, gen: torch.Generator) -> torch.Tensor:
    """Fresh points, a duplicate (an exact tie: the first index wins), a near-duplicate (bounds a
    rounding apart) and a stored point (posterior variance near zero)."""
    cand = torch.rand(n_arms, 3, dtype=torch.float64, generator=gen)
    if n_arms > 4:
        cand[n_arms // 2] = cand[1]
        cand[n_arms // 2 + 1] = cand[2] + 1e-15
        cand[3] = model.x[0]
    return cand


@pytest.mark.parametrize("n", [100, 160, 161, 191, 192, 250])
@pytest.mark.parametrize("n_arms", [1, 5, 16, 17, 25, 100, 130])
def test_the_row_pruned_select_is_the_full_select(n: int, n_arms: int) -> None:
    """Over widths from none to dominating (β ∈ {0, 10⁻³, 0.3, 3, 10³}) and two divisors, the
    pruned select (forced: ``pruned_select``) chooses as the full select, and the appends of its
    choice (from the pieces it kept) leave the model's state equal, bit for bit, to the full
    select's appends."""
    models = [_model(n, seed=n_arms), _model(n, seed=n_arms)]
    gen = torch.Generator().manual_seed(500 + n + n_arms)
    for trial, beta in enumerate((0.0, 1e-3, 0.3, 3.0, 1e3, 0.3)):
        cand = _candidates(models[0], n_arms, gen)
        form = UCBForm((LAM,), (beta,), (1.0 if trial % 2 else LAM,))
        picks = []
        for model, full in zip(models, (True, False), strict=True):
            with full_select() if full else pruned_select():
                best = model.fused_select(cand, lambda f=form: f)
                assert best is not None
                assert model._fused.hint[1] == (0 if full else 1)   # the pieces kept or not
                assert model.fused_append(cand[best], 0.5 - best / n_arms, (cand, best))
            picks.append(best)
        assert picks[0] == picks[1], (trial, beta)
    state, want = (m.state_dict() for m in models)
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(state[key], value), key


@pytest.mark.parametrize("case", ["negative beta", "nan target", "few points", "pruned",
                                  "many candidates, few points", "many candidates",
                                  "few candidates, few points", "few candidates", "one candidate",
                                  "forced, few points"])
def test_where_the_pruning_does_not_apply_the_full_select_runs(case: str) -> None:
    """β < 0 (the bound then falls with the variance: no row bound), a NaN in the whitened
    targets, fewer than 160 points (80 with 500 candidates, 320 with fewer than two groups' —
    14 here —, every candidate in the first group: never): the full select (no pieces kept),
    with its choice; else the pruned select (its pieces kept), also under 160 points inside
    ``pruned_select``."""
    points = {"few points": 159, "many candidates, few points": 79, "many candidates": 80,
              "few candidates, few points": 319, "few candidates": 320, "one candidate": 400,
              "forced, few points": 50}
    model = _model(points.get(case, 170), seed=1)
    n_arms = (500 if case.startswith("many") else 14 if case.startswith("few candidates")
              else 1 if case == "one candidate" else 60)
    cand = torch.rand(n_arms, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    beta = -0.5 if case == "negative beta" else 1.0
    if case == "nan target":
        model._buffers["_z"][0, 5] = float("nan")
    form = UCBForm((LAM,), (beta,), (1.0,))
    with full_select():
        want = model.fused_select(cand, lambda: form)
    with pruned_select() if case.startswith("forced") else contextlib.nullcontext():
        assert model.fused_select(cand, lambda: form) == want
    pruned = case in ("pruned", "many candidates", "few candidates", "forced, few points")
    assert model._fused.hint[1] == (1 if pruned else 0)


@pytest.mark.parametrize("name", ["kucb", "kucb-theory", "gpucb", "igp-ucb", "amm-ucb", "dmm-ucb"])
def test_runs_are_the_same_pruned_or_not(name: str) -> None:
    """A run of 230 rounds on fresh candidates (100 a round, d = 3; pruned from round 160): the
    same actions, rewards and diagnostics, and the same state bit for bit (the appends read the
    pruned select's pieces)."""
    def run():
        env = make_env("rkhs", dim=3)
        policy = make_policy(name, env)
        return simulate(policy, env, 230, 2, diagnostics_every=1), policy

    pruned, policy = run()
    assert policy.model._fused is not None                  # (the fused step ran)
    with full_select():
        full, reference = run()
    assert (pruned.actions, pruned.rewards) == (full.actions, full.rewards)
    assert json.dumps(pruned.diagnostics) == json.dumps(full.diagnostics)   # (NaN at round 0)
    state, want = policy.state_dict(), reference.state_dict()
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(state[key], value), key


def test_the_batched_select_prunes_each_run_as_the_single_run_select() -> None:
    """The batched compiled select (one factor per run, per-run β and divisors) chooses and
    appends as the full batched select, bit for bit, over 25 rounds of 6 runs with β from 0 to
    10³ (the largest: no candidate pruned)."""
    models = []
    for _ in range(2):
        model = BatchedExactKernelRidge(make_kernel("matern52", 0.4), LAM, 6)
        gen = torch.Generator().manual_seed(4)
        for _ in range(170):
            model.append(torch.rand(6, 3, dtype=torch.float64, generator=gen),
                         torch.randn(6, dtype=torch.float64, generator=gen))
        models.append(model)
    gen = torch.Generator().manual_seed(5)
    beta = torch.tensor([0.0, 1e-3, 0.3, 1.0, 3.0, 1e3], dtype=torch.float64)
    div = torch.tensor([LAM, 1.0, LAM, 1.0, LAM, 1.0], dtype=torch.float64)
    for _ in range(25):
        cand = torch.rand(6, 100, 3, dtype=torch.float64, generator=gen)
        cand[:, 50] = cand[:, 7]
        picks = []
        for model, full in zip(models, (True, False), strict=True):
            with full_select() if full else pruned_select():
                got = model.ucb_argmax_native(cand, beta, div)
                assert got is not None
                best = got[0]
                assert model.append_native(cand[torch.arange(6), best],
                                           torch.sin(best.to(torch.float64)))
            picks.append(best)
        assert torch.equal(picks[0], picks[1])
    state, want = (m.state_dict() for m in models)
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(state[key], value), key


@pytest.mark.parametrize("name", ["kucb", "amm-ucb", "dmm-ucb"])
def test_batched_runs_are_the_same_pruned_or_not(name: str) -> None:
    """``simulate_batch`` of 8 runs (fresh candidates, 200 rounds): the same actions and state with
    the pruned select and the full one."""
    def run():
        env = make_env("rkhs", dim=3)
        policy = make_policy(name, env)
        return simulate_batch(policy, env, 200, list(range(8)), progress=False), policy

    pruned, policy = run()
    with full_select():
        full, reference = run()
    assert [r.actions for r in pruned] == [r.actions for r in full]
    state, want = policy.state_dict(), reference.state_dict()
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(state[key], value), key


def test_a_late_winner_a_hair_above_the_first_groups_best_is_found() -> None:
    """The argmax is ranked outside the first group by its prior bound (16 candidates near the
    data, whose prior bounds are higher and posterior bounds lower) and its bound lies 10⁻⁴ to
    10⁻² above the best of that group: the row checks must keep its group to the end. The pruned
    select chooses it, as the full select does."""
    model = _model(170, seed=7)
    beta, div = 3.0, 1.0
    gen = torch.Generator().manual_seed(8)
    near = model.x[:120] + 0.02 * torch.randn(120, 3, dtype=torch.float64, generator=gen)
    pool = torch.cat([near, torch.rand(6000, 3, dtype=torch.float64, generator=gen)])
    mu, var = model.mean_var(pool, LAM)
    exact = (var / div).sqrt() * beta + mu
    key = mu + beta * float(var.max() / div) ** 0.5            # the prior bound, up to rounding
    first = key.argsort(descending=True)[:16]
    top0, key0 = float(exact[first].max()), float(key[first].min())
    late = ((key < key0 - 1e-6) & (exact > top0 + 1e-4) & (exact < top0 + 1e-2)).nonzero()
    assert len(late) > 0                                      # (else the test would be vacuous)
    winner = int(late[0])
    filler = (key < float(key[winner]) - 1e-3).nonzero()[:40, 0]
    cand = pool[torch.cat([first, filler, torch.tensor([winner])])]
    cand = cand[torch.randperm(len(cand), generator=gen)]
    form = UCBForm((LAM,), (beta,), (div,))
    with full_select():
        want = model.fused_select(cand, lambda: form)
    assert torch.equal(cand[want], pool[winner])
    assert model.fused_select(cand, lambda: form) == want
    assert model._fused.hint[1] == 1                           # (the pruned select ran)


def test_dmm_grid_with_its_rows_pruned_is_the_full_select() -> None:
    """From 160 points DMM's grid (five terms) prunes its first member's rows: from every starting
    member, random widths (several members minimal somewhere) and a duplicated candidate, the
    same choice and minimising member as the full select, and the appends of its pieces leave
    the state equal bit for bit."""
    regs = (0.01, 0.03, 0.1, 0.3, 1.0)
    models = []
    for _ in range(2):
        model = ExactKernelRidge(make_kernel("matern52", 0.4), regs[2], regs, cache_candidates=False)
        gen = torch.Generator().manual_seed(11)
        x = torch.rand(170, 3, generator=gen, dtype=torch.float64)
        model.extend(x, torch.sin(4.0 * x.sum(1)) + 0.1 * torch.randn(170, generator=gen,
                                                                      dtype=torch.float64))
        models.append(model)
    gen = torch.Generator().manual_seed(12)
    for trial in range(14):
        cand = torch.rand(100, 3, dtype=torch.float64, generator=gen)
        cand[60] = cand[4]
        betas = tuple((0.05 + 3.0 * torch.rand(5, dtype=torch.float64, generator=gen)).tolist())
        divs = tuple((0.5 + torch.rand(5, dtype=torch.float64, generator=gen)).tolist())
        picks = []
        for model, full in zip(models, (True, False), strict=True):
            seen: list[torch.Tensor] = []
            form = UCBForm(regs, betas, divs, done=lambda _u, arg, s=seen: s.append(arg.clone()))
            if not full and model._fused is not None:
                model._fused.hint[0] = trial % 7 - 1               # every start, and out of range
            with full_select() if full else pruned_select():
                best = model.fused_select(cand, lambda f=form: f)
                assert best is not None
                assert model._fused.hint[1] == (0 if full else 1)
                assert model.fused_append(cand[best], 0.3 - best / 100, (cand, best))
            picks.append((best, int(seen[0][0])))
        assert picks[0] == picks[1], trial
    state, want = (m.state_dict() for m in models)
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(state[key], value), key


def test_the_alpha_cache_keeps_alpha_and_only_guesses() -> None:
    """The pruned select keeps ``α = (K + λI)⁻¹y`` for the next select, which guesses its first
    candidates from it: the cache holds α (to rounding), and any content of it — garbage values, a
    length past ``n`` or negative, any count of full selects left — gives the full select's
    choice, single-run and batched."""
    model = _model(170, seed=21)
    form = UCBForm((LAM,), (2.0,), (1.0,))
    gen = torch.Generator().manual_seed(22)
    cand = torch.rand(100, 3, dtype=torch.float64, generator=gen)
    assert model.fused_select(cand, lambda: form) is not None
    cache = model._fused.acache
    k = model.kernel(model.x, model.x).to_dense() + LAM * torch.eye(170, dtype=torch.float64)
    alpha = torch.linalg.solve(k, model.y)
    assert int(cache[0]) == 170 and float(cache[1]) == 0.0   # (it pruned well)
    torch.testing.assert_close(cache[2:172], alpha, rtol=1e-9, atol=1e-9)
    for length, scale, state in ((1e9, 1.0, float("nan")), (-5.0, 1.0, -3.0), (120.0, 300.0, 1e9),
                                 (170.0, 1.0, 2.5), (170.0, 1.0, 16.0), (170.0, 1.0, -1.0)):
        cache[0], cache[1] = length, state          # past n, negative, garbage; then states
        cache[2:] = torch.randn(cache.numel() - 2, dtype=torch.float64, generator=gen) * scale
        cand = torch.rand(100, 3, dtype=torch.float64, generator=gen)
        with full_select():
            want = model.fused_select(cand, lambda: form)
        assert model.fused_select(cand, lambda: form) == want
    batched = BatchedExactKernelRidge(make_kernel("matern52", 0.4), LAM, 4)
    for _ in range(170):
        batched.append(torch.rand(4, 3, dtype=torch.float64, generator=gen),
                       torch.randn(4, dtype=torch.float64, generator=gen))
    beta, div = torch.full((4,), 2.0, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    for trial in range(3):
        cand = torch.rand(4, 100, 3, dtype=torch.float64, generator=gen)
        with full_select():
            want = batched.ucb_argmax_native(cand, beta, div)[0]
        if trial:
            batched._alpha_cache.normal_(generator=gen)       # garbage guesses and timings
            batched._alpha_cache[:, 0] = 170.0 if trial == 1 else 1e6
        assert torch.equal(batched.ucb_argmax_native(cand, beta, div)[0], want)


def test_two_selects_that_pruned_too_little_are_followed_by_full_selects() -> None:
    """Candidates a rounding apart (one point, moved by 10⁻¹²) have bounds no row check can tell
    apart, so the select solves every row of every candidate: finding its substitutions after the
    first group above 0.6 of the full select's, it leaves -1 in the cache (one poor select; fresh
    candidates next would clear it), a second such select 16, the next 16 selects take the full
    select (no pieces kept; the count falls by one each), and the next one prunes again (poor:
    -1); fresh candidates prune well and leave 0; the state outlives the cache's growth; DMM's
    grid keeps pruning (no such rule). Every
    choice is the full select's. The batched select keeps the same state per run."""
    model = _model(170, seed=31)
    gen = torch.Generator().manual_seed(32)

    def huddle(*shape: int) -> torch.Tensor:
        point = torch.rand(*shape[:-2], 1, shape[-1], dtype=torch.float64, generator=gen)
        return point + 1e-12 * torch.rand(*shape, dtype=torch.float64, generator=gen)

    form = UCBForm((LAM,), (2.0,), (1.0,))

    def step(cand: torch.Tensor) -> tuple[int, float]:
        with full_select():
            want = model.fused_select(cand, lambda: form)
        assert model.fused_select(cand, lambda: form) == want
        return model._fused.hint[1], float(model._fused.acache[1])

    ran = [step(huddle(100, 3)) for _ in range(19)]
    assert [kept for kept, _ in ran] == [1, 1] + [0] * 16 + [1]
    assert [state for _, state in ran] == [-1.0, 16.0, *range(15, -1, -1), -1.0]
    assert step(torch.rand(100, 3, dtype=torch.float64, generator=gen)) == (1, 0.0)
    cache = model._fused.acache                             # the state survives the cache's growth
    cache[1] = 5.0
    more = torch.rand(cache.numel(), 3, dtype=torch.float64, generator=gen)
    model.extend(more, torch.sin(4.0 * more.sum(1)))
    assert step(huddle(100, 3))[0] == 0 and model._fused.acache.numel() > cache.numel()
    assert float(model._fused.acache[1]) == 4.0
    grid = ExactKernelRidge(make_kernel("matern52", 0.4), 0.1, (0.01, 0.1, 1.0),
                            cache_candidates=False)             # (DMM's grid: no such rule)
    grid.extend(model.x, model.y)
    three = UCBForm((0.01, 0.1, 1.0), (2.0, 2.0, 2.0), (1.0, 1.0, 1.0))
    for _ in range(3):
        cand = huddle(100, 3)
        with full_select():
            want = grid.fused_select(cand, lambda: three)
        assert grid.fused_select(cand, lambda: three) == want
        assert grid._fused.hint[1] == 1 and float(grid._fused.acache[1]) == 0.0
    batched = BatchedExactKernelRidge(make_kernel("matern52", 0.4), LAM, 2)
    for _ in range(170):
        batched.append(torch.rand(2, 3, dtype=torch.float64, generator=gen),
                       torch.randn(2, dtype=torch.float64, generator=gen))
    beta, div = torch.full((2,), 2.0, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
    for state in (-1.0, 16.0, 15.0, 14.0):
        cand = torch.stack([torch.rand(100, 3, dtype=torch.float64, generator=gen),
                            huddle(100, 3)])
        with full_select():
            want = batched.ucb_argmax_native(cand, beta, div)[0]
        assert torch.equal(batched.ucb_argmax_native(cand, beta, div)[0], want)
        assert batched._alpha_cache[:, 1].tolist() == [0.0, state]
