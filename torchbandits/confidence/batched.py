"""Confidence widths of ``R`` runs at once, on a :class:`~torchbandits.models.batched_exact.
BatchedExactKernelRidge` (a leading run dimension; the batched mode of K-UCB / GP-UCB).

Each rule gives run ``r`` what its sequential ``bounds`` gives the sequential run ``r``, with the
same formulas in the same order of operations (the numbers agree to rounding: a batched BLAS
call may sum in another order). The pure pieces of the sequential rules are reused where their
shapes allow; the few restated here work for any leading shape ``[*]`` (``[R]`` for the runs):

* radius rules (``UCB = μ + β_t·sd``, :func:`batched_radius`): constant β, the K-UCB radius of
  Zenati et al. (2022, Lemma 3.1), IGP-UCB (Chowdhury & Gopalan 2017, Thm 2), GP-UCB of
  Srinivas et al. (2010, Thm 1 and Thm 3), Abbasi-Yadkori (2012, Thm 3.11), and AMM of Flynn &
  Reeb (2024, §5.5, Cor. 4.6 with Lemma C.2), each with every run's own log-det;
* DMM (Flynn & Reeb 2024, §5.4): the minimum of Eq. (14) over the grid ``{0.1, 0.3, 1, 3, 10}·α₀``
  per query, the posteriors at the grid from one companion model of ``R·G`` runs
  (:meth:`~torchbandits.models.batched_exact.BatchedExactKernelRidge.at_regularisers`);
* CMM by its 1-D dual (Flynn & Reeb 2024, Thm. 4.5 / Eq. 12): one batched ``eigh`` of the ``R``
  Gram matrices, then the α search of :func:`~torchbandits.confidence.alpha_search.min_over_alpha`
  run for every run and query at once (the sequential code's grid and safeguarded Newton steps).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ..deferred_checks import to_device
from ..kernels import kernel_diag, kernel_matrix
from ..models.batched_exact import BatchedExactKernelRidge
from .alpha_search import SIDES, dual_objective, dual_slopes, log_alpha_grid, min_over_alpha
from .amm_dmm import AMMBound, DMMBound
from .base import ConfidenceRule, ConstantBeta
from .cmm_dual import CMMBound
from .radii import AYBeta, IGPBeta, KernelUCBTheoryBeta, SrinivasBeta

__all__ = ["BATCHED_RULES", "batched_bounds", "batched_dual_ucb", "batched_radius",
           "batched_radius_sq", "why_not_rule"]

#: the confidence rules whose bounds :func:`batched_bounds` computes for ``R`` runs at once
BATCHED_RULES = (ConstantBeta, KernelUCBTheoryBeta, IGPBeta, SrinivasBeta, AYBeta, AMMBound,
                 DMMBound, CMMBound)


def why_not_rule(rule: ConfidenceRule, regularisers: tuple[float, ...]) -> str | None:
    """``None`` if ``rule`` batches on a model whose regularisers are ``regularisers`` (``λ``
    first, then the extras the sequential model maintains for the rule), else the reason."""
    kind = type(rule)
    name = kind.__name__
    if kind not in BATCHED_RULES:
        return f"{name} has no batched width (batched: {', '.join(k.__name__ for k in BATCHED_RULES)})"
    lam, extra = regularisers[0], regularisers[1:]
    if kind is CMMBound and rule.method != "dual":
        return "CMMBound(method='socp') (a CVXPY program per query) runs sequentially"
    if isinstance(rule, (AMMBound, DMMBound, CMMBound)):
        if lam != rule.alpha0:
            return f"{name} on a model at λ = {lam} ≠ σ²/c = {rule.alpha0} (not batched)"
        if kind is AMMBound and rule.alpha is not None and rule.alpha != rule.alpha0:
            return "AMMBound with its own alpha (not batched)"
        return None   # DMM's grid is served by the companion model, whatever the extras
    if extra:
        return f"{name} takes the posterior at a second regulariser {extra} (not batched)"
    return None


def why_not_per_run_lam(rule: ConfidenceRule) -> str | None:
    """``None`` if a per-run λ ``[R]`` batches with ``rule``, else the reason. With AMM and DMM
    a per-run λ is a per-run ``α₀ = σ²/c``, i.e. run ``r`` is the policy built with
    ``c_r = σ²/λ_r``; CMM's α search shares one log-grid around α₀ (not batched)."""
    if isinstance(rule, CMMBound):
        return "CMMBound searches α on one grid around σ²/c; per-run λ is not batched with it"
    return None


