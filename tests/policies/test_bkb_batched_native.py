"""Batched BKB's compiled rounds (Calandriello, Carratino, Lazaric, Valko & Rosasco, COLT 2019,
§3.1 eq. 4, §3.2): on a fixed float64 CPU arm set every run's posterior is the sequential
compiled round (:func:`torchbandits.native.bkb.dtc_rounds`, one C call per batch), so batched
run ``r`` equals the sequential compiled run with seed ``r`` bit for bit, and the batch with and
without the library (``torchbandits.native.disabled()``, the torch batched path) chooses the
same arms, scores the UCBs within 1e-10 and ends in the same state; rounds the kernel leaves to
torch (a pivoted ``K_ZZ``) and played points other than the selected arm still run."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import torchbandits.native as native
from torchbandits.envs.batched import BatchedEnv
from torchbandits.experiments.registry import make_env, make_policy
from torchbandits.kernels import make_kernel
from torchbandits.models.nystrom import NystromKernelRidge
from torchbandits.models.nystrom_updates import PIVOT_TOL
from torchbandits.native import bkb as native_bkb

from ..batch_checks import equal_leaves, lockstep, seeded

pytestmark = pytest.mark.skipif(not native_bkb.available(),
                                reason="no C compiler or BLAS symbols: only the torch path runs")
F64 = torch.float64


class _Spy:
    """Counts the batched compiled rounds that ran (returned a result): ``dtc_rounds`` and
    ``select_rounds`` (the round with every run's width and choice, ``fused``). A refused
    ``select_rounds`` refuses the ``dtc_rounds`` the policy then tries too (one refused round)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, refuse: Any = None) -> None:
        self.rounds = self.calls = self.fused = 0
        self.pending = False

        def counting(inner: Any, fused: bool) -> Any:
            def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
                if self.pending:         # the fallback of a refused select_rounds
                    self.pending = False
                    return None
                self.calls += 1
                if refuse is not None and refuse(self.calls):
                    self.pending = fused
                    return None          # as a pivoted K_ZZ: the round on the torch path
                out = inner(*args, **kwargs)
                self.rounds += out is not None
                self.fused += fused and out is not None
                return out
            return counted

        monkeypatch.setattr(native_bkb, "dtc_rounds", counting(native_bkb.dtc_rounds, False))
        monkeypatch.setattr(native_bkb, "select_rounds", counting(native_bkb.select_rounds, True))


def _env(n_arms: int) -> Any:
    return make_env("rkhs", dim=2, n_arms=n_arms, fixed_arms=True)


def _play(env: Any, seeds: list[int], horizon: int, options: dict, off: bool,
          other: bool = False) -> tuple[list[torch.Tensor], list[torch.Tensor], Any]:
    """One batch of ``horizon`` rounds (``off``: inside ``native.disabled()``): its choices, UCBs
    ``[R, A]`` and the policy; ``other``: every 7th round each run plays the arm after its
    selected one (its variance then comes from the rebuilt systems)."""
    policy = make_policy("bkb", env, **options)
    benv = BatchedEnv(env, seeds)
    rows = torch.arange(len(seeds))
    acts, ucbs = [], []
    for t in range(horizon):
        cand = benv.candidates()
        if off:
            with native.disabled():
                if t == 0:
                    policy.reset(seed=seeds)
                ucb = policy(cand) if policy.t >= policy.n_warmup else None
                idx = policy.select(cand)
        else:
            if t == 0:
                policy.reset(seed=seeds)
            ucb = policy(cand) if policy.t >= policy.n_warmup else None
            idx = policy.select(cand)
        if ucb is not None:
            ucbs.append(ucb)
        acts.append(idx)
        play = (idx + 1) % cand.shape[1] if other and t % 7 == 3 else idx
        reward, _ = benv.pull(play)
        if off:
            with native.disabled():
                policy.update(cand[rows, play], reward)
        else:
            policy.update(cand[rows, play], reward)
    return acts, ucbs, policy


