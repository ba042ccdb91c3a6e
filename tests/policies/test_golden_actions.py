"""Seeded runs of every registered policy make the same choices as the recorded golden run.

The golden file ``tests/data/golden_actions.json`` was recorded before the package was
reorganised (one home for each thing) and guards that reorganisations change no decision: every
policy of the registry plays 100 rounds on a fixed-arm environment (a rotating RKHS function,
24 arms, d = 2) and, where it accepts fresh candidates, 100 rounds of the Chessboard contextual
problem. Each case runs twice: as installed (the compiled steps of :mod:`torchbandits.native` where
a C compiler is present) and with the compiled steps off (the torch paths, which are what runs on
other devices and without a compiler). Re-record (only for an intended change of behaviour,
stated in the commit) with ``python tests/policies/test_golden_actions.py --record``.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest

from torchbandits import native
from torchbandits.experiments.registry import POLICIES, make_env, make_policy

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden_actions.json"
ROUNDS = 100
FAST = {
    "opkb": {"horizon": ROUNDS},
    "ada-opkb": {"horizon": ROUNDS},
    "opnn": {"horizon": ROUNDS, "width": 16, "train_steps": 2},
    "opnn0": {"horizon": ROUNDS, "width": 16, "train_steps": 2},
    "ada-opnn": {"horizon": ROUNDS, "width": 16, "train_steps": 2},
    "master-gpucb": {"horizon": ROUNDS},
    "supkernelucb": {"horizon": ROUNDS},
    "gpucb-fit": {"refit_every": 10},
}
ENVS = {
    "fixed": ("tv-rotation", {"dim": 2, "horizon": ROUNDS, "n_arms": 24, "lengthscale": 0.3}),
    "contextual": ("chessboard", {}),
}


def play(policy_name: str, env_key: str) -> list[int] | None:
    """The 100 seeded choices of one policy on one environment (None: it refuses the problem)."""
    env_name, env_kwargs = ENVS[env_key]
    env = make_env(env_name, **env_kwargs)
    env.reset(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            policy = make_policy(policy_name, env, **FAST.get(policy_name, {}))
        except (ValueError, TypeError):
            return None
        policy.reset(seed=0)
        actions = []
        for _ in range(ROUNDS):
            cand = env.candidates()
            try:
                i = policy.select(cand)
            except ValueError as err:
                if env_key == "contextual" and "arm" in str(err):
                    return None  # a fixed-arm policy refuses fresh candidates
                raise
            actions.append(int(i))
            policy.update(cand[i], env.pull(i))
    return actions


def _golden() -> dict:
    return json.loads(GOLDEN.read_text())


CASES = [(p, e) for p in sorted(POLICIES) for e in ENVS]


@pytest.mark.parametrize("compiled", [True, False], ids=["as-installed", "torch-path"])
@pytest.mark.parametrize(("policy_name", "env_key"), CASES)
def test_actions_equal_the_golden_run(policy_name, env_key, compiled):
    golden = _golden()
    key = f"{policy_name}/{env_key}"
    if key not in golden:
        pytest.skip(f"{key}: registered after the golden run was recorded")
    if compiled:
        assert play(policy_name, env_key) == golden[key]
    else:
        with native.disabled():
            assert play(policy_name, env_key) == golden[key]


def test_golden_file_covers_the_registry_at_recording():
    golden = _golden()
    recorded = {k.split("/")[0] for k in golden}
    assert len(recorded) >= 35
    assert sum(v is not None for v in golden.values()) >= 50


if __name__ == "__main__":
    if "--record" not in sys.argv:
        sys.exit("usage: python tests/policies/test_golden_actions.py --record")
    out = {f"{p}/{e}": play(p, e) for p, e in CASES}
    GOLDEN.write_text(json.dumps(out, indent=0) + "\n")
    print(f"recorded {sum(v is not None for v in out.values())} runs to {GOLDEN}")