def batched_radius(rule: ConfidenceRule, model: BatchedExactKernelRidge,
                   beta: Tensor | None = None, *, n_candidates: int = 0, t: int = 1,
                   per_run_lam: bool = False) -> Tensor:
    """β_t of every run ``[R]`` for a radius rule (the same formulas, in the same order of
    operations, as the rules' sequential ``radius``; ``t`` is the round being played):

    * :class:`~torchbandits.confidence.ConstantBeta`: ``β`` (or the per-run ``beta`` ``[R]``);
    * :class:`~torchbandits.confidence.KernelUCBTheoryBeta` (Zenati et al. 2022, Lemma 3.1):
      ``√λ_r·B + σ·sqrt(2 log(1/δ) + log det(I + K_r/λ_r))``;
    * :class:`~torchbandits.confidence.IGPBeta` (Chowdhury & Gopalan 2017, Thm 2):
      ``B + σ·sqrt(log det(I + K_r/(1+η)) + c_η + 2 log(1/δ))``, the model's λ being ``1 + η``;
    * :class:`~torchbandits.confidence.SrinivasBeta` (Srinivas et al. 2010): finite arm set
      (Thm 1) ``sqrt(2 log(A t² π²/(6δ)))``, the same for every run; RKHS (Thm 3)
      ``sqrt(2B² + 300 γ_r log³(t/δ))`` with ``γ_r = ½ log det(I + K_r/λ_r)``;
    * :class:`~torchbandits.confidence.AYBeta` (Abbasi-Yadkori 2012, Thm 3.11):
      ``σ·sqrt(log det(I + K_r/λ) + 2 log(1/δ))/√λ + B``, the model's λ being the rule's;
    * :class:`~torchbandits.confidence.AMMBound` (Flynn & Reeb 2024, Cor. 4.6 with Lemma C.2):
      ``sqrt(c log det(I + cK_r/σ²) + 2c log(1/δ) + B²)``, the model's λ being ``σ²/c``
      (``per_run_lam``: ``c_r = σ²/λ_r``, one value per run).
    """
    kind = type(rule)
    if kind is ConstantBeta:
        return beta if beta is not None else model.lam.new_full((model.n_runs,), rule.beta)
    if kind is KernelUCBTheoryBeta:
        inner = 2.0 * math.log(1.0 / rule.delta) + model.log_det()
        return torch.sqrt(model.lam) * rule.norm_bound + rule.noise_scale * torch.sqrt(inner)
    if kind is IGPBeta:
        extra = model.n * rule.eta if rule.use_t_eta else 2.0
        inner = model.log_det() + extra + 2.0 * math.log(1.0 / rule.delta)
        return rule.norm_bound + rule.noise_scale * torch.sqrt(inner)
    if kind is SrinivasBeta:
        if rule.mode == "finite":
            b = 2.0 * math.log(n_candidates * t * t * math.pi**2 / (6.0 * rule.delta))
            return model.lam.new_full((model.n_runs,), math.sqrt(max(b, 0.0)))
        gamma = 0.5 * model.log_det()
        log_term = max(math.log(t / rule.delta), 0.0)
        return torch.sqrt(2.0 * rule.norm_bound**2 + 300.0 * gamma * log_term**3)
    if kind is AYBeta:
        inner = model.log_det() + 2.0 * math.log(1.0 / rule.delta)
        return rule.noise_scale * torch.sqrt(inner) / math.sqrt(rule.reg) + rule.norm_bound
    if kind is AMMBound:
        c = rule.noise_std**2 / model.lam if per_run_lam else rule.c
        return torch.sqrt(c * model.log_det() + 2.0 * c * math.log(1.0 / rule.delta)
                          + rule.norm_bound**2)
    raise ValueError(f"{kind.__name__} has no batched radius (radius rules: ConstantBeta, "
                     f"KernelUCBTheoryBeta, IGPBeta, SrinivasBeta, AYBeta, AMMBound)")


