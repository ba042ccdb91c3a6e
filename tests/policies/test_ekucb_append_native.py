"""The compiled data update of a batched EK-UCB round (``torchbandits/native/ekucb_append.c``:
Zenati et al. 2022, Algorithm 2 in the whitened form of Prop. 4.2) against the torch path it
replaces (:meth:`BatchedNystrom.scored_columns` + :meth:`BatchedNystrom.append`; the model's
``_append_compiled``): the returned
columns and residuals, and every state tensor after the append, to rounding; a played point that
is not a candidate of the last score falls back to the torch path with nothing written by C
(user code), or is flagged naming its run (under deferred checks)."""

from __future__ import annotations

import copy

import pytest
import torch

from torchbandits import native
from torchbandits.batching import BatchCheckError
from torchbandits.deferred_checks import deferred_checks
from torchbandits.envs.batched import BatchedEnv
from torchbandits.experiments.registry import make_env, make_policy
from torchbandits.models.batched_nystrom import BatchedNystrom
from torchbandits.native import ekucb_append as native_append

pytestmark = pytest.mark.skipif(native.library("ekucb_append") is None,
                                reason="no C compiler: the compiled path is not built")

SEEDS = [0, 1, 2, 3, 4, 5]


def _scored_batch(monkeypatch: pytest.MonkeyPatch, rounds: int = 40):  # type: ignore[no-untyped-def]
    """A Bump batch (compiled score from the first scored round) stepped ``rounds`` rounds, then
    scored once more: the policy, the round's candidates (storage order) and the played rows."""
    monkeypatch.setattr(BatchedNystrom, "COMPILED_MIN_WIDTH", 0)
    env = make_env("bump")
    policy = make_policy("ekucb", env)
    policy.reset(seed=SEEDS)
    benv = BatchedEnv(env, SEEDS)
    rows = torch.arange(len(SEEDS))
    for _ in range(rounds):
        cand = benv.candidates()
        idx = policy.select(cand)
        reward, _ = benv.pull(idx)
        policy.update(cand[rows, idx], reward)
    cand = benv.candidates()
    idx = policy.select(cand)
    model = policy.batch_model
    assert model.compiled_scores() and model._pending is None
    played = model._scored[1][rows, idx]          # the storage order's candidates, as played
    reward = torch.linspace(-1.0, 1.0, len(SEEDS), dtype=torch.float64)
    return policy, played, reward


def _state(model: BatchedNystrom) -> dict[str, torch.Tensor]:
    model.apply_deferred()
    n = model.n
    return {"q": model._q.clone(), "g": model._g.clone(), "e": model._e[:, :n].clone(),
            "x": model._x[:, :n].clone(), "s": model._s[:, :n].clone(),
            "logdet": model._logdet.clone()}


