"""The compiled CPU products of the batched EK-UCB round (``torchbandits/native/ekucb_batch.c``:
the scores of Zenati et al. 2022, Prop. 4.2 and Algorithm 2, the Sherman–Morrison step of
Algorithm 4 and the KORS quadratic form of eq. 41) against the torch path: the kernels on padded
runs of different sizes (0, 1, odd, full width) and any number of candidates, and whole batched
runs with and without them (``native.disabled()``) — the same actions, UCBs, dictionaries and
state."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from fractions import Fraction

import pytest
import torch

from torchbandits import native
from torchbandits.envs.batched import BatchedEnv
from torchbandits.experiments.registry import make_env, make_policy
from torchbandits.models.batched_nystrom import BatchedNystrom
from torchbandits.native import ekucb as native_ekucb

F64 = torch.float64
pytestmark = pytest.mark.skipif(native.library("ekucb_batch") is None,
                                reason="no C compiler: the compiled path is not built")


def _padded(sizes: list[int], cap: int, lower: bool, seed: int = 0
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-run ``P`` (lower triangular if ``lower``), ``Q``, ``N`` ``[R, cap, cap]`` and ``g``
    ``[R, cap]``, zero beyond each run's size."""
    gen = torch.Generator().manual_seed(seed)
    r = len(sizes)
    p, q, n = (torch.randn(r, cap, cap, generator=gen, dtype=F64) for _ in range(3))
    g = torch.randn(r, cap, generator=gen, dtype=F64)
    if lower:
        p = p.tril()
    for j, m in enumerate(sizes):
        for t in (p, q, n):
            t[j, m:] = 0.0
            t[j, :, m:] = 0.0
        g[j, m:] = 0.0
    return p, q, n, g


#: the score tests' run sizes (padded capacity 24, width 17) and λ
SCORE_SIZES, SCORE_LAM = [0, 1, 5, 13, 17], 3.0