def batched_radius_sq(model: BatchedExactKernelRidge, noise_std: float, c: float,
                      delta: float, *, per_run_lam: bool = False) -> Tensor:
    """``R_t²`` of Eq. (8) (Flynn & Reeb 2024) of every run ``[R]``, stable form
    ``α₀ yᵀ(K+α₀I)⁻¹y + σ² log det(I + K/α₀) + 2σ² log(1/δ)`` on a model at ``λ = α₀ = σ²/c``
    (as :func:`~torchbandits.confidence.amm_dmm.radius_sq`; ``per_run_lam``: ``α₀ = λ_r``)."""
    s2 = noise_std**2
    a0 = model.lam if per_run_lam else s2 / c
    base = 2.0 * s2 * math.log(1.0 / delta)
    if model.n == 0:
        return model.lam.new_full((model.n_runs,), base)
    return a0 * model.quad_y() + s2 * model.log_det() + base


#: ``log`` of DMM's α grids on each dtype and device (read-only; made at the first round)
_LOG_GRIDS: dict[tuple[Any, ...], Tensor] = {}


def _dmm_terms(rule: DMMBound, model: BatchedExactKernelRidge, per_run_lam: bool = False
               ) -> tuple[BatchedExactKernelRidge, Tensor, Tensor]:
    """DMM's companion at ``α ∈ grid·α₀`` (Flynn & Reeb 2024, §5.4), ``R_t²`` ``[R]`` and the
    multipliers ``sqrt(R̃²_α/α)`` ``[R, G]``, ``R̃²_α = max(R_t² + αB² − α yᵀ(K+αI)⁻¹y, 0)``
    (Eq. 14 with Cor. 4.3 / Lemma C.1)."""
    g = len(rule.grid)
    r2 = batched_radius_sq(model, rule.noise_std, rule.c, rule.delta, per_run_lam=per_run_lam)
    comp = model.at_regularisers(rule.grid)
    alphas = comp.lam.reshape(-1, g)                                              # grid·α₀
    quad = comp.quad_y().reshape(-1, g)
    rt2 = torch.clamp(r2[:, None] + alphas * rule.norm_bound**2 - alphas * quad, min=0.0)
    return comp, r2, torch.sqrt(rt2 / alphas)


def _dmm_diag(rule: DMMBound, r2: Tensor, arg: Tensor) -> dict[str, Tensor]:
    """DMM's diagnostics: ``R_t²`` and ``log(α/α₀)`` of the grid point that sets the bound of
    each run's chosen candidate (``arg`` ``[R]``: the minimising grid index there)."""
    key = (tuple(rule.grid), r2.dtype, r2.device)        # log of the grid, made once
    if key not in _LOG_GRIDS:
        _LOG_GRIDS[key] = torch.log(to_device(torch.tensor(rule.grid, dtype=r2.dtype), r2.device))
    return {"r2": r2, "log_alpha_ratio": _LOG_GRIDS[key][arg]}


def _dmm_bounds(rule: DMMBound, model: BatchedExactKernelRidge, cand: Tensor,
                per_run_lam: bool = False, terms: tuple[Any, Tensor, Tensor] | None = None,
                which: str = "both") -> tuple[Tensor, Tensor | None, dict[str, Tensor], Tensor]:
    """DMM (Flynn & Reeb 2024, §5.4, Eq. 14 with Cor. 4.3 / Lemma C.1): per query the min over
    ``α ∈ grid·α₀`` of ``μ_α + sqrt(R̃²_α/α)·ρ_α`` (max of the LCBs, ``None`` unless
    ``which="both"``); ``[R, A]`` each, the diagnostics, and every run's UCB argmax ``[R]``."""
    n_runs, n_a = cand.shape[:2]
    g = len(rule.grid)
    comp, r2, mult = terms if terms is not None else _dmm_terms(rule, model, per_run_lam)
    mean, var = comp.mean_var_groups(cand, g)
    mean, var = mean.reshape(n_runs, g, n_a), var.reshape(n_runs, g, n_a)
    width = mult[..., None] * torch.sqrt(var)
    ucb, arg = (mean + width).min(1)
    lcb = (mean - width).max(1).values if which == "both" else None
    index = torch.argmax(ucb, dim=1)
    chosen = arg.gather(1, index[:, None])[:, 0]   # the minimising grid point at the argmax
    return ucb, lcb, _dmm_diag(rule, r2, chosen), index


