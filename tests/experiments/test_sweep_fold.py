"""Grid folding: trials of a sweep that differ only in λ or β run as one batch with per-run
settings, and every trial's runs equal its unfolded runs (no Ray needed: ``run_group`` is what a
Tune trial calls)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchbandits.experiments.sweep_fold import fold_trials, run_group
from torchbandits.experiments.sweep_report import DETERMINISTIC
from torchbandits.experiments.sweep_spec import parse_spec
from torchbandits.experiments.sweep_trials import expand_trials
from torchbandits.experiments.sweeps import run_trial

SPEC = {
    "name": "fold", "horizon": 30, "seeds": [0, 4, 7],
    "environments": [{"name": "rkhs", "kwargs": {"dim": 2, "n_arms": 15}},
                     {"name": "chessboard"}],
    "policies": [{"name": "kucb", "label": "K-UCB", "grid": {"lam": [0.1, 1.0, 10.0],
                                                             "beta": [0.3, 2.0]}},
                 {"name": "gpucb", "label": "GP-UCB", "grid": {"beta": [0.3, 3.0]}},
                 {"name": "kucb-theory", "label": "K-UCB-th", "grid": {"lam": [0.5, 2.0]}},
                 {"name": "gpucb-srinivas", "label": "Srinivas", "grid": {"lam": [0.5, 2.0]}},
                 {"name": "gpucb-fit", "label": "Fit", "grid": {"beta": [1.0, 2.0]}}],
}


def _runs(out: Path, trial_id: str) -> list[dict]:
    return [json.loads(p.read_text())
            for p in sorted((out / "trials" / trial_id / "runs").glob("*.json"))]


def test_fold_groups_only_lam_beta_grids_of_one_entry() -> None:
    trials = expand_trials(parse_spec(SPEC))
    groups = fold_trials(trials)
    sizes = [(g[0].env_label, g[0].policy_label, len(g)) for g in groups]
    assert sizes == [("rkhs", "K-UCB", 6), ("rkhs", "GP-UCB", 2), ("rkhs", "K-UCB-th", 2),
                     ("rkhs", "Srinivas", 2), ("rkhs", "Fit", 2), ("chessboard", "K-UCB", 6),
                     ("chessboard", "GP-UCB", 2), ("chessboard", "K-UCB-th", 2),
                     ("chessboard", "Srinivas", 2), ("chessboard", "Fit", 2)]
    assert [t for g in groups for t in g] == sorted(trials, key=trials.index)
    off = expand_trials(parse_spec({**SPEC, "batch": False}))
    assert all(len(g) == 1 for g in fold_trials(off))


@pytest.mark.parametrize("label", ["K-UCB", "GP-UCB", "K-UCB-th", "Srinivas", "Fit"])
def test_folded_trials_equal_unfolded(tmp_path: Path, label: str) -> None:
    spec = parse_spec({**SPEC, "environments": SPEC["environments"][:1]})
    group = next(g for g in fold_trials(expand_trials(spec)) if g[0].policy_label == label)
    folded, plain = tmp_path / "folded", tmp_path / "plain"
    records = run_group([t.to_dict() for t in group], folded)
    assert [r["trial"]["trial_id"] for r in records] == [t.trial_id for t in group]
    for t, rec in zip(group, records, strict=True):
        ref = run_trial(t, plain)
        if label == "Fit":   # marginal-likelihood refits do not batch: trial by trial
            assert "folded" not in rec
        else:
            assert rec["folded"] == [g.trial_id for g in group]
        det = {k: rec["metrics"][k] for k in DETERMINISTIC}
        assert det == pytest.approx({k: ref["metrics"][k] for k in DETERMINISTIC}, rel=1e-9)
        mine, theirs = _runs(folded, t.trial_id), _runs(plain, t.trial_id)
        assert [r["seed"] for r in mine] == [r["seed"] for r in theirs] == [0, 4, 7]
        for a, b in zip(mine, theirs, strict=True):
            assert a["actions"] == b["actions"]
            assert a["policy"] == b["policy"] and a["env"] == b["env"]
            assert a["rewards"] == pytest.approx(b["rewards"], abs=1e-12, rel=0)
            assert a["regret"] == pytest.approx(b["regret"], abs=1e-12, rel=0)
            drop = ("wall_seconds", "policy_repr")   # the repr names the batch's size
            head = [r["config"]["policy_repr"].split("(model)")[0] for r in (a, b)]
            assert head[0] == head[1]   # same λ, same rule and β
            assert {k: v for k, v in a["config"].items() if k not in drop} == \
                   {k: v for k, v in b["config"].items() if k not in drop}
    # finished trials are not rerun: a second call returns the markers as they are
    again = run_group(group, folded)
    assert [r["finished"] for r in again] == [r["finished"] for r in records]


def test_a_partly_finished_group_folds_only_its_pending_trials(tmp_path: Path) -> None:
    spec = parse_spec({**SPEC, "environments": SPEC["environments"][:1]})
    group = fold_trials(expand_trials(spec))[0]
    first = run_trial(group[0], tmp_path)
    records = run_group(group, tmp_path)
    assert records[0]["finished"] == first["finished"]
    assert records[1]["folded"] == [t.trial_id for t in group[1:]]
