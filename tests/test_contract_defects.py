"""Regression tests of the defects found by trying every policy as a new user would (issue 11)."""

from __future__ import annotations

import copy
import io
import json
import subprocess
import sys
import warnings

import pytest
import torch

from torchbandits import make_kernel
from torchbandits.cli import main
from torchbandits.experiments.registry import POLICIES, make_env, make_policy


def _env(horizon: int = 200, n_arms: int = 24):
    env = make_env("tv-rotation", dim=2, horizon=horizon, n_arms=n_arms, lengthscale=0.3)
    env.reset(0)
    return env


def _play(policy, env, steps: int) -> list[int]:
    out = []
    for _ in range(steps):
        cand = env.candidates()
        i = policy.select(cand)
        out.append(i)
        policy.update(cand[i], env.pull(i))
    return out


# ----------------------------------------------------------------------------- defect 1
def test_master_gpucb_reloads_mid_block_and_runs_in_float32():
    """MASTER-GP-UCB: the schedule, the base instances and the test statistics are state."""
    env = _env()
    pol = make_policy("master-gpucb", env, horizon=200)
    _play(pol, env, 25)
    assert len(pol.instances) >= 1 and pol.schedule is not None
    buf = io.BytesIO()
    torch.save(pol.state_dict(), buf)
    buf.seek(0)
    fresh = make_policy("master-gpucb", _env(), horizon=200)
    fresh.load_state_dict(torch.load(buf))             # weights_only: plain ints / lists / tensors
    assert sorted(fresh.instances) == sorted(pol.instances)
    assert fresh.schedule.to_state() == pol.schedule.to_state()
    ref = _play(copy.deepcopy(pol), copy.deepcopy(env), 40)
    assert _play(fresh, copy.deepcopy(env), 40) == ref
    low = copy.deepcopy(pol).to(torch.float32)
    assert all(m.v.dtype == torch.float32 for m in low.instances.values())
    assert len(_play(low, copy.deepcopy(env), 25)) == 25