def _compiled_argmax(rule: ConfidenceRule, model: BatchedExactKernelRidge, cand: Tensor, t: int,
                     beta: Tensor | None, per_run_lam: bool
                     ) -> tuple[tuple[Tensor, dict[str, Any]] | None, Any]:
    """``((index [R], diagnostics) or None, terms)``: every run's UCB argmax in one compiled call
    where the model's compiled step qualifies
    (:meth:`~torchbandits.models.batched_exact.BatchedExactKernelRidge.ucb_argmax`: the bound in
    its closed form ``min_g (sqrt(ρ²_g / div_g)·β_g + μ_g)``, the same numbers as
    :func:`batched_bounds`' ``μ + β·sd`` and DMM's minimum, and the first index on ties as
    ``torch.argmax``), with the diagnostics; ``None`` where it does not (asked first, from host
    metadata: elsewhere, e.g. on a GPU, nothing is computed here). ``terms``: the widths' terms
    computed on the way (β ``[R]``, or DMM's :func:`_dmm_terms`), for the caller's fallback to
    reuse; ``None`` if none were computed."""
    if type(rule) is CMMBound or not model.native_ready(cand):
        return None, None
    if type(rule) is DMMBound:
        terms = _dmm_terms(rule, model, per_run_lam)
        comp, r2, mult = terms
        got = comp.ucb_argmax(cand, mult.reshape(-1), torch.ones_like(comp.lam), mult.shape[1],
                              want_arg=True)
        return (None if got is None else (got[0], _dmm_diag(rule, r2, got[1]))), terms
    b = batched_radius(rule, model, beta, n_candidates=cand.shape[1], t=t,
                       per_run_lam=per_run_lam).to(cand)
    div = model.lam if rule.variance == "ridge" else torch.ones_like(model.lam)
    got = model.ucb_argmax(cand, b, div)
    return (None if got is None else (got[0], {"beta": b})), b


