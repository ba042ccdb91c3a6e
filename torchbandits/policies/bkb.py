"""BKB — Budgeted Kernelized Bandit (Calandriello, Carratino, Lazaric, Valko & Rosasco, COLT 2019).

GP-UCB on a Nyström (DTC) posterior whose dictionary is **resampled from scratch every round** by
ridge-leverage-score sampling over all pulled points (§3.1, Fig. 1):

* score ``ũ_t(x) = μ̃_t(x) + β̃_t · σ̃_t(x)`` (eq. 4) with the **1/λ-scaled (ridge) DTC variance**
  ``σ̃_t²(x) = (k(x,x) − ‖z_t(x)‖²)/λ + z_t(x)ᵀ V_t⁻¹ z_t(x)``: β̃_t multiplies the **ridge** sd
  ``sqrt(var_GP/λ)``, as in K-UCB (the model's GP-scale variance is ``λ σ̃_t²``);
* β̃_t: :class:`~torchbandits.confidence.bkb.BKBBeta` (``"paper"``: Theorem 2 / App. D.1 with a
  guarded log term; ``"authors_code"``; ``"constant"``), ``S_t = Σ_a n_a σ̃_t²(a)``;
* after the pull each distinct pulled arm ``a`` gets ``c_a ~ Binomial(n_a, min(q̄ σ̃_t²(a), 1))``
  copies, with the variances of the model that chose the new arm (§3.1); the dictionary is
  ``{a : c_a > 0}`` (:class:`~torchbandits.models.rls.RLSResampler`).

Count-based caching (§3.2): with pull counts ``n_a`` and reward sums ``b_a``, ``V = Σ_a n_a z_a
z_aᵀ + λI`` and ``Zᵀy = Σ_a b_a z_a``, so a round costs ``O((A + n_distinct) m² + m³)``, not
``O(t m²)`` (``NystromKernelRidge.rebuild_from_counts``); with a fixed arm set the pulled arms'
variances are read off the candidates', their kernel rows are cached (``ArmRowCache``) and the
round's rebuild and scoring are one pass over the cached rows that writes no model buffer
(:func:`~torchbandits.models.nystrom_arms.dtc_round`, via :class:`.bkb_posterior.BKBPosterior`,
with ``K_ZP`` gathered by rows from the pulled points' cached Gram matrix; the model is rebuilt on
demand, e.g. for :meth:`BKB.posterior`).

``variance="sor"`` (the variance-starvation ablation, §3.2, Fig. 2) scores with the
subset-of-regressors variance ``z_t(x)ᵀ V_t⁻¹ z_t(x)`` but draws its dictionary with the DTC
variances (the SoR ones never leave the empty dictionary), so BKB and its ablation share them.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..buffers import grow_rows, set_plain
from ..confidence.bkb import BetaRule, BKBBeta
from ..kernels import check_kernel, kernel_diag
from ..models.arm_rows import ArmRowCache, is_row_view
from ..models.exact import ExactKernelRidge
from ..models.nystrom import NystromKernelRidge
from ..models.nystrom_arms import tensor_version
from ..models.rls import RLSResampler, Sampler, theory_qbar
from ..native import bkb as native_bkb
from ..validation import as_scalar_reward, check_positive
from .bkb_batched import with_batch_mode
from .bkb_posterior import BKBPosterior

__all__ = ["BKB"]

VarianceKind = Literal["dtc", "sor"]


@with_batch_mode  # batched mode: reset(seed=[...]), see policies.bkb_batched
class BKB(BKBPosterior):
    """BKB for a finite arm set (Calandriello et al. 2019, Fig. 1).

    β multiplies the **ridge** (1/λ-scaled) sd ``σ̃_t(x) = sqrt(var_GP(x)/λ)``.

    Args:
        kernel: GPyTorch kernel on the arm features.
        lam: regulariser λ > 0 (default ``noise_std²``, the GP reading λ = ξ² of §2.1).
        noise_std: ξ, the sub-Gaussian noise scale used in β̃_t.
        norm_bound: F ≥ ‖f‖_H.
        eps: ε ∈ (0, 1) (α = (1+ε)/(1−ε)), used by β̃_t (and the theory q̄).
        delta: δ ∈ (0, 1).
        qbar: oversampling q̄ (float, our practical default 5) or ``"theory"``
            (6α log(4T/δ)/ε² of Theorem 1, needs ``horizon``).
        horizon: T, only for ``qbar="theory"``.
        sampler: ``"binomial"`` (paper), ``"linearized"`` (authors' code), ``"all"`` (every pulled
            arm: the exact-GP limit), ``"uniform"`` (ablation); see :mod:`torchbandits.models.rls`.
        beta_rule: ``"paper"`` (β̃_t of Theorem 2, guarded), ``"authors_code"``, or ``"constant"``.
        beta: the constant for ``beta_rule="constant"`` (ridge sd).
        beta_scale: multiplies β̃_t.
        variance: ``"dtc"`` (BKB) or ``"sor"`` (ablation: starves far from the dictionary; the
            sampler keeps the DTC variances).
        track_exact: also keep the exact posterior, report min / max of σ̃²/σ² per round (O(tA)).
        jitter: passed to the Nyström model. seed, n_warmup, dtype, device: see
            :class:`~torchbandits.policies.base.Policy` (first arm uniform, ``S_1 = {x̃_1}``, §3.1).

    Examples:
        >>> import torch
        >>> from torchbandits import make_kernel
        >>> from torchbandits.policies import BKB
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d]; noiseless f, best arm 7
        >>> f = lambda x: torch.exp(-((x - 0.7) ** 2).sum(-1) / 0.02)
        >>> policy = BKB(make_kernel("rbf", 0.2), beta_rule="constant", beta=0.3, seed=0)
        >>> for _ in range(30):
        ...     policy.update(arms[i := policy.select(arms)], f(arms[i]))
        >>> policy.select(arms) == 7, policy(arms).shape, policy.dictionary_size <= 30
        (True, torch.Size([11]), True)
    """
    batch_pays_from = 3  # --batch auto on the CPU: from 3 seeds (benchmarks/bench_batch_crossover.py)

    def __init__(
        self,
        kernel: Kernel,
        lam: float | None = None,
        *,
        noise_std: float = 0.1,
        norm_bound: float = 1.0,
        eps: float = 0.5,
        delta: float = 0.1,
        qbar: float | str = 5.0,
        horizon: int | None = None,
        sampler: Sampler = "binomial",
        beta_rule: BetaRule = "paper",
        beta: float = 1.0,
        beta_scale: float = 1.0,
        variance: VarianceKind = "dtc",
        track_exact: bool = False,
        jitter: float = 0.0,
        seed: int = 0,
        n_warmup: int = 1,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> None:
        check_kernel(kernel)
        noise_std = check_positive("noise_std", noise_std)
        lam = noise_std**2 if lam is None else check_positive("lam", lam)
        self.rule = BKBBeta(beta_rule, beta=beta, norm_bound=norm_bound, noise_std=noise_std,
                            eps=eps, delta=delta, beta_scale=beta_scale)
        if isinstance(qbar, str):
            if qbar != "theory":
                raise ValueError(f"qbar must be a positive number or 'theory', got {qbar!r}")
            if horizon is None:
                raise ValueError("horizon is required with qbar='theory'")
            qbar = theory_qbar(eps, delta, horizon)
        self.resampler = RLSResampler(qbar, sampler)
        if variance not in ("dtc", "sor"):
            raise ValueError(f"variance must be 'dtc' or 'sor', got {variance!r}")
        super().__init__(seed=seed, n_warmup=n_warmup, dtype=dtype, device=device)
        self.variance_kind: VarianceKind = variance
        self.model = NystromKernelRidge(kernel, lam, jitter=jitter, dtype=dtype, device=device)
        self.kernel = self._nys.kernel
        self.track_exact = bool(track_exact)
        self.exact = (ExactKernelRidge(copy.deepcopy(self.kernel), lam, dtype=dtype, device=device)
                      if self.track_exact else None)
        # count-based statistics over the distinct pulled points (§3.2)
        self.register_buffer("_px", torch.zeros(0, 0, dtype=dtype, device=device))
        self.register_buffer("_counts", torch.zeros(16, dtype=dtype, device=device))
        self.register_buffer("_sums", torch.zeros(16, dtype=dtype, device=device))
        self.register_buffer("_in_dict", torch.zeros(16, dtype=torch.bool, device=device))
        self._np = 0
        self._m_theory: int | Tensor = 0
        self._empty_dictionaries = 0
        self._last: dict[str, float] = {}
        self._view_cache: tuple[Any, ...] | None = None  # see _views
        self.arm_rows = ArmRowCache()
        self._invalidate()

    @property
    def lam(self) -> float:
        """The model's ridge regulariser λ."""
        return float(self._nys.lam)

    @property
    def qbar(self) -> float:
        """The oversampling constant q̄ of the ridge-leverage resampling."""
        return self.resampler.qbar

    @property
    def n_distinct(self) -> int:
        """Number of distinct pulled points."""
        return self._np

    @property
    def pulled(self) -> Tensor:
        """Distinct pulled points ``[n_distinct, d]``."""
        return self._views()[0]

    @property
    def counts(self) -> Tensor:
        """Pull counts ``n_a`` of the distinct pulled points."""
        return self._views()[1]

    @property
    def sums(self) -> Tensor:
        """Reward sums ``b_a`` of the distinct pulled points."""
        return self._views()[2]

    @property
    def dictionary_mask(self) -> Tensor:
        """Which distinct pulled points form the current dictionary."""
        return self._views()[3]

    @property
    def dictionary(self) -> Tensor:
        """The dictionary ``S_t`` ``[m, d]``."""
        return self.pulled[self.dictionary_mask]

    @property
    def dictionary_size(self) -> int:
        """Number of arms in the current dictionary (m_t)."""
        return int(self.dictionary_mask.sum())

    def _invalidate(self) -> None:
        self._model_ok = False
        self._view_cache = None
        self._scored: dict[str, Any] | None = None  # variances of the current model, last forward
        self._sel: Tensor | None = None  # the dictionary's positions among the pulled points
        self._gram: tuple[Any, ...] | None = None  # K_PP of the pulled points, see _pulled_gram
        self._seen: tuple[Tensor, int] | None = None  # see check_candidates
        self.arm_rows.clear()  # derived data: rebuilt on demand

    def _apply(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._invalidate()
        return super()._apply(fn, *args, **kwargs)

    def _extra_state(self) -> dict[str, Any]:
        return {"np": self._np, "m_theory": int(self._m_theory), "empty": self._empty_dictionaries,
                "last": dict(self._last)}

    def _set_extra_state(self, state: dict[str, Any]) -> None:
        self._np = int(state["np"])
        self._m_theory = int(state["m_theory"])
        self._empty_dictionaries = int(state["empty"])
        self._last = dict(state["last"])
        self._invalidate()

    def _reset(self) -> None:
        self._np = 0
        self._m_theory = 0
        self._empty_dictionaries = 0
        self._last = {}
        self._counts.zero_()
        self._sums.zero_()
        self._in_dict.zero_()
        self._nys.reset()
        if self.exact is not None:
            self.exact.reset()
        self._invalidate()

    @torch.no_grad()
    def posterior(self, candidates: Any) -> tuple[Tensor, Tensor, Tensor]:
        """``(μ̃_t, σ̃_t² (ridge, 1/λ-scaled), λσ̃_t² (GP scale))`` at ``candidates`` (eq. 4 and its GP scale);
        the SoR variance when ``variance="sor"``."""
        cand = self.check_candidates(candidates)
        mean, _, used = self._dtc(cand)
        return mean, used, used * self.lam

    def check_candidates(self, candidates: Any) -> Tensor:
        """Validated candidates ``[A, d]``; the fixed arm set seen before (found equal to the cached
        copy, which was validated then) is not validated again, and the very tensor last found
        equal is not compared again while its in-place modification counter stands still."""
        seen = self._seen
        if seen is not None and candidates is seen[0] and tensor_version(candidates) == seen[1]:
            return candidates
        if self.arm_rows.same_arms(candidates):
            set_plain(self, "_seen", (candidates, tensor_version(candidates)))
            return candidates
        set_plain(self, "_seen", None)
        return super().check_candidates(candidates)

    def select(self, candidates: Any) -> int:
        """Argmax of :meth:`forward` (first on ties), validating once; the choice is remembered
        so that :meth:`update` finds its row without a search."""
        cand = self.check_candidates(candidates)
        if self.t < self.n_warmup:
            return self.warmup_choice(cand)
        with torch.no_grad():
            ucb = self._ucb(cand)
        sc = self._scored
        i = sc["argmax"] if sc["argmax"] is not None else int(torch.argmax(ucb))  # type: ignore[index]
        sc["choice"], sc["version"] = i, tensor_version(cand)  # type: ignore[index]
        return i

    def update(self, x: Any, reward: Any) -> None:
        """:meth:`Policy.update <torchbandits.policies.base.Policy.update>`; the row that
        :meth:`select` chose, passed as the view ``candidates[i]`` of candidates not modified
        in place since (validated then), is not validated again."""
        sc = self._scored
        if (sc is not None and self.dim is not None and isinstance(x, Tensor)
                and is_row_view(x, sc["cand"], sc.get("choice", -1))
                and sc.get("version") == tensor_version(sc["cand"])):
            r = as_scalar_reward("reward", reward)
            with torch.no_grad():
                self._record(x, r, sc["choice"])
            set_plain(self, "t", self.t + 1)
            return
        super().update(x, reward)

    def forward(self, candidates: Tensor) -> Tensor:
        """``ũ_t(x) = μ̃_t(x) + β̃_t σ̃_t(x)`` of every candidate (ridge sd, eq. 4)."""
        return self._ucb(self.check_candidates(candidates))

    def _ucb(self, cand: Tensor) -> Tensor:  # forward on validated candidates [A, d]
        nat = self._native_round(cand)  # the fused route in C, or None (bkb_posterior)
        if nat is None:
            mean, var, used, pvar, pused, idx = self._round_posterior(cand)
            sum_var = float(torch.dot(self._views()[1], pused)) if self._np else 0.0
        else:  # the pulled points' variances are read off var by the draw
            (mean, var, sum_var, idx), pvar = nat, None
            used = var
        model = self._nys
        kc, lam = model.kernel_constant, float(model.lam)
        kappa2 = kc if kc is not None else float(kernel_diag(self.kernel, cand).max())
        beta = self.rule.radius(sum_var, self.t, kappa2, lam)
        sc = {"cand": cand, "var": var, "pvar": pvar, "idx": idx, "argmax": None}
        set_plain(self, "_scored", sc)
        self._last.update(beta=beta, sum_var=sum_var, kappa2=kappa2)
        if self.exact is not None:
            if self.exact.n:
                _, ev = self.exact.mean_var(cand)
                ratio = used * lam / ev.clamp_min(1e-300)
            else:
                ratio = torch.ones_like(used)
            self._last.update(var_ratio_min=float(ratio.min()), var_ratio_max=float(ratio.max()))
        sd = torch.sqrt(used)  # variances are clamped at 0 already
        fast = native_bkb.ucb_argmax(mean, sd, beta)  # (ũ, argmax) in C (the same bits), or None
        if fast is not None:
            sc["argmax"] = fast[1]
            return fast[0]
        return torch.add(mean, sd, alpha=beta)

    def _update(self, x: Tensor, reward: float) -> None:
        row = -1  # x's row among the last scored candidates (else the cached arm set), or -1
        sc = self._scored
        ref = sc["cand"] if sc is not None else self.arm_rows.arms
        if sc is not None and is_row_view(x, ref, sc.get("choice", -1)):
            row = sc["choice"]  # the arm just selected (no search)
        elif ref is not None:
            hit = (ref == x).all(-1).nonzero()
            row = int(hit[0, 0]) if hit.numel() else -1
        self._record(x, reward, row)

    def _record(self, x: Tensor, reward: float, row: int) -> None:
        """The pull of the trusted point ``x`` ``[d]`` at ``row`` of the last scored candidates
        (``-1``: not among them): count statistics and a fresh dictionary."""
        # 1. σ̃_t² of the model that chose x, at every distinct pulled point and at x (§3.1)
        sc = self._scored
        n = self._np
        known = sc is not None
        nat = known and row >= 0 and sc["pvar"] is None and sc["idx"] is not None  # type: ignore[index]
        if row >= 0 and known:
            pvar, xvar = sc["pvar"], None  # x's own variance is read below if x is new
        else:
            pts = torch.cat([self.pulled, x[None]]) if n else x[None]
            allv = self._dtc(pts)[1]
            pvar, xvar = allv[:-1], allv[-1:]
        # 2. count statistics (x's distinct point: by arm row on a fixed arm set, else compared)
        if known and row >= 0 and sc["idx"] is not None:  # type: ignore[index]
            j = self.arm_rows.position(row)
        else:
            same = (self.pulled == x).all(-1).nonzero() if n else x.new_zeros(0, 1)
            j = int(same[0, 0]) if same.numel() else -1
        if j >= 0:
            variances = pvar
        else:
            j = n
            if self._px.shape[0] == 0:
                self._px = x.new_zeros(16, x.shape[0])
            self._px = grow_rows(self._px, n + 1)
            self._counts = grow_rows(self._counts, n + 1)
            self._sums = grow_rows(self._sums, n + 1)
            self._in_dict = grow_rows(self._in_dict, n + 1)
            self._px[n] = x
            self._np = n + 1
            if not nat:
                variances = torch.cat([pvar, sc["var"][row:row + 1] if xvar is None else xvar])  # type: ignore[index]
            self.arm_rows.push(row)
        _, counts, sums, in_dict = self._views()
        counts.select(0, j).add_(1.0)
        sums.select(0, j).add_(reward)
        if self.exact is not None:
            self.exact.append(x, reward)
        # 3. resample the dictionary from scratch (§3.1), the mask written into its buffer; after
        # a round scored in C the pulled points' variances are var[idx] (x's row pushed last)
        copies, sel = None, self._native_draw(sc["var"], counts, in_dict) if nat else None  # type: ignore[index]
        if sel is None:
            if nat:
                variances = sc["var"].index_select(0, self.arm_rows.idx)  # type: ignore[index, arg-type]
            mask, copies = self.resampler.draw(variances, counts, self.generator, out=in_dict)
            sel = mask.nonzero().view(-1)  # m (a host int): the one sync the draw needs
        # the per-round attributes are plain ones: set without Module.__setattr__'s checks
        set_plain(self, "_sel", sel)
        # Σ copies (Theorem 1's multiset size), read when asked for (no sync here)
        set_plain(self, "_m_theory", sel.shape[0] if copies is None else copies.sum())
        if not sel.shape[0]:
            self._empty_dictionaries += 1
        set_plain(self, "_model_ok", False)
        set_plain(self, "_scored", None)

    def diagnostics(self) -> dict[str, float]:
        out = {"dictionary_size": float(self.dictionary_size), "m_theory": float(self._m_theory),
               "n_distinct": float(self._np), "empty_dictionaries": float(self._empty_dictionaries)}
        rank = getattr(self._nys, "rank", None)
        if isinstance(rank, (int, float)):
            out["rank"] = float(rank)
        for k in ("beta", "sum_var", "var_ratio_min", "var_ratio_max"):
            if k in self._last:
                out[k] = float(self._last[k])
        return out

    def extra_repr(self) -> str:
        return (f"lam={self.lam}, qbar={self.qbar:.4g}, sampler={self.resampler.sampler!r}, "
                f"rule={self.rule!r}, variance={self.variance_kind!r}")

