"""The presets' home and the registry's seams.

* Listing names imports nothing heavy (``torchbandits list`` reads a table of strings).
* ``experiments`` never imports ``reproduce``; the presets never import ``experiments`` or
  ``reproduce`` (imports run downward only).
* Every registry name resolves to a preset of :mod:`torchbandits.presets` or an environment of
  :mod:`torchbandits.envs`.
* GP-UCB is one class: every GP-UCB name builds a :class:`GPUCB`, and presets that are special cases
  of one another score identically.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torchbandits
from torchbandits import experiments
from torchbandits.experiments.registry import ENVIRONMENTS, POLICIES, make_env, make_policy, resolve
from torchbandits.kernels import make_kernel
from torchbandits.policies import AYGPUCB, GPUCB, IGPUCB, KernelUCB
from torchbandits.presets.from_env import DEFAULT_NOISE, env_horizon, env_kernel, env_noise, env_norm
from torchbandits.reproduce import REPRODUCTIONS

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "torchbandits"
HEAVY = ("torch", "gpytorch", "linear_operator", "cvxpy", "botorch", "matplotlib", "sklearn", "ray",
         "numpy", "scipy")
GP_UCB_NAMES = ("gpucb", "cgpucb", "gpucb-srinivas", "ay-gpucb", "gpucb-fit", "gpucb-ridge", "aygp-ucb",
                "igp-ucb")


def _run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.strip().splitlines()[-1]


def test_listing_imports_nothing_heavy():
    out = _run(
        "import contextlib, io, json, sys\n"
        "from torchbandits.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as text:\n"
        "    main(['list'])\n"
        "assert 'ekucb' in text.getvalue() and 'tv-rotation' in text.getvalue()\n"
        "print(json.dumps(sorted(sys.modules)))\n")
    loaded = json.loads(out)
    heavy = sorted({m.split(".")[0] for m in loaded} & set(HEAVY))
    assert heavy == [], heavy
    ours = sorted(m for m in loaded if m.startswith("torchbandits."))
    assert ours == ["torchbandits.cli", "torchbandits.experiments", "torchbandits.experiments.registry",
                    "torchbandits.lazy", "torchbandits.reproduce"], ours


def _imported_modules(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    if path.name == "__init__.py":
        package = ".".join(path.relative_to(ROOT).parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            names.add(mod)
            names.update(f"{mod}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "torchbandits." in node.value:
            names.add(node.value.partition(":")[0])  # "module:attr" targets resolved at run time
    return names


@pytest.mark.parametrize(("layer", "forbidden"), [
    ("experiments", ("torchbandits.reproduce", "torchbandits.cli")),
    ("presets", ("torchbandits.experiments", "torchbandits.reproduce", "torchbandits.cli")),
])
def test_imports_run_downward(layer, forbidden):
    bad = {}
    for path in sorted((PKG / layer).glob("*.py")):
        hits = sorted(m for m in _imported_modules(path) if m.startswith(forbidden))
        if hits:
            bad[path.name] = hits
    assert bad == {}


def test_resolving_every_policy_imports_no_reproduction():
    out = _run(
        "import json, sys\n"
        "from torchbandits.experiments.registry import ENVIRONMENTS, POLICIES, resolve\n"
        "import torchbandits.experiments.runner, torchbandits.experiments.sweeps\n"
        "for table in (ENVIRONMENTS, POLICIES):\n"
        "    [resolve(entry) for entry in table.values()]\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('torchbandits.'))))\n")
    loaded = json.loads(out)
    assert not [m for m in loaded if m.startswith("torchbandits.reproduce")]
    assert "torchbandits.presets.hong2023" in loaded


def test_every_name_resolves_to_its_home():
    for name, entry in POLICIES.items():
        assert entry.target.startswith("torchbandits.presets."), name
        assert callable(resolve(entry)), name
    for name, entry in ENVIRONMENTS.items():
        assert entry.target.startswith("torchbandits.envs."), name
        assert callable(resolve(entry)), name
    for name, entry in REPRODUCTIONS.items():
        assert entry.target == f"torchbandits.reproduce.{name}:main", name
    used = {entry.target.split(":")[0].rsplit(".", 1)[1] for entry in POLICIES.values()}
    on_disk = {p.stem for p in (PKG / "presets").glob("*.py")} - {"__init__", "from_env"}
    assert used == on_disk  # no presets module the registry forgets


def test_descriptions_cite_papers_not_specs():
    for table in (ENVIRONMENTS, POLICIES, REPRODUCTIONS):
        for name, entry in table.items():
            text = entry.description
            assert "seed 00" not in text and "spec" not in text and "DESIGN" not in text, (name, text)


@pytest.mark.parametrize("module", [torchbandits, experiments])
def test_lazy_packages_export_what_they_list(module):
    assert set(module.__all__) <= set(dir(module))
    for name in module.__all__:
        assert getattr(module, name) is not None
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018


class _Env:
    def __init__(self, **attrs):
        self.__dict__.update(attrs)


def test_env_parameters_once():
    kernel = make_kernel("rbf", 0.3)
    bare = _Env(kernel=kernel)
    assert env_noise(bare) == DEFAULT_NOISE and env_norm(bare) == 1.0
    assert env_noise(_Env(noise_std=0.0)) == DEFAULT_NOISE  # a noiseless problem keeps λ = σ² > 0
    assert env_noise(_Env(noise_std=0.25)) == 0.25 and env_norm(_Env(norm=3)) == 3.0
    copy = env_kernel(bare)
    assert copy is not kernel and torch.equal(copy.lengthscale, kernel.lengthscale)
    with pytest.raises(ValueError, match="kernel"):
        env_kernel(_Env())
    with pytest.raises(ValueError, match="horizon"):
        env_horizon(_Env())
    assert env_horizon(_Env(horizon=7)) == 7 and env_horizon(_Env(horizon=7), 3) == 3


def _env():
    env = make_env("rkhs", dim=2, n_arms=30, fixed_arms=True, norm=2.0, noise_std=0.2)
    env.reset(3)
    return env


def _same_scores(a, b, env, rounds: int = 25) -> None:
    """Feed both policies ``a``'s choices; their UCBs agree exactly every round."""
    for _ in range(rounds):
        cand = env.candidates()
        ua, ub = a(cand), b(cand)
        assert torch.equal(ua, ub)
        i = a.select(cand)
        assert b.select(cand) == i
        reward = env.pull(i)
        a.update(cand[i], reward)
        b.update(cand[i], reward)


@pytest.mark.parametrize("name", GP_UCB_NAMES)
def test_every_gp_ucb_name_is_a_preset_of_one_class(name):
    assert type(make_policy(name, _env())) is GPUCB


def test_gp_ucb_presets_that_are_special_cases_agree():
    env = _env()
    _same_scores(make_policy("aygp-ucb", env, c=1.0), make_policy("ay-gpucb", env), env)
    env = _env()
    _same_scores(make_policy("gpucb", env), IGPUCB(env.kernel, noise_std=0.2, norm_bound=2.0, eta=0.01), env)
    env = _env()
    ay = AYGPUCB(env.kernel, noise_std=0.2, norm_bound=2.0, c=4.0)
    assert ay.model.lam == pytest.approx(0.2**2 / 4.0)
    _same_scores(make_policy("aygp-ucb", env, c=4.0), ay, env)


def test_gpucb_ridge_is_kernel_ucb_on_the_ridge_sd():
    env = _env()
    reference = KernelUCB(env.kernel, lam=0.2**2, beta=0.3, variance="ridge")
    _same_scores(make_policy("gpucb-ridge", env), reference, env)