def batched_dual_ucb(evals: Tensor, evecs: Tensor, ytil: Tensor, kq: Tensor, kdiag: Tensor,
                     r2: Tensor, norm_bound: float, alpha0: float, *, which: str = "both",
                     grid_decades: float = 6.0, grid_per_decade: int = 4, steps: int = 3
                     ) -> tuple[Tensor | None, Tensor | None, Tensor]:
    """Exact CMM bounds by the 1-D dual (Flynn & Reeb 2024, Thm. 4.5 / Eq. 12) for a leading
    shape ``[*]`` of problems at once (``[R]`` runs): :func:`~torchbandits.confidence.cmm_dual.
    dual_bounds` restated with the leading dimensions.

    ``evals`` ``[*, t]``, ``evecs`` ``[*, t, t]`` and ``ytil = Qᵀy`` ``[*, t]`` of each Gram matrix,
    ``kq`` ``[*, t, A]``, ``kdiag`` ``[*, A]``, ``r2 = R_t²`` ``[*]``; ``α₀`` is shared (one
    log-grid). Per query, ``h(s) = ±μ_α + sqrt(max(R_t²/α + B² − yᵀ(K+αI)⁻¹y, 0)·ρ²_α)`` at
    ``s = log α`` is minimised by the grid then ``steps`` safeguarded Newton steps
    (:func:`~torchbandits.confidence.alpha_search.min_over_alpha`, the one search), capped by the
    α → ∞ limit ``B·sqrt(k(x,x))``. Returns ``(ucb, lcb, log_alpha_ucb)``, ``[*, A]`` each.
    """
    lam = evals
    p = evecs.mT @ kq                                                    # [*, t, A]
    signs = SIDES[which]
    ns, n_a = len(signs), kq.shape[-1]
    pm = torch.cat([p * (s * ytil[..., None]) for s in signs], dim=-1)   # σ p ỹ, [*, t, Q]
    p2q = (p * p).repeat(*([1] * (p.ndim - 1)), ns)                      # [*, t, Q]
    y2 = ytil * ytil                                                     # [*, t]
    kd = kdiag.repeat(*([1] * (kdiag.ndim - 1)), ns)                     # [*, Q]
    r2q = r2[..., None]                                                  # [*, 1]

    grid = log_alpha_grid(alpha0, grid_decades, grid_per_decade, dtype=kq.dtype, device=kq.device)
    ag = torch.exp(grid)
    wg = 1.0 / (lam[..., :, None] + ag)                                  # [*, t, G]
    quad_g = (y2[..., None, :] @ wg)[..., 0, :, None]                    # [*, G, 1]
    h_grid = dual_objective(wg.mT @ pm, wg.mT @ p2q, quad_g, ag[:, None], r2q[..., None],
                            norm_bound, kd[..., None, :])                # [*, G, Q]
    h_grid = h_grid.movedim(-2, 0)                                       # [G, *, Q]
    coef = torch.stack([pm.mT, p2q.mT, y2[..., None, :].expand_as(pm.mT)], dim=-1)  # [*, Q, t, 3]

    def h_at(s: Tensor) -> Tensor:                                       # [*, Q] -> [*, Q]
        a = torch.exp(s)
        w = torch.reciprocal(lam[..., None, :] + a[..., None])           # [*, Q, t]
        mu, sp, sq = (w[..., None, :] @ coef)[..., 0, :].unbind(-1)
        return dual_objective(mu, sp, sq, a, r2q, norm_bound, kd)

    def h_slopes_at(s: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        a = torch.exp(s)
        w = torch.reciprocal(lam[..., None, :] + a[..., None])           # [*, Q, t]
        sums = torch.stack([w, w * w, w * w * w], dim=-2) @ coef         # [*, Q, power, quantity]
        mean, drop, quad = (torch.stack([sums[..., 0, i], -sums[..., 1, i], 2 * sums[..., 2, i]])
                            for i in range(3))
        return dual_slopes(mean, drop, quad, a, r2q, norm_bound, kd)

    best, s_best = min_over_alpha(h_slopes_at, h_at, grid, h_grid, steps)
    limit = (norm_bound * torch.sqrt(torch.clamp(kdiag, min=0.0))).repeat(
        *([1] * (kdiag.ndim - 1)), ns)
    val = torch.minimum(best, limit)
    out = {sg: sg * val[..., i * n_a:(i + 1) * n_a] for i, sg in enumerate(signs)}
    return out.get(1.0), out.get(-1.0), s_best[..., :n_a]


def _cmm_bounds(rule: CMMBound, model: BatchedExactKernelRidge, cand: Tensor, which: str
                ) -> tuple[Tensor | None, Tensor | None, dict[str, Tensor]]:
    """Kernel CMM (Flynn & Reeb 2024, §5.3) by the dual for ``R`` runs; a fresh ``eigh`` every
    round (the sequential rule's bordered eigenbasis from ``border_min_n`` points on is the same
    bound, computed another way)."""
    if cand.dtype != torch.float64 and model.n:
        # the dual is solved in float64 whatever the model's dtype, as the sequential rule does
        # (in float32 the dual's minimiser moves enough to change the choices)
        kq, kdiag, r2, (evals, evecs, ytil) = _float64_dual_inputs(rule, model, cand)
        ucb, lcb, s = batched_dual_ucb(evals, evecs, ytil, kq, kdiag, r2, rule.norm_bound,
                                       rule.alpha0, which=which, grid_decades=rule.grid_decades,
                                       grid_per_decade=rule.grid_per_decade,
                                       steps=rule.newton_steps)
        ucb, lcb = (None if b is None else b.to(cand.dtype) for b in (ucb, lcb))
        return ucb, lcb, {"r2": r2.to(cand.dtype),
                          "log_alpha_ratio": (s - math.log(rule.alpha0)).mean(-1).to(cand.dtype)}
    kq, kdiag = model.kernel_columns(cand)
    if model.n == 0:
        lim = rule.norm_bound * torch.sqrt(kdiag)
        return lim, -lim, {}
    r2 = batched_radius_sq(model, rule.noise_std, rule.c, rule.delta)
    evals, evecs, ytil = model.spectrum()
    ucb, lcb, s = batched_dual_ucb(evals, evecs, ytil, kq, kdiag, r2, rule.norm_bound,
                                   rule.alpha0, which=which, grid_decades=rule.grid_decades,
                                   grid_per_decade=rule.grid_per_decade, steps=rule.newton_steps)
    return ucb, lcb, {"r2": r2, "log_alpha_ratio": (s - math.log(rule.alpha0)).mean(-1)}


def _float64_dual_inputs(rule: CMMBound, model: BatchedExactKernelRidge, cand: Tensor
                         ) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, Tensor, Tensor]]:
    """The dual's inputs of a model kept in a lower precision, from its data lifted to float64:
    ``K_SC [R, n, A]``, ``k_CC [R, A]``, ``R_t² [R]`` (Eq. 8 at ``α₀ = σ²/c``, from one float64
    Cholesky of ``K + α₀I``) and the spectrum ``(e [R, n], Q [R, n, n], Qᵀy [R, n])``."""
    x, y, c64 = model.x.to(torch.float64), model.y.to(torch.float64), cand.to(torch.float64)
    kq = kernel_matrix(model.kernel, x, c64)
    kdiag = kernel_diag(model.kernel, c64.reshape(-1, c64.shape[-1])).reshape(c64.shape[:2])
    gram = kernel_matrix(model.kernel, x, x)
    s2, n = rule.noise_std**2, model.n
    a0 = s2 / rule.c
    eye = torch.eye(n, dtype=torch.float64, device=x.device)
    chol = torch.linalg.cholesky(gram + a0 * eye)
    z = torch.linalg.solve_triangular(chol, y[..., None], upper=False)[..., 0]
    log_det = 2.0 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1) - n * math.log(a0)
    r2 = a0 * (z * z).sum(-1) + s2 * log_det + 2.0 * s2 * math.log(1.0 / rule.delta)
    evals, evecs = torch.linalg.eigh(gram)
    evals = torch.clamp(evals, min=0.0)
    return kq, kdiag, r2, (evals, evecs, (evecs.mT @ y[..., None])[..., 0])


