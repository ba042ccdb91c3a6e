"""A batched step reads nothing back to the host: proved on the CPU by making every host read raise.

:func:`no_host_reads` replaces the entry points through which a tensor's value reaches Python —
``Tensor.item``, ``tolist``, ``numpy``, ``__bool__``, ``__int__``, ``__float__``, ``__index__``,
``torch.equal``, ``Tensor.nonzero`` / ``torch.nonzero`` — by functions that raise
:class:`HostRead`. On a CUDA device each of them is a synchronisation; on the CPU they are not,
but a step that calls none of them on the CPU calls none on CUDA either (the code path is the
same). The guard is switched on around every round of ``simulate_batch``'s loop
(``select`` → environment round → ``update``) through the runner's step clock, and the runs must
still equal the sequential runs. Under CUDA the real thing: ``torch.cuda.set_sync_debug_mode``
("error") around the batched loop (skipped without a GPU).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from torchbandits.batching import (
    BatchCheckError,
    DeferredChecks,
    check_batch_index,
    check_batch_rewards,
    check_runs,
    deferred_checks,
)
from torchbandits.experiments import batch as batch_module
from torchbandits.experiments import simulate, simulate_batch
from torchbandits.experiments.registry import make_env, make_policy
from torchbandits.experiments.results import RunResult


class HostRead(AssertionError):
    """A tensor's value was read back to the host inside a guarded batched step."""


_TENSOR_READS = ("item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__",
                 "nonzero", "__array__")
_TORCH_READS = ("equal", "nonzero")


@contextmanager
def no_host_reads() -> Iterator[None]:
    """Inside, every host-reading entry point of a tensor raises :class:`HostRead`."""
    saved = [(torch.Tensor, n, torch.Tensor.__dict__.get(n)) for n in _TENSOR_READS]
    saved += [(torch, n, getattr(torch, n)) for n in _TORCH_READS]

    def forbid(name: str):  # type: ignore[no-untyped-def]
        def raiser(*args: Any, **kwargs: Any) -> Any:
            raise HostRead(f"host read through {name} inside a batched step")
        return raiser

    for owner, name, _ in saved:
        setattr(owner, name, forbid(name))
    try:
        yield
    finally:
        for owner, name, old in saved:
            if old is None:
                delattr(owner, name)
            else:
                setattr(owner, name, old)


