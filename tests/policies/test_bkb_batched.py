"""Batched BKB (Calandriello, Carratino, Lazaric, Valko & Rosasco, COLT 2019, Algorithm 1): run
``r`` of a batch is the sequential run with seed ``r`` — the same actions, dictionaries and
dictionary sizes, UCB values to 1e-10 — although every run resamples its own dictionary every
round (padded to a common size) from its own generator; per-run β and λ; bad input changes
nothing; ``state_dict`` round trip mid-batch; ``.to(dtype)``; the CLI's ``--batch on``.
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from torchbandits import make_kernel, native
from torchbandits.envs.batched import BatchedEnv
from torchbandits.experiments import simulate, simulate_batch
from torchbandits.experiments.batch import why_not_batch
from torchbandits.experiments.registry import make_env, make_policy
from torchbandits.models.batched_dtc import compact_positions
from torchbandits.policies import BKB
from torchbandits.policies.bkb_batched_posterior import CHUNK

from ..batch_checks import cli_runs_on_off, lockstep, play, refuses_bad_input, reloaded, seeded, started

F64 = torch.float64
FIXED = {"dim": 2, "n_arms": 60, "fixed_arms": True}


def _lockstep(env: Any, seeds: list[int], horizon: int, batch: Any, seqs: list[Any],
              atol: float = 1e-10) -> None:
    """Batched and sequential policies side by side (:func:`tests.batch_checks.lockstep`): the
    same choice every round, UCB values within ``atol``, the same dictionary (points, order)
    after every update, and the same dictionary diagnostics at the end."""

    def same_dictionary(r: int, pol: Any) -> None:
        assert torch.equal(batch.run_dictionary(r), pol.dictionary)

    lockstep(env, seeds, horizon, batch, seqs, atol=atol, check_update=same_dictionary)
    diag = batch.diagnostics()
    for key in ("dictionary_size", "m_theory", "n_distinct", "empty_dictionaries"):
        assert diag[key].tolist() == [pol.diagnostics()[key] for pol in seqs], key


@pytest.mark.parametrize(("env_name", "kwargs", "options"),
                         [("rkhs", FIXED, {}), ("bump", {}, {"lam": 0.1, "qbar": 1.0})])
def test_ucb_values_and_dictionaries_equal_the_sequential_ones(env_name: str, kwargs: dict,
                                                               options: dict) -> None:
    """R = 8, 200 rounds, Theorem 1's β̃_t: UCBs to 1e-10, identical actions and dictionaries;
    the sizes differ between runs (on Bump λ = 0.1 and q̄ = 1 keep some points out: with the
    registry's λ = ξ² every pulled point enters)."""
    env = make_env(env_name, **kwargs)
    seeds = list(range(8))
    batch = make_policy("bkb", env, **options)
    batch.reset(seed=seeds)
    _lockstep(env, seeds, 200, batch,
              [seeded(make_policy("bkb", env, **options), s) for s in seeds])
    assert len(set(batch.diagnostics()["dictionary_size"].tolist())) > 2


@pytest.mark.parametrize(("env_name", "kwargs", "atol"),
                         [("chessboard", {}, 1e-8), ("rkhs", {"dim": 2, "n_arms": 30}, 1e-6)])
def test_ill_conditioned_dictionaries_agree_to_rounding(env_name: str, kwargs: dict,
                                                        atol: float) -> None:
    """Contextual candidates (Chessboard) and fresh arm sets: every pulled point is distinct and
    the dictionaries hold up to ~160 nearby points (``K_ZZ`` ill-conditioned), so the batched
    products' rounding moves the UCBs by up to 1e-9 (Chessboard) and 5e-8 (fresh arms: a
    square root of a variance near 0 amplifies it); the actions and dictionaries are identical."""
    env = make_env(env_name, **kwargs)
    seeds = [0, 3, 5, 6]
    batch = make_policy("bkb", env)
    batch.reset(seed=seeds)
    _lockstep(env, seeds, 200, batch, [seeded(make_policy("bkb", env), s) for s in seeds],
              atol=atol)


def test_simulate_batch_equals_simulate() -> None:
    env = make_env("rkhs", **FIXED)
    policy = make_policy("bkb", env)
    assert why_not_batch(policy, env) is None
    runs = simulate_batch(policy, env, 200, list(range(8)))
    for run in runs:
        seq = simulate(make_policy("bkb", env), env, 200, run.seed)
        assert run.actions == seq.actions
        assert run.regret == pytest.approx(seq.regret, abs=1e-12, rel=0)
        assert sorted(run.diagnostics) == sorted(seq.diagnostics)
        for key in ("dictionary_size", "m_theory", "n_distinct", "empty_dictionaries"):
            assert run.diagnostics[key] == seq.diagnostics[key], key
        assert run.diagnostics["beta"] == pytest.approx(seq.diagnostics["beta"], abs=1e-10, rel=0)
        # a sum of A = 60 posterior variances (up to ~12): both score by the half-width product
        # [HᵀP; wᵀP] K_ZA, but the batched (padded) products round differently from the
        # sequential ones, to ~1e-11 relative
        assert run.diagnostics["sum_var"] == pytest.approx(seq.diagnostics["sum_var"], abs=1e-10,
                                                           rel=1e-10)


def test_groups_of_runs_sorted_by_dictionary_size() -> None:
    """R = 20 > CHUNK: each round the runs are grouped by dictionary size (16 + 4), each group at
    its own width; run ``r`` is still the sequential run with seed ``r``."""
    env = make_env("rkhs", **FIXED)
    seeds = list(range(20))
    batch = make_policy("bkb", env)
    batch.reset(seed=seeds)
    assert batch.n_runs > CHUNK
    _lockstep(env, seeds, 80, batch, [seeded(make_policy("bkb", env), s) for s in seeds])


@pytest.mark.parametrize("chunk_runs", [None, 20])
def test_the_torch_program_in_groups_or_as_one_padded_program(chunk_runs: int | None) -> None:
    """The batched torch program (the compiled rounds off): R = 20 in groups by dictionary size
    (the CPU's default) or as one padded program scored in one product (``set_chunk_runs(20)``:
    what a GPU runs); either way run ``r`` is the sequential run with seed ``r``."""
    env = make_env("rkhs", **FIXED)
    seeds = list(range(20))
    with native.disabled():
        batch = make_policy("bkb", env)
        batch.set_chunk_runs(chunk_runs)
        batch.reset(seed=seeds)
        _lockstep(env, seeds, 60, batch, [seeded(make_policy("bkb", env), s) for s in seeds])


def test_one_padded_program_launches_the_same_operators_at_any_r() -> None:
    """The GPU's program (one padded group, one scoring product; the torch program on the CPU
    here): a select launches as many operators at R = 24 as at R = 4 (in groups of
    :data:`CHUNK` it grows with R), counted as the backend sees them."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.n += func.overloadpacket.__name__ not in {"view", "slice", "select", "expand",
                                                           "unsqueeze", "as_strided", "t",
                                                           "transpose", "_unsafe_view", "alias"}
            return func(*args, **(kwargs or {}))

    env = make_env("rkhs", **FIXED)
    counted = {}
    with native.disabled():
        for r, chunk in ((4, 4), (24, 24), (24, None)):
            batch = make_policy("bkb", env)
            batch.set_chunk_runs(chunk)
            benv = BatchedEnv(env, list(range(r)))
            batch.reset(seed=list(range(r)))
            for t in range(30):
                cand = benv.candidates()
                count = Count()
                with count if t == 29 else contextlib.nullcontext():
                    idx = batch.select(cand)
                reward, _ = benv.pull(idx)
                batch.update(cand[torch.arange(r), idx], reward)
            counted[(r, chunk)] = count.n
    assert counted[(24, 24)] == counted[(4, 4)]
    assert counted[(24, None)] > counted[(24, 24)] + 20   # two groups of 16 and 8


@pytest.mark.parametrize("sampler", ["linearized", "uniform", "all"])
def test_other_samplers_draw_as_the_sequential_runs(sampler: str) -> None:
    env = make_env("rkhs", **FIXED)
    seeds = [2, 9, 4]
    batch = make_policy("bkb-const", env, sampler=sampler)
    batch.reset(seed=seeds)
    seqs = [seeded(make_policy("bkb-const", env, sampler=sampler), s) for s in seeds]
    _lockstep(env, seeds, 60, batch, seqs)


def test_beta_and_lambda_grids_equal_the_sequential_runs() -> None:
    """``set_per_run(beta=[0.1, 1, 10])`` (constant β) and ``lam=[…]`` with Theorem 1's width:
    each run is the sequential policy built with its own value."""
    env = make_env("rkhs", **FIXED)
    seeds = [0, 1, 2]
    grid = [0.1, 1.0, 10.0]
    batch = make_policy("bkb-const", env)
    batch.set_per_run(beta=grid)
    batch.reset(seed=seeds)
    seqs = [seeded(make_policy("bkb-const", env, beta=b), s) for b, s in zip(grid, seeds)]
    _lockstep(env, seeds, 120, batch, seqs)
    assert batch.diagnostics()["beta"].tolist() == pytest.approx(grid)
    lams = [0.003, 0.01, 0.05]
    batch = make_policy("bkb", env)
    batch.set_per_run(lam=lams)
    batch.reset(seed=seeds)
    seqs = [seeded(make_policy("bkb", env, lam=lam), s) for lam, s in zip(lams, seeds)]
    _lockstep(env, seeds, 120, batch, seqs)
    with pytest.raises(ValueError, match="beta"):
        make_policy("bkb", env).set_per_run(beta=grid)     # Theorem 1's width is not a constant
    before = {k: v.clone() for k, v in batch.state_dict().items() if isinstance(v, torch.Tensor)}
    t_before = batch.t
    with pytest.raises(ValueError, match="R = 2"):
        batch.reset(seed=[0, 1])
    assert batch.n_runs == 3 and batch.t == t_before == 120     # the rejected start changed nothing
    after = batch.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())


def test_bad_input_raises_naming_the_argument_and_changes_nothing() -> None:
    env = make_env("rkhs", **FIXED)
    seeds = [0, 1, 2, 3]
    policy = make_policy("bkb", env)
    policy.reset(seed=seeds)
    _lockstep(env, seeds, 30, policy, [seeded(make_policy("bkb", env), s) for s in seeds])
    state = copy.deepcopy(policy.state_dict())
    dicts = [policy.run_dictionary(r).clone() for r in range(4)]
    refuses_bad_input(policy, torch.rand(4, 10, 2, dtype=F64))
    now = policy.state_dict()
    assert all(torch.equal(a, b) for a, b in zip(state["_extra_state"]["batch"]["rng"],
                                                  now["_extra_state"]["batch"]["rng"]))
    assert policy.t == 30
    for r in range(4):
        assert torch.equal(policy.run_dictionary(r), dicts[r])


@pytest.mark.parametrize(("env_name", "kwargs"), [("rkhs", FIXED), ("chessboard", {})])
def test_state_dict_round_trip_mid_batch(env_name: str, kwargs: dict) -> None:
    env = make_env(env_name, **kwargs)
    seeds = [4, 7, 1]
    policy = started(make_policy("bkb", env), seeds)
    benv = BatchedEnv(env, seeds)
    play(policy, benv, 40)
    fresh = reloaded(policy, make_policy("bkb", env))   # sequential mode until it loads
    assert fresh.n_runs == 3 and fresh.t == 40
    # the fresh policy's first round evaluates the kernel and scores by the full product (its
    # cache of the fixed arm set's kernel rows is built when it sees the same arms again, then
    # the half-width product): rounding apart, then equal
    play(policy, benv, 60, twin=fresh, atol=0.0, first_atol=1e-11)
    for key, value in policy.diagnostics().items():
        assert torch.equal(fresh.diagnostics()[key], value), key
    fresh.load_state_dict(make_policy("bkb", env).state_dict())   # back to one run
    assert fresh.n_runs is None and fresh.batch_counts is None
    fresh.reset(seed=3)
    assert isinstance(fresh.select(benv.candidates()[0]), int)


def test_to_dtype_mid_batch() -> None:
    env = make_env("rkhs", **FIXED)
    seeds = [0, 1, 2]
    policy = make_policy("bkb", env)
    policy.reset(seed=seeds)
    _lockstep(env, seeds, 25, policy, [seeded(make_policy("bkb", env), s) for s in seeds])
    cand = BatchedEnv(env, seeds).candidates()
    ucb64 = policy(cand)
    single = copy.deepcopy(policy).to(torch.float32)
    assert single.n_runs == 3 and single.batch_counts.counts.dtype == torch.float32
    ucb32 = single(cand)
    assert ucb32.dtype == torch.float32 and ucb32.shape == (3, 60)
    torch.testing.assert_close(ucb32.double(), ucb64, atol=1e-3, rtol=1e-3)
    idx = single.select(cand)
    single.update(cand[torch.arange(3), idx], torch.zeros(3))
    assert single.t == 26
    back = copy.deepcopy(policy).to(torch.float32).to(F64)
    assert back(cand).dtype == F64


def test_refusals_and_single_run_mode() -> None:
    kernel = make_kernel("rbf", 0.2)
    assert "sor" in BKB(kernel, variance="sor").why_not_batched()
    assert "track_exact" in BKB(kernel, track_exact=True).why_not_batched()

    class Tweaked(BKB):
        pass

    assert "Tweaked" in Tweaked(kernel).why_not_batched()
    with pytest.raises(ValueError, match="seed"):
        BKB(kernel, variance="sor").reset(seed=[0, 1])
    policy = BKB(kernel)
    assert policy.why_not_batched() is None and policy.n_runs is None
    policy.reset(seed=[0, 1])
    assert policy.n_runs == 2
    policy.reset(seed=5)                               # an int returns to one run
    assert policy.n_runs is None and policy.batch_counts is None
    arms = torch.rand(7, 2, dtype=F64)
    assert isinstance(policy.select(arms), int)


def test_compact_positions_are_the_rows_nonzero() -> None:
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(6, 13, generator=g) < 0.4
    width = int(mask.sum(-1).max())
    pos, live = compact_positions(mask, width)
    for r in range(6):
        m = int(mask[r].sum())
        assert pos[r, :m].tolist() == mask[r].nonzero()[:, 0].tolist()
        assert live[r].tolist() == [True] * m + [False] * (width - m)


def test_cli_batch_on_equals_batch_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", "--env", "bump", "--policy", "bkb", "--seeds", "0", "1", "2",
            "--horizon", "25", "--no-progress"]
    on, off = cli_runs_on_off(args, tmp_path)
    assert len(on) == 3
    for name in on:
        assert on[name]["diagnostics"]["dictionary_size"] == off[name]["diagnostics"]["dictionary_size"]
    capsys.readouterr()


def test_half_width_scores_equal_the_full_product(monkeypatch: pytest.MonkeyPatch) -> None:
    """``dtc_system(half=True)``: the half-width product ``[wᵀP; HᵀP] K_ZA`` gives the full
    product's ``(μ̃, λσ̃²)`` to rounding on padded runs (m = 5, 3, 1 of M = 5: ``G``'s padded
    block is the identity and adds nothing; a run with no pulls has ``A = λI``, ``G ≈ 0``), and
    the per-run full product of the fallback runs (``G``'s Cholesky failed) too."""
    from torchbandits.models import batched_dtc
    from torchbandits.models.batched_dtc import dtc_system
    gen = torch.Generator().manual_seed(3)
    arms = torch.rand(40, 2, generator=gen, dtype=F64)
    kern = torch.exp(-torch.cdist(arms, arms).square() / (2 * 0.3 ** 2))        # k(x, x) = 1
    sizes, n = [5, 3, 1, 4], 7
    idx = torch.stack([torch.randperm(40, generator=gen)[:n] for _ in sizes])  # [R, n]
    live = torch.arange(5)[None, :] < torch.tensor(sizes)[:, None]
    sel = torch.where(live, torch.arange(5)[None, :], 0)
    kza = torch.stack([kern[idx[r, sel[r]]] for r in range(len(sizes))])       # [R, M, A]
    kpz = torch.stack([kza[r].mT[idx[r]] for r in range(len(sizes))])          # [R, n, M]
    kzz = torch.stack([kpz[r, sel[r]] for r in range(len(sizes))])
    counts = torch.randint(1, 4, (len(sizes), n), generator=gen).to(F64)
    counts[3] = 0.0                                                              # no pulls
    sums = torch.randn(len(sizes), n, generator=gen, dtype=F64) * counts
    lam = torch.full((len(sizes),), 0.5, dtype=F64)
    full = dtc_system(kpz, kzz, live, counts, sums, lam, 1.0, lam_scalar=0.5)
    half = dtc_system(kpz, kzz, live, counts, sums, lam, 1.0, lam_scalar=0.5, half=True)
    assert half.half is not None and half.half.shape == (4, 6, 5) and half.rank == sizes
    want = full.scores(kza, 1.0, 1.0)
    for got, ref in zip(half.scores(kza, 1.0, 1.0), want):
        torch.testing.assert_close(got, ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(want[1][3], torch.ones(40, dtype=F64), atol=1e-12, rtol=0)
    half.fallback = [0, 3]                      # the per-run full product of the fallback
    for got, ref in zip(half.scores(kza, 1.0, 1.0), want):
        torch.testing.assert_close(got, ref, atol=1e-12, rtol=0)
    # each chunk of runs at its own width (the sizes on the host), one run per chunk: the
    # columns of W and rows of HᵀP beyond a run's size are 0, so the same numbers
    monkeypatch.setattr(batched_dtc, "SCORE_RUNS", 1)
    narrow = dtc_system(kpz, kzz, live, counts, sums, lam, 1.0, lam_scalar=0.5, half=True,
                        widths=sizes)
    assert narrow.half is not None and bool((narrow.half[1, :, 3:] == 0).all())
    assert bool((narrow.half[2, 2:] == 0).all())          # the rows of HᵀP beyond m = 1
    for got, ref in zip(narrow.scores(kza, 1.0, 1.0), want):
        torch.testing.assert_close(got, ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("n_arms", [1000, 60, 7])
def test_fused_ucb_has_the_bits_of_the_sequential_add(n_arms: int) -> None:
    """The batched UCB ``torch.addcmul(μ̃, σ̃, β̃[:, None])`` equals, bit for bit, the sequential
    ``torch.add(μ̃_r, σ̃_r, alpha=β̃_r)`` run by run (one rounding per entry; ``μ̃ + β̃σ̃`` rounds
    twice and differs), vectorised part and tail alike: ties break the same way in both."""
    gen = torch.Generator().manual_seed(5)
    mean = torch.randn(16, n_arms, generator=gen, dtype=F64) * 1e-3
    sd = torch.rand(16, n_arms, generator=gen, dtype=F64)
    beta = torch.rand(16, generator=gen, dtype=F64) * 4.0
    seq = torch.stack([torch.add(mean[r], sd[r], alpha=float(beta[r])) for r in range(16)])
    assert torch.equal(torch.addcmul(mean, sd, beta[:, None]), seq)
    if n_arms == 1000:
        assert not torch.equal(mean + beta[:, None] * sd, seq)     # the test can tell them apart
