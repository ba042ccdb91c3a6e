"""CBKB and CBBKB: contextual (batched) BKB as run in seed 000 (spec §2.6, E13, E14).

Both score like EK-UCB, ``UCB = μ̃ + β σ̃`` on the Nyström posterior
(:class:`~torchbandits.models.NystromKernelRidge`), a float ``beta`` multiplying the **ridge** sd
``σ̃`` (GP variance / λ). They differ from EK-UCB in how the dictionary is built: it is
*resampled from scratch* from all stored states, each kept independently with probability
``p_i = min(q̄ σ̃²(s_i), 1)`` (the ridge variance under the current model), then the model is
rebuilt (``O(n m² + m³)``).

* **CBBKB** ("lazy resparsification", the authors' reference variant, E13): after each reward the
  played state's variance is accumulated, ``acc += σ̃²(s_t)``; when ``1 + acc > C_b`` the
  dictionary is resampled and ``acc = 0``, otherwise the model takes a Sherman–Morrison update.
  Feedback is used every round (no delayed feedback inside a batch). ``q̄ = 10·C_b`` by default.
* **CBKB** = CBBKB resampling every round with ``q̄ = 10`` (E14).

Reference details kept as defaults: the just-played state is not a resampling candidate
(``include_current=False``), its sampling variances come from the model before ``s_t`` is added,
the first stored state is always kept, and ``K_ZZ`` gets a ``1e-6`` nugget. Anchors are
deduplicated (duplicates do not change the span, E12).
"""

from __future__ import annotations

from typing import Any

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..confidence import ConfidenceRule
from ..validation import check_positive
from .ekucb import NystromUCB

__all__ = ["CBBKB", "CBKB"]


class CBBKB(NystromUCB):
    """Contextual batched BKB with lazy resparsification (seed 000 spec §2.6).

    Args:
        kernel, lam, beta: as :class:`~torchbandits.policies.ekucb.EKUCB`.
        batch_threshold: ``C_b``; resample when ``1 + Σ σ̃²(s_t) > C_b`` since the last resampling.
        qbar: oversampling ``q̄`` (default ``10·C_b``, the code's choice).
        always_resample: resample after every reward (CBKB).
        include_current: let the just-played state take part in the resampling, with variances
            from the model that includes it (the original BKB; default ``False`` as the code).
        jitter: nugget on ``K_ZZ`` (default ``1e-6`` as the code).
        **kwargs: ``variance``, ``min_residual``, ``parametrisation``, ``seed``, ``n_warmup``,
            ``dtype``, ``device``.
    """

    def __init__(
        self,
        kernel: Kernel,
        lam: float = 1.0,
        beta: float | ConfidenceRule = 0.1,
        *,
        batch_threshold: float = 10.0,
        qbar: float | None = None,
        always_resample: bool = False,
        include_current: bool = False,
        jitter: float = 1e-6,
        **kwargs: Any,
    ) -> None:
        super().__init__(kernel, lam, beta, jitter=jitter, **kwargs)
        self.batch_threshold = check_positive("batch_threshold", batch_threshold)
        self.qbar = check_positive("qbar", 10.0 * self.batch_threshold if qbar is None else qbar)
        self.always_resample = bool(always_resample)
        self.include_current = bool(include_current)
        self._acc = 0.0
        self.resparsifications = 0
        self._last_mean_p = float("nan")

    @torch.no_grad()
    def inclusion_probabilities(self) -> Tensor:
        """``p_i = min(q̄ σ̃²(s_i), 1)`` of every stored state under the current model ``[n]``."""
        model = self.model
        _, var = model._mean_var(model.x)
        return torch.clamp(self.qbar * var / self.lam, max=1.0)

    @torch.no_grad()
    def sample_dictionary(self) -> tuple[Tensor, Tensor]:
        """One resampling: independent coins with :meth:`inclusion_probabilities`, the first
        stored state always kept, duplicates removed. Returns ``(anchors, probabilities)``."""
        hist_x = self.model.x
        p = self.inclusion_probabilities()
        u = torch.rand(p.shape[0], generator=self.generator, dtype=torch.float64).to(p.device, p.dtype)
        keep = u < p
        keep[0] = True  # the first stored state is always kept (reference code)
        return torch.unique(hist_x[keep], dim=0), p

    def _resample(self, x: Tensor, reward: float) -> None:
        """Resample the dictionary from the stored states and rebuild with ``(x, reward)``."""
        model = self.model
        if self.include_current:
            model._append(x, reward)
        n = model.n
        if n:
            anchors, p = self.sample_dictionary()
            self._last_mean_p = float(p.mean())
        else:  # round 0: the first state is the dictionary
            anchors = x[None]
        hist_x = model.x.clone()
        hist_y = model.target_sums.clone()
        if not self.include_current:
            y_new = x.new_tensor([reward])
            hist_x = torch.cat([hist_x, x[None]]) if n else x[None]
            hist_y = torch.cat([hist_y, y_new]) if n else y_new
        model.rebuild(anchors, hist_x, hist_y)
        self.resparsifications += 1
        self._acc = 0.0

    def _update(self, x: Tensor, reward: float) -> None:
        model = self.model
        if model.m == 0 or self.always_resample:
            self._resample(x, reward)
            return
        _, var = model._mean_var(x[None])
        self._acc += float(var[0]) / self.lam
        if 1.0 + self._acc > self.batch_threshold:
            self._resample(x, reward)
        else:
            model._append(x, reward)

    def _reset(self) -> None:
        self.model.reset()
        self._acc = 0.0
        self.resparsifications = 0
        self._last_mean_p = float("nan")

    def _extra_state(self) -> dict[str, Any]:
        return {"acc": self._acc, "resparsifications": self.resparsifications,
                "last_mean_p": self._last_mean_p}

    def _set_extra_state(self, state: dict[str, Any]) -> None:
        self._acc = float(state["acc"])
        self.resparsifications = int(state["resparsifications"])
        self._last_mean_p = float(state["last_mean_p"])

    def diagnostics(self) -> dict[str, float]:
        """Dictionary size, number of resparsifications, the accumulated variance, the mean
        inclusion probability of the last resampling, and β."""
        return {"dict_size": float(self.model.m), "n": float(self.model.n),
                "resparsifications": float(self.resparsifications), "acc": self._acc,
                "resample_prob_mean": self._last_mean_p, **self.rule.diagnostics()}

    def extra_repr(self) -> str:
        return (f"lam={self.lam}, batch_threshold={self.batch_threshold}, qbar={self.qbar}, "
                f"always_resample={self.always_resample}, rule={self.rule!r}")


class CBKB(CBBKB):
    """Contextual BKB (seed 000 §2.6): the dictionary is resampled after every reward, ``q̄ = 10``
    (= CBBKB with ``C_b = 1``, spec E14)."""

    def __init__(self, kernel: Kernel, lam: float = 1.0, beta: float | ConfidenceRule = 0.1, *,
                 qbar: float = 10.0, **kwargs: Any) -> None:
        kwargs.setdefault("batch_threshold", 1.0)
        super().__init__(kernel, lam, beta, qbar=qbar, always_resample=True, **kwargs)