@pytest.fixture
def guarded_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every round of ``simulate_batch`` runs under :func:`no_host_reads`: the guard opens at the
    round's first clock mark (before ``select``) and closes at its last (after ``update``).
    Returns the list of guarded rounds (one entry per round)."""
    mark = batch_module._StepClock.mark
    rounds: list[int] = []
    state: dict[str, Any] = {}

    def guarded_mark(self: Any) -> None:
        k = len(self.marks) % 4
        if k == 3:
            state.pop("guard").__exit__(None, None, None)
        mark(self)
        if k == 0:
            state["guard"] = no_host_reads()
            state["guard"].__enter__()
            rounds.append(len(self.marks) // 4)

    monkeypatch.setattr(batch_module._StepClock, "mark", guarded_mark)
    return rounds


def test_the_guard_catches_every_host_read() -> None:
    x = torch.tensor([1.0, 2.0])
    reads = [lambda: x.sum().item(), lambda: x.tolist(), lambda: float(x[0]), lambda: int(x[0]),
             lambda: bool(x[0]), lambda: [0, 1, 2][x.long()[0]], lambda: torch.equal(x, x),
             lambda: x.nonzero(), lambda: torch.nonzero(x), lambda: x.numpy()]
    with no_host_reads():
        for read in reads:
            with pytest.raises(HostRead):
                read()
    assert float(x[0]) == 1.0 and torch.equal(x, x)   # restored
    # the eager (user-facing) checks do read the host: the guard sees them
    with no_host_reads(), pytest.raises(HostRead):
        check_batch_rewards("reward", x, 2, dtype=torch.float64, device=torch.device("cpu"))


CASES = [("kucb", "rkhs", {"dim": 3, "n_arms": 30}), ("kucb", "rkhs", {"dim": 2, "n_arms": 20,
                                                                        "fixed_arms": True}),
         ("kucb-theory", "rkhs", {"dim": 2, "n_arms": 20}), ("gpucb", "rkhs", {"dim": 3,
                                                                               "n_arms": 30}),
         ("random", "rkhs", {"dim": 3, "n_arms": 30}), ("kucb", "chessboard", {}),
         ("gpucb", "chessboard", {}), ("random", "chessboard", {})]


@pytest.mark.parametrize(("policy", "env", "kwargs"), CASES)
def test_batched_steps_make_no_host_read(guarded_steps: list[int], policy: str, env: str,
                                         kwargs: dict[str, Any]) -> None:
    horizon, seeds = 25, [0, 3, 7]
    e = make_env(env, **kwargs)
    runs = simulate_batch(make_policy(policy, e), e, horizon, seeds, sync_every=10)
    assert guarded_steps == list(range(horizon))   # every round ran under the guard
    for res in runs:
        seq = simulate(make_policy(policy, e), e, horizon, res.seed)
        assert res.actions == seq.actions
        assert res.regret == pytest.approx(seq.regret, abs=1e-12, rel=0)
        assert res.rewards == pytest.approx(seq.rewards, abs=1e-12, rel=0)


def _host_reading(reason: str) -> dict[str, Any]:
    return {"marks": pytest.mark.xfail(raises=HostRead, strict=True, reason=reason)}


#: the other batched policies: (policy, its keyword arguments, environment, its keyword
#: arguments); those that still read the host inside a round are strict xfails naming the read
MORE_CASES = [
    pytest.param("gpucb-srinivas", {}, "rkhs", {"dim": 2, "n_arms": 20}),
    pytest.param("ay-gpucb", {}, "rkhs", {"dim": 2, "n_arms": 20}),
    pytest.param("aygp-ucb", {"horizon": 200}, "rkhs", {"dim": 2, "n_arms": 20}),
    pytest.param("amm-ucb", {"horizon": 200}, "rkhs", {"dim": 2, "n_arms": 20}),
    pytest.param("cmm-ucb", {"horizon": 200}, "rkhs", {"dim": 2, "n_arms": 20}),
    pytest.param("amm-ucb", {"horizon": 200}, "rkhs", {"dim": 2, "n_arms": 20, "fixed_arms": True}),
    pytest.param("cgpucb", {}, "chessboard", {}),
    pytest.param("dmm-ucb", {"horizon": 200}, "rkhs", {"dim": 2, "n_arms": 20}),
    pytest.param("dmm-ucb", {"horizon": 200}, "rkhs", {"dim": 2, "n_arms": 20, "fixed_arms": True}),
    pytest.param("ekucb", {}, "chessboard", {}),
    pytest.param("r-gpucb", {"period": 7, "tie_break": "first"}, "tv-rotation", {"horizon": 100}),
    pytest.param("sw-gpucb", {"window": 6, "tie_break": "first"}, "tv-rotation", {"horizon": 100}),
    pytest.param("r-gpucb", {"period": 7, "tie_break": "first", "gamma": "realised"},
                 "tv-switch", {"horizon": 100}),
    pytest.param("sw-gpucb", {"window": 6, "tie_break": "first", "gamma": "realised"},
                 "tv-switch", {"horizon": 100}),
    pytest.param("sw-gpucb", {"window": 6}, "tv-rotation", {"horizon": 100}),
    pytest.param("r-gpucb", {"period": 7}, "tv-rotation", {"horizon": 100}),
    pytest.param("r-gpucb", {"period": 5, "n_warmup": 2}, "tv-bump", {"horizon": 100}),
]


@pytest.mark.parametrize(("policy", "policy_kwargs", "env", "env_kwargs"), MORE_CASES)
def test_every_batched_policy_makes_no_host_read(guarded_steps: list[int], policy: str,
                                                 policy_kwargs: dict[str, Any], env: str,
                                                 env_kwargs: dict[str, Any]) -> None:
    """Every other batched policy: 25 guarded rounds (past DMM's companion, EK-UCB's first
    dictionary growth, R-GP-UCB's restarts and SW-GP-UCB's removals), equal to the sequential
    runs."""
    horizon, seeds = 25, [0, 3, 7]
    e = make_env(env, **env_kwargs)
    runs = simulate_batch(make_policy(policy, e, **policy_kwargs), e, horizon, seeds,
                          sync_every=10)
    assert guarded_steps == list(range(horizon))
    for res in runs:
        seq = simulate(make_policy(policy, e, **policy_kwargs), e, horizon, res.seed)
        assert res.actions == seq.actions
        assert res.regret == pytest.approx(seq.regret, abs=1e-12, rel=0)


def test_a_nan_reward_is_reported_at_the_next_sync() -> None:
    """Run 1's reward turns NaN at round 7: nothing raises inside the step; the runner's read at
    round 10 (``sync_every=5``) raises naming the check, the run, its seed and the round."""
    env = make_env("rkhs", dim=2, n_arms=20)
    noise = env.batch_noise

    def bad_noise(b: Any, means: torch.Tensor) -> torch.Tensor:
        out = noise(b, means)
        if b.t == 7:
            out = out.clone()
            out[1] = float("nan")
        return out

    env.batch_noise = bad_noise
    for name in ("kucb", "random"):
        with pytest.raises(BatchCheckError, match=r"reward must be finite: failed in run 1 "
                                                  r"\(seed 11\) at round 7"):
            simulate_batch(make_policy(name, env), env, 30, [10, 11, 12], sync_every=5)
    # a NaN reward is a ValueError for code that catches those
    assert issubclass(BatchCheckError, ValueError)


def test_deferred_checks_flag_on_the_device_and_report_the_first_round() -> None:
    cpu = torch.device("cpu")
    checks = DeferredChecks()
    assert checks.failures() == []
    with deferred_checks() as checks:
        for t in range(4):
            checks.round = t
            y = torch.tensor([0.0, float("nan") if t >= 2 else 1.0, 0.0])
            check_batch_rewards("reward", y, 3, dtype=torch.float64, device=cpu)  # no raise
            idx = check_batch_index("index", torch.tensor([0, 5, -1]), 3, 4, cpu)
            assert idx.tolist() == [0, 3, 0]   # clamped into range until the read
            check_runs("pivot", torch.tensor([False, False, t == 3]), lambda r: f"run {r}")
    assert sorted(checks.failures()) == [("index must lie in [0, 4)", 1, 0),
                                         ("index must lie in [0, 4)", 2, 0),
                                         ("pivot", 2, 3), ("reward must be finite", 1, 2)]
    with pytest.raises(BatchCheckError, match=r"failed in run 1 \(seed 9\) at round 0"):
        checks.raise_if_failed([8, 9, 10])
    # outside the context the same checks raise at once, naming the run
    with pytest.raises(ValueError, match="run 1"):
        check_batch_rewards("reward", torch.tensor([0.0, float("inf")]), 2, dtype=torch.float64,
                            device=cpu)
    with pytest.raises(ValueError, match="in run 2"):
        check_runs("pivot", torch.tensor([False, False, True]), lambda r: f"bad in run {r}")


def test_folded_flags_keep_the_first_failing_round() -> None:
    """Flags are filed and folded every ``FOLD`` rounds: the first failing round survives the
    folds; ``flag_finite`` flags NaN and ±inf, not large finite values."""
    checks = DeferredChecks()
    for t in range(3 * DeferredChecks.FOLD + 5):
        checks.round = t
        checks.flag("c", torch.tensor([t == 70, t >= 130, False]))
        checks.flag("c", torch.tensor([t == 150]))    # another run count: its own entry
    assert sorted(checks.failures()) == [("c", 0, 70), ("c", 1, 130), ("c [1 runs]", 0, 150)]
    checks = DeferredChecks()
    x = torch.tensor([[1e308, 1e308], [float("inf"), 0.0], [float("nan"), 1.0], [0.0, -0.0],
                      [-float("inf"), 1.0]], dtype=torch.float64)
    checks.flag_finite("x", x)
    assert sorted(checks.failures()) == [("x", 1, 0), ("x", 2, 0), ("x", 4, 0)]


def test_nan_candidates_are_reported_by_the_runner() -> None:
    """The runner flags each round's candidates once (the policies skip the repeat): a NaN
    candidate of run 2 at round 12 is reported with its round, run and seed."""
    env = make_env("rkhs", dim=2, n_arms=20)
    batch_round = env.batch_round

    def bad_round(b: Any) -> tuple[torch.Tensor, torch.Tensor]:
        cand, means = batch_round(b)
        if b.t == 12:
            cand = cand.clone()
            cand[2, 5, 1] = float("nan")
        return cand, means

    env.batch_round = bad_round
    for name in ("random", "kucb"):
        with pytest.raises(BatchCheckError, match=r"failed in run 2 \(seed 7\) at round 12"):
            simulate_batch(make_policy(name, env), env, 20, [3, 5, 7], sync_every=0)


def test_memory_is_recorded_per_run_and_survives_json() -> None:
    env = make_env("rkhs", dim=2, n_arms=20)
    runs = simulate_batch(make_policy("kucb", env), env, 20, [0, 1, 2, 3])
    seq = simulate(make_policy("kucb", env), env, 20, 0)
    # CPU: the policy's tensor state / R; the batched factor [R, cap, cap] with cap = 32 after
    # 20 points holds at least R·32²·8 bytes, so a run's share is at least 32²·8
    assert all(r.memory_bytes == runs[0].memory_bytes for r in runs)
    assert runs[0].memory_bytes >= 32 * 32 * 8
    assert seq.memory_bytes is not None and seq.memory_bytes > 0
    back = RunResult.from_dict(runs[0].to_dict())
    assert back.memory_bytes == runs[0].memory_bytes
    old = runs[0].to_dict()
    del old["memory_bytes"]    # a file written before the field existed
    assert RunResult.from_dict(old).memory_bytes is None
    random_runs = simulate_batch(make_policy("random", env), env, 5, [0, 1])
    assert random_runs[0].memory_bytes < 64    # no posterior: a few scalars


#: (policy, its keyword arguments, environment, its keyword arguments) run on CUDA under the
#: sync-debug mode: every batched policy whose CPU round makes no host read (above)
CUDA_CASES = [(p, {}, "rkhs", {"dim": 3, "n_arms": 30})
              for p in ("kucb", "kucb-theory", "gpucb", "random", "gpucb-srinivas", "ay-gpucb",
                        "cgpucb")] + [
    (p, {"horizon": 200}, "rkhs", {"dim": 3, "n_arms": 30})
    for p in ("amm-ucb", "aygp-ucb", "dmm-ucb", "igp-ucb")] + [
    pytest.param("cmm-ucb", {"horizon": 200}, "rkhs", {"dim": 3, "n_arms": 30},
                 marks=pytest.mark.xfail(raises=RuntimeError, strict=True, reason=(
                     "CMM's dual needs the spectrum of K_t: torch.linalg.eigh on CUDA reads "
                     "cuSOLVER's convergence flag on the host (one sync per round)")))] + [
    ("amm-ucb", {"horizon": 200}, "rkhs", {"dim": 2, "n_arms": 20, "fixed_arms": True}),
    ("dmm-ucb", {"horizon": 200}, "rkhs", {"dim": 2, "n_arms": 20, "fixed_arms": True}),
    ("r-gpucb", {"period": 7, "tie_break": "first"}, "tv-rotation", {"horizon": 100}),
    ("sw-gpucb", {"window": 6, "tie_break": "first"}, "tv-rotation", {"horizon": 100}),
    ("r-gpucb", {"period": 7}, "tv-rotation", {"horizon": 100}),       # tie_break="random"
    ("sw-gpucb", {"window": 6}, "tv-rotation", {"horizon": 100}),
    ("ekucb", {}, "chessboard", {})]     # 20 rounds: before its first size check (round 63)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("policy", "policy_kwargs", "env_name", "env_kwargs"), CUDA_CASES)
def test_cuda_batched_loop_under_sync_debug_error(monkeypatch: pytest.MonkeyPatch, policy: str,
                                                  policy_kwargs: dict[str, Any], env_name: str,
                                                  env_kwargs: dict[str, Any]) -> None:
    """On a GPU: every round runs under ``torch.cuda.set_sync_debug_mode("error")``; the runs
    equal the sequential CPU runs."""
    _strict_rounds(monkeypatch)
    env = make_env(env_name, **env_kwargs, device="cuda")
    try:
        runs = simulate_batch(make_policy(policy, env, **policy_kwargs, device="cuda"), env, 20,
                              [0, 1, 2], sync_every=7)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    cpu_env = make_env(env_name, **env_kwargs)
    for res in runs:
        seq = simulate(make_policy(policy, cpu_env, **policy_kwargs), cpu_env, 20, res.seed)
        assert res.actions == seq.actions
        assert res.memory_bytes is not None and res.memory_bytes > 0


def _strict_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every round of ``simulate_batch`` (first clock mark to last) under
    ``torch.cuda.set_sync_debug_mode("error")``."""
    mark = batch_module._StepClock.mark

    def strict_mark(self: Any) -> None:
        k = len(self.marks) % 4
        if k == 3:
            torch.cuda.set_sync_debug_mode("default")
        mark(self)
        if k == 0:
            torch.cuda.set_sync_debug_mode("error")

    monkeypatch.setattr(batch_module._StepClock, "mark", strict_mark)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batch_drawing_ahead_under_sync_debug_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU, the environment's chunks drawn ahead (page-locked, on a background thread) and
    copied without a wait: no synchronisation in a round, and the runs are the sequential ones."""
    _strict_rounds(monkeypatch)
    env = make_env("rkhs", dim=2, n_arms=30, device="cuda")
    try:
        runs = simulate_batch(make_policy("igp-ucb", env, device="cuda"), env, 40, [0, 1, 2],
                              chunk=8, draw_ahead=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    cpu_env = make_env("rkhs", dim=2, n_arms=30)
    for res in runs:
        seq = simulate(make_policy("igp-ucb", cpu_env), cpu_env, 40, res.seed)
        assert res.actions == seq.actions


def test_block_solves_past_the_head_size_equal_the_sequential_model() -> None:
    """Past 64 points the batched factor is solved as a contiguous head plus a tail (refreshed
    every 64 appends): 150 appends against ``ExactKernelRidge`` run by run (mean, variance to
    1e-10), before and after a state-dict reload mid-way (the head is rebuilt from the state)."""
    from torchbandits import make_kernel
    from torchbandits.models import ExactKernelRidge
    from torchbandits.models.batched_exact import BatchedExactKernelRidge

    g = torch.Generator().manual_seed(3)
    r, n, a, d = 3, 150, 40, 2
    lam = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    x = torch.rand(r, n, d, generator=g, dtype=torch.float64)
    y = torch.randn(r, n, generator=g, dtype=torch.float64)
    cand = torch.rand(r, a, d, generator=g, dtype=torch.float64)
    model = BatchedExactKernelRidge(make_kernel("rbf", 0.3), lam, r)
    seq = [ExactKernelRidge(make_kernel("rbf", 0.3), float(lam[i])) for i in range(r)]
    for t in range(n):
        with deferred_checks() as checks:
            model.append(x[:, t], y[:, t])
        assert checks.failures() == []
        for i in range(r):
            seq[i].append(x[i, t], y[i, t])
        if t in (63, 64, 100, 129, 149):
            mean, var = model.mean_var(cand, "gp")
            for i in range(r):
                m_i, v_i = seq[i].mean_var(cand[i])
                assert torch.allclose(mean[i], m_i, atol=1e-10, rtol=0)
                assert torch.allclose(var[i], v_i, atol=1e-10, rtol=0)
        if t == 129:
            twin = BatchedExactKernelRidge(make_kernel("rbf", 0.3), lam, r)
            twin.load_state_dict(model.state_dict())
            assert torch.allclose(twin.mean_var(cand)[1], model.mean_var(cand)[1], atol=1e-13)
            model = twin


def test_kucb_batch_past_the_head_size_equals_sequential() -> None:
    env = make_env("rkhs", dim=2, n_arms=25)
    runs = simulate_batch(make_policy("kucb", env), env, 150, [0, 1])
    for res in runs:
        assert res.actions == simulate(make_policy("kucb", env), env, 150, res.seed).actions
