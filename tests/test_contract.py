"""The policy contract, for every policy of the registry (``experiments.registry.POLICIES``; a new
policy is covered by adding it there, with fast keyword arguments in ``FAST`` if it needs them).

Per policy, after 25 played rounds on a small fixed-arm environment:

* the issue's bad inputs (5 rewards, 6 candidate sets, 3 played points) raise a ``ValueError`` naming
  the argument; the state (every ``state_dict`` tensor and the extra state) is bit-for-bit
  unchanged and the next 25 choices equal those of an untouched copy;
* a ``state_dict`` loaded into a fresh instance, ``copy.deepcopy``, ``pickle``, ``torch.save`` of
  the module and of the ``state_dict`` (loaded with the default ``weights_only=True``) all continue
  with the same 25 choices;
* ``.to(torch.float32)`` continues: 25 valid choices with finite float32 scores.
"""

from __future__ import annotations

import copy
import io
import pickle
import warnings
from typing import Any

import pytest
import torch

from torchbandits.experiments.registry import POLICIES, make_env, make_policy

HORIZON = 200
WARM = 25
NEXT = 25
# keyword arguments that keep the suite fast (and give the horizon-aware policies this T)
FAST: dict[str, dict[str, Any]] = {
    "opkb": {"horizon": HORIZON},
    "ada-opkb": {"horizon": HORIZON},
    "opnn": {"horizon": HORIZON, "width": 16, "train_steps": 2},
    "opnn0": {"horizon": HORIZON, "width": 16, "train_steps": 2},
    "ada-opnn": {"horizon": HORIZON, "width": 16, "train_steps": 2},
    "master-gpucb": {"horizon": HORIZON},
    "supkernelucb": {"horizon": HORIZON},
}
NAMES = sorted(POLICIES)


def _env():
    env = make_env("tv-rotation", dim=2, horizon=HORIZON, n_arms=24, lengthscale=0.3)
    env.reset(0)
    return env


def _new(name: str, env=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_policy(name, env if env is not None else _env(), **FAST.get(name, {}))


def _play(policy, env, steps: int) -> list[int]:
    out = []
    for _ in range(steps):
        cand = env.candidates()
        i = policy.select(cand)
        out.append(i)
        policy.update(cand[i], env.pull(i))
    return out


_PLAYED: dict[str, bytes] = {}


def _played(name: str):
    """``(policy, env)`` after ``WARM`` rounds (built once per policy, handed out as copies)."""
    if name not in _PLAYED:
        env = _env()
        pol = _new(name, env)
        _play(pol, env, WARM)
        _PLAYED[name] = pickle.dumps((pol, env))
    return pickle.loads(_PLAYED[name])


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _same(a: Any, b: Any) -> bool:
    """Bit-for-bit equality of nested state (tensors: dtype, shape and every bit)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and _bits(a) == _bits(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True  # both NaN
    return a == b


def _snapshot(policy) -> dict[str, Any]:
    return {k: (v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v))
            for k, v in policy.state_dict().items()}


def _bad_inputs(cand: torch.Tensor):
    """The 13 bad inputs: (method, argument name, call arguments)."""
    x = cand[0]
    nan_c = cand.clone()
    nan_c[1, 0] = float("nan")
    nan_x = x.clone()
    nan_x[0] = float("nan")
    return [
        ("update", "reward", (x, float("nan"))),
        ("update", "reward", (x, float("inf"))),
        ("update", "reward", (x, torch.zeros(2))),
        ("update", "reward", (x, "a")),
        ("update", "reward", (x, None)),
        ("select", "candidates", (cand[None],)),
        ("select", "candidates", (cand[0],)),
        ("select", "candidates", (cand[:0],)),
        ("select", "candidates", (cand[:, :1],)),
        ("select", "candidates", (nan_c,)),
        ("select", "candidates", (cand.to(torch.complex128),)),
        ("update", "x", (x[:1], 0.1)),
        ("update", "x", (nan_x, 0.1)),
        ("update", "x", (cand[:2], 0.1)),
    ]


def test_the_bad_input_list_covers_the_issue():
    bad = _bad_inputs(torch.rand(4, 2, dtype=torch.float64))
    counts = {arg: sum(a == arg for _, a, _ in bad) for arg in ("reward", "candidates", "x")}
    assert counts == {"reward": 5, "candidates": 6, "x": 3}


@pytest.mark.parametrize("name", NAMES)
def test_bad_input_raises_and_changes_nothing(name):
    pol, env = _played(name)
    twin_pol, twin_env = copy.deepcopy(pol), copy.deepcopy(env)
    before = _snapshot(pol)
    cand = env.candidates()
    for method, arg, args in _bad_inputs(cand):
        with warnings.catch_warnings():
            warnings.simplefilter("error")   # no silent cast (complex → real) either
            with pytest.raises(ValueError, match=arg):
                getattr(pol, method)(*args)
    after = _snapshot(pol)
    assert after.keys() == before.keys()
    changed = [k for k in before if not _same(before[k], after[k])]
    assert not changed, f"state changed by rejected input: {changed}"
    assert _play(pol, env, NEXT) == _play(twin_pol, twin_env, NEXT)


def _reloads(name: str, pol):
    """Every way to carry a policy over: (label, new policy)."""
    fresh = _new(name)
    fresh.load_state_dict(pol.state_dict())
    yield "state_dict", fresh
    yield "deepcopy", copy.deepcopy(pol)
    yield "pickle", pickle.loads(pickle.dumps(pol))
    buf = io.BytesIO()
    torch.save(pol, buf)
    buf.seek(0)
    yield "torch.save(module)", torch.load(buf, weights_only=False)
    buf = io.BytesIO()
    torch.save(pol.state_dict(), buf)
    buf.seek(0)
    again = _new(name)
    again.load_state_dict(torch.load(buf))           # default weights_only (True)
    yield "torch.save(state_dict)", again


@pytest.mark.parametrize("name", NAMES)
def test_reload_continues_with_the_same_choices(name):
    pol, env = _played(name)
    reference = _play(copy.deepcopy(pol), copy.deepcopy(env), NEXT)
    for label, other in _reloads(name, pol):
        assert other.t == pol.t, label
        assert _play(other, copy.deepcopy(env), NEXT) == reference, label


@pytest.mark.parametrize("name", NAMES)
def test_float32_continues(name):
    pol, env = _played(name)
    pol = pol.to(torch.float32)
    assert pol.dtype == torch.float32
    for _ in range(NEXT):
        cand = env.candidates()
        with torch.no_grad():
            scores = pol(cand)
        assert scores.shape == (cand.shape[0],)
        assert bool(torch.isfinite(scores).all())
        i = pol.select(cand)
        assert 0 <= i < cand.shape[0]
        pol.update(cand[i], env.pull(i))
