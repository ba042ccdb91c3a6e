"""Checks shared by the tests of batched policies (``reset(seed=[s_1..s_R])``, ``select(candidates
[R, A, d]) -> [R]``, ``update(x [R, d], reward [R])``): a batch stepped in lockstep with ``R``
sequential runs, a batch stepped alone or beside a twin reloaded from its ``state_dict``,
malformed input refused without a change of state, and the CLI's ``--batch on`` against
``--batch off``."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from torchbandits.cli import main
from torchbandits.envs.batched import BatchedEnv

Scores = Callable[[Any, torch.Tensor], Any]


def equal_leaves(a: object, b: object) -> bool:
    """Exact equality of state leaves (tensors of equal shape and values, dicts, sequences,
    numbers), recursively."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal_leaves(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return (isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(equal_leaves(x, y) for x, y in zip(a, b, strict=True)))
    return a == b


def forward(policy: Any, cand: torch.Tensor) -> torch.Tensor:
    """The policy's UCB values: ``[R, A]`` for a batch, ``[A]`` for one run."""
    return policy(cand)


def started(policy: Any, seeds: list[int]) -> Any:
    """``policy`` after ``reset(seed=seeds)``: a batch of ``len(seeds)`` runs."""
    policy.reset(seed=seeds)
    return policy


def seeded(policy: Any, seed: int) -> Any:
    """``policy`` after ``reset(seed=seed)``: one sequential run."""
    policy.reset(seed=seed)
    return policy


def seeded_runs(make: Callable[[int], Any], seeds: list[int]) -> list[Any]:
    """One sequential policy per seed: ``make(r)`` after ``reset(seed=seeds[r])``."""
    return [seeded(make(r), s) for r, s in enumerate(seeds)]


def lockstep(env: Any, seeds: list[int], horizon: int, batch: Any, seqs: Sequence[Any], *,
             atol: float, score: Scores = forward,
             check_round: Callable[[int, torch.Tensor], None] | None = None,
             check_update: Callable[[int, Any], None] | None = None) -> torch.Tensor:
    """Step the batched policy ``batch`` (started with ``seeds``) and one sequential policy per
    seed on the rounds of ``BatchedEnv(env, seeds)``, both fed the batch's pulls.

    Every round from the batch's warm-up on, each tensor of ``score(batch, cand [R, A, d])``
    has shape ``[R, A]`` and its row ``r`` equals ``score(seqs[r], cand[r])`` within ``atol``
    (``score`` returns a tensor or a tuple of them, e.g. ``(ucb, lcb)``); then
    ``check_round(t, cand)`` when given. Every round the batch's choice is a ``LongTensor [R]``
    and equals the sequential choices; ``check_update(r, seqs[r])`` runs after each run's update.
    Returns the batch's actions ``[T, R]``."""
    benv = BatchedEnv(env, seeds)
    rows = torch.arange(len(seeds))
    actions = []
    for t in range(horizon):
        cand = benv.candidates()
        if batch.t >= batch.n_warmup:
            got = score(batch, cand)
            got = got if isinstance(got, tuple) else (got,)
            for r, pol in enumerate(seqs):
                want = score(pol, cand[r])
                want = want if isinstance(want, tuple) else (want,)
                for g, w in zip(got, want, strict=True):
                    assert g.shape == cand.shape[:2]
                    torch.testing.assert_close(g[r], w, atol=atol, rtol=0)
            if check_round is not None:
                check_round(t, cand)
        idx = batch.select(cand)
        assert idx.dtype == torch.long and idx.shape == (len(seeds),)
        assert [pol.select(cand[r]) for r, pol in enumerate(seqs)] == idx.tolist()
        reward, _ = benv.pull(idx)
        batch.update(cand[rows, idx], reward)
        for r, pol in enumerate(seqs):
            pol.update(cand[r, idx[r]], float(reward[r]))
            if check_update is not None:
                check_update(r, pol)
        actions.append(idx)
    return torch.stack(actions)


