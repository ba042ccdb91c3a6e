"""Hyper-parameter refits for the exact-posterior policies (``refit_every=k``).

A policy that mixes in :class:`RefitMixin` (K-UCB, GP-UCB and the confidence-bound presets built on
them, R-GP-UCB, SW-GP-UCB) refits its kernel by maximum marginal likelihood
(:func:`~torchbandits.fitting.fit_kernel`) on the data its model holds:

* after update ``t`` whenever ``t ≥ refit_warmup`` and ``(t − refit_warmup) mod refit_every = 0``
  (``refit_every = 0``: never, the default — the policy then behaves exactly as without the mixin);
* after a refit the model is refactorised **from scratch** with the new kernel and regularisers
  (:meth:`~torchbandits.models.ExactKernelRidge.set_kernel`, O(n³)); between refits every
  update stays incremental (O(n²)) and a fixed candidate set stays cached;
* each fit warm-starts from the previous one.

What a refit changes:

* the kernel: the template given to the policy with fitted lengthscales (and output scale if the
  template is a ``ScaleKernel``), times ``var(y)`` (the fit standardises ``y``);
* the regulariser ``λ`` becomes the fitted noise variance ``σ̂²`` when the policy's confidence
  rule evaluates the posterior at the model's λ (constant β, Srinivas, K-UCB theory); rules that
  fix their own regulariser (IGP-UCB's ``1 + η``, AY-GP-UCB's λ, the martingale mixtures' σ²/c)
  keep it. Override with ``refit_options={"refit_noise": True/False}``;
* the prior mean: with ``center=True`` (default) the model holds ``y − m`` with ``m`` the fitted
  constant mean, and the scores add ``m`` back (a GP with constant prior mean ``m``, as BoTorch's
  ``ConstantMean``); ``center=False`` keeps the zero prior mean of the papers.

A refit on constant rewards (e.g. all-zero rewards early in a classification bandit) is skipped
and counted (``refit_skips`` in ``diagnostics()``); the fitted values (``fit_noise``,
``fit_outputscale``, ``fit_lengthscale_i``, ``fit_mean``, ``refits``) are in ``diagnostics()``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from gpytorch.kernels import Kernel, ScaleKernel
from torch import Tensor

from ..fitting import DegenerateDataError, FitResult, fit_kernel
from ..validation import as_scalar_reward

__all__ = ["RefitMixin"]

class RefitMixin:
    """Adds ``refit_every`` / ``refit_warmup`` to a policy with an ``ExactKernelRidge`` ``model``
    and a confidence ``rule`` (see the module docstring). Call :meth:`init_refit` in
    ``__init__``; put the mixin first among the bases so its ``update``/``forward`` wrap the
    policy's."""

    model: Any
    rule: Any

    def init_refit(self, kernel: Kernel, refit_every: int = 0, refit_warmup: int = 5,
                   refit_options: dict[str, Any] | None = None) -> None:
        """Validate and store the refit schedule; ``refit_options`` holds keywords of
        :func:`~torchbandits.fitting.fit_kernel` plus ``refit_noise`` (None: automatic) and
        ``center`` (True)."""
        if isinstance(refit_every, bool) or int(refit_every) != refit_every or refit_every < 0:
            raise ValueError(f"refit_every must be an int >= 0, got {refit_every!r}")
        if isinstance(refit_warmup, bool) or int(refit_warmup) != refit_warmup or refit_warmup < 2:
            raise ValueError(f"refit_warmup must be an int >= 2, got {refit_warmup!r}")
        opts = dict(refit_options or {})
        self.refit_noise: bool | None = opts.pop("refit_noise", None)
        self.refit_center = bool(opts.pop("center", True))
        opts.setdefault("max_iter", 50)
        self.refit_options = opts
        if refit_every and not hasattr(self.model, "set_kernel"):
            raise ValueError(f"refit_every needs an exact-posterior model with set_kernel, "
                             f"not {type(self.model).__name__}")
        self.refit_every = int(refit_every)
        self.refit_warmup = int(refit_warmup)
        self.refit_template = copy.deepcopy(kernel)
        self.refit_initial_regularisers = tuple(self.model.regularisers)
        self.refit_offset = 0.0
        self.last_fit: FitResult | None = None
        self.n_refits = 0
        self.n_refit_skips = 0
        self.refit_last_candidates: Tensor | None = None  # see forward
        self.refit_fixed_candidates = False

    # ------------------------------------------------------------------ schedule
    def update(self, x: Any, reward: Any) -> None:
        """Record ``(x, reward)`` (the model holds ``reward − m``), then refit if due."""
        r = as_scalar_reward("reward", reward)
        super().update(x, r - self.refit_offset)  # type: ignore[misc]
        t = int(self.t)  # type: ignore[attr-defined]
        if self.refit_every and t >= self.refit_warmup and \
                (t - self.refit_warmup) % self.refit_every == 0:
            self.refit()

    def refit(self) -> FitResult | None:
        """Fit the kernel to the model's data now and refactorise; ``None`` if skipped (fewer
        than 2 points or constant rewards)."""
        if self.model.n < 2:
            self.n_refit_skips += 1
            return None
        y = self.model.y + self.refit_offset
        try:
            res = fit_kernel(self.refit_template, self.model.x, y, init=self.last_fit,
                             **self.refit_options)
        except DegenerateDataError:
            self.n_refit_skips += 1
            return None
        self.apply_fit(res)
        return res

    def _noise_into_lam(self, noise: float) -> bool:
        if self.refit_noise is not None:
            return bool(self.refit_noise)
        return getattr(self.rule, "reg", None) is None and not self.rule.required_regularisers(noise)

    def apply_fit(self, res: FitResult) -> None:
        """Install a fit: new kernel, λ (see module docstring), prior mean; refactorise."""
        lam = res.noise if self._noise_into_lam(res.noise) else float(self.model.lam)
        regs = (lam, *self.rule.required_regularisers(lam))
        offset = res.mean if self.refit_center else 0.0
        targets = self.model.y + (self.refit_offset - offset)
        self.model.set_kernel(res.kernel, regs, targets,  # a fresh kernel per fit
                              rescore=self.refit_fixed_candidates)
        self.refit_offset = float(offset)
        self.last_fit = res
        self.n_refits += 1

    # ------------------------------------------------------------------ scores, state, logs
    def forward(self, candidates: Tensor) -> Tensor:
        """UCB ``[A]`` of ``candidates [A, d]`` plus the fitted constant mean (``refit_offset``).

        Notes whether ``candidates`` repeat the previous call's (a fixed arm set): a refit then
        re-scores the model's candidate cache right away, into its storage (same values)."""
        last = self.refit_last_candidates
        self.refit_fixed_candidates = last is not None and (last is candidates or (
            last.shape == candidates.shape and last.dtype == candidates.dtype
            and torch.equal(last, candidates)))
        self.refit_last_candidates = candidates
        return super().forward(candidates) + self.refit_offset  # type: ignore[misc]

    def bounds(self, candidates: Tensor) -> tuple[Tensor, Tensor]:
        """``(UCB, LCB)``, each ``[A]``, shifted by the fitted constant mean."""
        ucb, lcb = super().bounds(candidates)  # type: ignore[misc]
        return ucb + self.refit_offset, lcb + self.refit_offset

    def _extra_state(self) -> dict[str, Any]:
        fit = self.last_fit
        own: dict[str, Any] = {"refit_offset": self.refit_offset, "n_refits": self.n_refits,
                               "n_refit_skips": self.n_refit_skips, "last_fit": None}
        if fit is not None:  # plain values only (weights_only loading); the kernel's values
            own["last_fit"] = {  # travel with the model's state
                "noise": fit.noise, "mean": fit.mean, "lengthscales": list(fit.lengthscales),
                "outputscale": fit.outputscale, "objective_initial": fit.objective_initial,
                "objective": fit.objective, "n_evals": fit.n_evals, "improved": fit.improved,
                "state": [t.detach().cpu() for t in fit.state],
                "curvature": None if fit.curvature is None else fit.curvature.detach().cpu()}
        return {**super()._extra_state(), "refit": own}  # type: ignore[misc]

    def _set_extra_state(self, state: dict[str, Any]) -> None:
        super()._set_extra_state(state)  # type: ignore[misc]
        own = state.get("refit")
        if own is None:
            return
        self.refit_offset = float(own["refit_offset"])
        self.n_refits = int(own["n_refits"])
        self.n_refit_skips = int(own["n_refit_skips"])
        fit = own["last_fit"]
        if fit is None:
            self.last_fit = None
            return
        # the fitted kernel's structure is ScaleKernel(template); its values load with the model
        kernel = ScaleKernel(copy.deepcopy(self.refit_template)).to(
            dtype=self.model.dtype, device=self.model.device)
        for p in kernel.parameters():
            p.requires_grad_(False)
        self.model.kernel = kernel
        curv = fit.get("curvature")  # the BFGS warm start's inverse Hessian (optimizer="bfgs")
        self.last_fit = FitResult(
            kernel=kernel, **{k: v for k, v in fit.items() if k not in ("state", "curvature")},
            state=[t.clone() for t in fit["state"]], curvature=None if curv is None else curv.clone())

    def _reset(self) -> None:
        super()._reset()  # type: ignore[misc]
        if self.n_refits:
            self.model.set_kernel(copy.deepcopy(self.refit_template),
                                  self.refit_initial_regularisers)
        self.refit_offset = 0.0
        self.last_fit = None
        self.n_refits = 0
        self.n_refit_skips = 0
        self.refit_last_candidates = None
        self.refit_fixed_candidates = False

    def diagnostics(self) -> dict[str, float]:
        """The policy's diagnostics plus the fitted hyper-parameters and the refit count."""
        out = dict(super().diagnostics())  # type: ignore[misc]
        if not self.refit_every:
            return out
        out["refits"] = float(self.n_refits)
        out["refit_skips"] = float(self.n_refit_skips)
        fit = self.last_fit
        if fit is not None:
            out["fit_noise"] = fit.noise
            out["fit_outputscale"] = fit.outputscale
            out["fit_mean"] = fit.mean
            out["fit_objective"] = fit.objective
            ls = fit.lengthscales
            if len(ls) <= 8:
                out.update({f"fit_lengthscale_{i}": v for i, v in enumerate(ls)})
            else:
                out["fit_lengthscale_min"] = min(ls)
                out["fit_lengthscale_median"] = sorted(ls)[len(ls) // 2]
                out["fit_lengthscale_max"] = max(ls)
            out["lam"] = float(self.model.lam)
        return out
