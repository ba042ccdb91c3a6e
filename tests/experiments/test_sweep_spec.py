"""Sweep SPECs: validation before anything runs, expansion into trials, the install hint."""

from __future__ import annotations

import json
import sys

import pytest

from torchbandits.experiments.sweep_spec import SpecError, load_spec, parse_spec
from torchbandits.experiments.sweep_trials import expand_trials

GOOD = {
    "name": "t", "horizon": 20, "seeds": [0, 1],
    "environments": [{"name": "rkhs", "kwargs": {"dim": 2, "n_arms": 10}}],
    "policies": [{"name": "kucb", "label": "K-UCB", "grid": {"lam": [0.1, 1.0]}},
                 {"name": "gpucb", "grid": {"beta": [0.3, 3.0]}}],
}


def _with(path: str, value):
    spec = json.loads(json.dumps(GOOD))
    node = spec
    keys = path.split("/")
    for k in keys[:-1]:
        node = node[int(k)] if k.isdigit() else node[k]
    node[keys[-1]] = value
    return spec


@pytest.mark.parametrize("path, value, expected", [
    ("policies/0/name", "kucbb", "policies[0]: unknown policy 'kucbb'"),
    ("environments/0/name", "rkhss", "environments[0]: unknown environment 'rkhss'"),
    ("environments/0/kwargs", {"dimm": 2}, "environments[0] ('rkhs'): unknown parameter 'dimm'"),
    ("policies/0/grid", {"lam": []}, "policies[0] ('kucb').grid.lam: empty grid"),
    ("policies/0/grid", {"lam": ["big", 1.0]}, "policies[0] ('kucb').grid.lam: 'big' has the wrong type"),
    ("policies/1/grid", {"betta": [1.0]}, "policies[1] ('gpucb') with {'betta': 1.0}: building it failed"),
    ("policies/0/grid", {"lam": {"loguniform": [0, 1]}}, "policies[0] ('kucb').grid.lam: loguniform"),
    ("seeds", [0, "1"], "seeds: expected a non-empty list of integer seeds"),
    ("horizon", 0, "horizon: expected a positive integer"),
    ("polices", [], "unknown top-level key 'polices'"),
    ("resources", {"run_threads_per_trial": 0}, "run_threads_per_trial: int >= 1"),
    ("resources", {"cpus_per_trial": 2, "threads": 2}, "resources: expected"),
])
def test_malformed_spec_names_the_entry(path, value, expected):
    with pytest.raises(SpecError) as info:
        parse_spec(_with(path, value))
    assert expected in str(info.value)


def test_all_errors_in_one_message_and_nothing_written(tmp_path):
    from torchbandits.experiments.sweeps import sweep

    bad = _with("policies/0/grid", {"lam": []})
    bad["environments"][0]["kwargs"] = {"dimm": 2}
    with pytest.raises(SpecError) as info:
        sweep(bad, tmp_path / "out")
    assert "empty grid" in str(info.value) and "'dimm'" in str(info.value)
    assert not (tmp_path / "out").exists()  # rejected before any trial (or folder) exists


def test_expand_grid_and_sampled_spaces_are_reproducible():
    spec = parse_spec({**GOOD, "search": {"num_samples": 3, "seed": 7},
                       "policies": [{"name": "kucb", "grid": {"lam": [0.1, 1.0],
                                                               "beta": {"loguniform": [0.01, 10.0]}}}]})
    a, b = expand_trials(spec), expand_trials(spec)
    assert len(a) == 2 * 3 and [t.to_dict() for t in a] == [t.to_dict() for t in b]
    assert len({t.trial_id for t in a}) == 6
    assert all(0.01 <= t.params["beta"] <= 10.0 for t in a)
    assert [t.params["lam"] for t in a] == [0.1] * 3 + [1.0] * 3


def test_yaml_quick_overrides(tmp_path):
    spec = load_spec("examples/sweeps/opkb_tuning.yaml", quick=True)
    assert spec.horizon == 200 and spec.tuning.tune_seeds == [0] and spec.tuning.eval_seeds == [1]
    assert spec.tuning.tune_on == ["env1"] and spec.tuning.evaluate_on == ["env1", "env2"]
    full = load_spec("examples/sweeps/opkb_tuning.yaml")
    assert full.horizon == 10_000 and full.environments[0]["kwargs"]["switches"] == [3000]
    (tmp_path / "s.json").write_text(json.dumps(GOOD))
    assert load_spec(tmp_path / "s.json").name == "t"


def test_without_ray_sweep_says_how_to_install(monkeypatch, capsys):
    from torchbandits import cli

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(SystemExit) as info:
        cli.main(["sweep", "examples/sweeps/quick.yaml", "--out", "/nonexistent/x"])
    assert "pip install 'torchbandits[sweep]'" in str(info.value.code)