def batched_bounds(rule: ConfidenceRule, model: BatchedExactKernelRidge, cand: Tensor, t: int,
                   beta: Tensor | None = None, *, which: str = "both", per_run_lam: bool = False
                   ) -> tuple[Tensor, Tensor | None, dict[str, Any]]:
    """``(UCB [R, A], LCB [R, A] or None, diagnostics)`` of checked candidates ``[R, A, d]`` at
    round ``t`` for any rule of :data:`BATCHED_RULES` (``beta`` ``[R]``: per-run constant β;
    ``which="ucb"``: CMM skips the LCB search; ``per_run_lam``: the model's λ ``[R]`` are per-run
    values, for AMM and DMM a per-run ``α₀``). Diagnostics hold ``[R]`` tensors (``beta`` for
    the radius rules, ``r2`` and ``log_alpha_ratio`` for DMM and CMM). ``which="argmax"``:
    ``(index [R], None, diagnostics)``, every run's UCB argmax (first index on ties), in one
    compiled call where the model's compiled step qualifies (CPU, float64, closed-form kernel,
    a fresh candidate set), else ``torch.argmax`` of the UCB."""
    if which == "argmax":
        got, terms = _compiled_argmax(rule, model, cand, t, beta, per_run_lam)
        if got is not None:
            return got[0], None, got[1]
        ucb, _, diag, index = _torch_bounds(rule, model, cand, t, beta, "ucb", per_run_lam,
                                            terms)
        return torch.argmax(ucb, dim=1) if index is None else index, None, diag
    return _torch_bounds(rule, model, cand, t, beta, which, per_run_lam)[:3]


def _torch_bounds(rule: ConfidenceRule, model: BatchedExactKernelRidge, cand: Tensor, t: int,
                  beta: Tensor | None, which: str, per_run_lam: bool, terms: Any = None
                  ) -> tuple[Tensor, Tensor | None, dict[str, Any], Tensor | None]:
    """:func:`batched_bounds` by the torch program (``which`` ``"both"`` or ``"ucb"``), and the
    UCB's argmax ``[R]`` where the rule took it already (DMM, for its diagnostic), else ``None``;
    ``terms``: the widths' terms :func:`_compiled_argmax` computed already (β ``[R]``, or DMM's
    :func:`_dmm_terms`), else ``None``."""
    if type(rule) is DMMBound:
        return _dmm_bounds(rule, model, cand, per_run_lam, terms, which)
    if type(rule) is CMMBound:
        ucb, lcb, diag = _cmm_bounds(rule, model, cand, which)
        assert ucb is not None
        return ucb, lcb, diag, None
    mean, var = model.mean_var(cand, rule.variance, validate=False)
    b = terms if terms is not None else batched_radius(
        rule, model, beta, n_candidates=cand.shape[1], t=t, per_run_lam=per_run_lam).to(var)
    width = b[:, None] * torch.sqrt(var)
    return mean + width, mean - width, {"beta": b}, None
