"""Batched EK-UCB (Zenati et al. 2022, Algorithms 2 and 4): run ``r`` of a batch is the sequential
run with seed ``r`` — the same actions, UCB values, KORS decisions and dictionary sizes — although
every run grows its own dictionary (padded to a common capacity); the batched Nyström posterior
equals the sequential one on dictionaries of different sizes (incremental and from scratch);
bad input changes nothing; ``state_dict`` round trip mid-batch; the CLI's ``--batch on``.
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import pytest
import torch

from torchbandits.confidence.ekucb import EKUCBTheoryBeta
from torchbandits.envs.batched import BatchedEnv
from torchbandits.experiments import simulate, simulate_batch
from torchbandits.experiments.batch import why_not_batch
from torchbandits.experiments.registry import make_env, make_policy
from torchbandits.kernels import make_kernel
from torchbandits.models import NystromKernelRidge
from torchbandits.models.batched_nystrom import BatchedNystrom
from torchbandits.models.nystrom import nystrom_posterior_reference
from torchbandits.policies import EKUCB
from torchbandits.policies.ekucb_batched import RunCoins

from ..batch_checks import cli_runs_on_off, lockstep, play, refuses_bad_input, reloaded, seeded, started

F64 = torch.float64


@pytest.mark.parametrize(("env_name", "horizon"), [("chessboard", 200), ("bump", 200)])
def test_simulate_batch_equals_simulate(env_name: str, horizon: int) -> None:
    env = make_env(env_name)
    seeds = list(range(8))
    policy = make_policy("ekucb", env)
    assert why_not_batch(policy, env) is None
    batched = simulate_batch(policy, env, horizon, seeds)
    sizes = set()
    for run in batched:
        seq = simulate(make_policy("ekucb", env), env, horizon, run.seed)
        assert run.actions == seq.actions
        assert run.regret == pytest.approx(seq.regret, abs=1e-10, rel=0)
        for key in ("dict_size", "refused", "n"):
            assert run.diagnostics[key] == seq.diagnostics[key], key
        for key in ("kors_prob_sum", "kors_prob_var_sum"):
            assert run.diagnostics[key] == pytest.approx(seq.diagnostics[key], abs=1e-10, rel=1e-12)
        sizes.add(run.diagnostics["dict_size"][-1])
    assert len(sizes) > 2          # the runs' dictionaries do differ (padding is exercised)


def _lockstep(env, seeds, horizon, batch, seqs, atol=1e-10):  # type: ignore[no-untyped-def]
    """Batched and sequential policies side by side (:func:`tests.batch_checks.lockstep`): the
    same choice every round, UCB values within ``atol``; every 40 rounds both posteriors against
    the extended-precision reference (the batched error at most ten times the sequential one,
    + 1e-8: both are rounding); at the end the same dictionaries, sizes and KORS
    probabilities."""

    def near_reference(t: int, cand: torch.Tensor) -> None:
        if t % 40 != 39:
            return
        mean_b, var_b = batch.batch_model.score(cand)
        for r, pol in enumerate(seqs):
            mdl = pol.model
            ref = nystrom_posterior_reference(pol.kernel, mdl.dictionary, mdl.x, mdl.target_sums,
                                              cand[r], pol.lam, extended=True)
            err_s = max(float((a - b).abs().max()) for a, b in zip(mdl.score(cand[r]), ref))
            err_b = max(float((a[r] - b).abs().max()) for a, b in zip((mean_b, var_b), ref))
            assert err_b <= 10.0 * err_s + 1e-8, (t, r, err_b, err_s)

    lockstep(env, seeds, horizon, batch, seqs, atol=atol, check_round=near_reference)
    sizes = batch.diagnostics()["dict_size"]
    assert sizes.tolist() == [pol.diagnostics()["dict_size"] for pol in seqs]
    for r, pol in enumerate(seqs):
        torch.testing.assert_close(batch.run_dictionary(r), pol.model.dictionary, atol=0, rtol=0)
        torch.testing.assert_close(batch.run_kors_probabilities(r), pol.kors.probabilities,
                                   atol=1e-12, rtol=0)


@pytest.mark.parametrize(("env_name", "atol"), [("bump", 1e-10), ("chessboard", 1e-6)])
def test_ucb_values_equal_the_sequential_ones_every_round(env_name: str, atol: float) -> None:
    """Bump: UCB values to 1e-10 for 200 rounds. Chessboard (γ = λ = 10, dictionaries of 50-70
    anchors with cond(K_ZZ) up to ~1e12): the batched products sum in another order and both
    posteriors are ~1e-6 from the extended-precision reference, so the UCBs agree to 1e-6 (1e-8
    measured); the batched model stays as close to the reference as the sequential one."""
    env = make_env(env_name)
    seeds = [3, 0, 11, 5]
    batch = make_policy("ekucb", env)
    batch.reset(seed=seeds)
    _lockstep(env, seeds, 200, batch, [seeded(make_policy("ekucb", env), s) for s in seeds],
              atol=atol)


def test_batched_nystrom_equals_sequential_models_incremental_and_rebuilt() -> None:
    """Dictionaries of sizes 0, 3, 7 in one batch: the padded model scores as three sequential
    models (incremental appends and growth, then a from-scratch rebuild with counts)."""
    torch.manual_seed(0)
    kernel = make_kernel("rbf", 0.3)
    lam, r, n, d = 0.5, 3, 12, 2
    x = torch.rand(n, r, d, dtype=F64)
    y = torch.randn(n, r, dtype=F64)
    grow = {0: set(), 1: {0, 4, 9}, 2: {0, 1, 2, 5, 6, 8, 11}}
    batch = BatchedNystrom(kernel, lam, r)
    seqs = [NystromKernelRidge(kernel, lam) for _ in range(r)]
    for i in range(n):
        f, omega = batch.append(x[i], y[i])
        for j, seq in enumerate(seqs):
            col = seq.kernel_column(x[i, j])
            seq.append_column(x[i, j], float(y[i, j]), col)
            if i in grow[j]:
                assert seq.add_last_to_dictionary(col)
        want = torch.tensor([i in grow[j] for j in range(r)])
        if i % 2:   # compacted: only the growing runs are passed
            runs = want.nonzero()[:, 0]
            if runs.numel():
                ones = torch.ones_like(runs, dtype=torch.bool)
                assert bool(batch.add_last(f[runs], omega[runs], ones, runs).all())
        else:       # sync-free: every run, masked writes (the widths become upper bounds)
            assert torch.equal(batch.add_last(f, omega, want), want)
    assert batch.sizes.tolist() == [0, 3, 7]
    cand = torch.rand(r, 9, d, dtype=F64)
    mean, var = batch.score(cand)
    for j, seq in enumerate(seqs):
        m_s, v_s = seq.score(cand[j])
        torch.testing.assert_close(mean[j], m_s, atol=1e-12, rtol=0)
        torch.testing.assert_close(var[j], v_s, atol=1e-12, rtol=0)
        torch.testing.assert_close(batch.log_det()[j], seq.log_det(), atol=1e-10, rtol=0)
    # from scratch (BKB's step): padded dictionaries, counts 0..2
    counts = torch.randint(0, 3, (r, n)).to(F64)
    sums = torch.randn(r, n, dtype=F64)
    xs = x.transpose(0, 1).contiguous()
    dicts = torch.zeros(r, 5, d, dtype=F64)
    sizes = torch.tensor([2, 5, 0])
    for j in range(r):
        dicts[j, : int(sizes[j])] = xs[j, : int(sizes[j])]
    batch.rebuild(dicts, sizes, xs, sums, counts)
    mean, var = batch.score(cand)
    for j, seq in enumerate(seqs):
        seq.rebuild(dicts[j, : int(sizes[j])], xs[j], sums[j], counts[j])
        m_s, v_s = seq.score(cand[j])
        torch.testing.assert_close(mean[j], m_s, atol=1e-12, rtol=0)
        torch.testing.assert_close(var[j], v_s, atol=1e-12, rtol=0)
        torch.testing.assert_close(batch.log_det()[j], seq.log_det(), atol=1e-10, rtol=0)


def test_run_coins_are_the_sequential_draws() -> None:
    """Coins drawn ahead in blocks of 5 and handed out by device counters are each run's
    sequential draws, also across refills and a rewind mid-way (``sync``)."""
    gens = [torch.Generator().manual_seed(s) for s in (0, 1, 2)]
    coins = RunCoins(gens, block=5)
    seq = [torch.Generator().manual_seed(s) for s in (0, 1, 2)]
    plan = [[1, 0, 1], [1, 1, 1], [0, 0, 1]] * 7
    for t, need in enumerate(plan):
        got = coins.draw(torch.tensor(need, dtype=torch.bool))
        for r, flag in enumerate(need):
            if flag:
                assert float(got[r]) == float(torch.rand((), generator=seq[r], dtype=F64))
        if t in (8, 14):    # a rewind to exactly the coins handed out, then on
            for g, s in zip(coins.sync(), seq, strict=True):
                assert torch.equal(g.get_state(), s.get_state())
    for g, s in zip(coins.sync(), seq, strict=True):
        assert torch.equal(g.get_state(), s.get_state())


def test_bad_input_raises_naming_the_argument_and_changes_nothing() -> None:
    env = make_env("chessboard")
    seeds = [0, 1, 2, 3]
    policy = make_policy("ekucb", env)
    policy.reset(seed=seeds)
    _lockstep(env, seeds, 30, policy, [seeded(make_policy("ekucb", env), s) for s in seeds])
    dicts = [policy.run_dictionary(r).clone() for r in range(4)]
    refuses_bad_input(policy, torch.rand(4, 10, 2, dtype=F64))
    assert policy.t == 30
    for r in range(4):
        assert torch.equal(policy.run_dictionary(r), dicts[r])


def test_state_dict_round_trip_mid_batch() -> None:
    env = make_env("chessboard")
    seeds = [4, 7, 1]
    policy = started(make_policy("ekucb", env), seeds)
    benv = BatchedEnv(env, seeds)
    play(policy, benv, 40)
    fresh = reloaded(policy, make_policy("ekucb", env))   # sequential mode until it loads
    assert fresh.n_runs == 3 and fresh.t == 40
    play(policy, benv, 60, twin=fresh, atol=0.0)
    assert torch.equal(fresh.diagnostics()["dict_size"], policy.diagnostics()["dict_size"])
    fresh.load_state_dict(make_policy("ekucb", env).state_dict())   # back to one run
    assert fresh.n_runs is None and fresh.batch_model is None
    fresh.reset(seed=3)
    assert isinstance(fresh.select(benv.candidates()[0]), int)


def test_refusals() -> None:
    env = make_env("chessboard")
    kernel = make_kernel("rbf", 0.2)
    assert "plain" in EKUCB(kernel, parametrisation="plain").why_not_batched()
    theory = EKUCBTheoryBeta(1.0, 10.0)
    assert "EKUCBTheoryBeta" in make_policy("ekucb", env, beta=theory).why_not_batched()
    with pytest.raises(ValueError, match="seed"):
        EKUCB(kernel, parametrisation="plain").reset(seed=[0, 1])
    assert EKUCB(kernel).why_not_batched() is None


def test_cli_batch_on_equals_batch_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", "--env", "chessboard", "--policy", "ekucb", "--seeds", "0", "1", "2",
            "--horizon", "25", "--no-progress"]
    on, _ = cli_runs_on_off(args, tmp_path)
    assert len(on) == 3
    capsys.readouterr()


@pytest.mark.parametrize("compiled", [False, True])
def test_runs_sorted_by_dictionary_size_still_equal_the_sequential_runs(compiled: bool) -> None:
    """R = 32, two chunks of 16: on the torch path the batch re-sorts its storage by dictionary
    size (round 64, 128); with the compiled per-run score (widths ≥ 48 by round 128) it is put
    back in run order at round 128 (no order speeds up per-run products). Inputs and outputs stay
    in run order, a reloaded state keeps the order."""
    from torchbandits import native

    env = make_env("chessboard")
    seeds = list(range(32))
    policy = make_policy("ekucb", env)
    with contextlib.nullcontext() if compiled else native.disabled():
        batch = simulate_batch(policy, env, 130, seeds)
        if compiled and native.library("ekucb_batch") is not None:
            assert policy.batch_model.compiled_scores() and policy._perm is None
        else:
            assert policy._perm is not None and not torch.equal(policy._perm, torch.arange(32))
    for run in batch:
        seq = simulate(make_policy("ekucb", env), env, 130, run.seed)
        assert run.actions == seq.actions
        assert run.diagnostics["dict_size"] == seq.diagnostics["dict_size"]
    for r in (0, 7, 31):
        assert policy.run_dictionary(r).shape[0] == batch[r].diagnostics["dict_size"][-1]
    fresh = make_policy("ekucb", env)
    fresh.load_state_dict(copy.deepcopy(policy.state_dict()))
    cand = BatchedEnv(env, seeds).candidates()
    with contextlib.nullcontext() if compiled else native.disabled():
        assert torch.equal(fresh(cand), policy(cand))
    assert torch.equal(fresh.diagnostics()["dict_size"], policy.diagnostics()["dict_size"])


@pytest.mark.parametrize("chunk_runs", [None, 20])
def test_sync_free_rounds_read_the_host_only_at_the_size_checks(chunk_runs: int | None) -> None:
    """``cpu_compact_above = None``: every round grows the dictionaries by masked writes, also on
    the CPU. R = 20 (two chunks of 16 and 4, or — ``chunk_runs = 20``, what a GPU runs — one
    padded program, unsorted), 140 rounds, every ``select`` and every ``update`` under the
    host-read guard of ``tests/experiments/test_batch_sync_free.py`` except the updates of the
    size checks (rounds 63 and 127: the documented read of the widths and the re-sort); run
    ``r`` equals the sequential run (actions, dictionary sizes, refusals)."""
    from tests.experiments.test_batch_sync_free import no_host_reads
    from torchbandits.batching import deferred_checks
    from torchbandits.policies.ekucb_batched import CHECK_EVERY

    env = make_env("chessboard")
    seeds = list(range(20))
    horizon = 2 * CHECK_EVERY + 12
    policy = make_policy("ekucb", env)
    policy.cpu_compact_above = None
    policy.reset(seed=seeds)
    policy.batch_model.set_chunk_runs(chunk_runs)
    assert len(policy.batch_model.chunks()) == (1 if chunk_runs else 2)
    benv = BatchedEnv(env, seeds)
    actions, sizes = [], []
    with deferred_checks() as checks:
        checks.inputs_checked = True
        for t in range(horizon):
            checks.round = t
            cand = benv.candidates()
            with no_host_reads():
                idx = policy.select(cand)
            reward, _ = benv.pull(idx)
            x = cand.gather(1, idx[:, None, None].expand(-1, 1, cand.shape[2]))[:, 0]
            if t % CHECK_EVERY == CHECK_EVERY - 1:
                policy.update(x, reward)
            else:
                with no_host_reads():
                    policy.update(x, reward)
            actions.append(idx)
            sizes.append(policy.diagnostics()["dict_size"])
        checks.raise_if_failed(seeds)
    assert policy.batch_model.max_size >= int(policy.batch_model.sizes.max())
    if chunk_runs:
        assert policy._perm is None      # one program: never re-sorted
    acts, dict_sizes = torch.stack(actions, 1).tolist(), torch.stack(sizes, 1).tolist()
    for r, s in enumerate(seeds):
        seq = simulate(make_policy("ekucb", env), env, horizon, s)
        assert acts[r] == seq.actions
        assert dict_sizes[r] == seq.diagnostics["dict_size"]
        assert policy.diagnostics()["refused"][r] == seq.diagnostics["refused"][-1]


def test_one_padded_program_launches_fewer_operators_than_chunks() -> None:
    """The chunk policy: 16 runs a chunk on the CPU, the whole batch as one program when
    ``chunk_runs`` says so (the default off the CPU). R = 64 sync-free rounds past a few
    anchors: one program launches under half the operators of four chunks (counted as the
    backend sees them, views left out), at most 200 a round; the same actions either way."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from torchbandits.batching import deferred_checks

    class Count(TorchDispatchMode):
        skip = frozenset({"view", "_unsafe_view", "as_strided", "slice", "select", "expand", "transpose",
                "t", "unsqueeze", "squeeze", "alias", "empty", "empty_like", "empty_strided",
                "detach", "lift_fresh", "_reshape_alias", "reshape", "unbind", "diagonal",
                "scalar_tensor", "_local_scalar_dense"})
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.n += func.overloadpacket.__name__ not in self.skip
            return func(*args, **(kwargs or {}))

    env = make_env("chessboard")
    seeds = list(range(64))
    counts, acts = [], []
    for chunk_runs in (None, 64):
        policy = make_policy("ekucb", env)
        policy.cpu_compact_above = None
        policy.reset(seed=seeds)
        assert policy.batch_model.CHUNK == 16
        policy.batch_model.set_chunk_runs(chunk_runs)
        benv = BatchedEnv(env, seeds)
        count, played = Count(), []
        with deferred_checks() as checks:
            checks.inputs_checked = True
            for t in range(40):
                cand = benv.candidates()
                with count if t >= 30 else contextlib.nullcontext():
                    idx = policy.select(cand)
                    x = cand.gather(1, idx[:, None, None].expand(-1, 1, cand.shape[2]))[:, 0]
                    reward, _ = benv.pull(idx)
                    policy.update(x, reward)
                played.append(idx)
        counts.append(count.n / 10)
        acts.append(torch.stack(played))
    assert torch.equal(acts[0], acts[1])
    assert counts[1] <= 200 and counts[1] < 0.5 * counts[0], counts
