"""The compiled CPU step of the batched exact posterior (``native/exact_batch.c``): every run of
a round scored in one C call and appended in one C call.

Run ``r`` of a batch equals the sequential run with seed ``r`` (same actions over 200 rounds,
UCBs to 1e-10) with the compiled path and with the torch path (:func:`torchbandits.native.disabled`),
for K-UCB (Zenati et al. 2022, Lemma 3.1), IGP-UCB and the AMM / DMM bounds of Flynn & Reeb
(2024, §5.5 / §5.4, DMM's five regularisers by the companion model) on the RKHS environment of
Flynn & Reeb (2024, §7: d = 3, 100 fresh or fixed arms, Matérn-5/2) and SW-GP-UCB (Zhou &
Shroff 2021, Algorithm 2, a window); compiled and torch scores and states agree to 1e-10 for every
closed-form kernel, λ down to 1e-4, per-run λ and t = 1; a pivot that is not positive is rejected
by the torch path with nothing changed; a deep copy, a state load and ``.to()`` go on from the
buffers of the copy (no address is kept); other dtypes and kernels take the torch path.
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

from ..batch_checks import lockstep, seeded_runs, started

pytestmark = pytest.mark.skipif(nb.available() is None, reason="no compiled library (no C compiler)")

GRID = (0.1, 0.3, 1.0, 3.0, 10.0)
SEEDS = [0, 1, 2, 5]


class _Calls:
    """Counts the compiled scoring and append calls (to know the compiled path ran)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.score = self.append = 0
        score, append = nb.score, nb.append

        def counted_score(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.score += 1
            return score(*args, **kwargs)

        def counted_append(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.append += 1
            return append(*args, **kwargs)

        monkeypatch.setattr(nb, "score", counted_score)
        monkeypatch.setattr(nb, "append", counted_append)


def _maybe_off(compiled: bool):  # type: ignore[no-untyped-def]
    return contextlib.nullcontext() if compiled else native.disabled()


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "torch"])
@pytest.mark.parametrize("fixed", [False, True], ids=["fresh", "fixed"])
@pytest.mark.parametrize("name", ["kucb", "amm-ucb", "dmm-ucb", "igp-ucb"])
def test_batched_run_r_equals_sequential_seed_r(name: str, fixed: bool, compiled: bool,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_env("rkhs", dim=3, n_arms=100, fixed_arms=fixed)
    extra = {"horizon": 200} if name.endswith("-ucb") else {}
    calls = _Calls(monkeypatch)
    with _maybe_off(compiled):
        batch = started(make_policy(name, env, **extra), SEEDS)
        seqs = seeded_runs(lambda r: make_policy(name, env, **extra), SEEDS)
        lockstep(env, SEEDS, 200, batch, seqs, atol=1e-10)
    if compiled:   # fresh sets: scored in C every round; every append in C from n = 1 on
        assert calls.append >= (2 if name == "dmm-ucb" else 1) * 190
        assert calls.score >= (0 if fixed else 190)
    else:
        assert calls.score == calls.append == 0


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "torch"])
def test_sliding_window_runs_equal_sequential_runs(compiled: bool) -> None:
    env = make_env("tv-rotation", horizon=80)
    with _maybe_off(compiled):
        policy = make_policy("sw-gpucb", env, window=15)
        runs = simulate_batch(policy, env, 80, [0, 3, 4])
        for res in runs:
            seq = simulate(make_policy("sw-gpucb", env, window=15), env, 80, res.seed)
            assert res.actions == seq.actions
            assert res.regret == pytest.approx(seq.regret, abs=1e-10, rel=0)


def _filled(kernel: str, lam: float | torch.Tensor, n: int, scale: float | None = None,
            runs: int = 3) -> tuple[BatchedExactKernelRidge, list[tuple[torch.Tensor, ...]]]:
    """A model after ``n`` appends of each run's UCB argmax over fresh candidates ``[R, 40, 3]``
    (Matérn / RBF with lengthscale 0.5), and the scores ``(μ, ρ², μ_G, ρ²_G)`` of every round
    (the companion at DMM's five regularisers included)."""
    gen = torch.Generator().manual_seed(7)
    model = BatchedExactKernelRidge(make_kernel(kernel, 0.5, outputscale=scale), lam, runs)
    out = []
    rows = torch.arange(runs)
    for _ in range(n + 1):
        cand = torch.rand(runs, 40, 3, dtype=torch.float64, generator=gen)
        mean, var = model.mean_var(cand)
        comp = model.at_regularisers(GRID)
        gm, gv = comp.mean_var_groups(cand, len(GRID))
        out.append((mean, var, gm, gv))
        if len(out) > n:
            break
        x = cand[rows, torch.argmax(mean + 2.0 * var.sqrt(), dim=1)]
        model.append(x, torch.randn(runs, dtype=torch.float64, generator=gen))
    return model, out


def _same_state(a: BatchedExactKernelRidge, b: BatchedExactKernelRidge, atol: float) -> None:
    assert a.n == b.n
    for key in ("x", "y"):
        assert torch.equal(getattr(a, key), getattr(b, key)), key
    torch.testing.assert_close(a.cholesky(), b.cholesky(), atol=atol, rtol=0)
    # ‖z‖² and the log-det grow as 1/λ: to 1e-10 relative
    torch.testing.assert_close(a.quad_y(), b.quad_y(), atol=atol, rtol=1e-10)
    torch.testing.assert_close(a.log_det(), b.log_det(), atol=atol, rtol=1e-10)


