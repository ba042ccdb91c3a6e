"""Confidence rules: how wide a policy is, on top of a model.

A rule turns a model and a candidate set into upper and lower confidence bounds. Most rules are
*radius rules*: ``UCB = μ_λ + β_t · sd`` where ``sd`` is one of two conventions, stated by the
rule's ``variance`` attribute:

* ``"gp"``    — ``sd = ρ_λ``, the GP posterior standard deviation (noise variance λ);
* ``"ridge"`` — ``sd = ρ_λ / √λ``, the kernel-ridge width ``‖φ(x)‖_{V⁻¹}`` of Zenati et al. (2022,
  §3.2) and of Calandriello et al. (2019, whose BKB uses the 1/λ-scaled variance throughout).

The same β therefore means ``√λ`` times more exploration under ``"ridge"`` than under ``"gp"``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, Protocol

import torch
from torch import Tensor

__all__ = ["ConfidenceRule", "ConstantBeta", "PosteriorModel", "RadiusRule", "UCBForm", "Variance",
           "as_rule", "log_det_value", "quad_y_value"]

Variance = Literal["gp", "ridge"]


class UCBForm(NamedTuple):
    """A rule's upper bound at one round in closed form, for a model that scores it in one call
    (:meth:`~torchbandits.models.ExactKernelRidge.ucb_argmax`):
    ``UCB(x) = min_i (sqrt(ρ²_{regs_i}(x) / divisors_i) · betas_i + μ_{regs_i}(x))`` with the GP
    posterior mean ``μ`` and variance ``ρ²`` (clamped at 0) at each regulariser; the divisor is
    the regulariser for a width on the ridge sd, else 1. ``done(bounds [A] or None, argmin i
    at the chosen candidate [1] int64 or None)``, if given, is called after the scoring (a rule's
    diagnostics)."""

    regs: tuple[float, ...]
    betas: tuple[float, ...]
    divisors: tuple[float, ...]
    done: Callable[[Any, Any], None] | None = None


class PosteriorModel(Protocol):
    """What a rule needs from a model (``ExactKernelRidge`` and the Nyström models)."""

    regularisers: tuple[float, ...]

    @property
    def n(self) -> int:
        """Number of observations held."""
        ...

    @property
    def lam(self) -> float:
        """The model's own regulariser λ (its noise variance in GP terms)."""
        ...

    def mean_var(self, candidates: Tensor, reg: float | None = None) -> tuple[Tensor, Tensor]:
        """Posterior mean ``μ_reg`` and GP variance ``ρ²_reg`` of ``candidates`` ``[A, d]``.

        Args:
            candidates: ``[A, d]`` points.
            reg: regulariser the posterior is taken at (``None``: λ; otherwise one of
                ``regularisers``).

        Returns:
            ``(mean [A], var [A])``.
        """
        ...

    def log_det(self, reg: float | None = None) -> Tensor:
        """``log det(I + K/reg)`` of the held points (0-d tensor; ``reg=None``: λ)."""
        ...


def log_det_value(model: PosteriorModel, reg: float | None = None) -> float:
    """``model.log_det(reg)`` as a float: the model's running value where it keeps one
    (:class:`~torchbandits.models.ExactKernelRidge`, no tensor operation), else from the tensor."""
    fast = getattr(model, "log_det_value", None)
    if fast is not None:
        return fast(reg)
    return float(model.log_det() if reg is None else model.log_det(reg))


def quad_y_value(model: PosteriorModel, reg: float | None = None) -> float:
    """``yᵀ(K + reg·I)⁻¹y`` of the model's data as a float (see :func:`log_det_value`)."""
    fast = getattr(model, "quad_y_value", None)
    if fast is not None:
        return fast(reg)
    return float(model.quad_y(reg))  # type: ignore[attr-defined]


class ConfidenceRule:
    """Base class: ``bounds(model, candidates, t) → (ucb, lcb)`` for round ``t`` (1-based)."""

    name = "rule"

    def required_regularisers(self, lam: float) -> tuple[float, ...]:
        """Regularisers (besides the model's λ) the model must maintain for this rule."""
        return ()

    def bounds(self, model: PosteriorModel, candidates: Tensor, t: int) -> tuple[Tensor, Tensor]:
        """Upper and lower confidence bounds of ``candidates`` at round ``t``.

        Args:
            model: the posterior model (holds the first ``t − 1`` observations).
            candidates: ``[A, d]`` points.
            t: the round being played (1-based).

        Returns:
            ``(ucb [A], lcb [A])``.
        """
        raise NotImplementedError

    def diagnostics(self) -> dict[str, float]:
        """Numbers of the last :meth:`bounds` call worth logging (e.g. ``{"beta": β_t}``)."""
        return {}

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({params})"


