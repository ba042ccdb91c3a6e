"""OPKB (Algorithm 2) and ADA-OPKB (Algorithms 3–4) of Hong, Li & Tewari (AISTATS 2023, §4.1, §4.3).

Randomised policies on a fixed finite arm set ``X = {a₁..a_N}``: ``select`` samples an arm from
the current distribution with the policy's own generator, ``distribution()`` returns it, and
``forward`` returns it as the "scores". There is no confidence width: exploration is the log-det
term of OP and the forced mixing with the optimal design ``π(X)``.

* Block ``j`` of an epoch has length ``2^j E``; block 0 plays ``π(X)``. At the start of block
  ``j ≥ 1`` the empirical gaps ``Δ̂ = G[j−1]`` of the IPS estimates over all of the epoch's history
  (Def. 4.1, each step with the IPS matrix ``M_m = Φ S(P^{(m)}, σ/T)⁻¹Φᵀ`` of the strategy it was
  played with, cached per strategy) feed OP with ``β_j``; ``P^{(j)} = (1 − μ_j) Q^{(j)} + μ_j π(X)``.
* ADA-OPKB draws a replay :class:`~.schedule.Schedule` per block; at round ``s`` it plays the
  strategy of the active index. When a scheduled interval ``I`` of index ``m`` ends, its gap
  estimate ``D`` is compared with every reference ``G[k]``, ``k < j`` (two-sided test
  ``max(D − 4G[k]) > thr`` or ``max(G[k] − 4D) > thr``, ``thr = 4c₀μ_{m∧k}`` in the paper); a
  failed test restarts: new epoch at ``s + 1`` with ``j = 0``, empty history, strategy ``π(X)``.
* ``λ = σ/T`` with the global horizon ``T`` in every epoch (as the authors' code; the paper
  does not say otherwise); all constants come from
  :class:`~.op_presets.OPConstants` (presets ``"theory"`` and ``"aistats2023_code"``).

Diagnostics: block index, epoch, restarts (and the last restart time; ``restart_times`` holds
them all), active index, γ_T (paper's convention), E, cumulative solver seconds, last KKT gap.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..buffers import grow_rows
from ..design import information_gain_at, ips_matrix, optimal_design, solve_op
from ..kernels import check_kernel
from ..models.features import kernel_features
from ..validation import match_rows, same_rows
from .base import Policy
from .op_presets import OPConstants, op_preset
from .schedule import Schedule, sample_schedule

__all__ = ["ADAOPKB", "OPKB", "OPPolicyBase"]


class OPPolicyBase(Policy):
    """Shared machinery of OPKB / ADA-OPKB / OPNN / ADA-OPNN (feature map supplied by hooks)."""

    adaptive: bool = True
    family: str = "opkb"

    def __init__(
        self,
        horizon: int,
        *,
        preset: str = "aistats2023_code",
        constants: OPConstants | None = None,
        solver: str = "newton",
        kkt_tol: float = 1e-9,
        seed: int = 0,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__(seed=seed, n_warmup=0, dtype=dtype, device=device)
        if int(horizon) < 2:
            raise ValueError(f"horizon must be >= 2, got {horizon}")
        if solver not in ("newton", "cvxpy"):
            raise ValueError(f"solver must be 'newton' or 'cvxpy', got {solver!r}")
        if constants is not None and overrides:
            raise ValueError("pass either constants or keyword overrides, not both")
        self.horizon = int(horizon)
        self.constants = constants if constants is not None else op_preset(
            preset, family=self.family, **self._preset_kwargs(), **overrides)
        self.solver = solver
        self.kkt_tol = float(kkt_tol)
        f = {"dtype": dtype, "device": device}
        for name in ("arms", "phi", "pi_x", "strategies", "ips", "ref_gaps", "p_star", "h_y"):
            self.register_buffer(name, torch.zeros(0, **f))
        self.register_buffer("h_arm", torch.zeros(0, dtype=torch.long, device=device))
        self.register_buffer("h_m", torch.zeros(0, dtype=torch.long, device=device))
        self._clear()

    def _preset_kwargs(self) -> dict[str, Any]:
        return {}

    # ------------------------------------------------------------------ state
    def _clear(self) -> None:
        self.ready = False
        self.epoch = -1
        self.j = 0
        self.epoch_start = 1
        self.h_n = 0
        self.schedule: Schedule | None = None
        self.restart_times: list[int] = []
        self.gamma_paper = self.gamma = self.alpha = self.c0 = self.lam = math.nan
        self.E = 0
        self.solver_seconds = 0.0
        self.last_kkt_gap = math.nan
        self.n_solves = 0
        self.n_tests = 0
        self._pending: int | None = None
        self._cdf: dict[int, Tensor] = {}

    def _extra_state(self) -> dict[str, Any]:
        return {
            "ready": self.ready, "epoch": self.epoch, "j": self.j, "epoch_start": self.epoch_start,
            "h_n": self.h_n, "schedule": self.schedule.to_state() if self.schedule else None,
            "restart_times": list(self.restart_times), "gamma_paper": self.gamma_paper,
            "gamma": self.gamma, "alpha": self.alpha, "c0": self.c0, "lam": self.lam, "E": self.E,
            "solver_seconds": self.solver_seconds, "last_kkt_gap": self.last_kkt_gap,
            "n_solves": self.n_solves, "n_tests": self.n_tests, "pending": self._pending,
        }

    def _set_extra_state(self, state: dict[str, Any]) -> None:
        for k in ("ready", "epoch", "j", "epoch_start", "h_n", "restart_times", "gamma_paper",
                  "gamma", "alpha", "c0", "lam", "E", "solver_seconds", "last_kkt_gap", "n_solves",
                  "n_tests"):
            setattr(self, k, state[k])
        self.restart_times = list(self.restart_times)
        self._pending = state["pending"]
        self.schedule = Schedule.from_state(state["schedule"]) if state["schedule"] else None
        self._cdf = {}

    def _reset(self) -> None:
        self._clear()
        f = {"dtype": self.dtype, "device": self.device}
        for name in ("arms", "phi", "pi_x", "strategies", "ips", "ref_gaps", "p_star", "h_y"):
            setattr(self, name, torch.zeros(0, **f))
        self.h_arm = torch.zeros(0, dtype=torch.long, device=self.device)
        self.h_m = torch.zeros(0, dtype=torch.long, device=self.device)

    # ------------------------------------------------------------------ hooks (feature maps)
    def _initial_features(self, arms: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _epoch_features(self) -> tuple[Tensor, Tensor]:
        """``(Φ, π_Φ(X))`` used by block 0 of a new epoch."""
        return self.phi, self.pi_x

    def _block_features(self, j: int) -> tuple[Tensor, Tensor]:
        """``(Φ_j, π_{Φ_j}(X))`` for block ``j ≥ 1``; may refresh ``self.ips``/``self.ref_gaps``."""
        return self.phi, self.pi_x

    # ------------------------------------------------------------------ setup / epochs / blocks
    def _setup(self, arms: Tensor) -> None:
        n = arms.shape[0]
        self.arms = arms.clone()
        self.phi = self._initial_features(self.arms)
        c = self.constants
        lam = c.sigma / self.horizon
        design = optimal_design(self.phi, lam, solver=self.solver, kkt_tol=self.kkt_tol)
        self._account(design.seconds, design.certificate.gap)
        self.pi_x = design.p
        self.gamma_paper = information_gain_at(self.phi, design.p, self.horizon, c.sigma)
        d = c.derived(self.gamma_paper, self.horizon, n)
        self.gamma, self.E, self.alpha, self.c0, self.lam = (
            d["gamma"], int(d["E"]), d["alpha"], d["c0"], d["lam"])
        jmax = int(math.log2(self.horizon / self.E + 1.0)) + 2
        f = {"dtype": self.dtype, "device": self.device}
        self.strategies = torch.zeros(jmax, n, **f)
        self.ips = torch.zeros(jmax, n, n, **f)
        self.ref_gaps = torch.zeros(jmax, n, **f)
        self.p_star = torch.zeros(0, **f)
        cap = min(self.horizon, 1024)
        self.h_arm = torch.zeros(cap, dtype=torch.long, device=self.device)
        self.h_m = torch.zeros(cap, dtype=torch.long, device=self.device)
        self.h_y = torch.zeros(cap, **f)
        self.ready = True
        self._start_epoch(1)

    def _account(self, seconds: float, gap: float) -> None:
        self.solver_seconds += seconds
        self.last_kkt_gap = gap
        self.n_solves += 1

    def _ensure_rows(self, j: int) -> None:
        self.strategies = grow_rows(self.strategies, j + 1)
        self.ips = grow_rows(self.ips, j + 1)
        self.ref_gaps = grow_rows(self.ref_gaps, j + 1)

    def _set_strategy(self, m: int, p: Tensor, phi: Tensor) -> None:
        self._ensure_rows(m)
        self.strategies[m] = p
        self.ips[m] = ips_matrix(phi, p, self.lam)
        self._cdf.pop(m, None)

    def _start_epoch(self, s: int) -> None:
        self.epoch += 1
        self.epoch_start = s
        self.h_n = 0
        self.j = 0
        self.p_star = torch.zeros(0, dtype=self.dtype, device=self.device)
        phi, pi = self._epoch_features()
        self._cdf = {}
        self._set_strategy(0, pi, phi)
        self.schedule = sample_schedule(s, 0, self.E, self.generator, replays=False)

    def _start_block(self, s: int, j: int) -> None:
        c = self.constants
        self.j = j
        phi, pi = self._block_features(j)
        self._ensure_rows(j)
        self.ref_gaps[j - 1] = self.interval_gaps(0, self.h_n)
        beta = c.beta(j, self.gamma, self.alpha)
        res = solve_op(
            phi, self.ref_gaps[j - 1], alpha=self.alpha, beta=beta, lam=self.lam,
            gamma=self.gamma, design_mix=c.design_mix, threshold=c.a_threshold(j, self.alpha),
            solver=self.solver, warm_start=self.p_star if self.p_star.numel() else None,
            subdesign=c.subdesign, kkt_tol=self.kkt_tol,
        )
        self._account(res.seconds, res.certificate.gap)
        self.p_star = res.p_star
        mu = c.mu(j)
        self._set_strategy(j, (1.0 - mu) * res.q + mu * pi, phi)
        self.schedule = sample_schedule(s, j, self.E, self.generator, min_index=c.j_star,
                                        replays=self.adaptive)

    # ------------------------------------------------------------------ IPS estimates
    def interval_estimates(self, a: int, b: int) -> Tensor:
        """``R̂_I(x) = (1/|I|) Σ_{t∈I} M_{m_t}[x, x_t] y_t`` over epoch steps ``a..b−1`` (§2.4)."""
        n = self.arms.shape[0]
        nm = self.j + 1
        y = self.h_y[a:b]
        key = self.h_m[a:b] * n + self.h_arm[a:b]
        sums = torch.zeros(nm * n, dtype=self.dtype, device=self.device).index_add_(0, key, y)
        est = torch.einsum("mxa,ma->x", self.ips[:nm], sums.view(nm, n))
        return est / max(b - a, 1)

    def interval_gaps(self, a: int, b: int) -> Tensor:
        """``Δ̂_I = max R̂_I − R̂_I`` over epoch steps ``a..b−1``."""
        est = self.interval_estimates(a, b)
        return est.max() - est

    # ------------------------------------------------------------------ contract
    def _check_arms(self, cand: Tensor) -> None:
        if not self.ready:
            self._setup(cand)
        elif not same_rows(self.arms, cand):
            raise ValueError("candidates must be the same fixed arm set on every round "
                             f"({tuple(self.arms.shape)}); call reset() for a new arm set")

    def distribution(self, candidates: Any | None = None) -> Tensor:
        """The distribution over arms used at the next round (``[N]``)."""
        if candidates is not None:
            self._check_arms(self.check_candidates(candidates))
        if not self.ready:
            raise ValueError("distribution() needs the arm set: pass candidates or call select first")
        return self.strategies[self.schedule.active_index(self.t + 1)].clone()

    def forward(self, candidates: Tensor) -> Tensor:
        """Selection probabilities of the candidates at the next round."""
        return self.distribution(candidates)

    def select(self, candidates: Any) -> int:
        cand = self.check_candidates(candidates)
        self._check_arms(cand)
        m = self.schedule.active_index(self.t + 1)
        cdf = self._cdf.get(m)
        if cdf is None:
            cdf = torch.cumsum(self.strategies[m].detach().double().cpu(), 0)
            self._cdf[m] = cdf
        u = torch.rand((), generator=self.generator, dtype=torch.float64) * cdf[-1]
        idx = min(int(torch.searchsorted(cdf, u, right=True)), cdf.numel() - 1)
        self._pending = idx
        return idx

    def _arm_index(self, x: Tensor) -> int:
        if not self.ready:
            raise ValueError("update() before the first select(): the arm set is unknown")
        if self._pending is not None and torch.equal(self.arms[self._pending], x):
            return self._pending
        return int(match_rows("x", self.arms, x)[0])

    def _update(self, x: Tensor, reward: float) -> None:
        arm = self._arm_index(x)     # validates before any state change
        s = self.t + 1
        m = self.schedule.active_index(s)
        pos = self.h_n
        self.h_arm = grow_rows(self.h_arm, pos + 1)
        self.h_m = grow_rows(self.h_m, pos + 1)
        self.h_y = grow_rows(self.h_y, pos + 1)
        self.h_arm[pos] = arm
        self.h_m[pos] = m
        self.h_y[pos] = reward
        self.h_n = pos + 1
        self._pending = None
        if self.adaptive and self._change_detected(s):
            self.restart_times.append(s)
            self._start_epoch(s + 1)
            return
        if s == self.schedule.end:
            self._start_block(s + 1, self.j + 1)

    def _change_detected(self, s: int) -> bool:
        c = self.constants
        if c.max_restarts is not None and len(self.restart_times) >= c.max_restarts:
            return False
        ks = list(range(c.j_star, self.j))
        if not ks:
            return False
        for rep in self.schedule.ending_at(s):
            if rep.index == self.j and not c.test_full_block:
                continue
            d = self.interval_gaps(rep.start - self.epoch_start, rep.end - self.epoch_start + 1)
            self.n_tests += 1
            refs = self.ref_gaps[c.j_star:self.j]
            thr = torch.tensor([c.test_threshold(rep.index, k, self.c0) for k in ks],
                               dtype=self.dtype, device=self.device)
            up = (d.unsqueeze(0) - 4.0 * refs).amax(1)
            down = (refs - 4.0 * d.unsqueeze(0)).amax(1)
            if bool(((up > thr) | (down > thr)).any()):
                return True
        return False

    def diagnostics(self) -> dict[str, float]:
        return {
            "block": float(self.j), "epoch": float(max(self.epoch, 0)),
            "restarts": float(len(self.restart_times)),
            "last_restart": float(self.restart_times[-1]) if self.restart_times else 0.0,
            "gamma": float(self.gamma_paper), "E": float(self.E),
            "solver_seconds": self.solver_seconds, "kkt_gap": float(self.last_kkt_gap),
        }

    def extra_repr(self) -> str:
        return f"horizon={self.horizon}, solver={self.solver!r}, constants={self.constants}"


class ADAOPKB(OPPolicyBase):
    """ADA-OPKB (Hong, Li & Tewari 2023, Algorithm 3 with the replay schedule of Algorithm 4).

    Args:
        kernel: the known kernel (GPyTorch) — the feature map is the Cholesky factor of ``K``.
        horizon: ``T`` (known; ``λ = σ/T``).
        preset: ``"aistats2023_code"`` (default, the released configs) or ``"theory"``.
        constants: a full :class:`~.op_presets.OPConstants` instead of ``preset``.
        solver: ``"newton"`` (barrier Newton, default) or ``"cvxpy"`` for every OP / design.
        kkt_tol: Frank–Wolfe gap every solve is certified to.
        jitter: added to ``K`` before its Cholesky factorisation.
        **overrides: any field of :class:`~.op_presets.OPConstants` (``sigma``, ``j_star``, …).

    Examples:
        >>> import torch
        >>> from torchbandits import make_kernel
        >>> from torchbandits.policies import ADAOPKB
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> f = lambda x: torch.exp(-((x - 0.7) ** 2).sum(-1) / 0.02)  # noiseless, best arm 7
        >>> policy = ADAOPKB(make_kernel("rbf", 0.2), 40, seed=0)
        >>> for _ in range(30):
        ...     i = policy.select(arms)
        ...     policy.update(arms[i], f(arms[i]))
        >>> p = policy.distribution(arms)  # sampling distribution of the next round, [A]
        >>> p.shape, round(float(p.sum()), 6)
        (torch.Size([11]), 1.0)
        >>> bool(p[6:9].sum() > 0.5)  # most of the mass next to the best arm
        True
        >>> policy.diagnostics()['restarts']  # a stationary function: no change detected
        0.0
    """

    adaptive = True

    def __init__(self, kernel: Kernel, horizon: int, *, jitter: float = 1e-10, **kwargs: Any) -> None:
        check_kernel(kernel)
        super().__init__(horizon, **kwargs)
        self.kernel = kernel.to(dtype=self.dtype, device=self.device)
        self.jitter = float(jitter)

    def _initial_features(self, arms: Tensor) -> Tensor:
        return kernel_features(self.kernel, arms, self.jitter)


class OPKB(ADAOPKB):
    """OPKB, the stationary algorithm (Hong, Li & Tewari 2023, Algorithm 2): doubling blocks, no replays and
    no change tests. Same arguments as :class:`ADAOPKB`.

    Examples:
        The usage is that of :class:`ADAOPKB`; what differs is the schedule. Block ``j`` of the
        epoch has ``2^j E`` rounds, so it starts after round ``E(2^j − 1)`` and, with no change
        test, the epoch never restarts:

        >>> import torch
        >>> from torchbandits import make_kernel
        >>> from torchbandits.policies import OPKB
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> policy = OPKB(make_kernel("rbf", 0.2), 40, seed=0)
        >>> blocks = []  # blocks[t - 1]: the block under way after round t
        >>> for _ in range(31):
        ...     i = policy.select(arms)
        ...     policy.update(arms[i], torch.sin(3 * arms[i]).sum())
        ...     blocks.append(int(policy.diagnostics()["block"]))
        >>> policy.E, [blocks.index(j) + 1 for j in range(1, 6)]  # E (2^j - 1), j = 1..5
        (1, [1, 3, 7, 15, 31])
        >>> policy.diagnostics()["restarts"]
        0.0
    """

    adaptive = False
