"""Batched mode of BKB (Calandriello, Carratino, Lazaric, Valko & Rosasco, COLT 2019, Fig. 1 /
Algorithm 1): ``R`` runs, each resampling its own dictionary every round, stepped together.

``reset(seed=[s_1, …, s_R])`` starts a batch. The state is the count statistics of every run
(:class:`~torchbandits.models.batched_counts.BatchedCounts`: distinct pulled points, counts,
reward sums, dictionary masks, padded to a common capacity). A round:

* ``select(candidates [R, A, d])``: every run's dictionary is compacted to ``M = max m_r``
  padded positions, and the DTC posterior of all runs is rebuilt from scratch and scored in one
  batched program (:func:`~torchbandits.models.batched_dtc.dtc_system`), runs grouped by
  dictionary size beyond 16 (:mod:`~torchbandits.policies.bkb_batched_posterior`); on a fixed arm
  set (the same candidate tensor as the round before) every kernel value is gathered from the
  runs' cached kernel rows of their pulled arms ``[R, n, A]``, as the sequential fused round does
  (in float64 on the CPU, every run's round by the sequential compiled round, one C call per
  batch, and β̃_t run by run in the sequential rule's float arithmetic: the sequential bits);
  ``ũ = μ̃ + β̃_t σ̃`` with the ridge sd and the width ``β̃_t`` ``[R]`` of every run
  (:func:`~torchbandits.confidence.bkb_batched.batched_bkb_radius`); ``LongTensor [R]``, first
  index on ties (``torch.addcmul(μ̃, σ̃, β̃)``: the bits of the sequential ``torch.add(μ̃, σ̃,
  alpha=β̃)``, one rounding per entry);
* ``update(x [R, d], reward [R])``: the variances of the model that chose ``x`` at every run's
  distinct points and at ``x``, the count update, and each run's ridge-leverage resampling from
  **its own generator**: ``torch.binomial`` on the run's padded row (a zero count draws nothing,
  so the draws are exactly the sequential ones), the other samplers through
  :meth:`~torchbandits.models.rls.RLSResampler.resample` run by run. After a compiled round in
  which every run played its selected arm, the count update, the cache's arm rows, the draw's
  variances and binomial probabilities are one C call
  (:func:`torchbandits.native.bkb.record_rounds`; the argmax too,
  :func:`~torchbandits.native.bkb.ucb_argmax_rounds`), and the binomial draws read kept per-run
  rows of the counts and probabilities: the same numbers as the torch statements (tested).

Run ``r`` plays what the sequential BKB reset with ``seed=s_r`` plays. Host reads per round (CPU
tensors on a CPU device; on CUDA one copy of the variances, which the CPU generators need, the
widths ``N``, ``M``, the Cholesky flags and whether every run played its selected arm): the step
is not sync-free.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..batching import check_batch_points, check_batch_rewards, check_batched_candidates
from ..confidence.bkb_batched import batched_bkb_radius, radius_offsets, radius_terms
from ..models.batched_counts import BatchedCounts
from ..models.batched_nystrom_state import batched_kernel
from ..native import bkb as native_bkb
from .batch_mode import BatchModeMixin, check_run_lengths
from .bkb_batched_posterior import BKBBatchPosterior

__all__ = ["BKBBatchMixin", "with_batch_mode"]


class BKBBatchMixin(BatchModeMixin, BKBBatchPosterior):
    """The batched branch of :class:`~torchbandits.policies.BKB` (module docstring); single-run
    calls go to the sequential class unchanged. Installed in front of it by
    :func:`with_batch_mode`."""

    gens: list[torch.Generator] | None = None

    # ---------------------------------------------------------------- eligibility / settings
    def why_not_batched(self) -> str | None:
        """``None`` if this policy can step a batch of runs, else the reason."""
        if type(self).__mro__[1] is not BKBBatchMixin:
            return f"{type(self).__name__} changes BKB's steps (runs sequentially)"
        if self.variance_kind != "dtc":  # type: ignore[attr-defined]
            return "the SoR ablation (variance='sor') runs sequentially (batched: DTC)"
        if self.track_exact:  # type: ignore[attr-defined]
            return "track_exact keeps an exact posterior per run (runs sequentially)"
        if self._nys.parametrisation != "whitened":  # type: ignore[attr-defined]
            return "the plain parametrisation runs sequentially (batched: whitened)"
        return None

    @property
    def n_runs(self) -> int | None:
        """``R`` in batched mode, ``None`` for a single run (the runs' streams are a list of
        generators, one per run)."""
        return None if self.gens is None else len(self.gens)

    @property
    def batch_counts(self) -> BatchedCounts | None:
        """The ``R`` runs' count statistics in batched mode (a submodule), else ``None``."""
        return self._modules.get("batched")  # type: ignore[attr-defined,return-value]

    def set_per_run(self, *, lam: Any = None, beta: Any = None) -> None:
        """Per-run settings of the next batches: ``lam`` ``[R]`` (> 0) and, with
        ``beta_rule="constant"``, ``beta`` ``[R]`` (≥ 0): run ``r`` then plays what the sequential
        BKB built with ``lam=lam[r]`` (``beta=beta[r]``) plays. Held in float64; ``None`` clears."""
        out: dict[str, Tensor | None] = {}
        for name, value, low in (("lam", lam, 0.0), ("beta", beta, -1.0)):
            if value is None:
                out[name] = None
                continue
            v = torch.as_tensor(value, dtype=torch.float64).reshape(-1)
            if v.numel() == 0 or not bool(torch.isfinite(v).all()) or bool((v <= low).any()) \
                    or (name == "beta" and bool((v < 0).any())):
                raise ValueError(f"{name} must be finite numbers {'> 0' if low == 0 else '>= 0'}"
                                 f", got {value!r}")
            out[name] = v
        if out["beta"] is not None and self.rule.rule != "constant":  # type: ignore[attr-defined]
            raise ValueError("beta: per-run widths need beta_rule='constant'")
        self._per_run = out

    # ---------------------------------------------------------------- start / leave
    def _per_run_settings(self, r: int) -> dict[str, Any]:
        """The per-run β / λ of :meth:`set_per_run`, checked against ``R = r`` runs (a
        ``ValueError`` naming the setting; nothing changed)."""
        return check_run_lengths(getattr(self, "_per_run", {"lam": None, "beta": None}), r)

    def _start_batch(self, gens: list[torch.Generator]) -> None:
        r = len(gens)
        settings = self._per_run_settings(r)
        self.batched = BatchedCounts(r, dtype=self.dtype, device=self.device)  # type: ignore[attr-defined]
        self.gens = gens
        lam = settings["lam"]
        self._lam64 = lam.clone() if lam is not None else torch.full((r,), self.lam, dtype=torch.float64)  # type: ignore[attr-defined]
        self._beta64 = None if settings["beta"] is None else settings["beta"].clone()
        self._lam_list = self._lam64.tolist()
        lams = self._lam64.unique()
        self._lam_scalar = float(lams[0]) if lams.numel() == 1 else None
        self._bk = batched_kernel(self._nys.kernel)  # type: ignore[attr-defined]
        self._forget()

    def _forget(self) -> None:
        """Drop the derived data (row cache, last scores); kept: the statistics and generators."""
        self._bcache: dict[str, Any] | None = None      # fixed arm set: idx, rows
        self._bscored: Any = None                        # [version, pulled var, var, cand, choice]
        self._bmodel: Any = None                         # (version, [(runs, system, Z)])
        self._last_key: Any = None
        self._last_cand: Tensor | None = None            # held: its memory is not reused
        self._last_b: dict[str, Tensor] = {}
        self._bdraw: Any = None                          # (key, probs, count rows, prob rows)
        self._bterms: Any = None                         # (rule key, width offsets c [R])
        self._bkappa: Any = None                         # (key, κ² [R])

    def _leave_batch(self) -> None:
        if "batched" in self._modules:  # type: ignore[attr-defined]
            del self.batched
        self.gens = None

    def _prepare_batch(self, seeds: list[int]) -> None:
        self._per_run_settings(len(seeds))

    def _begin_batch(self, seeds: list[int], prepared: None) -> None:
        self._start_batch([torch.Generator().manual_seed(s) for s in seeds])

    def _restart_batch(self) -> None:
        super()._restart_batch()   # the counts emptied; the generators go on
        self._forget()

    # ---------------------------------------------------------------- rounds
    def _check_batch(self, candidates: Any) -> Tensor:
        return check_batched_candidates("candidates", candidates, len(self.gens),  # type: ignore[arg-type]
                                        dtype=self.dtype, device=self.device, dim=self.dim)  # type: ignore[attr-defined]

    def _batch_ucb(self, cand: Tensor) -> Tensor:
        """UCB ``[R, A]`` of checked candidates: ``μ̃ + β̃_t σ̃`` (ridge sd ``σ̃ = sqrt(var_GP/λ)``)."""
        mean, sd, beta, _ = self._batch_scores(cand)
        assert sd is not None
        # ``addcmul`` rounds μ̃ + σ̃·β̃ once per entry, as the sequential ``torch.add(μ̃, σ̃,
        # alpha=β̃)`` does (a fused multiply-add; ``μ̃ + β̃σ̃`` would round twice): the same bits
        # (tested), so near-ties at the prior break identically, with no host read of β̃
        return torch.addcmul(mean, sd, beta[:, None])

    def _batch_scores(self, cand: Tensor, choose: bool = False
                      ) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None]:
        """``(μ̃ [R, A], σ̃ [R, A], β̃_t [R], choice)`` of checked candidates (ridge sd); remembers
        the round's variances for :meth:`update`. With ``choose`` the compiled rounds may take
        every run's width and UCB argmax in their loop (:func:`torchbandits.native.bkb.select_rounds`):
        then ``σ̃`` is ``None`` and ``choice`` ``[R]`` is set, else ``choice`` is ``None``."""
        lam = self._lam()
        kc = self._nys.kernel_constant  # type: ignore[attr-defined]
        kappa2 = kc if kc is not None else self._bk.diag(cand).amax(-1)
        rule = self.rule  # type: ignore[attr-defined]
        post = self._posterior(cand, ucb=(lambda: self._width_terms(kc)) if choose else None)
        native = "sum_var" in post
        if native:   # the compiled rounds (CPU): ridge variances and S_t (torch.dot's)
            var, pvar, sum_var = post["var"], post["pvar"], post["sum_var"]
        else:
            var = post["var"] / lam[:, None]
            pvar = post["pvar"] / lam[:, None]
            sum_var = (self.batched.counts[:, :pvar.shape[1]] * pvar).sum(-1)
        choice = post.get("choice")
        if choice is not None:   # β̃_t and the choice made in C; the runs it left, here
            beta = post["beta"]
            for r in post["failed"]:
                beta[r] = self._run_width(float(sum_var[r]), kappa2, r)
                row = slice(r, r + 1)
                pick = native_bkb.ucb_argmax_rounds(post["mean"][row], torch.sqrt(var[row]),
                                                    beta[row])
                choice[r] = pick[0] if pick is not None else torch.argmax(
                    torch.addcmul(post["mean"][r], torch.sqrt(var[r]), beta[r]))
        elif native and rule.rule != "constant":  # β̃_t in the sequential rule's float arithmetic
            beta = torch.tensor([rule.radius(s, self.t, kappa2, v) for s, v in  # type: ignore[attr-defined]
                                 zip(sum_var.tolist(), self._lam64.tolist(), strict=True)],
                                dtype=var.dtype)
        else:
            beta = batched_bkb_radius(rule, sum_var, self.t, kappa2, lam, self._beta64)  # type: ignore[attr-defined]
        self._bscored = [self.batched.version, pvar, var, cand, None, native]
        self._last_b = {"beta": beta, "sum_var": sum_var, "kappa2": self._kappa2_runs(kappa2, beta)}
        return post["mean"], None if choice is not None else torch.sqrt(var), beta, choice

    def _kappa2_runs(self, kappa2: Tensor | float, beta: Tensor) -> Tensor:
        """κ² per run ``[R]`` (``beta``'s shape; a kernel constant's on the host, made once per
        batch: no copy to a device)."""
        if isinstance(kappa2, Tensor):
            return kappa2.to(self.dtype).expand_as(beta)  # type: ignore[attr-defined]
        key = (kappa2, beta.shape, self.dtype)  # type: ignore[attr-defined]
        if self._bkappa is None or self._bkappa[0] != key:
            self._bkappa = (key, torch.as_tensor(kappa2, dtype=self.dtype).expand_as(beta))  # type: ignore[attr-defined]
        return self._bkappa[1]

    def _width_terms(self, kc: float | None) -> tuple[Tensor | None, Tensor | None, float, float,
                                                       float, float] | None:
        """The width's terms for :func:`torchbandits.native.bkb.select_rounds` at this round:
        the constant rule's widths ``[R]``, or the folded constants of
        :func:`~torchbandits.confidence.bkb_batched.radius_terms` (``None`` without a kernel
        constant: no compiled round)."""
        if kc is None:
            return None
        rule = self.rule  # type: ignore[attr-defined]
        if rule.rule == "constant":
            beta = batched_bkb_radius(rule, self._lam64, self.t, kc, self._lam64, self._beta64)  # type: ignore[attr-defined]
            return beta.to(torch.float64).contiguous(), None, 0.0, 0.0, 0.0, 1.0
        key = (rule.rule, rule.eps, rule.norm_bound)   # c [R]: the rule and λ only
        kept = self._bterms
        if kept is None or kept[0] != key:
            c = radius_offsets(rule, self._lam_list)
            kept = self._bterms = (key, torch.tensor(c, dtype=torch.float64))
        return (None, kept[1], *radius_terms(rule, self.t, kc))  # type: ignore[attr-defined]

    def _run_width(self, sum_var: float, kappa2: float, r: int) -> float:
        """β̃_t of run ``r`` by the sequential rule (``S_t = sum_var``)."""
        rule = self.rule  # type: ignore[attr-defined]
        if rule.rule == "constant":
            base = rule.beta if self._beta64 is None else float(self._beta64[r])
            return base * rule.beta_scale
        return rule.radius(sum_var, self.t, kappa2, self._lam_list[r])  # type: ignore[attr-defined]

    def forward(self, candidates: Tensor) -> Tensor:
        """UCB ``[A]`` of candidates ``[A, d]``; in batched mode ``[R, A]`` of ``[R, A, d]``."""
        if self.gens is None:
            return super().forward(candidates)  # type: ignore[misc]
        with torch.no_grad():
            return self._batch_ucb(self._check_batch(candidates))

    def select(self, candidates: Any) -> Any:
        """One index (single run), or a ``LongTensor [R]`` for candidates ``[R, A, d]``: each
        run's UCB argmax (first index on ties), uniform from its own generator in the warm-up."""
        if self.gens is None:
            return super().select(candidates)  # type: ignore[misc]
        cand = self._check_batch(candidates)
        dev = self.device  # type: ignore[attr-defined]
        if self.t < self.n_warmup:  # type: ignore[attr-defined]
            self._rows(cand, 0)   # remember the candidate tensor (a fixed arm set)
            index = self.warmup_index  # type: ignore[attr-defined]
            if index is None:
                draws = [torch.randint(cand.shape[1], (1,), generator=g) for g in self.gens]
                return torch.cat(draws).to(dev)
            if index >= cand.shape[1]:
                raise ValueError(f"warmup_index {index} is out of range for {cand.shape[1]} "
                                 f"candidates")
            return torch.full((cand.shape[0],), index, dtype=torch.long, device=dev)
        with torch.no_grad():
            mean, sd, beta, index = self._batch_scores(cand, choose=True)
            if index is None:
                assert sd is not None
                # compiled rounds: the argmax of the same fused UCB in C, the UCB not formed
                index = native_bkb.ucb_argmax_rounds(mean, sd, beta) if self._bscored[5] else None
            if index is None:
                assert sd is not None
                index = torch.argmax(torch.addcmul(mean, sd, beta[:, None]), dim=1)
        self._bscored[4] = index
        return index

    def update(self, x: Any, reward: Any) -> None:
        """Single run: as before. Batch: ``x [R, d]`` and ``reward [R]``, both checked before any
        run's state changes (``ValueError`` naming the argument); then every run's count update
        and its dictionary resampled from its own generator (§3.1)."""
        if self.gens is None:
            super().update(x, reward)  # type: ignore[misc]
            return
        st, r = self.batched, len(self.gens)
        opts = dict(dtype=self.dtype, device=self.device)  # type: ignore[attr-defined]
        xv = check_batch_points("x", x, r, dim=self.dim, **opts)  # type: ignore[attr-defined,arg-type]
        y = check_batch_rewards("reward", reward, r, **opts)  # type: ignore[arg-type]
        with torch.no_grad():
            lam = self._lam()
            scored, arms = self._bscored, None
            fresh = scored is not None and scored[0] == st.version and scored[4] is not None
            binomial = self.resampler.sampler == "binomial"  # type: ignore[attr-defined]
            native = (self._record_native(xv, y, scored, self.resampler.qbar if binomial else None)  # type: ignore[attr-defined]
                      if fresh and scored[5] else None)
            if native is not None:   # compiled: counts, arm rows and the draw's variances
                slot, new, var = native
                n = var.shape[1] - 1
            elif not fresh:                                    # no select
                pvar = self._posterior(xv[:, None, :], cached=False)["pvar"] / lam[:, None]
                xvar = self._played_variance(xv) / lam
            else:
                pvar = scored[1]
                chosen = scored[3].gather(1, scored[4][:, None, None].expand(-1, 1, xv.shape[1]))
                hit = (chosen[:, 0] == xv).all(-1)           # the candidate just selected
                xvar = scored[2].gather(1, scored[4][:, None])[:, 0]
                if bool(hit.all()):                          # one host read: arms known
                    arms = scored[4] if scored[3] is self._last_cand else None
                else:
                    xvar = torch.where(hit, xvar, self._played_variance(xv) / lam)
            if native is None:
                n = pvar.shape[1]
                slot, new = st.record(xv, y, n)
                self._cache_played(xv, slot, new, arms)
                ar = torch.arange(r, device=xv.device)
                var = torch.cat([pvar, pvar.new_zeros(r, 1)], 1)
                var[ar, slot] = torch.where(new, xvar, var[ar, slot])
            if native is not None and binomial:   # the probabilities written by the C update
                _, rows, probs = self._draw_rows()
                self.batched.set_dictionary(torch.stack([
                    torch.binomial(c, p, generator=g) for c, p, g in zip(rows, probs, self.gens)]))  # type: ignore[arg-type]
            else:
                self._resample(var, st.counts[:, :n + 1])
            self._bscored = None
        self.dim = xv.shape[1]
        self.t += 1  # type: ignore[attr-defined]

    def _resample(self, var: Tensor, counts: Tensor) -> None:
        """Every run's dictionary drawn from its own generator over its distinct points."""
        res = self.resampler  # type: ignore[attr-defined]
        v = var.detach().to("cpu", torch.float64)
        c = counts.detach().to("cpu", torch.float64)
        if res.sampler == "binomial":
            p = torch.clamp(res.qbar * v.clamp_min(0.0), max=1.0).nan_to_num_(0.0)
            copies = torch.stack([torch.binomial(ci, pi, generator=g) for ci, pi, g in  # type: ignore[arg-type]
                                  zip(c.unbind(0), p.unbind(0), self.gens, strict=True)])
        else:
            sizes = self.batched.n_distinct.tolist()
            copies = torch.zeros_like(c)
            for i, g in enumerate(self.gens):  # type: ignore[arg-type]
                copies[i, :sizes[i]] = res.resample(v[i, :sizes[i]], c[i, :sizes[i]], g).copies
        self.batched.set_dictionary(copies)

    # ---------------------------------------------------------------- per-run views / state
    def run_dictionary(self, run: int) -> Tensor:
        """Dictionary of run ``run`` ``[m_r, d]`` (in the order of the sequential run's)."""
        st = self.batched
        return st.px[run][st.in_dict[run]]

    def diagnostics(self) -> dict[str, Any]:
        """As the sequential diagnostics; in batched mode tensors ``[R]``, one entry per run."""
        if self.gens is None:
            return super().diagnostics()  # type: ignore[misc]
        st, dt = self.batched, self.dtype  # type: ignore[attr-defined]
        out = {"dictionary_size": st.sizes.to(dt), "m_theory": st.m_theory.to(dt),
               "n_distinct": st.n_distinct.to(dt), "empty_dictionaries": st.empty.to(dt)}
        out.update({k: self._last_b[k] for k in ("beta", "sum_var") if k in self._last_b})
        return out

    def get_extra_state(self) -> dict[str, Any]:
        state = super().get_extra_state()  # type: ignore[misc]
        if self.gens is not None:
            state["batch"] = {"rng": [g.get_state() for g in self.gens], "lam": self._lam64.clone(),
                              "beta": None if self._beta64 is None else self._beta64.clone(),
                              "last": {k: v.detach().cpu().clone() for k, v in self._last_b.items()}}
        return state

    def set_extra_state(self, state: dict[str, Any]) -> None:
        super().set_extra_state(state)  # type: ignore[misc]
        batch = state.get("batch")
        self._leave_batch()
        if batch is None:
            return
        gens = [torch.Generator() for _ in batch["rng"]]
        for g, s in zip(gens, batch["rng"], strict=True):
            g.set_state(s)
        saved = getattr(self, "_per_run", None)
        self._per_run = {"lam": batch["lam"], "beta": batch["beta"]}
        self._start_batch(gens)   # an empty batch of the saved R: its buffers load right after
        self._per_run = saved if saved is not None else {"lam": None, "beta": None}
        self._last_b = {k: v.to(dtype=self.dtype, device=self.device)  # type: ignore[attr-defined]
                        for k, v in batch["last"].items()}

    def _apply(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = super()._apply(fn, *args, **kwargs)  # type: ignore[misc]
        if self.gens is not None:
            last = {k: fn(v) for k, v in self._last_b.items()}
            self._forget()
            self._last_b = last
        return out


def with_batch_mode(cls: type) -> type:
    """``cls`` with :class:`BKBBatchMixin` in front (the same name, module and docstring): the
    batched entry points wrap the sequential ones without touching them."""
    return type(cls.__name__, (BKBBatchMixin, cls), {
        "__doc__": cls.__doc__, "__module__": cls.__module__, "__qualname__": cls.__qualname__})