def _scored(n_cand: int, lower: bool, seed: int, seed_kz: int
            ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Random ``(P, Q, g, k_Z, k(x, x))`` at :data:`SCORE_SIZES` and the compiled score's
    ``(mean, var, f, qf)`` of them."""
    p, q, _, g = _padded(SCORE_SIZES, 24, lower, seed=seed)
    gen = torch.Generator().manual_seed(seed_kz)
    kz = torch.rand(len(SCORE_SIZES), n_cand, 17, generator=gen, dtype=F64)
    kdiag = 5.0 + torch.rand(len(SCORE_SIZES), n_cand, generator=gen, dtype=F64)
    out = native_ekucb.score(kz, p, q, g, torch.tensor(SCORE_SIZES), kdiag, SCORE_LAM,
                             p_lower=lower)
    assert out is not None
    return (p, q, g, kz, kdiag), out


@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("n_cand", [1, 10, 11, 12, 25])
def test_score_kernel_equals_the_torch_products(lower: bool, n_cand: int) -> None:
    """``f = P k_Z``, ``[Q f; Q g]``, ``μ̃ = fᵀQg`` and ``((k − ‖f‖²)₊ + λ fᵀQf)₊`` run by run at
    sizes 0, 1, 5, 13 and the full width 17 (padded capacity 24): equal to the torch products
    to rounding, exactly zero beyond each size, and the mean 0 / variance ``k`` of an empty
    dictionary."""
    sizes, width, lam = SCORE_SIZES, 17, SCORE_LAM
    (p, q, g, kz, kdiag), (mean, var, f, qf) = _scored(n_cand, lower, 0, 1)
    assert f.shape == (5, n_cand, width) and qf.shape == (5, n_cand + 1, width)
    for r, m in enumerate(sizes):
        f_ref = kz[r, :, :m] @ p[r, :m, :m].mT
        qf_ref = torch.cat([f_ref, g[r, None, :m]]) @ q[r, :m, :m].mT
        mean_ref = f_ref @ qf_ref[-1]
        var_ref = (kdiag[r] - (f_ref * f_ref).sum(-1)).clamp(min=0.0)
        var_ref = (var_ref + lam * (f_ref * qf_ref[:-1]).sum(-1)).clamp(min=0.0)
        torch.testing.assert_close(f[r, :, :m], f_ref, atol=1e-12, rtol=1e-13)
        torch.testing.assert_close(qf[r, :, :m], qf_ref, atol=1e-11, rtol=1e-13)
        torch.testing.assert_close(mean[r], mean_ref, atol=1e-10, rtol=1e-13)
        torch.testing.assert_close(var[r], var_ref, atol=1e-10, rtol=1e-13)
        assert not f[r, :, m:].any() and not qf[r, :, m:].any()
    assert not mean[0].any() and torch.equal(var[0], kdiag[0])


def _fma(a: float, b: float, c: float) -> float:
    """``a·b + c`` rounded once (exact rationals, then one correctly rounded division)."""
    return float(Fraction(a) * Fraction(b) + Fraction(c))


def _in_order(x: list[float], y: list[float]) -> float:
    """``Σ_j x_j y_j`` in order, each product rounded, then added (no FMA)."""
    s = 0.0
    for a, b in zip(x, y, strict=True):
        s += a * b
    return s


@pytest.mark.parametrize("n_cand", [10, 25])
def test_score_sums_are_the_in_order_sums_to_the_bit(n_cand: int) -> None:
    """The score's ``‖f‖²``, ``fᵀQf`` and ``fᵀQg`` (taken for a group of candidates at once,
    across them) are, bit for bit, each candidate's sum in order with rounded products, from the
    returned ``f`` and ``[Qf; Qg]``; ``((k − ‖f‖²)₊ + λ fᵀQf)₊`` likewise. 25 candidates: three
    groups, the first two waiting for ``Qg``."""
    sizes, lam = SCORE_SIZES, SCORE_LAM
    (_, _, _, _, kdiag), (mean, var, f, qf) = _scored(n_cand, True, 3, 4)
    for r, m in enumerate(sizes[1:], start=1):
        w = qf[r, n_cand, :m].tolist()
        for a in range(n_cand):
            fa, qa = f[r, a, :m].tolist(), qf[r, a, :m].tolist()
            v = max(float(kdiag[r, a]) - _in_order(fa, fa), 0.0)
            v = max(v + lam * _in_order(fa, qa), 0.0)
            assert float(var[r, a]) == v
            assert float(mean[r, a]) == _in_order(fa, w)


def _quadratic_form(k: torch.Tensor, n: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """KORS's compiled ``u = kᵀNk`` ``[R]``, as :func:`native_ekucb.kors_probability` returns it
    beside ``p̃`` (which does not enter ``u``)."""
    got = native_ekucb.kors_probability(k, n, sizes, 1.0, 1.0, 0.5, 1.0, False)
    assert got is not None
    return got[0]


def test_quadratic_form_is_dot4_in_row_order_to_the_bit() -> None:
    """KORS's ``u = Σ_i k_i (N_ii k_i + 2 Σ_{j<i} N_ij k_j)`` (rows four at a time on AVX2):
    bit for bit the rows' sums in order, each inner sum in four interleaved fused lanes
    (``j mod 4``) added ``(l0 + l2) + (l1 + l3)``, then its last ``i mod 4`` terms in order."""
    sizes, cap = [0, 1, 3, 4, 6, 9, 13], 16
    _, _, n, _ = _padded(sizes, cap, False, seed=5)
    n = n + n.mT
    k = torch.randn(len(sizes), 13, dtype=F64)
    u = _quadratic_form(k, n, torch.tensor(sizes))
    for r, m in enumerate(sizes):
        kr, s = k[r].tolist(), 0.0
        for i in range(m):
            row, n4 = n[r, i].tolist(), i - i % 4
            lanes = [0.0] * 4
            for j in range(n4):
                lanes[j % 4] = _fma(row[j], kr[j], lanes[j % 4])
            d = (lanes[0] + lanes[2]) + (lanes[1] + lanes[3])
            for j in range(n4, i):
                d += row[j] * kr[j]
            s += kr[i] * (row[i] * kr[i] + 2.0 * d)
        assert float(u[r]) == s


def test_quadratic_form_and_rank_one_step_equal_torch() -> None:
    """KORS's ``k_rᵀ N_r k_r`` (``N_r`` symmetric: the kernel reads its lower triangle) and
    ``Q_r ← Q_r − a_r b_rᵀ`` on each run's ``[:m_r, :m_r]``: the torch values to rounding, the
    padding untouched (bit for bit)."""
    sizes, cap = [0, 1, 6, 9], 12
    _, q, n, _ = _padded(sizes, cap, False, seed=2)
    n = n + n.mT
    k = torch.randn(4, 9, dtype=F64)
    a, b = torch.randn(4, 9, dtype=F64), torch.randn(4, 9, dtype=F64)
    for j, m in enumerate(sizes):
        a[j, m:] = 0.0
        b[j, m:] = 0.0
    u = _quadratic_form(k, n, torch.tensor(sizes))
    for r, m in enumerate(sizes):
        ref = (k[r, :m] @ n[r, :m, :m]) @ k[r, :m]
        torch.testing.assert_close(u[r], ref, atol=1e-12, rtol=1e-13)
    want = q.clone()
    want[:, :9, :9].addcmul_(a[:, :, None], b[:, None, :], value=-1.0)
    before = q.clone()
    assert native_ekucb.rank_one_sub(q[:, :9, :9], a, b, torch.tensor(sizes))
    torch.testing.assert_close(q, want, atol=1e-14, rtol=0)
    for r, m in enumerate(sizes):
        assert torch.equal(q[r, m:], before[r, m:]) and torch.equal(q[r, :, m:], before[r, :, m:])


def test_tensors_that_do_not_qualify_take_the_torch_path() -> None:
    """float32, a last dimension that is not contiguous, sizes not int64, no candidates, or a
    width beyond the buffers: ``None`` (the caller's torch path)."""
    p, q, _, g = _padded([3, 2], 4, True)
    kz, kd, sizes = torch.rand(2, 5, 3, dtype=F64), torch.ones(2, 5, dtype=F64), torch.tensor([3, 2])
    assert native_ekucb.score(kz, p, q, g, sizes, kd, 1.0) is not None
    assert native_ekucb.score(kz.float(), p.float(), q.float(), g.float(), sizes, kd.float(),
                              1.0) is None
    assert native_ekucb.score(kz, p.mT, q, g, sizes, kd, 1.0) is None
    assert native_ekucb.score(kz, p, q, g, sizes.int(), kd, 1.0) is None
    assert native_ekucb.score(kz[:, :0], p, q, g, sizes, kd[:, :0], 1.0) is None
    assert native_ekucb.score(torch.rand(2, 5, 6, dtype=F64), p, q, g, sizes, kd, 1.0) is None
    assert native_ekucb.kors_probability(kz[:, 0].float(), q.float(), sizes, 1.0, 1.0, 0.5, 1.0,
                                         False) is None
    assert not native_ekucb.rank_one_sub(q.mT, kz[:, 0], kz[:, 0], sizes)
    with native.disabled():
        assert native_ekucb.score(kz, p, q, g, sizes, kd, 1.0) is None


@contextlib.contextmanager
def _counting(calls: list[int]) -> Iterator[None]:
    """Count the calls of the compiled score that ran (returned a result)."""
    real = native_ekucb.score

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = real(*args, **kwargs)
        calls[0] += out is not None
        return out

    native_ekucb.score = spy   # the model looks the function up at each call
    try:
        yield
    finally:
        native_ekucb.score = real


def _twin_runs(env_name: str, seeds: list[int], horizon: int, atol: float) -> tuple[int, object, object]:
    """A batch with the compiled products and its twin on the torch path (``native.disabled()``)
    stepped on the same rounds: the same choice every round, UCBs within ``atol``. Returns the
    number of compiled scores and both policies."""
    env = make_env(env_name)
    compiled, reference = make_policy("ekucb", env), make_policy("ekucb", env)
    compiled.reset(seed=seeds)
    with native.disabled():
        reference.reset(seed=seeds)
    benv = BatchedEnv(env, seeds)
    rows = torch.arange(len(seeds))
    calls = [0]
    with _counting(calls):
        for _ in range(horizon):
            cand = benv.candidates()
            if compiled.t >= compiled.n_warmup:
                ucb = compiled(cand)
                with native.disabled():
                    torch.testing.assert_close(ucb, reference(cand), atol=atol, rtol=0)
            idx = compiled.select(cand)
            with native.disabled():
                assert torch.equal(idx, reference.select(cand))
            reward, _ = benv.pull(idx)
            compiled.update(cand[rows, idx], reward)
            with native.disabled():
                reference.update(cand[rows, idx], reward)
    return calls[0], compiled, reference


def test_bump_runs_equal_the_torch_path_from_the_first_round(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """Bump (Zenati et al. 2022, §5), 6 runs, 200 rounds, the compiled score from the first
    scored round on (one anchor per run, then dictionaries of different sizes): the same actions,
    UCBs to 1e-10, and at the end the same dictionaries and every state tensor to 1e-10."""
    monkeypatch.setattr(BatchedNystrom, "COMPILED_MIN_WIDTH", 0)
    calls, compiled, reference = _twin_runs("bump", [0, 1, 2, 3, 4, 5], 200, 1e-10)
    assert calls >= 190
    want = reference.state_dict()
    got = compiled.state_dict()
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            torch.testing.assert_close(got[key], value, atol=1e-10, rtol=0, msg=key)
        elif isinstance(value, torch.Tensor):
            assert torch.equal(got[key], value), key
    sizes = compiled.batch_diagnostics()["dict_size"]
    assert torch.equal(sizes, reference.batch_diagnostics()["dict_size"])
    assert len(set(sizes.tolist())) > 1


def test_chessboard_runs_equal_the_torch_path() -> None:
    """Chessboard (γ = λ = 10, cond(K_ZZ) up to ~1e12), 4 runs, 200 rounds at the default
    :attr:`BatchedNystrom.COMPILED_MIN_WIDTH` (compiled once a dictionary reaches it): the same
    actions and dictionary sizes, UCBs to 1e-6 (rounding amplified by the conditioning, as
    between the batched and the sequential torch paths)."""
    calls, compiled, reference = _twin_runs("chessboard", [3, 0, 11, 5], 200, 1e-6)
    assert calls > 0
    assert torch.equal(compiled.batch_diagnostics()["dict_size"],
                       reference.batch_diagnostics()["dict_size"])


def _poisoned_twin(monkeypatch: pytest.MonkeyPatch, compact: bool) -> tuple[list, list]:
    """Bump, 6 runs × 150 rounds, compiled from the first scored round, the runs re-sorted by
    size (chunks of 2), the growing runs compacted every round (``compact``) or every run
    bordered with masked writes, with a ``state_dict`` round trip into a fresh policy at round 70 and a
    ``.to(float64)`` at round 100: the actions and the final state of a batch with
    ``debug_stale_q`` (the stored ``Q`` NaN while a step is pending) and without."""
    monkeypatch.setattr(BatchedNystrom, "COMPILED_MIN_WIDTH", 0)
    deferred = [0]   # appends whose step of Q was deferred (and, with poison, Q set to NaN)
    defer = BatchedNystrom._defer_q_step

    def counted(self, a, b):  # type: ignore[no-untyped-def]
        deferred[0] += 1
        defer(self, a, b)

    monkeypatch.setattr(BatchedNystrom, "_defer_q_step", counted)
    out = []
    for poison in (False, True):
        deferred[0] = 0
        monkeypatch.setattr(BatchedNystrom, "debug_stale_q", poison)
        env = make_env("bump")
        seeds = [0, 1, 2, 3, 4, 5]
        policy = make_policy("ekucb", env)
        policy.reset(seed=seeds)
        policy.cpu_compact_above = 0 if compact else None
        policy.batch_model.set_chunk_runs(2)
        benv = BatchedEnv(env, seeds)
        rows, actions, pending_seen = torch.arange(len(seeds)), [], 0
        for t in range(150):
            cand = benv.candidates()
            idx = policy.select(cand)
            actions.append(idx)
            reward, _ = benv.pull(idx)
            policy.update(cand[rows, idx], reward)
            model = policy.batch_model
            if model._pending is not None:
                pending_seen += 1
                assert torch.isnan(model._q_stored()).any() == poison   # what a stale read sees
            if t == 70:
                state = policy.state_dict()
                policy = make_policy("ekucb", env)
                policy.load_state_dict(state)
                policy.batch_model.set_chunk_runs(2)
                policy.cpu_compact_above = 0 if compact else None
            if t == 100:
                policy = policy.to(torch.float64)
            if t % 25 == 0:   # the module's generic readers: flushed
                for _, buf in policy.named_buffers():
                    assert not (buf.is_floating_point() and torch.isnan(buf).any())
        # every append defers its step (and poisons Q): the readers are exercised either way;
        # after the masked border (it reads Q through the flushing property) nothing is pending
        assert deferred[0] > 100
        assert pending_seen > 100 if compact else pending_seen == 0
        out.append((actions, policy.state_dict()))
    return out[0], out[1]


@pytest.mark.parametrize("compact", [True, False])
def test_no_reader_sees_a_stale_q(monkeypatch: pytest.MonkeyPatch, compact: bool) -> None:
    """The deferred Sherman–Morrison step of ``Q`` (applied by the next compiled score) is never
    bypassed: with ``debug_stale_q`` every read of the stored ``Q`` behind a pending step reads
    NaN, and the batch still plays the same actions and ends in the same state, bit for bit, as
    without it — through the compiled score, the appends, the compacted (``compact``) or masked
    borders, the re-sorts (``permute``), ``state_dict``/``load_state_dict``, ``.to`` and
    ``named_buffers``."""
    (plain_actions, plain_state), (poison_actions, poison_state) = _poisoned_twin(monkeypatch,
                                                                                  compact)
    assert all(torch.equal(a, b) for a, b in zip(plain_actions, poison_actions, strict=True))
    assert plain_state.keys() == poison_state.keys()
    for key, value in plain_state.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(poison_state[key], value), key


def test_reading_q_applies_the_pending_step() -> None:
    """After an append on the compiled path the step of ``Q`` is pending; ``model._q`` returns
    the stored ``Q`` with it applied — the torch path's ``Q`` after the same append (to
    rounding) — and leaves nothing pending."""
    env = make_env("bump")
    policies = [make_policy("ekucb", env) for _ in range(2)]
    seeds = [0, 1, 2]
    benv = BatchedEnv(env, seeds)
    for j, policy in enumerate(policies):
        with native.disabled() if j else contextlib.nullcontext():
            policy.reset(seed=seeds)
    rows = torch.arange(3)
    for _ in range(12):
        cand = benv.candidates()
        idx = policies[0].select(cand)
        reward, _ = benv.pull(idx)
        for j, policy in enumerate(policies):
            with native.disabled() if j else contextlib.nullcontext():
                policy.update(cand[rows, idx], reward)
    model, ref = policies[0].batch_model, policies[1].batch_model
    x = torch.stack([model.dictionary(r)[0] for r in range(3)])   # an anchor: a large step
    y = torch.tensor([0.5, -0.2, 1.0], dtype=F64)
    model.append(x, y)
    with native.disabled():
        ref.append(x, y)
    assert model._pending is not None and ref._pending is None
    stale = model._q_stored().clone()
    q = model._q
    assert model._pending is None and not torch.equal(q, stale)
    torch.testing.assert_close(q, ref._q, atol=1e-12, rtol=0)


@pytest.mark.parametrize("dim", [1, 2])
def test_rbf_exponent_is_cdist_to_the_bit(dim: int) -> None:
    """``c·‖a − b‖²`` compiled equals ``cdist(…, "donot_use_mm_for_euclid_dist").square_()
    .mul_(c)`` bit for bit (views with run and row strides, one point against many, Chessboard's
    joint points), so the RBF block of the batched model keeps torch's numbers; dimensions past
    :data:`~torchbandits.native.ekucb.RBF_MAX_DIM`, float32 and mismatched runs are refused."""
    gen = torch.Generator().manual_seed(dim)
    env = make_env("chessboard")
    cases = [(torch.rand(8, 40, dim, generator=gen, dtype=F64)[:, 3:14],
              torch.rand(8, 130, dim, generator=gen, dtype=F64)[:, :97]),
             (torch.rand(5, 300, dim, generator=gen, dtype=F64),
              torch.rand(5, 1, dim, generator=gen, dtype=F64))]
    if dim == 2:
        cand = BatchedEnv(env, list(range(6))).candidates()
        cases.append((cand, cand[:, :7]))
    for a, b in cases:
        want = torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist").square_().mul_(-50.0)
        got = native_ekucb.rbf_exponent(a, b, -50.0)
        assert got is not None and torch.equal(got, want)
    a = torch.rand(2, 4, 3, dtype=F64)
    assert native_ekucb.rbf_exponent(a, a, -1.0) is None
    assert native_ekucb.rbf_exponent(a[..., :2].float(), a[..., :2].float(), -1.0) is None
    assert native_ekucb.rbf_exponent(a[:1, :, :2], a[..., :2], -1.0) is None


@pytest.mark.parametrize("dim", [1, 2, 3, 6])
def test_rbf_block_is_torch_to_an_ulp(dim: int) -> None:
    """The compiled score's RBF block ``exp(c·‖a − b‖²)`` (a vectorised exp) against torch's
    ``cdist``/``exp_``: within 2.5e-16 relative where the exponents agree (d ≤ 2), padded
    tails (``nb`` not a multiple of 4), strided views, exponents below −708 (libm's exp, down to
    0) included."""
    gen = torch.Generator().manual_seed(10 + dim)
    for a, b, c in [(torch.rand(6, 12, dim, generator=gen, dtype=F64)[:, 1:11],
                     torch.rand(6, 90, dim, generator=gen, dtype=F64)[:, :67], -50.0),
                    (torch.rand(3, 5, dim, generator=gen, dtype=F64) * 30,
                     torch.rand(3, 7, dim, generator=gen, dtype=F64), -3.0),
                    (torch.rand(2, 4, dim, generator=gen, dtype=F64),
                     torch.rand(2, 1, dim, generator=gen, dtype=F64), -0.5)]:
        expo = torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist").square_().mul_(c)
        want = expo.exp()
        got = native_ekucb.rbf_block(a, b, c)
        assert got is not None and got.shape == want.shape
        # d <= 2: the same exponent (an ulp of exp); d > 2: cdist sums in another order, and
        # ulps of the exponent e are |e| times as many ulps of exp(e)
        slack = 2.5e-16 + (0.0 if dim <= 2 else 1e-15) * expo.abs().clamp(min=1.0)
        assert ((got - want).abs() <= slack * want + 1e-300).all()
    assert native_ekucb.rbf_block(a.float(), b.float(), -1.0) is None
