"""A sweep trial runs its seeds as one batch where the policy and environment can be batched
(no Ray needed: ``run_seeds`` is what each Tune trial calls), and the runs equal ``simulate``."""

from __future__ import annotations

from torchbandits.experiments import make_env, make_policy, simulate
from torchbandits.experiments.sweep_trials import TrialSpec
from torchbandits.experiments.sweeps import run_seeds


def _trial(policy: str, batch: bool = True) -> TrialSpec:
    return TrialSpec(trial_id="t0", phase="run", env="rkhs", env_label="rkhs",
                     env_kwargs={"dim": 2, "n_arms": 12}, policy=policy, policy_label=policy,
                     policy_kwargs={}, params={}, seeds=[0, 1, 2], horizon=40, batch=batch)


def _reference(policy: str, seed: int):
    env = make_env("rkhs", dim=2, n_arms=12)
    return simulate(make_policy(policy, env), env, 40, seed)


def test_batchable_trial_runs_as_one_batch_equal_to_simulate():
    saved = []
    runs = run_seeds(_trial("random"), saved.append)
    assert [r.seed for r in runs] == [0, 1, 2] and saved == runs
    assert all(r.config["batched"] is True for r in runs)
    for r in runs:
        ref = _reference("random", r.seed)
        assert r.actions == ref.actions
        assert max(abs(a - b) for a, b in zip(r.rewards, ref.rewards)) < 1e-12


def test_unbatchable_policy_and_batch_off_run_seed_after_seed():
    for trial in (_trial("cbkb"), _trial("random", batch=False)):   # CBKB: sequential
        runs = run_seeds(trial, lambda r: None)
        assert all("batched" not in r.config for r in runs)
        for r in runs:
            assert r.actions == _reference(trial.policy, r.seed).actions