# ----------------------------------------------------------------------------- defect 2
def test_logdet_program_solved_in_float64_for_float32_input():
    from torchbandits.design import optimal_design, solve_logdet_program
    from torchbandits.models.features import kernel_features

    arms = torch.rand(30, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    phi = kernel_features(make_kernel("rbf", 0.3), arms)
    c = torch.linspace(0, 1, 30, dtype=torch.float64)
    lam = 0.1 / 10_000                                   # σ/T: float32 loses S(p)'s small eigenvalues
    ref = solve_logdet_program(phi, c, 2.0, lam)
    low = solve_logdet_program(phi.float(), c.float(), 2.0, lam)
    assert low.p.dtype == torch.float32 and low.certificate.ok(1e-9)
    assert float((low.p.double() - ref.p).abs().max()) < 1e-4
    d32 = optimal_design(phi.float(), lam)
    assert d32.p.dtype == torch.float32 and abs(float(d32.p.sum()) - 1.0) < 1e-5


@pytest.mark.parametrize("name,kw", [("opkb", {}), ("ada-opkb", {}),
                                     ("opnn0", {"width": 16, "train_steps": 2})])
def test_op_policies_run_in_float32(name, kw):
    env = _env()
    built = make_policy(name, env, horizon=200, dtype=torch.float32, **kw)
    assert len(_play(built, env, 30)) == 30
    env = _env()
    pol = make_policy(name, env, horizon=200, **kw)
    _play(pol, env, 20)
    moved = copy.deepcopy(pol).to(torch.float32)
    assert len(_play(moved, copy.deepcopy(env), 20)) == 20


# ----------------------------------------------------------------------------- defect 3
def test_cmm_ucb_float32_chooses_as_float64():
    """CMM-UCB's dual is computed in float64 for a float32 model: same 25 choices."""
    env = _env()
    pol = make_policy("cmm-ucb", env)
    _play(pol, env, 25)
    low = copy.deepcopy(pol).to(torch.float32)
    cand = env.candidates()
    assert low(cand).dtype == torch.float32
    torch.testing.assert_close(low(cand).double(), pol(cand), rtol=1e-5, atol=1e-5)
    ref = _play(copy.deepcopy(pol), copy.deepcopy(env), 25)
    assert _play(low, copy.deepcopy(env), 25) == ref


# ----------------------------------------------------------------------------- defect 4
@pytest.mark.parametrize("name", ["r-gpucb", "sw-gpucb"])
def test_time_varying_default_width_is_not_rounded_to_float32(name):
    env = _env()
    pol = make_policy(name, env)
    _play(pol, env, 10)
    beta = pol.rule.beta_at(pol.model, pol.t + 1)
    radius = pol.rule.radius(pol.model, 24, pol.t + 1)
    assert radius.dtype == torch.float64 and float(radius) == beta
    assert float(torch.tensor(beta, dtype=torch.float32)) != beta     # float32 would round it
    cand = env.candidates()
    mean, var = pol.model.mean_var(cand)
    torch.testing.assert_close(pol(cand), mean + beta * var.sqrt(), rtol=1e-13, atol=0)


# ----------------------------------------------------------------------------- defect 5
def test_importing_the_library_leaves_the_matplotlib_backend_alone():
    code = (
        "import matplotlib, sys\n"
        "matplotlib.use('svg')\n"
        "import torchbandits, torchbandits.experiments, torchbandits.experiments.report\n"
        "import torchbandits.reproduce.ekucb, torchbandits.reproduce.tvbo, torchbandits.reproduce.bkb\n"
        "import torchbandits.reproduce.cmm, torchbandits.reproduce.opkb\n"
        "assert matplotlib.get_backend() == 'svg', matplotlib.get_backend()\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=_subprocess_env())


def test_report_plots_are_saved_without_pyplot(tmp_path):
    from torchbandits.experiments import simulate
    from torchbandits.experiments.report import plot_regret
    from torchbandits.policies import RandomPolicy

    res = [simulate(RandomPolicy(), _env(), 20, 0, policy_name="random", env_name="tv")]
    before = sys.modules.get("matplotlib.pyplot")
    n_figs = len(before.get_fignums()) if before is not None else 0
    plot_regret(res, tmp_path / "regret.png")
    assert (tmp_path / "regret.png").stat().st_size > 1000
    after = sys.modules.get("matplotlib.pyplot")
    assert after is None or len(after.get_fignums()) == n_figs   # no pyplot figure left behind


def _subprocess_env():
    import os
    from pathlib import Path

    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("MPLBACKEND", None)
    return env


# ----------------------------------------------------------------------------- defect 6
# the EK-UCB reproduction's factories build their kernel from env.lengthscale, not env.kernel:
# their classes are checked directly below
_OWN_KERNEL = {"ekucb", "cbkb", "cbbkb", "supkernelucb"}
KERNEL_POLICIES = [n for n in sorted(POLICIES)
                   if n != "random" and "opnn" not in n and n not in _OWN_KERNEL]
_HORIZON_KW = {"opkb", "ada-opkb", "master-gpucb"}


@pytest.mark.parametrize("name", KERNEL_POLICIES)
def test_zero_lengthscale_is_refused_at_construction(name):
    env = _env()
    env.kernel.lengthscale = 0.0
    kw = {"horizon": 200} if name in _HORIZON_KW else {}
    with pytest.raises(ValueError, match="kernel"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            make_policy(name, env, **kw)


def test_check_kernel_names_the_bad_hyperparameter():
    from gpytorch.kernels import ScaleKernel

    from torchbandits.kernels import check_kernel
    from torchbandits.policies import BKB, CBBKB, CBKB, EKUCB, KernelUCB, SupKernelUCB

    bad = make_kernel("matern52", 0.5)
    bad.lengthscale = 0.0
    for cls in (KernelUCB, EKUCB, CBKB, CBBKB, SupKernelUCB, BKB):
        with pytest.raises(ValueError, match="kernel has lengthscale"):
            cls(bad)
    scaled = ScaleKernel(make_kernel("rbf", 0.5)).double()
    scaled.outputscale = 0.0
    with pytest.raises(ValueError, match="outputscale"):
        check_kernel(scaled)
    with pytest.raises(ValueError, match="kernel must be"):
        check_kernel("rbf")
    good = make_kernel("rbf", [0.2, 0.3])
    assert check_kernel(good) is good


# ----------------------------------------------------------------------------- defect 7
def test_complex_input_is_refused():
    from torchbandits.validation import as_matrix, as_point, as_scalar_reward

    f = {"dtype": torch.float64, "device": torch.device("cpu")}
    with pytest.raises(ValueError, match="candidates must be real"):
        as_matrix("candidates", torch.ones(3, 2, dtype=torch.complex64), **f)
    with pytest.raises(ValueError, match="x must be real"):
        as_point("x", torch.ones(2, dtype=torch.complex128), **f)
    with pytest.raises(ValueError, match="reward must be real"):
        as_scalar_reward("reward", 1 + 2j)


@pytest.mark.parametrize("name", ["opkb", "opnn0", "gpucb-alg8", "sw-gpucb-finite", "master-gpucb"])
def test_fixed_arm_policies_accept_float32_and_int64_copies_of_the_arms(name):
    kw = {"horizon": 200} if name in ("opkb", "opnn0", "master-gpucb") else {}
    if name == "opnn0":
        kw.update(width=16, train_steps=2)
    env = _env()
    pol = make_policy(name, env, **kw)
    _play(pol, env, 10)
    twin = copy.deepcopy(pol)
    cand = env.candidates()
    i = pol.select(cand.float())                       # float32 copy of the same arm set
    j = twin.select(cand)
    assert i == j
    pol.update(cand[i].float(), 0.5)
    twin.update(cand[j], 0.5)
    assert _play(pol, copy.deepcopy(env), 10) == _play(twin, copy.deepcopy(env), 10)
    # an integer arm set, given as int64
    arms = torch.tensor([[0, 0], [1, 0], [0, 1], [1, 1], [2, 1]], dtype=torch.float64)
    from torchbandits.kernels import make_kernel as mk

    env.kernel = mk("rbf", 1.0)
    pol = make_policy(name, env, **kw)
    a = pol.select(arms.long())
    pol.update(arms.long()[a], 0.1)
    assert pol.t == 1
    with pytest.raises(ValueError, match="candidates"):
        pol.select(arms + 0.5)


# ----------------------------------------------------------------------------- defect 8
def test_cli_bad_set_value_is_one_line_and_exit_2(tmp_path, capsys):
    for bad, key in (("kucb.lam=-1", "kucb.lam=-1"), ("kucb.nope=3", "kucb.nope=3"),
                     ("env.dim=0", "env.dim=0")):
        code = main(["run", "--policy", "kucb", "--horizon", "5", "--seeds", "0", "--set", bad,
                     "--out", str(tmp_path / "out"), "--no-progress"])
        err = capsys.readouterr().err.strip()
        assert code == 2
        assert len(err.splitlines()) == 1 and key in err and "Traceback" not in err
    assert not (tmp_path / "out" / "runs").exists()    # nothing was run


def test_cli_reproduce_help_shows_the_reproductions_options(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["reproduce", "bkb", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--quick" in out and "--seeds" in out and "--horizon" in out
    with pytest.raises(SystemExit):
        main(["reproduce", "--help"])
    assert "NAME --help" in capsys.readouterr().out


# ----------------------------------------------------------------------------- defect 10
def test_progress_bar_is_plain_without_ipywidgets(monkeypatch):
    import importlib
    import importlib.util

    import torchbandits.experiments.runner as runner

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ipywidgets" else real(name, *a))
    try:
        plain = importlib.reload(runner).tqdm
        assert plain.__module__ in ("tqdm.std", "tqdm")  # no notebook bar: no TqdmWarning
    finally:
        monkeypatch.undo()
        importlib.reload(runner)
    assert importlib.util.find_spec("ipywidgets") is not None   # dev extra installs it


def test_dev_extra_lists_the_notebook_and_property_test_dependencies():
    from configparser import ConfigParser
    from pathlib import Path

    cfg = ConfigParser()
    cfg.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    dev = cfg["options.extras_require"]["dev"]
    assert "ipywidgets" in dev and "hypothesis" in dev


def test_run_result_json_is_plain_json(tmp_path):
    """Atomic save leaves exactly the JSON file (no temporary file) and it parses."""
    from torchbandits.experiments import simulate
    from torchbandits.policies import RandomPolicy

    res = simulate(RandomPolicy(), _env(), 5, 0)
    path = res.save(tmp_path / "runs" / "r.json")
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["r.json"]
    assert json.loads(path.read_text())["seed"] == 0
