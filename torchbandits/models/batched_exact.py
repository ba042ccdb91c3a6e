"""``R`` runs of exact kernel ridge regression stepped together (a leading run dimension).

The math is :class:`~torchbandits.models.ExactKernelRidge`'s, run by run: for run ``r`` with data
``S_r = (s_1..s_n)``, targets ``Y_r`` and regulariser ``λ_r > 0`` (the GP noise variance),

* mean      ``μ_r(x) = k_{S_r}(x)ᵀ (K_r + λ_r I)⁻¹ Y_r``
* variance  ``ρ²_r(x) = k(x, x) − k_{S_r}(x)ᵀ (K_r + λ_r I)⁻¹ k_{S_r}(x)`` (the **GP** variance);
  the kernel-ridge ("ridge") variance of Zenati et al. (2022, §3.2) and Calandriello et al.
  (2019, §3.1) is ``ρ²_r(x) / λ_r``;
* ``log det(I + K_r/λ_r) = 2 Σ log L_ii − n log λ_r``.

Every run holds the same number of points ``n`` (one per round), so the state stacks: lower
Cholesky factors ``L`` ``[R, cap, cap]`` of ``K_r + λ_r I``, inputs ``[R, cap, d]``, targets and
whitened targets ``z = L⁻¹Y`` ``[R, cap]``, the capacity doubling as in the sequential model.
An append borders every factor at once (O(n²) per run; the Cholesky form of the recursive
update of Flynn & Reeb 2024, App. E.2); scoring candidates ``[R, A, d]`` is one batched kernel
evaluation and ``V = L⁻¹ K_SC`` ``[R, n, A]``, ``μ = zᵀV``, ``ρ² = k_CC − colsum(V ⊙ V)``. Up
to :data:`~torchbandits.models.batched_inverse.INVERSE_MAX_N` points the explicit ``L⁻¹`` is
kept by the same bordering and ``V`` is one batched product into reused buffers
(:mod:`~torchbandits.models.batched_inverse`, :mod:`~torchbandits.models.batched_kernel`);
beyond, or after the factor changed otherwise, a blocked batched triangular solve. A fixed
candidate set (the same tensor values as the previous call) keeps ``V`` from its second call on
and gains one row per append, as :class:`~torchbandits.models.posterior.CandidateCache` does
for one run (O(n·A) per round).

On the CPU in float64 with a closed-form kernel (RBF, Matérn) the scoring of fresh candidates
(or the scoring, a rule's closed-form bound and its argmax: :meth:`~BatchedExactKernelRidge.
ucb_argmax`) and the append are instead one compiled call each for all runs (the mixin
:class:`~torchbandits.models.batched_exact_native.BatchedExactNative`); the torch program stays
the reference and is what runs on other devices and dtypes.

``λ`` may be one float for all runs or a tensor ``[R]`` (a λ grid as one batch). The numbers
equal the sequential model's up to rounding (batched BLAS may sum in another order).
"""

from __future__ import annotations

from typing import Any

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..batching import (
    active_checks,
    check_batch_points,
    check_batch_rewards,
    check_batched_candidates,
    check_runs,
)
from ..buffers import ResizableModule, grow_rows
from ..kernels import kernel_diag, kernel_matrix
from .batched_exact_native import BatchedExactNative
from .batched_groups import BatchedGroups
from .batched_inverse import InverseFactor, Workspace
from .batched_kernel import ScaledPoints, fast_kernel
from .batched_solve import FactorHead, block_solve, check_run_values, storage_key

__all__ = ["BatchedExactKernelRidge", "check_run_values"]


