"""CBKB and CBBKB: contextual (batched) BKB as run by Zenati et al. (AISTATS 2022, §5), after
Calandriello et al. (COLT 2019; ICML 2020).

Both score like EK-UCB, ``UCB = μ̃ + β σ̃`` on the Nyström posterior
(:class:`~torchbandits.models.NystromKernelRidge`), a float ``beta`` multiplying the **ridge** sd
``σ̃`` (GP variance / λ). They differ from EK-UCB in how the dictionary is built: it is
*resampled from scratch* from all stored states, each kept independently with probability
``p_i = min(q̄ σ̃²(s_i), 1)`` (the ridge variance under the current model), then the model is
rebuilt (``O(n m² + m³)``).

* **CBBKB** ("lazy resparsification", the authors' reference variant): after each reward the
  played state's variance is accumulated, ``acc += σ̃²(s_t)``; when ``1 + acc > C_b`` the
  dictionary is resampled and ``acc = 0``, otherwise the model takes a Sherman–Morrison update.
  Feedback is used every round (no delayed feedback inside a batch). ``q̄ = 10·C_b`` by default.
* **CBKB** = CBBKB resampling every round with ``q̄ = 10`` (Zenati et al. 2022, §5: CBKB is CBBKB with
  ``C_b = 1``).

Incremental resampling (ours, semantics-preserving; Calandriello et al. 2019, §3.2, suggest such
caches): the model keeps the
variances of all stored states current (``track_data_variances``, ``O(nm)`` per update instead of an
``O(nm²)`` pass), and when a resampling keeps every current anchor, the new anchors are bordered in
one by one (``O(nm + m²)`` each) instead of a rebuild (``O(nm² + m³)``) — the same posterior up to
round-off. Any dropped anchor (or a refused one) triggers the rebuild. On Bump, where nearly every
state has ``p_i = 1``, this turns CBKB's round from ``O(n³)`` into ``O(n²)``.

Reference details kept as defaults: the just-played state is not a resampling candidate
(``include_current=False``), its sampling variances come from the model before ``s_t`` is added,
the first stored state is always kept, and ``K_ZZ`` gets a ``1e-6`` nugget. Anchors are
deduplicated (duplicates do not change the span).
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
    """Contextual batched BKB with lazy resparsification (Zenati et al. 2022, §5).

    Args:
        kernel, lam, beta: as :class:`~torchbandits.policies.ekucb.EKUCB`.
        batch_threshold: ``C_b``; resample when ``1 + Σ σ̃²(s_t) > C_b`` since the last resampling.
        qbar: oversampling ``q̄`` (default ``10·C_b``, the code's choice).
        always_resample: resample after every reward (CBKB).
        include_current: let the just-played state take part in the resampling, with variances
            from the model that includes it (the original BKB; default ``False`` as the code).
        jitter: nugget on ``K_ZZ`` (default ``1e-6`` as the code).
        incremental: grow the dictionary in place when a resampling keeps every anchor (default);
            ``False`` rebuilds after every resampling, as the reference code.
        **kwargs: ``variance``, ``min_residual``, ``parametrisation``, ``seed``, ``n_warmup``,
            ``dtype``, ``device``.

    Examples:
        >>> import torch
        >>> from torchbandits import make_kernel
        >>> from torchbandits.policies import CBBKB
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> f = lambda x: torch.exp(-((x - 0.7) ** 2).sum(-1) / 0.02)  # noiseless, best arm 7
        >>> policy = CBBKB(make_kernel("rbf", 0.2), lam=0.01, beta=0.1, batch_threshold=2.0)
        >>> for _ in range(30):
        ...     i = policy.select(arms)
        ...     policy.update(arms[i], f(arms[i]))
        >>> policy.select(arms) == int(f(arms).argmax())  # the best arm after the loop
        True
        >>> policy(arms).shape  # one UCB per candidate
        torch.Size([11])
        >>> sorted(policy.diagnostics())
        ['acc', 'beta', 'dict_size', 'n', 'rebuilds', 'resample_prob_mean', 'resparsifications']
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
        incremental: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(kernel, lam, beta, jitter=jitter, **kwargs)
        self.incremental = bool(incremental)
        self.model.track_data_variances = self.incremental
        self._anchor_rows: Tensor | None = None  # [n] stored states that are anchors (None: unknown)
        self.rebuilds = 0
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
        return torch.clamp(self.qbar * self.model.data_variances() / self.lam, max=1.0)

    @torch.no_grad()
    def sample_dictionary(self) -> tuple[Tensor, Tensor]:
        """One resampling: independent coins with :meth:`inclusion_probabilities`, the first
        stored state always kept, duplicates removed. Returns ``(anchors, probabilities)``."""
        rows, p = self._sample_rows()
        return self.model.x[rows], p

    def _sample_rows(self) -> tuple[Tensor, Tensor]:
        """Rows of the stored states drawn into the dictionary (deduplicated: the first kept row of
        each distinct state; ordered as ``torch.unique`` orders the states) and the probabilities."""
        hist_x = self.model.x
        p = self.inclusion_probabilities()
        u = torch.rand(p.shape[0], generator=self.generator, dtype=torch.float64).to(p.device, p.dtype)
        keep = u < p
        keep[0] = True  # the first stored state is always kept (reference code)
        kept = torch.nonzero(keep)[:, 0]
        _, inverse = torch.unique(hist_x[kept], dim=0, return_inverse=True)
        first = torch.full((int(inverse.max()) + 1,), kept.shape[0], dtype=torch.long, device=kept.device)
        first.scatter_reduce_(0, inverse, torch.arange(kept.shape[0], device=kept.device), reduce="amin")
        return kept[first], p

    def _resample(self, x: Tensor, reward: float) -> None:
        """Resample the dictionary from the stored states and rebuild with ``(x, reward)``."""
        model = self.model
        if self.include_current:
            model.append_column(x, reward)
        n = model.n
        if n:
            rows, p = self._sample_rows()
            self._last_mean_p = float(p.mean())
        else:  # round 0: the first state is the dictionary
            rows = torch.zeros(1, dtype=torch.long, device=x.device)
        self.resparsifications += 1
        self._acc = 0.0
        if n and self.incremental and self._grow_to(rows, x, reward):
            return
        hist_x = model.x.clone()
        hist_y = model.target_sums.clone()
        if not self.include_current:
            y_new = x.new_tensor([reward])
            hist_x = torch.cat([hist_x, x[None]]) if n else x[None]
            hist_y = torch.cat([hist_y, y_new]) if n else y_new
        model.rebuild(hist_x[rows], hist_x, hist_y)
        self.rebuilds += 1
        mask = torch.zeros(hist_x.shape[0], dtype=torch.bool, device=x.device)
        mask[rows] = True
        self._anchor_rows = mask

    def _grow_to(self, rows: Tensor, x: Tensor, reward: float) -> bool:
        """If the drawn rows keep every current anchor, append ``(x, reward)`` (unless already
        appended) and border the new anchors in; ``False`` (nothing changed) if a rebuild is needed."""
        model, old = self.model, self._anchor_rows
        n_old = model.n
        if old is None or old.shape[0] > n_old or model.m != int(old.sum()):
            return False
        new = torch.zeros(n_old, dtype=torch.bool, device=old.device)
        new[rows] = True
        if bool((old & ~new[: old.shape[0]]).any()):
            return False
        if not self.include_current:
            model.append_column(x, reward)
        fresh = new.clone()  # drawn rows that are not anchors yet (rows stored since included)
        fresh[: old.shape[0]] &= ~old
        for r in torch.nonzero(fresh)[:, 0].tolist():
            if not model.add_to_dictionary(model.x[r]):
                self._anchor_rows = None  # refused: rebuild below from the stored data
                return self._rebuild_now(new)
        mask = torch.zeros(model.n, dtype=torch.bool, device=old.device)
        mask[:n_old] = new
        self._anchor_rows = mask
        return True

    def _rebuild_now(self, rows_mask: Tensor) -> bool:
        """Rebuild on the drawn rows from the stored data (after a partial incremental attempt)."""
        model = self.model
        rows = torch.nonzero(rows_mask)[:, 0]
        model.rebuild(model.x[rows].clone(), model.x.clone(), model.target_sums.clone())
        self.rebuilds += 1
        mask = torch.zeros(model.n, dtype=torch.bool, device=rows.device)
        mask[rows] = True
        self._anchor_rows = mask
        return True

    def _update(self, x: Tensor, reward: float) -> None:
        model = self.model
        if model.m == 0 or self.always_resample:
            self._resample(x, reward)
            return
        _, var = model.score(x[None])
        self._acc += float(var[0]) / self.lam
        if 1.0 + self._acc > self.batch_threshold:
            self._resample(x, reward)
        else:
            model.append_column(x, reward)
            if self._anchor_rows is not None:
                self._anchor_rows = torch.cat([self._anchor_rows, self._anchor_rows.new_zeros(1)])

    def _reset(self) -> None:
        self.model.reset()
        self._anchor_rows = None
        self.rebuilds = 0
        self._acc = 0.0
        self.resparsifications = 0
        self._last_mean_p = float("nan")

    def _extra_state(self) -> dict[str, Any]:
        return {"acc": self._acc, "resparsifications": self.resparsifications,
                "last_mean_p": self._last_mean_p}

    def _set_extra_state(self, state: dict[str, Any]) -> None:
        self._anchor_rows = None  # unknown after a load: the next resampling rebuilds
        self._acc = float(state["acc"])
        self.resparsifications = int(state["resparsifications"])
        self._last_mean_p = float(state["last_mean_p"])

    def diagnostics(self) -> dict[str, float]:
        """Dictionary size, number of resparsifications (and how many were full rebuilds rather
        than incremental growth), the accumulated variance, the mean
        inclusion probability of the last resampling, and β."""
        return {"dict_size": float(self.model.m), "n": float(self.model.n),
                "resparsifications": float(self.resparsifications), "rebuilds": float(self.rebuilds),
                "acc": self._acc,
                "resample_prob_mean": self._last_mean_p, **self.rule.diagnostics()}

    def extra_repr(self) -> str:
        return (f"lam={self.lam}, batch_threshold={self.batch_threshold}, qbar={self.qbar}, "
                f"always_resample={self.always_resample}, incremental={self.incremental}, "
                f"rule={self.rule!r}")


class CBKB(CBBKB):
    """Contextual BKB (Zenati et al. 2022, §5): the dictionary is resampled after every reward, ``q̄ = 10``
    (= CBBKB with ``C_b = 1``).

    Examples:
        >>> import torch
        >>> from torchbandits import make_kernel
        >>> from torchbandits.policies import CBKB
        >>> arms = torch.linspace(0, 1, 11).unsqueeze(1)  # [A, d] = [11, 1]
        >>> f = lambda x: torch.exp(-((x - 0.7) ** 2).sum(-1) / 0.02)  # noiseless, best arm 7
        >>> policy = CBKB(make_kernel("rbf", 0.2), lam=0.01, beta=0.1, seed=0)
        >>> for _ in range(30):
        ...     i = policy.select(arms)
        ...     policy.update(arms[i], f(arms[i]))
        >>> policy.select(arms) == int(f(arms).argmax())  # the best arm after the loop
        True
        >>> policy(arms).shape  # one UCB per candidate
        torch.Size([11])
        >>> policy.diagnostics()['n']  # rewards seen
        30.0
    """

    def __init__(self, kernel: Kernel, lam: float = 1.0, beta: float | ConfidenceRule = 0.1, *,
                 qbar: float = 10.0, **kwargs: Any) -> None:
        kwargs.setdefault("batch_threshold", 1.0)
        super().__init__(kernel, lam, beta, qbar=qbar, always_resample=True, **kwargs)