class RadiusRule(ConfidenceRule):
    """``UCB/LCB = μ_reg ± β_t · sd_reg`` with ``sd`` per ``variance`` (see module docstring).

    Subclasses implement :meth:`radius`. ``reg`` is the regulariser the posterior is taken at
    (``None``: the model's λ).
    """

    variance: Variance = "gp"
    reg: float | None = None

    def radius(self, model: PosteriorModel, n_candidates: int, t: int) -> Tensor:
        """The radius ``β_t`` (0-d float64 tensor) at round ``t`` (1-based).

        Args:
            model: the posterior model (its ``n``, ``lam``, ``log_det`` may enter β_t).
            n_candidates: ``A``, the number of candidates this round (finite-domain widths).
            t: the round being played.

        A subclass implements this or :meth:`radius_value` (the same number as a float).
        """
        return torch.tensor(self.radius_value(model, n_candidates, t), dtype=torch.float64)

    def radius_value(self, model: PosteriorModel, n_candidates: int, t: int) -> float:
        """:meth:`radius` as a Python float (the rules of this package compute it in floats from
        the model's running scalars, with no tensor operation)."""
        if type(self).radius is RadiusRule.radius:
            raise NotImplementedError(f"{type(self).__name__} implements neither radius nor radius_value")
        return float(self.radius(model, n_candidates, t))

    def _beta(self, model: PosteriorModel, n_candidates: int, t: int) -> float:
        """β_t as a float: from :meth:`radius` where a subclass overrides it, else
        :meth:`radius_value`."""
        if type(self).radius is not RadiusRule.radius:
            beta = float(self.radius(model, n_candidates, t))
        else:
            beta = self.radius_value(model, n_candidates, t)
        self._last_beta = beta
        return beta

    def required_regularisers(self, lam: float) -> tuple[float, ...]:
        return () if self.reg is None or self.reg == lam else (self.reg,)

    def mean_sd(self, model: PosteriorModel, candidates: Tensor) -> tuple[Tensor, Tensor]:
        """``(μ_reg, sd_reg)`` ``[A]`` each for ``candidates`` ``[A, d]``: the posterior mean and
        the width's ``sd`` per ``variance`` (``ρ_reg``, or ``ρ_reg/√reg`` for ``"ridge"``) at the
        rule's regulariser ``reg`` (the model's ``λ`` if unset); ``sd`` a fresh tensor."""
        reg = model.lam if self.reg is None else self.reg
        mean, var = model.mean_var(candidates, reg=reg)
        if self.variance == "ridge":
            var = var / reg
        return mean, torch.sqrt(var)

    def bounds(self, model: PosteriorModel, candidates: Tensor, t: int) -> tuple[Tensor, Tensor]:
        """``(μ + β_t·sd, μ − β_t·sd)``, each ``[A]``, for ``candidates`` ``[A, d]`` at round ``t``."""
        mean, width = self.mean_sd(model, candidates)
        width.mul_(self._beta(model, candidates.shape[0], t))
        return mean + width, mean - width

    def ucb(self, model: PosteriorModel, candidates: Tensor, t: int) -> Tensor:
        """``μ + β_t·sd`` ``[A]`` alone (what ``select`` needs; the same values as
        ``bounds(...)[0]``)."""
        mean, width = self.mean_sd(model, candidates)
        return width.mul_(self._beta(model, candidates.shape[0], t)).add_(mean)

    def ucb_form(self, model: PosteriorModel, n_candidates: int, t: int) -> UCBForm | None:
        """:meth:`ucb` as a :class:`UCBForm` — ``μ_reg + β_t·sd_reg``, β computed now (the same
        diagnostics) — or ``None`` where a subclass computes its bound otherwise (it overrides
        :meth:`ucb` or the posterior it reads)."""
        cls = type(self)
        if cls.ucb is not RadiusRule.ucb or cls.mean_sd is not RadiusRule.mean_sd:
            return None
        reg = model.lam if self.reg is None else self.reg
        beta = self._beta(model, n_candidates, t)
        return UCBForm((reg,), (beta,), (reg if self.variance == "ridge" else 1.0,))

    def diagnostics(self) -> dict[str, float]:
        """``{"beta": β}`` of the last :meth:`bounds` call (``nan`` before the first)."""
        return {"beta": getattr(self, "_last_beta", float("nan"))}


class ConstantBeta(RadiusRule):
    """``β_t ≡ beta`` (the experiments of Zenati et al. 2022, Calandriello et al. 2019
    and Hong et al. 2023 use a constant)."""

    name = "constant"

    def __init__(self, beta: float, variance: Variance = "gp") -> None:
        self.beta = float(beta)
        if not math.isfinite(self.beta) or self.beta < 0:
            raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
        if variance not in ("gp", "ridge"):
            raise ValueError(f"variance must be 'gp' or 'ridge', got {variance!r}")
        self.variance = variance

    def radius_value(self, model: PosteriorModel, n_candidates: int, t: int) -> float:
        """``beta`` at every round."""
        return self.beta


def as_rule(beta: float | ConfidenceRule, variance: Variance) -> ConfidenceRule:
    """``beta`` itself if it is a rule, else a constant radius on the ``variance`` sd
    (:class:`ConstantBeta` rejects a negative or non-finite value, naming ``beta``)."""
    if isinstance(beta, ConfidenceRule):
        return beta
    return ConstantBeta(float(beta), variance=variance)
