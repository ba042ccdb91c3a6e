"""The contextual environments of Zenati et al. (2022): Bump (§5), Chessboard and Step Diagonal
(App. F.2.2).

Each round a context ``x ~ U[0,1]^{d_x}`` is drawn; the candidates are the joint vectors
``[x; a]`` for the 10 actions of the grid of the authors' released code (in its order)
``(0.08, 0.7, 0.82, 0.28, 0.63, 0, 0.05, 0.5, 0.81, 0.04)``; the reward is ``f(x, a) + N(0, 0.1²)``.
The kernel the papers give the agents is the Gaussian RBF with ``σ_k = 0.1`` on ``[x; a]``
(:attr:`kernel`).

* **Bump** (``d_x = 5``): ``f(x, a) = max(0, 1 − |a − a*| − ⟨w*, x − x*⟩)`` with the code's
  constants from ``RandomState(123)``: ``a* = 0.81``, ``x*``, ``w*`` below (hard-coded).
* **Chessboard** (``squares``): 4×4 cells of width 0.25 with value 1 on
  ``[.25,.5)×[0,.25)``, ``[.25,.5)×[.5,.75)``, ``[.75,1]×[.5,.75)``, value 0.5 on
  ``[0,.25)×[.25,.5)``, ``[.5,.75)×[.25,.5)``, ``[.5,.75)×[.75,1]`` (context × action), else 0.
* **Step Diagonal**: 1 if ``|x − (a + 0.15)| < 0.1``, else 0.5 if ``|x − (a − 0.15)| < 0.1``, else 0.

Regret (Eq. 1 of the paper): :meth:`mean_rewards` gives the noiseless means of this round's
candidates, so the runner's regret is the pseudo-regret against the **grid** optimum. With
``regret_mode="reference"`` the environment also records the authors' realised regret
``best_code(x_t) + ξ'_t − r_t`` (``best_code ≡ 1`` on Chessboard / Step Diagonal, fresh noise
``ξ'``) in :attr:`reference_regret`.

Generators (all from the ``reset`` seed): one for the contexts, one for the reward noise, so two
policies run with the same seed see the same contexts and noise (common random numbers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from ..deferred_checks import to_device
from ..kernels import make_kernel
from ..validation import check_positive
from .base import gaussian_reward, joint
from .batched import BatchedEnv, gaussian_noise, stack_to, tensor_version

__all__ = [
    "ACTION_GRID",
    "BUMP_A_STAR",
    "BUMP_W_STAR",
    "BUMP_X_STAR",
    "BumpEnv",
    "ChessboardEnv",
    "ContextualGridEnv",
    "StepDiagonalEnv",
]

#: ``RandomState(123).choice(arange(0, 1, 0.01), 10, replace=False)``, the code's order.
ACTION_GRID = (0.08, 0.7000000000000001, 0.8200000000000001, 0.28, 0.63, 0.0, 0.05, 0.5, 0.81, 0.04)
BUMP_A_STAR = 0.81
BUMP_X_STAR = (0.10854229568516027, 0.5116547174153498, 0.909769397634143, 0.2183760135542644,
               0.3631040671850181)
BUMP_W_STAR = (0.7099456316481529, 0.42278360362943346, -0.21411117846382477, -0.5373970373754491,
               -0.23965057137331858)

RegretMode = Literal["pseudo", "reference"]


class ContextualGridEnv:
    """Contexts ``U[0,1]^{d_x}`` × a finite action grid, joint features ``[x; a]``.

    Subclasses define :meth:`f` (the mean reward) and :meth:`code_best` (the authors' "best").

    Args:
        noise_std: σ of the Gaussian reward noise (0.1).
        lengthscale: σ_k of the RBF kernel handed to the agents (0.1).
        actions: the action grid (default :data:`ACTION_GRID`).
        regret_mode: ``"pseudo"`` (default) or ``"reference"`` (also record the code's regret).
    """

    context_dim = 1
    name = "grid"

    def __init__(
        self,
        noise_std: float = 0.1,
        lengthscale: float = 0.1,
        *,
        actions: tuple[float, ...] | list[float] | Tensor | None = None,
        regret_mode: RegretMode = "pseudo",
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
    ) -> None:
        if float(noise_std) < 0:
            raise ValueError(f"noise_std must be >= 0, got {noise_std}")
        if regret_mode not in ("pseudo", "reference"):
            raise ValueError(f"regret_mode must be 'pseudo' or 'reference', got {regret_mode!r}")
        self.noise_std = float(noise_std)
        self.lengthscale = check_positive("lengthscale", lengthscale)
        self.dtype = dtype
        self.device = torch.device(device)
        grid = ACTION_GRID if actions is None else actions
        self.actions = torch.as_tensor(grid, dtype=dtype).reshape(-1).to(self.device)
        if self.actions.numel() == 0 or not bool(torch.isfinite(self.actions).all()):
            raise ValueError("actions must be a non-empty list of finite numbers")
        self.regret_mode: RegretMode = regret_mode
        self.kernel = make_kernel("rbf", self.lengthscale, dtype=dtype, device=self.device)
        self.norm = 1.0  # nominal ‖f‖ bound for theory radii (unknown for these functions)
        self.reset(0)

    # ------------------------------------------------------------------ the problem
    @property
    def n_actions(self) -> int:
        """``A``, the number of actions on the grid (candidates per round)."""
        return int(self.actions.numel())

    def f(self, contexts: Tensor, actions: Tensor) -> Tensor:  # pragma: no cover - abstract
        """Mean reward ``[n, A]`` of contexts ``[n, d_x]`` × actions ``[A]``."""
        raise NotImplementedError

    def code_best(self, contexts: Tensor) -> Tensor:  # pragma: no cover - abstract
        """The optimum ``best(x)`` ``[n]`` the authors' released code measures regret against."""
        raise NotImplementedError

    def best_mean(self, contexts: Tensor) -> Tensor:
        """``max_a f(x, a)`` over the grid ``[n]``."""
        return self.f(contexts, self.actions).max(dim=1).values

    # ------------------------------------------------------------------ the contract
    def _draw_context(self) -> None:
        ctx = torch.rand(self.context_dim, generator=self._g_ctx, dtype=self.dtype).to(self.device)
        self.context = ctx
        self._cands = joint(ctx, self.actions)
        self._means = self.f(ctx[None], self.actions)[0]

    @staticmethod
    def _generators(seed: int) -> dict[str, torch.Generator]:
        """The context and noise generators of ``reset(seed)``."""
        return {"context": torch.Generator().manual_seed(2 * int(seed) + 1000),
                "noise": torch.Generator().manual_seed(2 * int(seed) + 1001)}

    def reset(self, seed: int) -> None:
        """Restart time with the context and noise streams of ``seed``."""
        self.seed = int(seed)
        gens = self._generators(self.seed)
        self._g_ctx, self._g_noise = gens["context"], gens["noise"]
        self.t = 0
        self.reference_regret: list[float] = []
        self._draw_context()

    def candidates(self) -> Tensor:
        """This round's joint features ``[A, d_x + 1]``."""
        return self._cands

    def mean_rewards(self) -> Tensor:
        """Noiseless means of this round's candidates ``[A]``."""
        return self._means

    def pull(self, index: int) -> float:
        """Noisy reward of candidate ``index``; draws the next context."""
        reward = gaussian_reward(self._means, index, self._g_noise, self.noise_std)
        if self.regret_mode == "reference":
            xi = float(torch.randn((), generator=self._g_noise, dtype=torch.float64)) * self.noise_std
            best = float(self.code_best(self.context[None])[0])
            self.reference_regret.append(best + xi - reward)
        self.t += 1
        self._draw_context()
        return reward

    # ------------------------------------------------------------------ batched runs
    batch_fields = ("_cands", "_means")
    batch_fresh = True   # rows of chunk tensors that nobody writes

    def why_not_batched(self) -> str | None:
        """Why :class:`~torchbandits.envs.batched.BatchedEnv` refuses this configuration (``None``: it
        accepts it).
        """
        if self.regret_mode == "reference":
            return "regret_mode='reference' records the authors' regret run by run (not batched)"
        return None

    def batch_generators(self) -> dict[str, torch.Generator]:
        """The per-round generators after ``reset`` (``context`` and ``noise``), for
        :class:`~torchbandits.envs.batched.BatchedEnv`.
        """
        return {"context": self._g_ctx, "noise": self._g_noise}

    def batch_reset(self, seeds: Sequence[int]) -> tuple[dict[str, Tensor],
                                                         dict[str, list[torch.Generator]]]:
        """Every run's ``reset(seeds[r])`` at once: each run's first context drawn on the host
        from its own generator, the ``[R, d_x]`` contexts moved with one copy, candidates and
        means made over the batch. Fields ``[R, ...]``, generators per name."""
        gens = [self._generators(s) for s in seeds]
        ctx = stack_to([torch.rand(self.context_dim, generator=g["context"], dtype=self.dtype)
                        for g in gens], self.device)
        cands, means = self._batch_candidates(ctx)
        return ({"_cands": cands, "_means": means},
                {name: [g[name] for g in gens] for name in ("context", "noise")})

    def _batch_candidates(self, ctx: Tensor) -> tuple[Tensor, Tensor]:
        """Candidates ``[x; a]`` ``[*B, A, d_x + 1]`` and means ``f(x, a)`` ``[*B, A]`` of the
        contexts ``ctx`` ``[*B, d_x]`` (``B = (R,)`` at reset, ``(K, R)`` for a chunk of ``K``
        rounds: :meth:`_batch_means`)."""
        lead = ctx.shape[:-1]
        acts = self.actions.reshape(*(1,) * len(lead), -1, 1).expand(*lead, -1, 1)
        cands = torch.cat([ctx[..., None, :].expand(*lead, acts.shape[-2], -1), acts], dim=-1)
        return cands, self._batch_means(ctx)

    def _batch_means(self, ctx: Tensor) -> Tensor:
        """``f(x, a)`` ``[*B, A]`` of contexts ``[*B, d_x]``: one call of ``f`` over all of
        them where the class defining ``f`` declares it row-wise to the bit (``f_rowwise``:
        elementwise arithmetic and lookups), else one call per ``[R, d_x]`` round, as a round
        alone makes it (a matrix product's rounding may depend on the row count)."""
        if ctx.ndim == 2:
            return self.f(ctx, self.actions)
        home = next(c for c in type(self).__mro__ if "f" in vars(c))
        if vars(home).get("f_rowwise", False):
            return self.f(ctx.reshape(-1, ctx.shape[-1]), self.actions).reshape(
                *ctx.shape[:-1], -1)
        return torch.stack([self._batch_means(c) for c in ctx])

    def batch_round(self, b: BatchedEnv) -> tuple[Tensor, Tensor]:
        """Round ``b.t``: the contexts drawn by ``reset`` first, then one ``U[0,1]^{d_x}`` context
        per run; candidates ``[x_r; a]`` ``[R, A, d_x + 1]``, means ``f(x_r, a)`` ``[R, A]``."""
        if b.t == 0:
            return b.fields["_cands"], b.fields["_means"]
        cands, means, best = b.streams["context"].mapped(
            self._chunk_candidates, self._chunk_key(), "uniform", self.context_dim,
            dtype=self.dtype)
        b.keep_best(means, best)
        return cands, means

    def _chunk_key(self) -> tuple[object, ...]:
        """What the kept candidates of a chunk depend on besides its contexts: the action grid
        (the same unchanged tensor) and the device."""
        return (id(self.actions), tensor_version(self.actions), self.device, type(self).f)

    def _chunk_candidates(self, ctx: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`_batch_candidates` of a chunk's contexts ``[K, R, d_x]`` at once, and the
        best means ``max_a f(x, a)`` ``[K, R]``."""
        cands, means = self._batch_candidates(ctx.to(self.device))
        return cands, means, means.max(dim=-1).values

    def batch_noise(self, b: BatchedEnv, means: Tensor) -> Tensor:
        """Gaussian noise ``[R]`` (float64) for the chosen means ``[R]`` of every run, one draw per run."""
        return gaussian_noise(b, self.noise_std, torch.float64)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(d_x={self.context_dim}, actions={self.n_actions}, "
                f"noise_std={self.noise_std}, lengthscale={self.lengthscale}, "
                f"regret_mode={self.regret_mode!r})")


class BumpEnv(ContextualGridEnv):
    """Bump (Zenati et al. 2022, §5): ``f(x, a) = max(0, 1 − |a − a*| − ⟨w*, x − x*⟩)``, ``d_x = 5``.

    ``d_x`` other than 5 keeps the first ``d_x`` coordinates of ``x*``/``w*`` (at most 5).
    """

    name = "bump"

    def __init__(self, noise_std: float = 0.1, lengthscale: float = 0.1, *, d_x: int = 5,
                 **kwargs) -> None:  # type: ignore[no-untyped-def]
        if not 1 <= int(d_x) <= 5:
            raise ValueError(f"d_x must lie in [1, 5], got {d_x}")
        self.context_dim = int(d_x)
        # on the env's device before the base class draws the first context (reset(0) reads them)
        where = {"dtype": kwargs.get("dtype", torch.float64),
                 "device": torch.device(kwargs.get("device", "cpu"))}
        self.x_star = torch.tensor(BUMP_X_STAR[: self.context_dim], **where)
        self.w_star = torch.tensor(BUMP_W_STAR[: self.context_dim], **where)
        self.a_star = BUMP_A_STAR
        super().__init__(noise_std, lengthscale, **kwargs)

    def _shift(self, contexts: Tensor) -> Tensor:
        return (contexts - self.x_star) @ self.w_star

    def f(self, contexts: Tensor, actions: Tensor) -> Tensor:
        dist = (actions.reshape(1, -1) - self.a_star).abs()
        return torch.clamp(1.0 - dist - self._shift(contexts)[:, None], min=0.0)

    def code_best(self, contexts: Tensor) -> Tensor:
        return torch.clamp(1.0 - self._shift(contexts), min=0.0)


class ChessboardEnv(ContextualGridEnv):
    """Chessboard (``squares`` in the released code; Zenati et al. 2022, App. F.2.2): 4×4 cells
    with values 1, 0.5, 0."""

    name = "chessboard"
    f_rowwise = True   # a lookup per context (see ContextualGridEnv._batch_means)
    #: cell values, rows = context cell (0..3), columns = action cell (0..3)
    CELLS = ((0.0, 0.5, 0.0, 0.0),
             (1.0, 0.0, 1.0, 0.0),
             (0.0, 0.5, 0.0, 0.5),
             (0.0, 0.0, 1.0, 0.0))

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        #: :attr:`CELLS` as a ``[4, 4]`` tensor, made once (on the environment's device)
        self.cells = torch.tensor(self.CELLS, dtype=kwargs.get("dtype", torch.float64))
        super().__init__(*args, **kwargs)
        self.cells = to_device(self.cells, self.device)

    def f(self, contexts: Tensor, actions: Tensor) -> Tensor:
        """``CELLS[c(x), c(a)]`` ``[N, A]`` of contexts ``[N, d_x]`` and actions ``[A]``, ``c(u) =
        clamp(⌊4u⌋, 0, 3)``: the rows of the action columns ``CELLS[:, c(a)]`` ``[4, A]``, which
        are kept while ``actions`` is the same unchanged tensor (the fixed action grid: one gather
        a round instead of six operators)."""
        ci = torch.clamp((contexts[:, 0] * 4).floor().long(), 0, 3)
        return self._action_columns(actions, contexts).index_select(0, ci)

    def _action_columns(self, actions: Tensor, like: Tensor) -> Tensor:
        kept, version = getattr(self, "_columns", None), tensor_version(actions)
        if (kept is None or kept[0] is not actions or version is None or kept[1] != version
                or kept[3] is not self.cells or kept[2].device != like.device
                or kept[2].dtype != like.dtype):
            cells = self.cells.to(device=like.device, dtype=like.dtype)   # no copy if there
            ai = torch.clamp((actions.reshape(-1) * 4).floor().long(), 0, 3)
            kept = self._columns = (actions, version, cells[:, ai], self.cells)
        return kept[2]

    def code_best(self, contexts: Tensor) -> Tensor:
        return torch.ones(contexts.shape[0], dtype=contexts.dtype, device=contexts.device)


class StepDiagonalEnv(ContextualGridEnv):
    """Step Diagonal (``step_diag``; Zenati et al. 2022, App. F.2.2): 1 on ``|x − (a + 0.15)| < 0.1``,
    else 0.5 on ``|x − (a − 0.15)| < 0.1``, else 0."""

    name = "step_diagonal"
    f_rowwise = True   # elementwise in the contexts

    def f(self, contexts: Tensor, actions: Tensor) -> Tensor:
        x = contexts[:, :1]
        a = actions.reshape(1, -1)
        high = (x - (a + 0.15)).abs() < 0.1
        low = (x - (a - 0.15)).abs() < 0.1
        one = torch.ones((), dtype=contexts.dtype, device=contexts.device)
        return torch.where(high, one, torch.where(low, 0.5 * one, 0.0 * one))

    def code_best(self, contexts: Tensor) -> Tensor:
        return torch.ones(contexts.shape[0], dtype=contexts.dtype, device=contexts.device)
