"""MASTER + GP-UCB (Hong, Li & Tewari 2023, Appendix E) — **reconstructed** from Wei &
Luo (2021).

The seed paper only states Condition E.1 / Theorem E.2 and never runs this baseline; the
procedure below is our reconstruction (verify against Wei & Luo before relying on it):

* Epochs of blocks ``n = 0, 1, …`` of length ``2^n`` starting at ``t_n``. In block ``n`` base
  instances of order ``m = n, …, 0`` are scheduled on aligned sub-intervals of length ``2^m``,
  each with probability ``ρ(2^n)/ρ(2^m)`` (order ``n`` always) — the replay schedule of
  :mod:`.schedule` with base length 1. The active instance at ``t`` is the scheduled one of
  smallest order covering ``t``; only it acts and is updated. Every instance is a fresh GP-UCB
  (Algorithm 8 on the finite-arm posterior, β on the **GP** sd), started when its interval starts.
* ``f̃_t = max_x UCB_t(x)`` of the active instance, ``U_t = min_{τ∈[t_n,t]} f̃_τ``;
  ``ρ(τ) = β̄·sqrt(γ̄ log(T/δ)/τ)`` with ``γ̄ = γ_T`` (½ log det at the optimal design, computed once)
  and ``β̄ = 1 + sqrt(2(γ̄ + 1 + ln 1/δ))`` — so the scheduling probability is ``2^{(m−n)/2}``;
  ``ρ̂(τ) = C_M·log(T/δ)·log₂T·ρ(τ)``.
* Restart (new epoch, ``n = 0``) if (Test 1) an order-``m`` instance ends at ``t`` and the mean
  reward it observed is ``≥ U_t + 9ρ̂(2^m)``, or (Test 2) ``(1/(t−t_n+1)) Σ_{τ=t_n}^t (f̃_τ − y_τ) ≥
  3ρ̂(t − t_n + 1)``.

``c_master`` (``C_M``) is a free constant; with ``C_M`` of order one the thresholds are far above
any reward gap at ``T = 10⁴`` (the theory constants are conservative), so restarts need a small
``C_M``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from gpytorch.kernels import Kernel
from torch import Tensor, nn

from ..confidence.gain import GainBeta
from ..design import information_gain
from ..kernels import check_kernel
from ..models.features import kernel_features
from ..models.finite_arm import FiniteArmRidge
from ..validation import check_positive, check_probability, match_rows, same_rows
from .base import Policy
from .schedule import Schedule, sample_schedule

__all__ = ["MasterGPUCB"]


class MasterGPUCB(Policy):
    """MASTER-GP-UCB (reconstructed; see the module docstring).

    Args:
        kernel: known kernel; horizon: ``T``; lam: GP-UCB ridge λ; ucb_scale: ``v``;
        delta: δ; c_master: ``C_M``.

    Examples:
        >>> import torch
        >>> from torchbandits import make_kernel
        >>> from torchbandits.policies.master import MasterGPUCB
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> f = lambda x: torch.exp(-((x - 0.7) ** 2).sum(-1) / 0.02)  # noiseless, best arm 7
        >>> policy = MasterGPUCB(make_kernel("rbf", 0.2), 40, lam=0.01)
        >>> for _ in range(30):
        ...     i = policy.select(arms)
        ...     policy.update(arms[i], f(arms[i]))
        >>> policy(arms).shape  # the active GP-UCB instance's UCB
        torch.Size([11])
        >>> sorted(policy.diagnostics())
        ['block', 'epoch', 'last_restart', 'restarts']
    """

    def __init__(self, kernel: Kernel, horizon: int, lam: float = 1.0, ucb_scale: float = 1.0, *,
                 delta: float = 0.01, c_master: float = 1.0, seed: int = 0,
                 dtype: torch.dtype = torch.float64, device: torch.device | str | None = None) -> None:
        check_kernel(kernel)
        super().__init__(seed=seed, n_warmup=0, dtype=dtype, device=device)
        if int(horizon) < 2:
            raise ValueError(f"horizon must be >= 2, got {horizon}")
        self.kernel = kernel.to(dtype=dtype, device=device)
        self.horizon = int(horizon)
        self.lam = check_positive("lam", lam)
        self.delta = check_probability("delta", delta)
        self.c_master = check_positive("c_master", c_master)
        self.rule = GainBeta(ucb_scale, delta=delta)
        self.register_buffer("arms", torch.zeros(0, dtype=dtype, device=device))
        self.register_buffer("phi", torch.zeros(0, dtype=dtype, device=device))
        self._clear()

    def _clear(self) -> None:
        self.ready = False
        self.gamma_bar = math.nan
        self.epoch = 0
        self.block = 0
        self.block_start = 1
        self.schedule: Schedule | None = None
        self.instances = nn.ModuleDict()   # "m_start" → FiniteArmRidge (moved by .to, saved)
        self.inst_sum: dict[tuple[int, int], float] = {}
        self.inst_cnt: dict[tuple[int, int], int] = {}
        self.u_min = math.inf
        self.gap_sum = 0.0
        self.restart_times: list[int] = []
        self._last: tuple[tuple[int, int], float] | None = None

    def _reset(self) -> None:
        self._clear()
        self.arms = torch.zeros(0, dtype=self.dtype, device=self.device)
        self.phi = torch.zeros(0, dtype=self.dtype, device=self.device)

    # ------------------------------------------------------------------ state
    @staticmethod
    def _name(key: tuple[int, int]) -> str:
        return f"{key[0]}_{key[1]}"

    def _new_instance(self) -> FiniteArmRidge:
        return FiniteArmRidge(self.kernel, self.lam, arms=self.arms, features=self.phi,
                              dtype=self.dtype, device=self.device)

    def _extra_state(self) -> dict[str, Any]:
        """Everything but the buffers, as ints, floats, bools and lists (``weights_only`` loads
        it): the block, its schedule, the per-instance sums and counts, the test statistics."""
        keys = [list(k) for k in self.inst_cnt]
        return {"ready": self.ready, "gamma_bar": self.gamma_bar, "epoch": self.epoch,
                "block": self.block, "block_start": self.block_start,
                "schedule": None if self.schedule is None else list(self.schedule.to_state()),
                "inst_keys": keys, "inst_sum": [self.inst_sum[tuple(k)] for k in keys],
                "inst_cnt": [self.inst_cnt[tuple(k)] for k in keys], "u_min": self.u_min,
                "gap_sum": self.gap_sum, "restart_times": list(self.restart_times),
                "last": None if self._last is None else [*self._last[0], self._last[1]]}

    def _set_extra_state(self, state: dict[str, Any]) -> None:
        self.ready = bool(state["ready"])
        self.gamma_bar = float(state["gamma_bar"])
        self.epoch, self.block = int(state["epoch"]), int(state["block"])
        self.block_start = int(state["block_start"])
        sched = state["schedule"]
        self.schedule = None if sched is None else Schedule.from_state(tuple(sched))
        keys = [(int(a), int(b)) for a, b in state["inst_keys"]]
        self.inst_sum = dict(zip(keys, (float(v) for v in state["inst_sum"])))
        self.inst_cnt = dict(zip(keys, (int(v) for v in state["inst_cnt"])))
        # fresh instances under the saved names; load_state_dict fills them in next (children
        # are loaded after their parent's extra state)
        self.instances = nn.ModuleDict({self._name(k): self._new_instance() for k in keys})
        self.u_min, self.gap_sum = float(state["u_min"]), float(state["gap_sum"])
        self.restart_times = [int(v) for v in state["restart_times"]]
        last = state["last"]
        self._last = None if last is None else ((int(last[0]), int(last[1])), float(last[2]))

    # ------------------------------------------------------------------ constants
    def rho(self, tau: float) -> float:
        """``ρ(τ) = β̄·sqrt(γ̄ log(T/δ)/τ)`` (module docstring), ``τ`` clipped below at 1."""
        g = self.gamma_bar
        beta = 1.0 + math.sqrt(2.0 * (g + 1.0 + math.log(1.0 / self.delta)))
        return beta * math.sqrt(g * math.log(self.horizon / self.delta) / max(tau, 1.0))

    def rho_hat(self, tau: float) -> float:
        """``ρ̂(τ) = C_M·log(T/δ)·log₂T·ρ(τ)``, the scale of both restart tests."""
        return (self.c_master * math.log(self.horizon / self.delta) * math.log2(self.horizon)
                * self.rho(tau))

    # ------------------------------------------------------------------ blocks
    def _setup(self, arms: Tensor) -> None:
        self.arms = arms.clone()
        self.phi = kernel_features(self.kernel, self.arms)
        self.gamma_bar = information_gain(self.phi, self.horizon, self.lam, convention="half")
        self.ready = True
        self._start_block(1, 0)

    def _start_block(self, s: int, n: int) -> None:
        self.block, self.block_start = n, s
        self.schedule = sample_schedule(s, n, 1, self.generator)
        self.instances = nn.ModuleDict()
        self.inst_sum, self.inst_cnt = {}, {}
        self.u_min = math.inf
        self.gap_sum = 0.0

    def _active(self, s: int) -> tuple[int, int]:
        m = self.schedule.active_index(s)
        slot = 2**m
        start = self.block_start + ((s - self.block_start) // slot) * slot
        key = (m, start)
        if key not in self.inst_cnt:
            self.instances[self._name(key)] = self._new_instance()
            self.inst_sum[key], self.inst_cnt[key] = 0.0, 0
        return key

    # ------------------------------------------------------------------ contract
    def forward(self, candidates: Tensor) -> Tensor:
        cand = self.check_candidates(candidates)
        if not self.ready:
            self._setup(cand)
        elif not same_rows(self.arms, cand):
            raise ValueError("candidates must be the same fixed arm set on every round "
                             f"({tuple(self.arms.shape)}); call reset() for a new arm set")
        key = self._active(self.t + 1)
        return self.rule.bounds(self.instances[self._name(key)], self.arms, self.t + 1)[0]

    def select(self, candidates: Any) -> int:
        with torch.no_grad():
            scores = self(candidates)
        idx = int(torch.argmax(scores))
        self._last = (self._active(self.t + 1), float(scores[idx]))
        return idx

    def _update(self, x: Tensor, reward: float) -> None:
        if not self.ready:
            raise ValueError("update() before the first select(): the arm set is unknown")
        match_rows("x", self.arms, x)    # x must be an arm: checked before any state change
        s = self.t + 1
        key = self._active(s)
        model = self.instances[self._name(key)]
        model.append(x, reward)          # validates x (must be an arm) before the rest
        if self._last is not None and self._last[0] == key:
            f_tilde = self._last[1]
        else:
            f_tilde = float(self.rule.bounds(model, self.arms, s)[0].max())
        self._last = None
        self.inst_sum[key] += reward
        self.inst_cnt[key] += 1
        self.u_min = min(self.u_min, f_tilde)
        self.gap_sum += f_tilde - reward
        restart = False
        for rep in self.schedule.ending_at(s):
            k = (rep.index, rep.start)
            if self.inst_cnt.get(k, 0) > 0:
                mean = self.inst_sum[k] / self.inst_cnt[k]
                if mean >= self.u_min + 9.0 * self.rho_hat(2**rep.index):
                    restart = True
        elapsed = s - self.block_start + 1
        if self.gap_sum / elapsed >= 3.0 * self.rho_hat(elapsed):
            restart = True
        if restart:
            self.restart_times.append(s)
            self.epoch += 1
            self._start_block(s + 1, 0)
        elif s == self.schedule.end:
            self._start_block(s + 1, self.block + 1)

    def diagnostics(self) -> dict[str, float]:
        return {"block": float(self.block), "epoch": float(self.epoch),
                "restarts": float(len(self.restart_times)),
                "last_restart": float(self.restart_times[-1]) if self.restart_times else 0.0}

    def extra_repr(self) -> str:
        return f"horizon={self.horizon}, lam={self.lam}, c_master={self.c_master}"