def play(policy: Any, benv: BatchedEnv, rounds: int, twin: Any = None, *, atol: float = 0.0,
         first_atol: float | None = None, score: Scores = forward) -> list[list[int]]:
    """Play ``rounds`` rounds of the batched ``policy`` on ``benv``. A ``twin`` (e.g. reloaded
    from the policy's ``state_dict``) plays beside it on the policy's pulls: every round
    ``score(twin, cand)`` equals ``score(policy, cand)`` (``[R, A]``) within ``atol`` (the first
    round within ``first_atol`` when given) and the twin makes the same choice ``[R]``.
    Returns the actions, a list of ``rounds`` lists of ``R``."""
    rows = torch.arange(benv.n_runs)
    out = []
    for t in range(rounds):
        cand = benv.candidates()
        if twin is not None:
            tol = first_atol if t == 0 and first_atol is not None else atol
            torch.testing.assert_close(score(twin, cand), score(policy, cand), atol=tol, rtol=0)
        idx = policy.select(cand)
        if twin is not None:
            assert torch.equal(twin.select(cand), idx)
        reward, _ = benv.pull(idx)
        policy.update(cand[rows, idx], reward)
        if twin is not None:
            twin.update(cand[rows, idx], reward)
        out.append(idx.tolist())
    return out


def reloaded(policy: Any, fresh: Any) -> Any:
    """``fresh`` (a new policy, sequential until it loads) after loading a copy of the batched
    ``policy``'s ``state_dict``: a batch of as many runs, at the same round."""
    fresh.load_state_dict(copy.deepcopy(policy.state_dict()))
    assert fresh.n_runs == policy.n_runs and fresh.t == policy.t
    return fresh


def refuses_bad_input(policy: Any, cand: torch.Tensor) -> None:
    """Every malformed call on the batched ``policy`` (``R = cand.shape[0] ≥ 2`` runs,
    ``cand [R, A, d]`` well formed) raises ``ValueError`` naming its argument — ``candidates``
    with R - 1 rows, one run's ``[A, d]`` or another ``d`` (to ``select`` and to the forward);
    ``x`` with R - 1 rows, another ``d`` or an infinite entry; ``reward`` with R - 1 entries,
    shape ``[R, 1]`` or a NaN (float64 and float32) — and leaves every tensor of its
    ``state_dict`` unchanged."""
    n_runs, dim = cand.shape[0], cand.shape[-1]

    def other_width(t: torch.Tensor) -> torch.Tensor:
        return t[..., :1] if dim > 1 else torch.cat([t, t], -1)

    x, y = cand[:, 0], torch.zeros(n_runs, dtype=cand.dtype)
    nan = y.clone()
    nan[n_runs // 2] = float("nan")
    bad = [("candidates", lambda: policy.select(cand[:-1])),
           ("candidates", lambda: policy.select(cand[0])),
           ("candidates", lambda: policy.select(other_width(cand))),
           ("candidates", lambda: policy(other_width(cand))),
           ("x", lambda: policy.update(x[:-1], y)),
           ("x", lambda: policy.update(other_width(x), y)),
           ("x", lambda: policy.update(torch.full_like(x, float("inf")), y)),
           ("reward", lambda: policy.update(x, y[:-1])),
           ("reward", lambda: policy.update(x, y[:, None])),
           ("reward", lambda: policy.update(x, nan)),
           ("reward", lambda: policy.update(x, nan.float()))]
    state = copy.deepcopy(policy.state_dict())
    for name, call in bad:
        with pytest.raises(ValueError, match=name):
            call()
    now = policy.state_dict()
    for k, v in state.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, now[k]), k


def cli_runs_on_off(args: list[str], out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the CLI's ``args`` with ``--batch on`` and with ``--batch off`` (into ``out / "on"`` and
    ``out / "off"``; both exit 0). Returns each mode's run records (the JSON files of ``runs/``)
    by file name; both modes wrote the same files, each with the same fields and actions."""
    for mode in ("on", "off"):
        assert main([*args, "--batch", mode, "--out", str(out / mode)]) == 0
    on, off = ({p.name: json.loads(p.read_text()) for p in (out / m / "runs").glob("*.json")}
               for m in ("on", "off"))
    assert sorted(on) == sorted(off)
    for name in on:
        assert sorted(on[name]) == sorted(off[name]), name
        assert on[name]["actions"] == off[name]["actions"], name
    return on, off