@pytest.mark.parametrize(("n_arms", "qbar"), [(1000, 1.0), (1000, 5.0), (60, 1.0), (60, 5.0)])
def test_compiled_batch_equals_torch_batch(n_arms: int, qbar: float,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """R = 8, 200 rounds: identical choices and the same state (``state_dict`` leaves, the
    generators' states included; the last β̃_t and ``S_t`` to rounding) with and without the
    compiled rounds, which ran on every
    scored round. The UCBs agree to 1e-7 only: the torch batched path's padded products round
    differently from the sequential ones (up to 8e-8 on UCBs of ~300 at q̄ = 1, A = 1000, where
    a square root of a variance near 0 amplifies it), while the compiled batch has the
    sequential runs' bits (next test)."""
    env, seeds = _env(n_arms), list(range(8))
    spy = _Spy(monkeypatch)
    acts, ucbs, pol = _play(env, seeds, 200, {"qbar": qbar}, off=False)
    compiled = spy.rounds
    acts_t, ucbs_t, pol_t = _play(env, seeds, 200, {"qbar": qbar}, off=True)
    assert spy.rounds == compiled                       # nothing compiled inside disabled()
    assert compiled == 2 * (200 - pol.n_warmup)         # forward + select per scored round
    assert spy.fused == 200 - pol.n_warmup              # select: widths and choices in C
    assert all(torch.equal(a, b) for a, b in zip(acts, acts_t, strict=True))
    assert max(float((u - v).abs().max()) for u, v in zip(ucbs, ucbs_t, strict=True)) <= 1e-7
    sa, sb = pol.state_dict(), pol_t.state_dict()
    assert sa.keys() == sb.keys()
    # the last round's β̃_t and S_t: the compiled batch has the sequential runs' bits, the torch
    # batch its own sums (within rounding)
    last, last_t = sa["_extra_state"]["batch"].pop("last"), sb["_extra_state"]["batch"].pop("last")
    for key, va in sa.items():
        assert equal_leaves(va, sb[key]), key
    for key in ("beta", "sum_var"):
        torch.testing.assert_close(last[key], last_t[key], rtol=1e-9, atol=0)
    assert torch.equal(pol.diagnostics()["dictionary_size"], pol_t.diagnostics()["dictionary_size"])


class _TorchPath:
    """A sequential policy whose calls run inside ``native.disabled()`` (its torch path)."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def __call__(self, cand: torch.Tensor) -> torch.Tensor:
        with native.disabled():
            return self.policy(cand)

    def select(self, cand: torch.Tensor) -> int:
        with native.disabled():
            return self.policy.select(cand)

    def update(self, x: torch.Tensor, reward: float) -> None:
        with native.disabled():
            self.policy.update(x, reward)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)


@pytest.mark.parametrize("torch_path", [False, True])
@pytest.mark.parametrize(("n_arms", "qbar"), [(1000, 1.0), (1000, 5.0), (60, 1.0), (60, 5.0)])
def test_compiled_batch_run_is_the_sequential_run_bit_for_bit(n_arms: int, qbar: float,
                                                              torch_path: bool) -> None:
    """Batched run ``r`` against the sequential run with seed ``r``, compiled or on its torch
    path (lockstep, 200 rounds, :func:`tests.batch_checks.lockstep`): the same choices and
    dictionaries and the same UCB bits (``atol = 0``: the same BLAS/LAPACK calls on the same
    shapes; β̃_t in the sequential rule's float arithmetic; the rounds with a pivoted ``K_ZZ``
    by the sequential torch round), the same β̃_t and ``S_t``."""
    env, seeds = _env(n_arms), list(range(8))
    batch = make_policy("bkb", env, qbar=qbar)
    batch.reset(seed=seeds)
    seqs = [seeded(make_policy("bkb", env, qbar=qbar), s) for s in seeds]
    if torch_path:
        seqs = [_TorchPath(pol) for pol in seqs]

    def same_dictionary(r: int, pol: Any) -> None:
        assert torch.equal(batch.run_dictionary(r), pol.dictionary)

    lockstep(env, seeds, 200, batch, seqs, atol=0.0, check_update=same_dictionary)
    diag = batch.diagnostics()
    for key in ("beta", "sum_var", "dictionary_size", "n_distinct"):
        assert diag[key].tolist() == [pol.diagnostics()[key] for pol in seqs], key


def test_torch_rounds_in_between_and_other_played_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every third compiled round refused (the torch batched path runs, as after a pivoted
    ``K_ZZ``) and every 7th round an arm other than the selected one played (its variance from
    the systems rebuilt on demand): the same choices, UCBs and state as the torch batch."""
    env, seeds = _env(100), list(range(6))
    spy = _Spy(monkeypatch, refuse=lambda call: call % 3 == 0)
    acts, ucbs, pol = _play(env, seeds, 120, {"qbar": 5.0}, off=False, other=True)
    assert 70 < spy.rounds < 160
    acts_t, ucbs_t, pol_t = _play(env, seeds, 120, {"qbar": 5.0}, off=True, other=True)
    assert all(torch.equal(a, b) for a, b in zip(acts, acts_t, strict=True))
    assert max(float((u - v).abs().max()) for u, v in zip(ucbs, ucbs_t, strict=True)) <= 1e-10
    assert torch.equal(pol.batch_counts.in_dict, pol_t.batch_counts.in_dict)
    assert torch.equal(pol.batch_counts.counts, pol_t.batch_counts.counts)


def _batch(ell: float, sizes: list[int], masks: list[list[int]]) -> dict[str, Any]:
    """Padded per-run buffers of ``len(sizes)`` runs on 500 arms (run ``r``: ``sizes[r]``
    distinct arms, its dictionary the positions ``masks[r]``)."""
    g = torch.Generator().manual_seed(len(sizes))
    arms = torch.rand(500, 2, generator=g, dtype=F64)
    r, cap = len(sizes), 64
    out: dict[str, Any] = {"rows": torch.zeros(r, cap, 500, dtype=F64),
                           "idx": torch.zeros(r, cap, dtype=torch.int64),
                           "in_dict": torch.zeros(r, cap, dtype=torch.bool),
                           "counts": torch.zeros(r, cap, dtype=F64),
                           "sums": torch.zeros(r, cap, dtype=F64),
                           "n_distinct": torch.tensor(sizes, dtype=torch.int64),
                           "lam": torch.linspace(0.01, 0.05, r, dtype=F64)}
    kern = NystromKernelRidge(make_kernel("rbf", ell), 0.01)
    for i, (n, mask) in enumerate(zip(sizes, masks, strict=True)):
        idx = torch.randperm(500, generator=g)[:n]
        out["idx"][i, :n] = idx
        out["rows"][i, :n] = kern.kernel_block(arms[idx], arms)
        out["in_dict"][i, mask] = True
        out["counts"][i, :n] = torch.randint(1, 9, (n,), generator=g).double()
        out["sums"][i, :n] = torch.randn(n, generator=g, dtype=F64)
    return out


def test_dtc_rounds_are_the_single_run_rounds_bit_for_bit() -> None:
    """The batch kernel against :func:`native_bkb.dtc_round` run by run (padded strides, per-run
    λ, an empty dictionary: the prior ``μ̃ = 0``, ``σ̃² = k/λ``, ``S_t`` by ``dot``); a run with a
    singular ``K_ZZ`` is returned as failed (left to torch), the others are set; no library or
    float32 rows: ``None``."""
    sizes = [30, 5, 50, 12]
    masks = [list(range(0, 30, 3)), [], list(range(1, 50, 2)), [0, 11]]
    b = _batch(0.3, sizes, masks)
    out = native_bkb.dtc_rounds(b["rows"], b["idx"], b["in_dict"], b["counts"], b["sums"],
                                b["n_distinct"], b["lam"], 50, 1.0, 0.0, PIVOT_TOL)
    assert out is not None
    mean, var, pvar, st, failed = out
    assert failed is None
    for r, n in enumerate(sizes):
        idx, counts, lam = b["idx"][r, :n], b["counts"][r, :n], float(b["lam"][r])
        sel = b["in_dict"][r, :n].nonzero()[:, 0]
        if sel.numel():
            one = native_bkb.dtc_round(b["rows"][r], idx, sel, counts, b["sums"][r, :n], lam, 1.0,
                                       0.0, PIVOT_TOL)
            assert one is not None
            assert torch.equal(mean[r], one[0]) and torch.equal(var[r], one[1]), r
            assert float(st[r]) == one[2]
        else:
            assert torch.equal(mean[r], torch.zeros(500, dtype=F64))
            assert torch.equal(var[r], torch.full((500,), 1.0 / lam, dtype=F64))
            assert float(st[r]) == float(torch.dot(counts, var[r].index_select(0, idx)))
        assert torch.equal(pvar[r, :n], var[r].index_select(0, idx))
        assert not pvar[r, n:].any()
    sing = _batch(1.5, [40, 40], [list(range(40)), [0]])
    out = native_bkb.dtc_rounds(sing["rows"], sing["idx"], sing["in_dict"], sing["counts"],
                                sing["sums"], sing["n_distinct"], sing["lam"], 40, 1.0, 0.0,
                                PIVOT_TOL)
    assert out is not None and out[4] is not None and out[4].tolist() == [0]
    one = native_bkb.dtc_round(sing["rows"][1], sing["idx"][1, :40], torch.tensor([0]),
                               sing["counts"][1, :40], sing["sums"][1, :40],
                               float(sing["lam"][1]), 1.0, 0.0, PIVOT_TOL)
    assert one is not None and torch.equal(out[1][1], one[1])   # the other run is set
    with native.disabled():
        assert native_bkb.dtc_rounds(b["rows"], b["idx"], b["in_dict"], b["counts"], b["sums"],
                                     b["n_distinct"], b["lam"], 50, 1.0, 0.0, PIVOT_TOL) is None
    assert native_bkb.dtc_rounds(b["rows"].float(), b["idx"], b["in_dict"], b["counts"],
                                 b["sums"], b["n_distinct"], b["lam"], 50, 1.0, 0.0,
                                 PIVOT_TOL) is None