CASES = [("matern52", 1e-4, None), ("matern52", 0.01, None), ("matern52", 1.0, 2.5),
         ("matern32", 0.01, None), ("matern12", 0.01, 0.7), ("rbf", 0.01, None),
         ("rbf", 1.0, 2.5)]


@pytest.mark.parametrize(("kernel", "lam", "scale"), CASES)
def test_compiled_scores_and_state_equal_the_torch_path(kernel: str, lam: float,
                                                        scale: float | None,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _Calls(monkeypatch)
    a, got = _filled(kernel, lam, 60, scale)
    assert calls.score >= 2 * 60 and calls.append >= 2 * 59   # the model and its companion
    with native.disabled():
        b, want = _filled(kernel, lam, 60, scale)
    for g, w in zip(got, want, strict=True):
        for x, y in zip(g, w, strict=True):
            assert x.shape == y.shape
            torch.testing.assert_close(x, y, atol=1e-10, rtol=0)
    _same_state(a, b, 1e-10)
    _same_state(a.at_regularisers(GRID), b.at_regularisers(GRID), 1e-10)


def test_per_run_lam_and_one_point() -> None:
    lam = torch.tensor([1e-4, 0.03, 1.0], dtype=torch.float64)
    for n in (1, 2, 9):   # t = 1: one stored point (the scoring's first compiled call)
        a, got = _filled("matern52", lam, n)
        with native.disabled():
            b, want = _filled("matern52", lam, n)
        for g, w in zip(got, want, strict=True):
            for x, y in zip(g, w, strict=True):
                torch.testing.assert_close(x, y, atol=1e-10, rtol=0)
        _same_state(a, b, 1e-12)


def test_non_positive_pivot_is_rejected_with_nothing_changed(monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    calls = _Calls(monkeypatch)
    model = BatchedExactKernelRidge(make_kernel("matern52", 0.5), 1e-300, 2)
    x = torch.tensor([[0.2, 0.3], [0.5, 0.1]], dtype=torch.float64)
    model.append(x, torch.ones(2, dtype=torch.float64))
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="pivot"):
        model.append(x, torch.ones(2, dtype=torch.float64))   # k(x,x) + λ − ‖l‖² = 0
    assert calls.append == 1 and model.n == 1
    for key, value in model.state_dict().items():
        if torch.is_tensor(value):
            assert torch.equal(value, before[key]), key


def test_copies_and_loads_go_on_from_their_own_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _Calls(monkeypatch)
    model, _ = _filled("matern52", 0.03, 20)
    twin = BatchedExactKernelRidge(model.kernel, 0.03, 3)
    twin.load_state_dict(copy.deepcopy(model.state_dict()))
    clone = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(11)
    for _ in range(5):
        cand = torch.rand(3, 30, 3, dtype=torch.float64, generator=gen)
        ref = model.mean_var(cand)
        for other in (twin, clone):
            got = other.mean_var(cand)
            assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
        x, y = cand[:, 0], torch.randn(3, dtype=torch.float64, generator=gen)
        for m in (model, twin, clone):
            m.append(x, y)
    _same_state(model, twin, 0.0)
    _same_state(model, clone, 0.0)
    before = calls.score
    low = copy.deepcopy(model).to(torch.float32)            # another dtype: the torch path
    mean, _ = low.mean_var(cand.float())
    low.append(x.float(), y.float())
    assert calls.score == before and low.n == model.n + 1
    torch.testing.assert_close(mean.double(), model.mean_var(cand)[0], atol=1e-4, rtol=0)


def test_fixed_set_cache_and_strided_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fixed set is scored in C at its first two calls (the second also keeps ``V``) and then
    served by the candidate cache (``V`` extended by rows); a strided view of candidates is
    scored in C from a copy."""
    model, _ = _filled("matern52", 0.03, 12)
    calls = _Calls(monkeypatch)
    gen = torch.Generator().manual_seed(2)
    arms = torch.rand(30, 3, 3, dtype=torch.float64, generator=gen).transpose(0, 1)  # strided
    with native.disabled():
        twin = copy.deepcopy(model)
    for _ in range(4):
        got = model.mean_var(arms)
        with native.disabled():
            want = twin.mean_var(arms)
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
        x, y = arms[:, 3].contiguous(), torch.randn(3, dtype=torch.float64, generator=gen)
        model.append(x, y)
        with native.disabled():
            twin.append(x, y)
    assert calls.score == 2 and calls.append == 4   # its first two calls


def test_other_kernels_take_the_torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _Calls(monkeypatch)
    model = BatchedExactKernelRidge(make_kernel("linear"), 0.1, 2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        model.append(torch.rand(2, 3, dtype=torch.float64, generator=gen),
                     torch.randn(2, dtype=torch.float64, generator=gen))
    model.mean_var(torch.rand(2, 5, 3, dtype=torch.float64, generator=gen))
    assert calls.score == calls.append == 0
