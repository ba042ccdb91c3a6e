"""Batched BKB's compiled update and argmax (Calandriello, Carratino, Lazaric, Valko & Rosasco,
COLT 2019, §3.1 / §3.2): :func:`native_bkb.record_rounds` (the count update, the fixed arm set's
arm rows, the dictionary draw's variances and binomial probabilities),
:func:`native_bkb.set_dictionary` and :func:`native_bkb.ucb_argmax_rounds` against the torch
statements they replace (:meth:`BatchedCounts.record`, :meth:`BatchedCounts.set_dictionary`
inside ``native.disabled()``, ``torch.argmax(torch.addcmul(…))``), exactly; the whole batch
against the sequential runs is tested in ``test_bkb_batched_native.py``."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

import torchbandits.native as native
from torchbandits.models.batched_counts import BatchedCounts
from torchbandits.native import bkb as native_bkb

pytestmark = pytest.mark.skipif(not native_bkb.available(),
                                reason="no C compiler or BLAS symbols: only the torch path runs")
F64 = torch.float64


def _state(r: int = 6, a: int = 9, d: int = 2, seed: int = 0) -> tuple[BatchedCounts, torch.Tensor]:
    """``r`` runs with 0 … 4 distinct points among ``a`` arms (two arms share a point), after a
    few torch updates; the arms ``[r, a, d]``."""
    g = torch.Generator().manual_seed(seed)
    cand = torch.rand(r, a, d, generator=g, dtype=F64)
    cand[:, 3] = cand[:, 5]                        # two arms at the same point
    st = BatchedCounts(r)
    with native.disabled():
        for t in range(4):
            pick = torch.randint(a, (r,), generator=g)
            pick[0] = 0                            # run 0 always pulls arm 0
            x = cand[torch.arange(r), pick]
            st.record(x, torch.randn(r, generator=g, dtype=F64), st.width)
            if t == 0:
                st.reset()                         # every run starts again
    for name in ("px", "counts", "sums", "n_distinct"):
        getattr(st, name)[r - 1] = 0               # the last run: no point yet
    return st, cand


def _torch_update(st: BatchedCounts, x: torch.Tensor, y: torch.Tensor, pvar: torch.Tensor,
                  xvar: torch.Tensor, qbar: float) -> tuple[torch.Tensor, ...]:
    """The torch statements of the batched update: the record, the draw's variances and the
    binomial probabilities."""
    n = pvar.shape[1]
    with native.disabled():
        slot, new = st.record(x, y, n)
    ar = torch.arange(x.shape[0])
    var = torch.cat([pvar, pvar.new_zeros(x.shape[0], 1)], 1)
    var[ar, slot] = torch.where(new, xvar, var[ar, slot])
    p = torch.clamp(qbar * var.clamp_min(0.0), max=1.0).nan_to_num_(0.0)
    return slot, new, var, p


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_record_rounds_is_the_torch_record(seed: int) -> None:
    """Repeated and new points (an arm sharing its point with another joins that point's entry),
    an empty run, variances ≤ 0, NaN and above 1/q̄: the same buffers, slots, draw variances,
    arm rows, and the binomial probabilities wherever they are > 0 (the others draw nothing)."""
    st, cand = _state(seed=seed)
    r, a, _ = cand.shape
    g = torch.Generator().manual_seed(10 + seed)
    st_t = copy.deepcopy(st)
    n = st.width
    choice = torch.randint(a, (r,), generator=g)
    choice[0] = 0                                     # a point pulled before
    choice[1] = 3                                     # the point of arm 5 too
    x = cand[torch.arange(r), choice].contiguous()
    y = torch.randn(r, generator=g, dtype=F64)
    var = torch.rand(r, a, generator=g, dtype=F64) * 0.5 - 0.05
    var[2, choice[2]] = float("nan")
    pvar = torch.rand(r, n, generator=g, dtype=F64) * 0.5 - 0.05
    pvar[3, 0] = float("nan")
    st.reserve(n + 1)
    idx = torch.full((r, st.counts.shape[1]), -1, dtype=torch.int64)
    probs = torch.zeros(r, st.counts.shape[1], dtype=F64)
    out = native_bkb.record_rounds(cand, choice, x, y, var, pvar, st.px, st.counts, st.sums,
                                   st.n_distinct, idx, 5.0, probs)
    assert out is not None
    xvar = var[torch.arange(r), choice]
    slot_t, new_t, var_t, p_t = _torch_update(st_t, x, y, pvar, xvar, 5.0)
    slot, new, var_c = out
    assert torch.equal(slot, slot_t) and torch.equal(new, new_t)
    assert not new[0] and new[r - 1] and slot[r - 1] == 0
    assert torch.equal(var_c.nan_to_num(7.0), var_t.nan_to_num(7.0))
    for name in ("px", "counts", "sums", "n_distinct"):
        assert torch.equal(getattr(st, name), getattr(st_t, name)), name
    ar = torch.arange(r)
    assert torch.equal(idx[ar, slot][new], choice[new]) and (idx[ar, slot][~new] == -1).all()
    live = p_t > 0
    assert torch.equal(probs[:, :n + 1][live], p_t[live]) and not (probs[:, :n + 1][~live] > 0).any()
    assert not probs[:, n + 1:].any()


def test_record_rounds_refuses_a_point_other_than_the_selected_arm() -> None:
    """A run whose point is not its selected arm: ``None`` and nothing changed (the torch update
    runs); float32 or too small buffers: ``None``."""
    st, cand = _state()
    r, a, _ = cand.shape
    n = st.width
    st.reserve(n + 1)
    before = copy.deepcopy(st.state_dict())
    choice = torch.zeros(r, dtype=torch.int64)
    x = cand[:, 1].contiguous()
    x[:, 0] = cand[:, 0, 0]
    x[4] = cand[4, 0]                                   # the others play arm 1's point
    idx = torch.zeros(r, st.counts.shape[1], dtype=torch.int64)
    args = (torch.zeros(r, dtype=F64), torch.rand(r, a, dtype=F64), torch.rand(r, n, dtype=F64))
    assert native_bkb.record_rounds(cand, choice, x, *args, st.px, st.counts, st.sums,
                                    st.n_distinct, idx) is None
    assert all(torch.equal(v, before[k]) for k, v in st.state_dict().items())
    x = cand[:, 0].contiguous()
    assert native_bkb.record_rounds(cand.float(), choice, x, *args, st.px, st.counts, st.sums,
                                    st.n_distinct, idx) is None
    assert native_bkb.record_rounds(cand, choice, x, *args, st.px, st.counts, st.sums,
                                    st.n_distinct, idx[:, :n]) is None


def test_set_dictionary_is_the_torch_statements() -> None:
    """Copies narrower than the capacity, rows with nothing kept (counted as empty), a stale
    mask beyond the copies: the same mask, multiset sizes and empty counts."""
    g = torch.Generator().manual_seed(3)
    st = BatchedCounts(5)
    st.reserve(40)
    st.in_dict[:, 30:] = True                           # stale entries, cleared by both
    st.empty += torch.arange(5)
    st_t = copy.deepcopy(st)
    copies = torch.binomial(torch.full((5, 23), 3.0, dtype=F64),
                            torch.full((5, 23), 0.2, dtype=F64), generator=g)
    copies[1] = 0.0
    copies[3, :] = 0.0
    copies[3, 22] = 2.0
    st.set_dictionary(copies)
    with native.disabled():
        st_t.set_dictionary(copies)
    for name in ("in_dict", "m_theory", "empty"):
        assert torch.equal(getattr(st, name), getattr(st_t, name)), name
    assert st.version == st_t.version
    assert st.empty.tolist() == [0, 2, 2, 3, 4]


def test_ucb_argmax_rounds_is_the_argmax_of_the_fused_ucb() -> None:
    """Ties (first index), a NaN (the largest), infinities, rows where β̃ = 0: the choices of
    ``torch.argmax(torch.addcmul(μ̃, σ̃, β̃))`` and of the single-run ``ucb_argmax``."""
    g = torch.Generator().manual_seed(4)
    mean = torch.randn(7, 50, generator=g, dtype=F64)
    sd = torch.rand(7, 50, generator=g, dtype=F64)
    beta = torch.rand(7, generator=g, dtype=F64) * 3
    beta[2] = 0.0
    mean[1, 10] = mean[1, 30] = 99.0
    sd[1, 10] = sd[1, 30] = 0.0                         # a tie: the first index
    mean[3, 40] = float("nan")
    mean[4, 0] = float("inf")
    mean[5, :] = float("-inf")
    mean[6, 20] = float("nan")
    mean[6, 5] = float("inf")
    choice = native_bkb.ucb_argmax_rounds(mean, sd, beta)
    assert choice is not None
    ref = torch.argmax(torch.addcmul(mean, sd, beta[:, None]), dim=1)
    assert torch.equal(choice, ref)
    for r in range(7):
        one = native_bkb.ucb_argmax(mean[r], sd[r], float(beta[r]))
        assert one is not None and one[1] == int(choice[r])
    assert choice[1] == 10 and choice[3] == 40 and choice[6] == 20
    assert native_bkb.ucb_argmax_rounds(mean.float(), sd.float(), beta.float()) is None
    assert native_bkb.ucb_argmax_rounds(mean[:, ::2], sd[:, ::2], beta) is None


@pytest.mark.parametrize("compiled", [True, False])
def test_row_cache_tail_is_never_read(compiled: bool) -> None:
    """The fixed arm set's kernel-row cache grows without a zero fill (16 → 32 → 64 rows a run
    here): its rows past each run's ``n_r`` are set to NaN after every update, and every
    batched run still equals its sequential run: bit for bit compiled (``atol = 0``), to rounding
    on the torch paths (1e-8 on UCBs ~10: a NaN read would fail; the batch's padded dictionary
    positions read row 0)."""
    from torchbandits.experiments.registry import make_env, make_policy

    from ..batch_checks import lockstep, seeded

    env, seeds = make_env("rkhs", dim=2, n_arms=400, fixed_arms=True), list(range(4))
    batch = make_policy("bkb", env, qbar=5.0)
    batch.reset(seed=seeds)
    seqs = [seeded(make_policy("bkb", env, qbar=5.0), s) for s in seeds]
    grown = set()

    def poison(r: int, pol: object) -> None:
        cache = batch._bcache
        if cache is not None:
            grown.add(cache["rows"].shape[1])
            cache["rows"][r, int(batch.batch_counts.n_distinct[r]):] = float("nan")

    with native.disabled() if not compiled else contextlib.nullcontext():
        lockstep(env, seeds, 90, batch, seqs, atol=0.0 if compiled else 1e-8,
                 check_update=poison)
    assert {32, 64} <= grown