def _twins(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    policy, played, reward = _scored_batch(monkeypatch)
    fused, torch_path = policy.batch_model, copy.deepcopy(policy.batch_model)
    monkeypatch.setattr(torch_path, "_append_compiled", lambda x, y: None)
    return fused, torch_path, played, reward


def test_fused_append_equals_scored_columns_and_append(monkeypatch: pytest.MonkeyPatch) -> None:
    fused, reference, played, reward = _twins(monkeypatch)
    calls = []
    real = native_append.append_played

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = real(*args, **kwargs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(native_append, "append_played", spy)
    got = fused.append_scored(played, reward)
    want = reference.append_scored(played, reward)
    assert calls == [True] and fused.n == reference.n
    sizes = fused.sizes
    assert len(set(sizes.tolist())) > 1       # runs of different sizes: the padding is exercised
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-14, rtol=1e-12)
    for key, value in _state(reference).items():
        torch.testing.assert_close(_state(fused)[key], value, atol=1e-14, rtol=1e-11, msg=key)
    # the padding stays zero: f and E beyond each run's size
    for r, m in enumerate(sizes.tolist()):
        assert not got[1][r, m:].any() and not fused._e[r, fused.n - 1, m:].any()


def test_a_point_that_is_not_a_candidate_takes_the_torch_path(monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """User code: ``x_r`` not among the last candidates — C writes nothing and the torch path
    (fresh kernel columns) runs: the same numbers, to the bit, as the torch path alone."""
    fused, reference, played, reward = _twins(monkeypatch)
    played = played.clone()
    played[2, 0] += 1e-3
    got = fused.append_scored(played, reward)
    want = reference.append_scored(played, reward)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    for key, value in _state(reference).items():
        assert torch.equal(_state(fused)[key], value), key


def test_a_point_that_is_not_a_candidate_is_flagged_under_deferred_checks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fused, _, played, reward = _twins(monkeypatch)
    played = played.clone()
    played[4, 1] = float("nan")
    with deferred_checks() as checks, pytest.raises(BatchCheckError, match="run 4"):
        fused.append_scored(played, reward)
        checks.raise_if_failed(SEEDS)


@pytest.mark.parametrize("kxx_tensor", [False, True])
def test_kernel_equals_its_formulas_on_random_tensors(kxx_tensor: bool) -> None:
    """``append_played`` on random tensors (5 runs, 7 candidates, width 9, padded capacities)
    against the formulas in torch: every output and every written row to 1e-15 relative."""
    gen = torch.Generator().manual_seed(3)
    r, na, w, d, cap, n = 5, 7, 9, 3, 6, 4
    rand = lambda *s: torch.rand(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    cand, y = rand(r, na, d), rand(r) - 0.5
    idx = torch.tensor([6, 0, 3, 3, 1])
    x = cand[torch.arange(r), idx].clone()
    kz, f, qf = rand(r, na, w), rand(r, na, w), rand(r, na + 1, w)
    kxx = rand(r) + 1.0 if kxx_tensor else 1.25
    g, e, xs, s, logdet = rand(r, w + 2), rand(r, cap, w + 1), rand(r, cap, d), rand(r, cap), rand(r)
    before = [t.clone() for t in (g, e, xs, s, logdet)]
    got = native_append.append_played(cand, x, y, kz, f, qf, kxx, 0.5, g, e, xs, s, n, logdet,
                                      write_missing=False)
    assert got is not None and got.n_missing == 0
    rows = torch.arange(r)
    fx, qx = f[rows, idx], qf[rows, idx]
    fq, ff = (fx * qx).sum(-1), (fx * fx).sum(-1)
    close = lambda a, b: torch.testing.assert_close(a, b, atol=0, rtol=1e-15)  # noqa: E731
    assert torch.equal(got.kz, kz[rows, idx]) and torch.equal(got.f, fx)
    assert torch.equal(got.a, qx)
    close(got.b, qx / (1.0 + fq)[:, None])
    close(got.omega, (kxx + 0.5) - ff)
    close(g[:, :w], before[0][:, :w] + fx * y[:, None])
    assert torch.equal(g[:, w:], before[0][:, w:])                 # beyond the width: untouched
    assert torch.equal(e[:, n, :w], fx) and torch.equal(e[:, n, w:], before[1][:, n, w:])
    assert torch.equal(xs[:, n], x) and torch.equal(s[:, n], y)
    for t, b in zip((e, xs, s), before[1:4], strict=True):          # other rows: untouched
        assert torch.equal(t[:, :n], b[:, :n]) and torch.equal(t[:, n + 1:], b[:, n + 1:])
    close(logdet, before[4] + torch.log1p(fq))


def test_kernel_writes_nothing_when_a_point_is_missing() -> None:
    gen = torch.Generator().manual_seed(4)
    r, na, w, d = 3, 4, 5, 2
    cand = torch.rand(r, na, d, generator=gen, dtype=torch.float64)
    x = cand[:, 1].clone()
    x[1, 1] = -1.0                                                     # run 1: not a candidate
    cols = [torch.rand(r, na, w, generator=gen, dtype=torch.float64) for _ in range(3)]
    state = [torch.rand(r, w), torch.rand(r, 3, w), torch.rand(r, 3, d), torch.rand(r, 3),
             torch.rand(r)]
    state = [t.double() for t in state]
    before = [t.clone() for t in state]
    got = native_append.append_played(cand, x, torch.ones(r, dtype=torch.float64), *cols, 1.0,
                                      0.0, state[0], state[1], state[2], state[3], 1, state[4],
                                      write_missing=False)
    assert got is not None and got.n_missing == 1 and got.missing.tolist() == [0, 1, 0]
    assert all(torch.equal(a, b) for a, b in zip(state, before, strict=True))
