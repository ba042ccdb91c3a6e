"""Exact kernel ridge regression / GP posterior with O(n²) incremental updates.

For data ``S = (s_1..s_n)``, ``Y`` and a regulariser ``λ > 0`` (the GP noise variance):

* mean      ``μ_λ(x) = k_S(x)ᵀ (K + λI)⁻¹ Y``
* variance  ``ρ²_λ(x) = k(x, x) − k_S(x)ᵀ (K + λI)⁻¹ k_S(x)``   — the **GP** posterior variance.

The kernel-ridge ("ridge") variance of Zenati et al. (2022, §3.2) and Calandriello et al. (2019,
§3.1) is ``ρ²_λ(x) / λ``; models
always return the GP variance and each policy states which one its β multiplies.

State per regulariser: the lower Cholesky factor ``L`` of ``K + λI`` (a :class:`GrowingCholesky`)
and ``z = L⁻¹ Y``. Then for candidates ``C`` with ``V = L⁻¹ K_SC``: ``μ = Vᵀ z`` and
``ρ² = k_CC − colsum(V ⊙ V)`` — one triangular solve per round, no explicit inverse (the Cholesky
form of the recursive update of Flynn & Reeb 2024, App. E.2, preferred over their recursive
inverse for small λ). The solve-and-score step and the candidate cache are
:mod:`torchbandits.models.posterior`'s; the queries (scoring, log-det, ``yᵀ(K+αI)⁻¹y``) and what
an append reuses from the last scoring are :mod:`torchbandits.models.exact_scoring`'s.

* append one point: one triangular solve, O(n²) — or O(n) when the point is a candidate of the
  last scoring (``append(x, y, column=(candidates, j))``: the new row is that scoring's column);
* remove the oldest point: a rank-one Cholesky update, O(n²) (sliding windows, Zhou & Shroff 2021);
* a fixed candidate set (the same tensor values as the previous call) is cached: ``V`` gains one
  row per appended point, so scoring costs O(n·A) instead of O(n²·A);
* ``log det(I + K/λ) = 2 Σ log L_ii − n log λ`` and ``yᵀ(K+λI)⁻¹y = ‖z‖²`` kept as running
  floats, O(1) per append;
* on the CPU in float64, for the RBF and Matérn kernels and up to
  :data:`~torchbandits.native.exact.MAX_N` (1500) points, a round's scoring
  (kernel rows, the solves, means, variances — with a policy's rule also the bound and its argmax)
  and the append of the played candidate are one compiled call each
  (:mod:`torchbandits.models.exact_native`; a policy's step on fresh candidates:
  :mod:`torchbandits.models.exact_fused`, one call per select and one per update on a table of
  the model's addresses kept between calls); the torch path stays the reference and runs otherwise;
* several regularisers can be maintained at once (``regularisers=(λ, α_1, …)``) for confidence
  rules that need the posterior at other regularisers; any other value is served from a
  from-scratch factorisation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..buffers import StoredData, grow_rows, set_plain
from ..kernels import kernel_diag, kernel_matrix
from ..linalg import GrowingCholesky, safe_cholesky
from ..validation import as_matrix, as_point, as_scalar_reward, check_positive
from .exact_fused import ExactFused
from .exact_rebuild import CandidateRescore
from .exact_scoring import ExactQueries, ScoredSet
from .posterior import CandidateCache, whitened_solve

__all__ = ["ExactKernelRidge"]


class ExactKernelRidge(ExactFused, ExactQueries, CandidateRescore, StoredData):
    """Exact posterior of kernel ridge regression at one or more regularisers.

    Args:
        kernel: a GPyTorch kernel (see :mod:`torchbandits.kernels`); kept as a submodule.
        lam: the primary regulariser ``λ > 0`` (GP noise variance).
        extra_regularisers: further regularisers maintained incrementally alongside ``λ``.
        dtype, device: of all state (float64 by default).
        refresh_every: if > 0, refactorise from scratch every that many appends (drift control).
        cache_candidates: keep ``L⁻¹K_SC`` of the last fixed candidate set (see the module
            docstring).
        removal: how :meth:`remove_oldest` updates the factor: ``"rank_one"`` (default, O(n²)
            Cholesky rank-one update) or ``"refactorise"`` (O(n³) from-scratch factorisation of
            the remaining points; the baseline of the sliding-window benchmark).
    """

    def __init__(
        self,
        kernel: Kernel,
        lam: float = 1.0,
        extra_regularisers: Sequence[float] = (),
        *,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
        refresh_every: int = 0,
        cache_candidates: bool = True,
        removal: str = "rank_one",
    ) -> None:
        super().__init__()
        if removal not in ("rank_one", "refactorise"):
            raise ValueError(f"removal must be 'rank_one' or 'refactorise', got {removal!r}")
        self.removal = removal
        regs = [check_positive("lam", lam)]
        regs += [check_positive("extra_regularisers", r) for r in extra_regularisers]
        self.regularisers: tuple[float, ...] = tuple(regs)
        self.kernel = kernel.to(dtype=dtype, device=device)
        self.factors = torch.nn.ModuleList(GrowingCholesky(dtype=dtype) for _ in regs)
        self.register_buffer("_x", torch.zeros(0, 0, dtype=dtype))
        self.register_buffer("_y", torch.zeros(16, dtype=dtype))
        self.register_buffer("_z", torch.zeros(len(regs), 16, dtype=dtype))
        self.refresh_every = int(refresh_every)
        self.cache_candidates = bool(cache_candidates)
        self._n = 0
        self._version = 0
        self._appends_since_refresh = 0
        self._caches: dict[int, CandidateCache] = {}
        self._scratch: dict[tuple[float, int, int], tuple[Tensor, Tensor]] = {}
        self._removal_p: list[Tensor] = []  # per factor, p of the last removal (see remove_first)
        self._plan = None  # the kernel's hyper-parameters read once (see exact_scoring)
        self._scored: ScoredSet | None = None  # the last scored candidate set
        self._sums: dict[int, list] = {}  # per factor, running Σ log L_ii and ‖z‖²
        self._lean: list | None = None  # the stored points scaled for the kernel (exact_scoring)
        self._cache_seen: dict[int, int] = {}  # per factor: version of its cache's candidates
        if device is not None:
            self.to(device)

    # ------------------------------------------------------------------ properties / state
    @property
    def lam(self) -> float:
        """The model's own regulariser λ (the first of ``regularisers``)."""
        return self.regularisers[0]

    def get_extra_state(self) -> dict:
        return {"n": self._n, "regularisers": self.regularisers,
                "appends_since_refresh": self._appends_since_refresh}

    def set_extra_state(self, state: dict) -> None:
        self._n = int(state["n"])
        self.regularisers = tuple(float(r) for r in state["regularisers"])
        self._appends_since_refresh = int(state.get("appends_since_refresh", 0))
        self._invalidate()

    def _apply(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._invalidate()
        self._plan = None
        return super()._apply(fn, *args, **kwargs)

    def _invalidate(self) -> None:
        self._version += 1
        self._caches.clear()
        self._scratch.clear()
        self._sums.clear()
        self._scored = None
        self._lean = None
        self._fused = None  # the fused step's tables (models.exact_fused): rebuilt on demand

    def reset(self) -> None:
        """Forget all data (the posterior returns to the prior)."""
        for f in self.factors:
            f.reset()
        self._n = 0
        self._appends_since_refresh = 0
        self._invalidate()

    # ------------------------------------------------------------------ updates
    def _check_x(self, name: str, x: Tensor) -> Tensor:
        bufs = self._buffers  # (dtype, device and dim without nn.Module.__getattr__: a step's cost)
        ys, xs = bufs["_y"], bufs["_x"]
        dim = xs.shape[1] if xs.shape[0] > 0 else None  # type: ignore[union-attr]
        return as_point(name, x, dtype=ys.dtype, device=ys.device, dim=dim)  # type: ignore[union-attr]

    def room_for(self, n: int) -> tuple[Tensor, Tensor, Tensor]:
        """The stored points ``[cap, d]``, rewards ``[cap]`` and ``z`` ``[factors, cap]`` buffers
        with a row for point ``n`` (each regrown, and reassigned, only when full)."""
        bufs = self._buffers  # (read past nn.Module.__getattr__: this is on every append)
        xs, ys, zs = bufs["_x"], bufs["_y"], bufs["_z"]
        if xs.shape[0] <= n:
            self._x = xs = grow_rows(xs, n + 1)
        if ys.shape[0] <= n:
            self._y = ys = grow_rows(ys, n + 1)
        if zs.shape[1] <= n:
            self._z = zs = grow_rows(zs, n + 1, dims=(1,))
        return xs, ys, zs

    def append(self, x: Tensor, y: float | Tensor, *,
               column: tuple[Tensor, int] | None = None) -> None:
        """Add one observation ``(x, y)`` in O(n²) per regulariser.

        ``column = (candidates, j)`` says ``x`` is the candidate ``j`` of the last scored set
        (the caller checked it): each factor scored there takes its new row from the scoring,
        O(n) (see :mod:`~torchbandits.models.exact_scoring`). Validates first; a rejected call
        leaves the model unchanged.
        """
        x = self._check_x("x", x)
        yv = as_scalar_reward("y", y)
        n = self._n
        reuse = self.reused_column(column)
        if reuse is not None and n and self._native_append(x, yv, *reuse):
            return self._appended(n)
        if torch.is_grad_enabled():  # (the compiled append above needs no switch)
            with torch.no_grad():
                return self._append_torch(x, yv, n, reuse)
        return self._append_torch(x, yv, n, reuse)

    def _append_torch(self, x: Tensor, yv: float, n: int,
                      reuse: tuple[ScoredSet, int] | None) -> None:
        """:meth:`append`'s torch path (validated arguments, no autograd)."""
        pieces = reuse[0].pieces(reuse[1]) if reuse is not None and n else {}
        kcol: Tensor | None = None
        kxx: float | None = None
        # compute every new row before touching state (a failing pivot changes nothing)
        rows = []
        for r, (f, reg) in enumerate(zip(self.factors, self.regularisers)):
            if not n:
                row, sq, mz = x.new_zeros(0), 0.0, 0.0
            elif r in pieces:
                row, sq, mz = pieces[r]
            else:
                if kcol is None:
                    kq = reuse[0].kq if reuse is not None else None
                    kcol = kq[:, reuse[1]] if kq is not None else \
                        self.kernel_plan().matrix(self._x[:n], x[None])[:, 0]
                row = f.solve(kcol)
                sq, mz = float(row @ row), float(row @ self._z[r, :n])
            if kxx is None:
                kxx = self._kxx(x, reuse)
            d2 = kxx + reg - sq
            if not d2 > 0:
                raise ValueError(f"append: pivot {d2:.3e} not positive at λ={reg}")
            rows.append((row, math.sqrt(d2), mz))
        if self._buffers["_x"].shape[0] == 0:
            self._x = x.new_zeros(16, x.shape[0])
        xs, ys, zs = self.room_for(n)
        xs[n] = x
        ys[n : n + 1].fill_(yv)
        z_new = [(yv - mz) / d for _, d, mz in rows]
        if len(rows) == 1:
            zs[0, n : n + 1].fill_(z_new[0])
        else:
            zs[: len(rows), n] = zs.new_tensor(z_new)
        for r, (f, (row, d, _)) in enumerate(zip(self.factors, rows)):
            f.append(row, d)
            self._advance(r, n, d, z_new[r])
        self._append_scaled(n, reuse)
        self._appended(n)

    def _appended(self, n: int) -> None:
        """The bookkeeping after the append of point ``n`` (any path; plain attributes set
        without ``nn.Module.__setattr__``'s checks)."""
        set_plain(self, "_n", n + 1)
        self._scratch.clear()
        set_plain(self, "_appends_since_refresh", self._appends_since_refresh + 1)
        if self.refresh_every and self._appends_since_refresh >= self.refresh_every:
            self.refresh()

    def _kxx(self, x: Tensor, reuse: tuple[ScoredSet, int] | None) -> float:
        """``k(x, x)`` of the appended point (from the scored set if it holds it)."""
        if reuse is not None:
            kd = reuse[0].kdiag
            return kd if isinstance(kd, float) else float(kd[reuse[1]])
        plan = self.kernel_plan()
        const = plan.diag_constant
        return const if const is not None else float(plan.diag(x[None])[0])

    def extend(self, x: Tensor, y: Tensor) -> None:
        """Append several observations in order (validated as a whole first)."""
        x = as_matrix("x", x, dtype=self.dtype, device=self.device, dim=self.dim)
        y = torch.as_tensor(y, dtype=self.dtype, device=self.device).reshape(-1)
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"y must have {x.shape[0]} entries (one per row of x), got {y.shape[0]}")
        if not bool(torch.isfinite(y).all()):
            raise ValueError("y must be finite (found NaN or inf)")
        for xi, yi in zip(x, y):
            self.append(xi, yi)

    def remove_oldest(self, count: int = 1) -> None:
        """Drop the ``count`` oldest observations: O(n²) each by a Cholesky rank-one update, or
        one O(n³) refactorisation of the rest with ``removal="refactorise"``."""
        if count < 0 or count > self._n:
            raise ValueError(f"count must lie in [0, {self._n}], got {count}")
        if self.removal == "refactorise":
            n, m = self._n, self._n - count
            self._x[:m] = self._x[count:n].clone()
            self._y[:m] = self._y[count:n].clone()
            self._n = m
            for f in self.factors:
                f.reset()
            self.refresh()
            self._invalidate()
            return
        for _ in range(count):
            n = self._n
            self._removal_p = []
            for r, f in enumerate(self.factors):
                self._removal_p.append(f.remove_first())  # rank-one update, recycled storage
                if n > 1:
                    self._z[r, : n - 1] = f.solve(self._y[1:n])
            self._x[: n - 1] = self._x[1:n].clone()
            self._y[: n - 1] = self._y[1:n].clone()
            self._n = n - 1
        self._invalidate()

    def refresh(self) -> None:
        """Refactorise ``K + λI`` from scratch for every regulariser (O(n³))."""
        n = self._n
        self._appends_since_refresh = 0
        if n == 0:
            return
        gram = kernel_matrix(self.kernel, self.x, self.x)
        eye = torch.eye(n, dtype=self.dtype, device=self.device)
        for r, (f, reg) in enumerate(zip(self.factors, self.regularisers)):
            chol = torch.linalg.cholesky(gram + reg * eye)
            f.set_dense(chol)
            self._z[r, :n] = whitened_solve(chol, self.y)
        self._invalidate()

    def set_kernel(self, kernel: Kernel, regularisers: Sequence[float] | None = None,
                   targets: Tensor | None = None, rescore: bool = False) -> None:
        """Replace the kernel (and optionally the regularisers ``(λ, …)`` and the stored targets
        ``[n]``), then refactorise ``K + λI`` from scratch with the stored inputs (O(n³)).

        Used after a hyper-parameter refit (:mod:`torchbandits.policies.refit`); the candidate
        caches are dropped — or, with ``rescore=True`` (a caller that queries a fixed candidate
        set), rebuilt now into their own storage
        (:class:`~torchbandits.models.exact_rebuild.CandidateRescore`, same values); later
        appends are incremental again. Validates before changing state.
        """
        regs = self.regularisers if regularisers is None else tuple(
            check_positive("regularisers", r) for r in regularisers)
        if not regs:
            raise ValueError("regularisers must hold at least the primary λ")
        if targets is not None:
            targets = torch.as_tensor(targets, dtype=self.dtype, device=self.device).reshape(-1)
            if targets.shape[0] != self._n or not bool(torch.isfinite(targets).all()):
                raise ValueError(f"targets must be {self._n} finite values (one per stored point)")
        self.kernel = kernel.to(dtype=self.dtype, device=self.device)
        if len(regs) != len(self.regularisers):
            self.factors = torch.nn.ModuleList(
                GrowingCholesky(dtype=self.dtype) for _ in regs).to(self.device)
            z = self._y.new_zeros(len(regs), self._y.shape[0])
            self._z = z
        self.regularisers = regs
        if targets is not None:
            self._y[: self._n] = targets
        stale = dict(self._caches) if rescore and len(regs) == len(self.factors) else {}
        self.refresh()
        self._invalidate()
        if stale:
            self._rescore_candidate_caches(stale)

    # ------------------------------------------------------------------ queries
    def _scratch_factor(self, reg: float) -> tuple[Tensor, Tensor]:
        """``(L, z)`` for a regulariser not maintained incrementally (cached until the data change)."""
        key = (reg, self._n, self._version)
        if key not in self._scratch:
            gram = kernel_matrix(self.kernel, self.x, self.x)
            eye = torch.eye(self._n, dtype=self.dtype, device=self.device)
            chol = torch.linalg.cholesky(gram + reg * eye)
            z = whitened_solve(chol, self.y)
            self._scratch[key] = (chol, z)
        return self._scratch[key]


def exact_posterior_reference(
    kernel: Kernel, x: Tensor, y: Tensor, candidates: Tensor, reg: float
) -> tuple[Tensor, Tensor]:
    """Textbook GP posterior ``(μ, ρ²)`` by a from-scratch factorisation (tests, baselines)."""
    gram = kernel_matrix(kernel, x, x)
    chol, _ = safe_cholesky(gram + reg * torch.eye(x.shape[0], dtype=x.dtype, device=x.device))
    kq = kernel_matrix(kernel, x, candidates)
    alpha = torch.cholesky_solve(y.reshape(-1, 1), chol)[:, 0]
    v = torch.linalg.solve_triangular(chol, kq, upper=False)
    return kq.mT @ alpha, torch.clamp(kernel_diag(kernel, candidates) - (v * v).sum(0), min=0.0)
