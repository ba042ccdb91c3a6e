"""The Bayesian-optimisation benchmark functions of BoTorch as finite-armed bandits.

Each environment wraps a ``botorch.test_functions`` synthetic function ``g`` on its box
``[lb, ub] ⊂ R^d`` (a **minimisation** problem with known minimum ``g*``) as the maximisation
bandit

    f(u) = −g(lb + u ⊙ (ub − lb)),      u ∈ [0, 1]^d,

so the policies see inputs scaled to the unit cube. The arms are a **scrambled Sobol** set of
``n_arms`` points in ``[0, 1]^d`` (Owen scrambling, ``torch.quasirandom.SobolEngine``): the same
set for the whole run (``fixed_arms=True``, the default — what a BO loop over a candidate set
does) or a fresh set every round. Rewards are ``f(u) + N(0, σ²)`` with ``σ = noise_frac · range``,
where ``range = max g − min g`` over a fixed reference Sobol set of 4,096 points (so σ is the
same for every seed and every arm set).

Two regrets are recorded for round t with played arm ``u_t``:

* the runner's pseudo-regret ``max_{u ∈ arms_t} f(u) − f(u_t)`` (against the **candidate set's**
  best, via :meth:`mean_rewards`);
* ``g(x_t) − g*`` against the function's **known optimum** (``optimal_value``), appended to
  :attr:`optimum_regret` at each :meth:`pull` and returned by :meth:`round_metrics` (NaN when
  BoTorch does not know ``g*``, e.g. Michalewicz outside d ∈ {2, 5, 10}).

BoTorch is an optional dependency (``pip install torchbandits[bo]``), imported when an
environment is built. Generators (from the ``reset`` seed): one for the arm sets, one for the
noise, so two policies run with the same seed face the same arms and the same noise.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import torch
from gpytorch.kernels import Kernel
from torch import Tensor
from torch.quasirandom import SobolEngine

from ..kernels import make_kernel
from .base import gaussian_reward

__all__ = ["FUNCTIONS", "TestFunctionEnv", "ackley", "branin", "hartmann6", "levy", "michalewicz",
           "rosenbrock"]

#: registry name → (BoTorch class, default dimension, whether the dimension is fixed)
FUNCTIONS: dict[str, tuple[str, int, bool]] = {
    "branin": ("Branin", 2, True),
    "hartmann6": ("Hartmann", 6, True),
    "ackley": ("Ackley", 6, False),
    "levy": ("Levy", 4, False),
    "rosenbrock": ("Rosenbrock", 4, False),
    "michalewicz": ("Michalewicz", 5, False),
}

_REFERENCE_POINTS = 4096


def _botorch_function(name: str, dim: int | None) -> Any:
    if name not in FUNCTIONS:
        raise ValueError(f"function must be one of {sorted(FUNCTIONS)}, got {name!r}")
    try:
        synthetic = importlib.import_module("botorch.test_functions.synthetic")
    except ImportError as err:  # pragma: no cover - depends on the installation
        raise ImportError("the test-function environments need BoTorch: "
                          "pip install 'torchbandits[bo]'") from err
    cls_name, default_dim, fixed = FUNCTIONS[name]
    cls = getattr(synthetic, cls_name)
    if fixed:
        if dim is not None and int(dim) != default_dim:
            raise ValueError(f"dim of {name} is fixed at {default_dim}, got {dim}")
        return cls(dim=6) if cls_name == "Hartmann" else cls()
    d = default_dim if dim is None else int(dim)
    if d < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    return cls(dim=d)


class TestFunctionEnv:
    """A BoTorch synthetic function as a bandit on a scrambled Sobol candidate set.

    Args:
        function: a name of :data:`FUNCTIONS` or a BoTorch ``SyntheticTestFunction`` instance.
        dim: dimension for the functions that take one (``None``: the default of
            :data:`FUNCTIONS`).
        n_arms: A, the size of the candidate set (2,000).
        fixed_arms: one candidate set per run (default) instead of a fresh one each round.
        noise_frac: σ as a fraction of the function's range (0.05); ``noise_std`` overrides it
            with an absolute σ.
        lengthscale: of the Matérn-5/2 ARD kernel offered to the policies as :attr:`kernel`
            (a guess on the unit cube; refit it with ``refit_every=``).
    """

    __test__ = False  # not a pytest class

    def __init__(
        self,
        function: str | Any = "branin",
        dim: int | None = None,
        *,
        n_arms: int = 2000,
        fixed_arms: bool = True,
        noise_frac: float = 0.05,
        noise_std: float | None = None,
        lengthscale: float = 0.25,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
    ) -> None:
        if isinstance(function, str):
            self.name = function
            self.function = _botorch_function(function, dim)
        else:
            self.name = type(function).__name__.lower()
            self.function = function
        if int(n_arms) < 1:
            raise ValueError(f"n_arms must be >= 1, got {n_arms}")
        if not math.isfinite(noise_frac) or noise_frac < 0:
            raise ValueError(f"noise_frac must be a finite number >= 0, got {noise_frac}")
        if noise_std is not None and (not math.isfinite(noise_std) or noise_std < 0):
            raise ValueError(f"noise_std must be a finite number >= 0, got {noise_std}")
        self.dim = int(self.function.dim)
        self.n_arms = int(n_arms)
        self.fixed_arms = bool(fixed_arms)
        self.dtype = dtype
        self.device = torch.device(device)
        bounds = self.function.bounds.to(torch.float64)
        self.lower, self.width = bounds[0], bounds[1] - bounds[0]
        try:
            opt = self.function.optimal_value
        except NotImplementedError:  # e.g. Michalewicz outside d ∈ {2, 5, 10}
            opt = None
        self.optimal_value = float("nan") if opt is None else float(opt)
        ref = SobolEngine(self.dim, scramble=True, seed=0).draw(_REFERENCE_POINTS, dtype=torch.float64)
        g_ref = self.value(ref)
        self.range = float(g_ref.max() - g_ref.min())
        self.noise_frac = float(noise_frac)
        self.noise_std = float(noise_std) if noise_std is not None else self.noise_frac * self.range
        self.norm = float(g_ref.abs().max())
        self.kernel: Kernel = make_kernel("matern52", [lengthscale] * self.dim,
                                          outputscale=float(g_ref.var()), dtype=dtype).to(self.device)
        self.optimum_regret: list[float] = []
        self.reset(0)

    # ------------------------------------------------------------------ the function
    def to_box(self, u: Tensor) -> Tensor:
        """Unit-cube points ``[n, d]`` → the function's box (float64, CPU)."""
        return self.lower + u.detach().to("cpu", torch.float64) * self.width

    def value(self, u: Tensor) -> Tensor:
        """BoTorch's noiseless value ``g(lb + u ⊙ (ub − lb))`` at unit-cube points ``[n, d]``."""
        return self.function.evaluate_true(self.to_box(u))

    def f(self, u: Tensor) -> Tensor:
        """Mean reward ``−g`` at unit-cube points ``[n, d]`` (in the env's dtype / device)."""
        return (-self.value(u)).to(dtype=self.dtype, device=self.device)

    def _draw_arms(self) -> None:
        seed = int(torch.randint(2**62, (1,), generator=self._g_arms))
        arms = SobolEngine(self.dim, scramble=True, seed=seed).draw(self.n_arms, dtype=torch.float64)
        self._arms = arms.to(dtype=self.dtype, device=self.device)
        self._g = self.value(arms)
        self._means = (-self._g).to(dtype=self.dtype, device=self.device)

    # ------------------------------------------------------------------ BanditEnv
    def reset(self, seed: int) -> None:
        """Draw the (first) candidate set from ``seed``; restart time and the regret log."""
        self.seed = int(seed)
        self._g_arms = torch.Generator().manual_seed(2 * self.seed)
        self._g_noise = torch.Generator().manual_seed(2 * self.seed + 1)
        self.t = 0
        self.optimum_regret = []
        self._draw_arms()

    def candidates(self) -> Tensor:
        """This round's candidate points ``[A, d]`` in the unit cube."""
        return self._arms

    def mean_rewards(self) -> Tensor:
        """Noiseless means ``[A]`` of this round's candidates."""
        return self._means

    def pull(self, index: int) -> float:
        """Noisy reward of candidate ``index``; logs its regret against the function's optimum and
        advances one round.
        """
        reward = gaussian_reward(self._means, index, self._g_noise, self.noise_std, self.dtype)
        self.optimum_regret.append(float(self._g[int(index)]) - self.optimal_value)
        self.t += 1
        if not self.fixed_arms:
            self._draw_arms()
        return reward

    def why_not_batched(self) -> str | None:
        """Why :class:`~torchbandits.envs.batched.BatchedEnv` refuses this environment."""
        return ("its arm sets are scrambled Sobol points drawn per run and it logs round_metrics "
                "(not batched yet)")

    def round_metrics(self) -> dict[str, float]:
        """Extra quantities of the last round: ``optimum_regret = g(x_t) − g*``."""
        return {"optimum_regret": self.optimum_regret[-1] if self.optimum_regret else float("nan")}

    def candidate_gap(self) -> float:
        """``min over this round's arms of g − g*`` (how far the candidate set's best is from the
        optimum; the two regrets differ by this much per round)."""
        return float(self._g.min()) - self.optimal_value

    def __repr__(self) -> str:
        return (f"TestFunctionEnv({self.name!r}, dim={self.dim}, n_arms={self.n_arms}, "
                f"fixed_arms={self.fixed_arms}, noise_std={self.noise_std:.4g})")


def _named(name: str):  # type: ignore[no-untyped-def]
    def build(dim: int | None = None, **kwargs: Any) -> TestFunctionEnv:
        return TestFunctionEnv(name, dim, **kwargs)

    build.__name__ = name
    build.__doc__ = f"``TestFunctionEnv({name!r}, dim, **kwargs)`` (registry entry ``{name}``)."
    return build


branin = _named("branin")
hartmann6 = _named("hartmann6")
ackley = _named("ackley")
levy = _named("levy")
rosenbrock = _named("rosenbrock")
michalewicz = _named("michalewicz")