class BatchedExactKernelRidge(BatchedExactNative, BatchedGroups, FactorHead, ResizableModule):
    """Exact kernel ridge regression / GP posterior of ``R`` runs with one kernel.

    Args:
        kernel: a GPyTorch kernel (shared by every run; kept as a submodule).
        lam: the regulariser, a float or a tensor ``[R]`` of per-run values (all > 0).
        n_runs: ``R``.
        dtype, device: of all state (float64 by default).
        cache_candidates: keep ``V = L⁻¹K_SC`` of the last fixed candidate set.
    """

    def __init__(self, kernel: Kernel, lam: float | Tensor, n_runs: int, *,
                 dtype: torch.dtype = torch.float64, device: torch.device | str | None = None,
                 cache_candidates: bool = True, lam_checked: bool = False) -> None:
        super().__init__()
        if int(n_runs) < 1:
            raise ValueError(f"n_runs must be >= 1, got {n_runs}")
        r = int(n_runs)
        self.kernel = kernel.to(dtype=dtype, device=device)
        self.register_buffer("_lam", check_run_values("lam", lam, r, positive=True, dtype=dtype,
                                                         checked=lam_checked))
        # state made on the device (a companion is built inside a round: no host copy)
        self.register_buffer("_L", torch.zeros(r, 16, 16, dtype=dtype, device=device))
        self.register_buffer("_x", torch.zeros(r, 16, 0, dtype=dtype, device=device))
        self.register_buffer("_y", torch.zeros(r, 16, dtype=dtype, device=device))
        self.register_buffer("_z", torch.zeros(r, 16, dtype=dtype, device=device))
        self.cache_candidates = bool(cache_candidates)
        self._n = 0
        self._cache: dict[str, Any] | None = None
        self._extra: dict[Any, Any] = {}   # companions / spectra derived from the data
        self._inverse = InverseFactor()      # explicit L⁻¹ while n <= INVERSE_MAX_N
        self.workspace, self._scaled = Workspace(), ScaledPoints()   # scoring buffers; x/ℓ kept
        if device is not None:
            self.to(device)

    # ------------------------------------------------------------------ properties / state
    @property
    def n_runs(self) -> int:
        """Number of runs R stepped together."""
        return int(self._lam.shape[0])

    @property
    def n(self) -> int:
        """Number of points per run."""
        return self._n

    @property
    def lam(self) -> Tensor:
        """Per-run regularisers ``[R]``."""
        return self._lam

    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype of the model's tensors."""
        return self._lam.dtype

    @property
    def device(self) -> torch.device:
        """Device of the model's tensors."""
        return self._lam.device

    @property
    def dim(self) -> int | None:
        """Input dimension d of the stored points (None while empty)."""
        return int(self._x.shape[2]) if self._n else None

    @property
    def x(self) -> Tensor:
        """Stored inputs ``[R, n, d]`` (a view)."""
        return self._x[:, : self._n]

    @property
    def y(self) -> Tensor:
        """Stored targets ``[R, n]`` (a view)."""
        return self._y[:, : self._n]

    def cholesky(self) -> Tensor:
        """Lower factors of ``K_r + λ_r I`` ``[R, n, n]`` (a copy)."""
        return self._L[:, : self._n, : self._n].clone()

    def get_extra_state(self) -> dict:
        return {"n": self._n, "no_inverse": self._inverse.stale(self._L, self._n)}

    def set_extra_state(self, state: dict) -> None:
        self._n = int(state["n"])
        self._cache = None
        self._extra = {}
        self._scaled.clear()
        self._pending = self._pivots = None
        self._inverse.restart()    # rebuilt from the loaded factor at the next use ...
        if state.get("no_inverse", False):
            self._inverse.drop()   # ... unless the saved model solved with the factor

    def _apply(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._cache = None
        self._extra = {}
        self._inverse.restart()
        self._scaled.clear()
        self.workspace.clear()
        self._pending = self._pivots = None
        return super()._apply(fn, *args, **kwargs)

    def reset(self) -> None:
        """Forget all data of every run (the posteriors return to the prior)."""
        self._n = 0
        self._cache = None
        self._extra = {}
        self._inverse.restart()
        self._pending = self._pivots = None
        self._scaled.clear()       # the kernel's hyper-parameters are read again

    def inverse_valid(self) -> bool:
        """Whether the explicit ``L⁻¹`` of every run is kept for the current points
        (:class:`~torchbandits.models.batched_inverse.InverseFactor`; rebuilt here if missing)."""
        return self._inverse.valid(self._L, self._n)

    def inverse_factor(self, n: int) -> Tensor:
        """``L⁻¹`` ``[R, n, n]`` (a view; call :meth:`inverse_valid` first)."""
        assert self._inverse.inv is not None
        return self._inverse.inv[:, :n, :n]

    # ------------------------------------------------------------------ kernel helpers
    def _kdiag(self, x: Tensor) -> Tensor:
        """``k(x, x)`` ``[R, m]`` of points ``[R, m, d]`` (RBF, Matérn: an expanded view)."""
        if fast_kernel(self.kernel):
            return self._scaled.diag(self.kernel, x, x.shape[:2])
        return kernel_diag(self.kernel, x.reshape(-1, x.shape[-1])).reshape(x.shape[:2])

    # ------------------------------------------------------------------ updates
    @torch.no_grad()
    def append(self, x: Any, y: Any, *, validate: bool = True) -> None:
        """Add one observation per run, ``x [R, d]``, ``y [R]``: a bordered Cholesky step,
        ``row = L⁻¹ k_S(x)``, ``d = sqrt(k(x,x) + λ − ‖row‖²)``, ``z_n = (y − row·z)/d``.

        Validates first (shapes, finiteness, positive pivots; ``validate=False``: the caller has
        checked ``x`` and ``y`` already); a rejected call changes nothing. Inside
        :func:`~torchbandits.batching.deferred_checks` the pivot check is a device flag (no host
        read): a run with a non-positive pivot goes on with NaN until the runner reads the flags.
        """
        n, r = self._n, self.n_runs
        if validate:
            x = check_batch_points("x", x, r, dtype=self.dtype, device=self.device, dim=self.dim)
            y = check_batch_rewards("y", y, r, dtype=self.dtype, device=self.device)
        if self.append_native(x, y):   # the compiled step (CPU, float64; BatchedExactNative)
            return
        kxx = self._kdiag(x[:, None])[:, 0]
        with_inverse = self._inverse.ready_for_append(self._L, n)
        new = self._scaled.scaled(self.kernel, x, self._x, n)  # x/ℓ [R, d], ‖x/ℓ‖² [R] or None
        if n:
            k_col = (self._scaled.column(self.kernel, self._x, n, *new) if new is not None
                     else kernel_matrix(self.kernel, self._x[:, :n], x[:, None]))  # [R, n, 1]
            row = (self._inverse.matvec(n, k_col) if with_inverse
                   else block_solve(self._L, self._factor_head(), n, k_col))[..., 0]
            d2 = kxx + self._lam - (row * row).sum(-1)
        else:
            row = x.new_zeros(r, 0)
            d2 = kxx + self._lam
        check_runs("append: Cholesky pivot not positive", ~(d2 > 0),
                   lambda run: f"append: pivot {float(d2[run]):.3e} not positive in run {run} "
                               f"(λ = {float(self._lam[run])})")
        d = torch.sqrt(d2)
        if self._x.shape[2] != x.shape[1]:
            self._x = x.new_zeros(r, self._x.shape[1], x.shape[1])
        self._L = grow_rows(self._L, n + 1, dims=(1, 2))
        self._x = grow_rows(self._x, n + 1, dims=(1,))
        self._y = grow_rows(self._y, n + 1, dims=(1,))
        self._z = grow_rows(self._z, n + 1, dims=(1,))
        self._L[:, n, :n] = row
        self._L[:, n, n] = d
        self._x[:, n] = x
        if new is not None:
            self._scaled.append(self._x, n)
        self._y[:, n] = y
        self._z[:, n] = (y - (row * self._z[:, :n]).sum(-1)) / d
        if with_inverse:
            self._inverse.border(self._L, row, d, n)
        self._n = n + 1

    # ------------------------------------------------------------------ queries
    def _cache_hit(self, cand: Tensor) -> dict[str, Any] | None:
        """The cache of a fixed candidate set if ``cand`` ``[R, A, d]`` is its set: a view of the
        same, unmodified storage as the cached call (a host-side comparison of storage, offset,
        strides and version counter — the cache holds a reference, so the storage cannot be
        reused), or, in an eager call, the same values by ``torch.equal`` (one host read)."""
        c = self._cache
        if c is not None and "cand" in c and c["cand"].shape == cand.shape and c["n_at"] <= self._n \
                and (cand is c["cand"] or c["key"] == storage_key(cand)
                     or (active_checks() is None and torch.equal(c["cand"], cand))):
            return c
        return None

    def _remember(self, cand: Tensor, kdiag: Tensor | None) -> None:
        """Remember a fresh set (its ``V`` is kept if it comes again; ``kdiag`` None: made then)."""
        if self.cache_candidates:
            self._cache = {"cand": cand.clone(), "kdiag": kdiag, "n_at": self._n, "src": cand,
                           "key": storage_key(cand), "head": (self._cache or {}).get("head")}

    def _whitened(self, cand: Tensor, compiled: bool = False
                  ) -> tuple[Tensor | None, Tensor, Tensor]:
        """``(V [R, n, A], k_CC [R, A], colsum(V ⊙ V) [R, A])`` for candidates ``[R, A, d]``.

        A set is remembered at its first call and its ``V`` kept from its second (fresh arm sets,
        seen once, cost no copy of ``V``; :meth:`_cache_hit`). Fresh candidates are scored by
        :meth:`_score_fresh`, or with ``compiled`` by the compiled step where it qualifies
        (:meth:`~torchbandits.models.batched_exact_native.BatchedExactNative.mean_var_native`),
        which gives ``(None, μ, ρ²)`` instead."""
        n = self._n
        c = self._cache_hit(cand)
        if c is not None:
            if "v" not in c:   # the second call with this set: its V, owned by the cache
                got = self.mean_var_native(cand, keep=True) if compiled else None
                if got is not None:   # compiled: the scores of this call as a fresh set's
                    c.update(v=got[2], sumsq=got[3], n_at=n)
                    return None, got[0], got[1]
                v, _, sumsq = self._score_fresh(cand, owned=True)
                c.update(v=v, sumsq=sumsq, n_at=n)
            a = c["n_at"]
            if a < n:   # the rows of V for the points appended since the last call
                kq_new = kernel_matrix(self.kernel, self._x[:, a:n], cand)     # [R, n−a, A]
                rows = self._L[:, a:n, :n]
                rhs = kq_new - rows[:, :, :a] @ c["v"][:, :a] if a else kq_new
                v_new = torch.linalg.solve_triangular(rows[:, :, a:n], rhs, upper=False)
                c["v"] = grow_rows(c["v"], n, dims=(1,))
                c["v"][:, a:n] = v_new
                c["sumsq"] = c["sumsq"] + (v_new * v_new).sum(1)
                c["n_at"] = n
            if c["kdiag"] is None:
                c["kdiag"] = self._kdiag(c["cand"])
            return c["v"][:, :n], c["kdiag"], c["sumsq"]
        got = self.mean_var_native(cand) if compiled else None
        if got is not None:
            self._remember(cand, None)
            return None, got[0], got[1]
        v, kdiag, sumsq = self._score_fresh(cand)
        self._remember(cand, kdiag)
        return v, kdiag, sumsq

    def _score_fresh(self, cand: Tensor, *, owned: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """``(V, k_CC, colsum(V ⊙ V))`` of candidates ``[R, A, d]`` from scratch: with the
        explicit inverse, ``Vᵀ = K_CS (L⁻¹)ᵀ`` ``[R, A, n]``, one batched product into the
        workspace (``owned``: into a new tensor, ``V`` contiguous); else the blocked triangular
        solve (:func:`~torchbandits.models.batched_solve.block_solve`)."""
        n = self._n
        kdiag = self._kdiag(cand)
        if self._inverse.valid(self._L, n):
            kq_t = self._scaled.rows(self.kernel, cand, self._x, n, self.workspace)  # [R, A, n]
            shape = (cand.shape[0], cand.shape[1], n)
            vt = torch.empty(shape, dtype=kq_t.dtype, device=kq_t.device) if owned \
                else self.workspace.get("vt", shape, kq_t)
            self._inverse.whiten_t(kq_t, n, vt)
            sumsq = torch.mul(vt, vt, out=kq_t).sum(-1)     # kq_t is spent: its memory reused
            return (vt.mT.contiguous() if owned else vt.mT), kdiag, sumsq
        kq = kernel_matrix(self.kernel, self._x[:, :n], cand)                  # [R, n, A]
        v = block_solve(self._L, self._factor_head(), n, kq)
        return v, kdiag, (v * v).sum(1)

    @torch.no_grad()
    def mean_var(self, candidates: Any, variance: str = "gp", *, validate: bool = True
                 ) -> tuple[Tensor, Tensor]:
        """Posterior mean ``μ_r`` and variance (clamped at 0) of every run at its candidates
        ``[R, A, d]``; both ``[R, A]``. ``variance="gp"``: ``ρ²_r``; ``"ridge"``: ``ρ²_r/λ_r``.
        ``validate=False``: the caller has checked ``candidates`` already."""
        if variance not in ("gp", "ridge"):
            raise ValueError(f"variance must be 'gp' or 'ridge', got {variance!r}")
        cand = candidates
        if validate:
            cand = check_batched_candidates("candidates", candidates, self.n_runs,
                                            dtype=self.dtype, device=self.device, dim=self.dim)
        if self._n == 0:
            mean, var = cand.new_zeros(cand.shape[:2]), self._kdiag(cand).contiguous()
        else:
            v, a, b = self._whitened(cand, compiled=True)   # (V, k_CC, colsum V²) or (None, μ, ρ²)
            mean, var = (a, b) if v is None else \
                ((self._z[:, None, : self._n] @ v)[:, 0], torch.clamp(a - b, min=0.0))
        if variance == "ridge":
            var = var / self._lam[:, None]
        return mean, var

    @torch.no_grad()
    def log_det(self) -> Tensor:
        """``log det(I + K_r/λ_r)`` of every run ``[R]`` (0 when empty)."""
        n = self._n
        if n == 0:
            return self._lam.new_zeros(self.n_runs)
        diag = self.factor_diagonal(n)   # [R, n]: L_ii (a contiguous copy where it is kept)
        key = ("log_lam", id(self._lam), self._lam._version)      # log λ, once per λ tensor
        if key not in self._extra:
            self._extra[key] = torch.log(self._lam)
        return 2.0 * torch.log(diag).sum(-1) - n * self._extra[key]

    @torch.no_grad()
    def quad_y(self) -> Tensor:
        """``Y_rᵀ (K_r + λ_r I)⁻¹ Y_r = ‖z_r‖²`` ``[R]`` (0 when empty)."""
        z = self._z[:, : self._n]
        return (z * z).sum(-1)

    @torch.no_grad()
    def spectrum(self) -> tuple[Tensor, Tensor, Tensor]:
        """``K_r = Q_r diag(e_r) Q_rᵀ`` of every run (one batched ``eigh``; eigenvalues clamped
        at 0) and ``ỹ_r = Q_rᵀ Y_r``: ``(e [R, n], Q [R, n, n], ỹ [R, n])``, cached until the
        next append (the Kernel CMM dual of Flynn & Reeb 2024, Eq. 12, for ``R`` runs)."""
        key = ("spectrum", self._n)
        if key not in self._extra:
            self._extra = {k: v for k, v in self._extra.items() if k[0] != "spectrum"}
            x, y = self.x, self.y
            gram = kernel_matrix(self.kernel, x, x)
            evals, evecs = torch.linalg.eigh(gram)
            evals = torch.clamp(evals, min=0.0)
            self._extra[key] = (evals, evecs, (evecs.mT @ y[..., None])[..., 0])
        return self._extra[key]

    def kernel_columns(self, candidates: Tensor) -> tuple[Tensor, Tensor]:
        """``(K_{S_r, C_r} [R, n, A], k(c, c) [R, A])`` for checked candidates ``[R, A, d]``."""
        return kernel_matrix(self.kernel, self.x, candidates), self._kdiag(candidates)

    def extra_repr(self) -> str:
        return f"n_runs={self.n_runs}, n={self._n}"
