"""Projected (Nyström / DTC) kernel ridge posterior on a growing dictionary.

Seed 000 spec §2.3 (Prop. 4.2) and seed 001 spec §2.2. Data: points ``x_j`` with pull counts ``c_j``
and reward sums ``s_j`` (the plain history is ``c_j = 1``, ``s_j = y_j``); dictionary
``Z = (z_1..z_m)``; ``C = diag(c)``. With ``k_Z(x) = [k(z_i, x)]_i``:

* ``Λ = (K_ZS C K_SZ + λ K_ZZ)⁻¹``, ``Γ = K_ZS s``;
* mean ``μ̃(x) = k_Z(x)ᵀ Λ Γ``;
* ridge variance ``σ̃²(x) = (k(x,x) − k_Zᵀ K_ZZ⁻¹ k_Z)/λ + k_Zᵀ Λ k_Z`` — the part of ``φ(x)``
  outside the span of the dictionary keeps the prior scale ``1/λ`` (DTC form).

:meth:`NystromKernelRidge.mean_var` returns the **GP-scale** variance ``λ·σ̃²`` (like
:class:`~torchbandits.models.ExactKernelRidge`), so a policy's ridge variance is ``var/λ``.

Two parametrisations with the same cost (``parametrisation=``):

* ``"whitened"`` (default, spec §2.5 (e)): the lower Cholesky factor ``L`` of ``K_ZZ`` is kept as its
  inverse ``L⁻¹`` (bordering appends one row), states are embedded as ``e(x) = L⁻¹ k_Z(x)`` and
  ``A = Eᵀ C E + λI`` (eigenvalues ≥ λ) is kept as ``A⁻¹``. Then ``Λ = L⁻ᵀ A⁻¹ L⁻¹`` and
  ``λσ̃² = (k − ‖e‖²) + λ eᵀA⁻¹e``: a bounded non-negative residual plus a well-conditioned
  quadratic form. Growing the dictionary appends one embedding coordinate to every stored state
  (old coordinates do not change), ``O(nm)``.
* ``"plain"`` (the paper's Alg. 2/4): ``K_ZZ⁻¹`` and ``Λ`` by bordered inverses and Sherman–Morrison,
  with the cached ``K_SZ``. It suffers from cancellation when ``K_ZZ`` is ill conditioned (1-D
  environments with a 0.1 bandwidth), which is why ``"whitened"`` is the default.

Updates (spec §2.5 steps 5 and 7):

* :meth:`append` — one data point with the current dictionary, Sherman–Morrison, ``O(m²)``;
* :meth:`add_to_dictionary` — one anchor (bordered inverses with the cached ``E``/``K_SZ``),
  ``O(nm + m²)`` plus ``n`` kernel evaluations; refused (returns ``False``) when the anchor's
  unregularised residual ``ω = k(z,z) − k_Zᵀ K_ZZ⁻¹ k_Z`` is below ``min_residual·k(z,z)``
  (spec §2.5 (b));
* :meth:`rebuild` — from scratch on a dictionary and (possibly weighted) data, ``O(nm² + m³)``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from gpytorch.kernels import Kernel, MaternKernel, RBFKernel, ScaleKernel
from torch import Tensor

from ..buffers import ResizableModule, grow_rows
from ..kernels import kernel_bound, kernel_diag, kernel_matrix
from ..linalg import safe_cholesky
from ..validation import as_matrix, as_point, as_scalar_reward, check_positive

__all__ = ["NystromKernelRidge", "border_apply", "border_prepare", "nystrom_posterior_reference"]

Parametrisation = Literal["whitened", "plain"]


def border_prepare(a_inv: Tensor, b: Tensor, c: Tensor | float) -> tuple[Tensor, Tensor]:
    """First half of an in-place bordered inverse: ``q = A⁻¹b`` and the Schur complement
    ``s = c − bᵀq`` (raises ``ValueError`` if ``s ≤ 0``, before anything changes)."""
    q = a_inv @ b
    s = torch.as_tensor(c, dtype=a_inv.dtype, device=a_inv.device) - b @ q
    if not bool(s > 0):
        raise ValueError(f"bordered inverse: Schur complement {float(s):.3e} is not positive")
    return q, s


def border_apply(buf: Tensor, m: int, q: Tensor, s: Tensor) -> None:
    """Second half: ``buf[:m+1, :m+1] ← [[A⁻¹ + qqᵀ/s, −q/s], [−qᵀ/s, 1/s]]`` in place (the
    capacity of ``buf`` must exceed ``m``). Same result as
    :func:`~torchbandits.linalg.bordered_inverse` without allocating an ``(m+1)²`` matrix."""
    inv_s = 1.0 / float(s)
    if m:
        buf[:m, :m].addr_(q, q, alpha=inv_s)
        buf[:m, m] = q * -inv_s
        buf[m, :m] = q * -inv_s
    buf[m, m] = inv_s


class NystromKernelRidge(ResizableModule):
    """Projected kernel ridge posterior on a dictionary (see the module docstring).

    Args:
        kernel: GPyTorch kernel (evaluated densely with :func:`~torchbandits.kernels.kernel_matrix`).
        lam: ridge regulariser ``λ > 0``.
        jitter: nugget ``η ≥ 0`` added to the diagonal of ``K_ZZ`` (spec §2.5 (c), E12).
        min_residual: an anchor whose residual ``ω`` is below ``min_residual·k(z,z)`` is refused.
            Default ``1e-8`` (spec §2.5 (b) suggests ``1e-10``): on Chessboard at T = 2000 (γ = λ = 10)
            ``1e-10`` let ``cond(K_ZZ)`` reach 1e16 and the incremental variance drift by 0.3 from a
            from-scratch rebuild, ``1e-8`` kept them within 3e-7 with the same decisions.
        parametrisation: ``"whitened"`` (stable, default) or ``"plain"`` (the paper's Λ, K_ZZ⁻¹).
        track_data_variances: keep the variances at the stored data points up to date through
            :meth:`append` (``O(nm)`` extra) and :meth:`add_to_dictionary` (whitened only), so that
            :meth:`data_variances` costs nothing instead of ``O(nm²)`` (CBKB/CBBKB resample from
            them every round).
        dtype, device: of all state (float64 by default).
    """

    def __init__(
        self,
        kernel: Kernel,
        lam: float = 1.0,
        *,
        jitter: float = 0.0,
        min_residual: float = 1e-8,
        parametrisation: Parametrisation = "whitened",
        track_data_variances: bool = False,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.track_data_variances = bool(track_data_variances)
        self._hv: Tensor | None = None  # GP-scale variances at the data points (a cache)
        self._hv_version = -1  # model version at which _hv is valid
        self.regularisers: tuple[float, ...] = (check_positive("lam", lam),)
        if float(jitter) < 0:
            raise ValueError(f"jitter must be >= 0, got {jitter}")
        if float(min_residual) < 0:
            raise ValueError(f"min_residual must be >= 0, got {min_residual}")
        if parametrisation not in ("whitened", "plain"):
            raise ValueError(f"parametrisation must be 'whitened' or 'plain', got {parametrisation!r}")
        self.jitter = float(jitter)
        self.min_residual = float(min_residual)
        self.parametrisation: Parametrisation = parametrisation
        self.kernel = kernel.to(dtype=dtype, device=device)
        z = dict(dtype=dtype, device=device)
        self.register_buffer("_z", torch.zeros(0, 0, **z))  # dictionary [cap_m, d]
        self.register_buffer("_x", torch.zeros(0, 0, **z))  # data points [cap_n, d]
        self.register_buffer("_c", torch.ones(16, **z))  # counts (1 beyond n: an append is one pull)
        self.register_buffer("_s", torch.zeros(16, **z))  # reward sums
        # whitened: _p = L⁻¹, _q = A⁻¹, _g = Eᵀ s, _f = E (n × m)
        # plain:    _p = K_ZZ⁻¹, _q = Λ, _g = Γ, _f = K_SZ (n × m)
        self.register_buffer("_p", torch.zeros(16, 16, **z))
        self.register_buffer("_q", torch.zeros(16, 16, **z))
        self.register_buffer("_g", torch.zeros(16, **z))
        self.register_buffer("_f", torch.zeros(16, 16, **z))
        self._n = 0
        self._m = 0
        self._logdet_a = 0.0  # log det(A), A = EᵀCE + λI (tracked through every update)
        self._logdet_running = 0.0  # Σ log(1 + σ̃²_{i−1}(x_i)) over appends
        self.refused = 0  # anchors refused by the min_residual guard
        self.last_residual = float("nan")
        self._version = 0
        self._cache: tuple[int, Tensor, Tensor, Tensor | None] | None = None
        self._last_scored: tuple[int, Tensor, Tensor, Tensor] | None = None
        self._view_cache: tuple[Tensor, Tensor, Tensor, Tensor] | None = None
        self._setup_fast_kernel()

    def _setup_fast_kernel(self) -> None:
        """Hot-path kernel evaluation: a plain isotropic RBF is evaluated as
        ``exp(−‖a − b‖²/(2ℓ²))`` with the lengthscale read once (GPyTorch recomputes it from the
        raw parameter on every access); ``k(x, x)`` is a constant for stationary kernels."""
        k = self.kernel
        self._kconst = kernel_bound(k) if isinstance(k, (RBFKernel, MaternKernel, ScaleKernel)) else None
        self._rbf_c: float | None = None
        if type(k) is RBFKernel and k.active_dims is None and k.lengthscale.numel() == 1:
            self._rbf_c = -0.5 / float(k.lengthscale) ** 2

    # ------------------------------------------------------------------ properties / state
    @property
    def lam(self) -> float:
        return self.regularisers[0]

    @property
    def n(self) -> int:
        """Number of stored data points (rows; a row may carry a count > 1 after :meth:`rebuild`)."""
        return self._n

    @property
    def m(self) -> int:
        """Dictionary size."""
        return self._m

    @property
    def dtype(self) -> torch.dtype:
        return self._c.dtype

    @property
    def device(self) -> torch.device:
        return self._c.device

    @property
    def dim(self) -> int | None:
        if self._n:
            return self._x.shape[1]
        if self._m:
            return self._z.shape[1]
        return None

    @property
    def dictionary(self) -> Tensor:
        """Anchor points ``[m, d]`` (a view)."""
        return self._views()[0]

    @property
    def x(self) -> Tensor:
        """Stored data points ``[n, d]`` (a view)."""
        return self._x[: self._n]

    @property
    def counts(self) -> Tensor:
        return self._c[: self._n]

    @property
    def target_sums(self) -> Tensor:
        return self._s[: self._n]

    def get_extra_state(self) -> dict:
        return {"n": self._n, "m": self._m, "lam": self.lam, "logdet_a": self._logdet_a,
                "logdet_running": self._logdet_running,
                "refused": self.refused, "parametrisation": self.parametrisation}

    def set_extra_state(self, state: dict) -> None:
        self._n, self._m = int(state["n"]), int(state["m"])
        self.regularisers = (float(state["lam"]),)
        self._logdet_a = float(state["logdet_a"])
        self._logdet_running = float(state["logdet_running"])
        self.refused = int(state["refused"])
        self.parametrisation = state["parametrisation"]
        self._touch()

    def _apply(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._touch()
        out = super()._apply(fn, *args, **kwargs)
        self._setup_fast_kernel()
        return out

    def _touch(self) -> None:
        d = self.__dict__  # plain attributes: bypass nn.Module.__setattr__ (hot path)
        d["_version"] = self._version + 1
        d["_cache"] = d["_last_scored"] = d["_view_cache"] = d["_row_cap"] = None

    def _views(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(Z, P, Q, G)`` = the live ``[:m]`` views of the dictionary and the three matrices,
        cached until the dictionary or the buffers change (saves ~10 slicing ops per round)."""
        v = self.__dict__.get("_view_cache")
        if v is None:
            m = self._m
            v = (self._z[:m], self._p[:m, :m], self._q[:m, :m], self._g[:m])
            self.__dict__["_view_cache"] = v
        return v

    def scored_column(self, x: Tensor) -> tuple[Tensor, Tensor] | None:
        """``(k_Z(x), features(x))`` if ``x`` is a row of the candidates of the last
        :meth:`mean_var` call and the model has not changed since (else ``None``)."""
        last = self._last_scored
        if last is None or last[0] != self._version:
            return None
        cand = last[1]
        if x.ndim != 1 or x.shape[0] != cand.shape[1]:
            return None
        # the usual case, ``update(candidates[i])``: a view of the same memory (no tensor op)
        off = x.data_ptr() - cand.data_ptr()
        row = cand.stride(0) * cand.element_size()
        if x.stride(0) == cand.stride(1) and row > 0 and off >= 0 and off % row == 0 \
                and off // row < cand.shape[0]:
            i = off // row
        else:
            hit = (cand == x).all(dim=1).nonzero()
            if hit.numel() == 0:
                return None
            i = int(hit[0, 0])
        return last[2].select(1, i), last[3].select(1, i)

    def reset(self) -> None:
        """Forget the data and the dictionary."""
        self._n = 0
        self._m = 0
        self._logdet_a = 0.0
        self._logdet_running = 0.0
        self.refused = 0
        self._c.fill_(1.0)
        self._touch()

    # ------------------------------------------------------------------ helpers
    def _k(self, a: Tensor, b: Tensor) -> Tensor:
        if self._rbf_c is not None:
            d = torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist")
            return d.square_().mul_(self._rbf_c).exp_()
        return kernel_matrix(self.kernel, a, b)

    def _kdiag(self, a: Tensor) -> Tensor:
        if self._kconst is not None:
            return a.new_full((a.shape[0],), self._kconst)
        return kernel_diag(self.kernel, a)

    def _check_point(self, name: str, x: Tensor) -> Tensor:
        return as_point(name, x, dtype=self.dtype, device=self.device, dim=self.dim)

    def _ensure_rows(self, n: int, d: int) -> None:
        cap = self.__dict__.get("_row_cap")  # (rows, d) of the current buffers: no Module lookups
        if cap is not None and n <= cap[0] and d == cap[1]:
            return
        if n <= self._x.shape[0] and self._x.shape[1] == d and n <= self._f.shape[0]:
            self.__dict__["_row_cap"] = (min(self._x.shape[0], self._f.shape[0], self._c.shape[0]), d)
            return
        if self._x.shape[0] == 0 or self._x.shape[1] != d:
            self._x = self._c.new_zeros(16, d)
        self._x = grow_rows(self._x, n)
        old = self._c.shape[0]
        self._c = grow_rows(self._c, n)
        self._c[old:] = 1.0
        self._s = grow_rows(self._s, n)
        self._f = grow_rows(self._f, n)
        self.__dict__["_row_cap"] = None

    def _ensure_anchors(self, m: int, d: int) -> None:
        if m <= self._z.shape[0] and self._z.shape[1] == d and m <= self._p.shape[0] \
                and m <= self._f.shape[1]:
            return
        if self._z.shape[0] == 0 or self._z.shape[1] != d:
            self._z = self._c.new_zeros(16, d)
        self._z = grow_rows(self._z, m)
        self._p = grow_rows(self._p, m, dims=(0, 1))
        self._q = grow_rows(self._q, m, dims=(0, 1))
        self._g = grow_rows(self._g, m)
        self._f = grow_rows(self._f, m, dims=(1,))

    def features(self, points: Tensor) -> Tensor:
        """``k_Z`` of ``points`` ``[m, A]`` (plain) or the embeddings ``L⁻¹ k_Z`` (whitened)."""
        m = self._m
        if m == 0:
            return points.new_zeros(0, points.shape[0])
        zv, pv, _, _ = self._views()
        kz = self._k(zv, points)
        if self.parametrisation == "whitened":
            return pv @ kz
        return kz

    # ------------------------------------------------------------------ updates
    @torch.no_grad()
    def append(self, x: Tensor, y: float | Tensor, *, kz: Tensor | None = None) -> Tensor:
        """Add one observation with the current dictionary (Sherman–Morrison, ``O(m²)``).

        ``kz`` may pass a precomputed ``k_Z(x)`` ``[m]``. Also accumulates
        ``Σ log(1 + σ̃²_{i−1}(x_i))`` (see :attr:`log_det_running`). Returns the point's feature
        column (``k_Z(x)`` plain, ``e(x)`` whitened).
        """
        x = self._check_point("x", x)
        yv = as_scalar_reward("y", y)
        if kz is not None and kz.shape != (self._m,):
            raise ValueError(f"kz must have shape ({self._m},), got {tuple(kz.shape)}")
        return self._append(x, yv, kz)

    def _append(self, x: Tensor, yv: float, kz: Tensor | None = None, f: Tensor | None = None) -> Tensor:
        """:meth:`append` without validation (hot path of the policies). Leaves the point's
        unregularised residual ``ω = k(x,x) − k_Zᵀ K_ZZ⁻¹ k_Z`` (before the append) in
        :attr:`last_residual`, so that a caller can apply the ``min_residual`` guard for free."""
        n, m, lam = self._n, self._m, self.lam
        kxx = self._kconst if self._kconst is not None else float(self._kdiag(x[None])[0])
        if m:
            zv, pv, q, gv = self._views()
            if kz is None:
                kz = self._k(zv, x[None])[:, 0]
            whitened = self.parametrisation == "whitened"
            if f is None:
                f = pv @ kz if whitened else kz
            g = q @ f
            if whitened:
                fg, ff = torch.mv(torch.stack((g, f)), f).tolist()  # one sync for fᵀg and fᵀf
                omega = kxx + self.jitter - ff
            else:
                fg = float(f @ g)
                omega = kxx + self.jitter - float(f @ (pv @ f))
            ridge_var = omega / lam + fg
            track = self._hv_version == self._version and whitened
            if track:  # Q' = Q − ggᵀ/(1+fg): var_i −= λ (f_iᵀg)²/(1+fg), O(nm)
                hv = self._data_var_buffer(n + 1)
                hv[:n].sub_((self._f[:n, :m] @ g).square_(), alpha=lam / (1.0 + fg))
                hv[n] = kxx - ff + lam * fg / (1.0 + fg)
            q.addr_(g, g, alpha=-1.0 / (1.0 + fg))
            gv.add_(f, alpha=yv)
            logdet_a = self._logdet_a + math.log1p(fg)
        else:
            f = x.new_zeros(0)
            omega = kxx + self.jitter
            ridge_var = kxx / lam
            logdet_a = self._logdet_a
            track = self._hv_version == self._version
            if track:
                self._data_var_buffer(n + 1)[n] = kxx
        self._ensure_rows(n + 1, x.shape[0])
        self._x[n] = x  # (_c[n] is already 1)
        self._s[n] = yv
        if m:
            self._f[n, :m] = f
        # plain Python counters: bypass nn.Module.__setattr__ (measurable in the hot path)
        d = self.__dict__
        d["_logdet_a"] = logdet_a
        d["last_residual"] = omega
        d["_logdet_running"] = self._logdet_running + math.log1p(max(ridge_var, 0.0))
        d["_n"] = n + 1
        d["_version"] = self._version + 1
        if track:
            d["_hv_version"] = self._version
        return f

    @torch.no_grad()
    def add_to_dictionary(self, z: Tensor, *, kz: Tensor | None = None) -> bool:
        """Add the anchor ``z`` (spec §2.5 step 7): ``O(nm + m²)`` and ``n`` kernel evaluations.

        Returns ``False`` (and changes nothing but the ``refused`` counter) when the residual
        ``ω = k(z,z) + η − k_Zᵀ (K_ZZ + ηI)⁻¹ k_Z`` is below ``min_residual · k(z,z)``.
        ``kz`` may pass a precomputed ``k_Z(z)`` ``[m]``.
        """
        z = as_point("z", z, dtype=self.dtype, device=self.device, dim=self.dim)
        n, m, lam = self._n, self._m, self.lam
        kzz_raw = self._kdiag(z[None])[0]
        kzz = kzz_raw + self.jitter
        if kz is None:
            kz = self._k(self._z[:m], z[None])[:, 0] if m else z.new_zeros(0)
        elif kz.shape != (m,):
            raise ValueError(f"kz must have shape ({m},), got {tuple(kz.shape)}")
        xs, cs, ss = self._x[:n], self._c[:n], self._s[:n]
        if self.parametrisation == "whitened":
            linv = self._p[:m, :m]
            l_vec = linv @ kz
            omega = kzz - l_vec @ l_vec
            if not bool(omega > self.min_residual * kzz_raw):  # guard first: a refusal is O(m²)
                self.refused += 1
                return False
            gs = self._k(xs, z[None])[:, 0] if n else kz.new_zeros(0)
            d = torch.sqrt(omega)
            new_row = torch.cat([-(linv.mT @ l_vec) / d, (1.0 / d).reshape(1)])
            e_all = self._f[:n, :m]
            e_new = (gs - e_all @ l_vec) / d if n else gs
            ce = cs * e_new
            border_q = border_prepare(self._q[:m, :m], e_all.mT @ ce, e_new @ ce + lam)
            schur = border_q[1]
            track = self._hv_version == self._version and n > 0
            if track:  # f' = [f, e], Q' bordered: var_i += −e_i² + λ (f_iᵀq − e_i)²/s, O(nm)
                hv = self._data_var_buffer(n)
                hv[:n].add_((e_all @ border_q[0] - e_new).square_(), alpha=lam / float(schur))
                hv[:n].sub_(e_new.square())
            self._ensure_anchors(m + 1, z.shape[0])
            self._p[m, : m + 1] = new_row
            self._p[:m, m] = 0.0
            border_apply(self._q, m, *border_q)
            self._g[m] = e_new @ ss
            self._f[:n, m] = e_new
        else:
            kinv = self._p[:m, :m]
            q_p = kinv @ kz
            omega = kzz - kz @ q_p
            border_p = (q_p, omega)
            if not bool(omega > self.min_residual * kzz_raw):
                self.refused += 1
                return False
            gs = self._k(xs, z[None])[:, 0] if n else kz.new_zeros(0)
            ksz = self._f[:n, :m]
            b_l = ksz.mT @ (cs * gs) + lam * kz
            c_l = gs @ (cs * gs) + lam * kzz
            q_l = self._q[:m, :m] @ b_l
            s_l = c_l - b_l @ q_l
            if not bool(s_l > 0):  # ill-conditioning broke the plain form: refuse the anchor
                self.refused += 1
                return False
            border_q = (q_l, s_l)
            # log det A = log det Λ⁻¹ − log det K_ZZ: the two Schur complements
            schur = border_q[1] / omega
            self._ensure_anchors(m + 1, z.shape[0])
            border_apply(self._p, m, *border_p)
            border_apply(self._q, m, *border_q)
            self._g[m] = gs @ ss
            self._f[:n, m] = gs
        self._z[m] = z
        self._logdet_a += float(torch.log(schur))
        self._m = m + 1
        self._touch()
        if self.parametrisation == "whitened" and track:
            self.__dict__["_hv_version"] = self._version
        return True

    @torch.no_grad()
    def rebuild(
        self,
        dictionary: Tensor,
        x: Tensor,
        target_sums: Tensor,
        counts: Tensor | None = None,
        *,
        kzz: Tensor | None = None,
        kxz: Tensor | None = None,
    ) -> None:
        """Recompute everything from scratch (``O(nm² + m³)``).

        ``x`` ``[n, d]`` are data points (distinct for BKB-style finite arms, or the plain history)
        with pull counts ``counts`` (default 1) and reward sums ``target_sums``:
        ``Λ = (Σ_j c_j k_Z(x_j) k_Z(x_j)ᵀ + λ K_ZZ)⁻¹``, ``Γ = Σ_j s_j k_Z(x_j)``. An empty
        dictionary (``[0, d]``) is allowed. Duplicated anchors are the caller's business (they make
        ``K_ZZ`` singular; deduplicate first, or set ``jitter``). ``kzz`` ``[m, m]`` and ``kxz``
        ``[n, m]`` may pass precomputed kernel blocks (e.g. gathered from a cache of kernel columns,
        as BKB does on a fixed arm set).
        """
        x = as_matrix("x", x, dtype=self.dtype, device=self.device)
        d = x.shape[1]
        zs = torch.as_tensor(dictionary, dtype=self.dtype, device=self.device)
        if zs.ndim != 2 or zs.shape[1] != d:
            raise ValueError(f"dictionary must be [m, {d}], got shape {tuple(zs.shape)}")
        if not bool(torch.isfinite(zs).all()):
            raise ValueError("dictionary must be finite (found NaN or inf)")
        n, m = x.shape[0], zs.shape[0]
        s = torch.as_tensor(target_sums, dtype=self.dtype, device=self.device).reshape(-1)
        if s.shape[0] != n or not bool(torch.isfinite(s).all()):
            raise ValueError(f"target_sums must be {n} finite numbers (one per row of x)")
        if counts is None:
            c = torch.ones(n, dtype=self.dtype, device=self.device)
        else:
            c = torch.as_tensor(counts, dtype=self.dtype, device=self.device).reshape(-1)
            if c.shape[0] != n or not bool(torch.isfinite(c).all()) or bool((c < 0).any()):
                raise ValueError(f"counts must be {n} finite non-negative numbers")
        for name, block, shape in (("kzz", kzz, (m, m)), ("kxz", kxz, (n, m))):
            if block is not None and tuple(block.shape) != shape:
                raise ValueError(f"{name} must have shape {shape}, got {tuple(block.shape)}")
        self._rebuild(zs, x, s, c, kzz, kxz)

    def _rebuild(self, zs: Tensor, x: Tensor, s: Tensor, c: Tensor,
                 kzz: Tensor | None = None, kxz: Tensor | None = None) -> None:
        """:meth:`rebuild` without validation (BKB's hot path)."""
        n, d = x.shape
        m, lam = zs.shape[0], self.lam
        self._ensure_rows(n, d)
        self._ensure_anchors(max(m, 1), d)
        self._x[:n] = x
        self._c[:n] = c
        self._c[n:] = 1.0
        self._s[:n] = s
        self._z[:m] = zs
        dct = self.__dict__  # plain attributes: bypass nn.Module.__setattr__ (hot path)
        dct["_n"], dct["_m"] = n, m
        if m:
            kzz = self._k(zs, zs) if kzz is None else kzz
            eye = torch.eye(m, dtype=self.dtype, device=self.device)
            kzz_j = kzz + self.jitter * eye if self.jitter else kzz
            chol, _ = safe_cholesky(kzz_j)
            linv = torch.linalg.solve_triangular(chol, eye, upper=False)
            kxz = self._k(x, zs) if kxz is None else kxz
            if self.parametrisation == "whitened":
                feat = kxz @ linv.mT  # E = K_SZ L⁻ᵀ
                a = feat.mT @ (c[:, None] * feat) + lam * eye
                self._p[:m, :m] = linv
            else:
                feat = kxz
                a = feat.mT @ (c[:, None] * feat) + lam * kzz_j
                self._p[:m, :m] = linv.mT @ linv
            chol_a, _ = safe_cholesky(a)
            self._q[:m, :m] = torch.cholesky_inverse(chol_a)
            self._g[:m] = feat.mT @ s
            self._f[:n, :m] = feat
            logdet_a = 2.0 * torch.log(torch.diagonal(chol_a)).sum()
            if self.parametrisation == "plain":
                logdet_a = logdet_a - 2.0 * torch.log(torch.diagonal(chol)).sum()
            dct["_logdet_a"] = float(logdet_a)
            hv = None
            if self.track_data_variances and self.parametrisation == "whitened":
                # λσ̃²(x_j) = k − ‖e_j‖² + λ e_jᵀA⁻¹e_j from the embeddings at hand (one n×m×m product)
                qa = self._q[:m, :m]
                hv = torch.linalg.vecdot(feat, torch.addmm(feat, feat, qa, beta=-1.0, alpha=lam))
                hv = hv.add_(self._kdiag(x) if self._kconst is None else self._kconst)
        else:
            dct["_logdet_a"] = 0.0
            hv = self._kdiag(x) if self.track_data_variances else None
        self._touch()
        if hv is not None:
            self._data_var_buffer(n)[:n] = hv
            dct["_hv_version"] = self._version

    # ------------------------------------------------------------------ queries
    def _round_cache(self) -> tuple[Tensor, Tensor]:
        """Per-state mean weights ``w`` (``μ̃ = wᵀf``) and variance matrix (whitened: ``A⁻¹``;
        plain: ``λΛ − K_ZZ⁻¹``)."""
        cache = self._cache
        if cache is None or cache[0] != self._version:
            _, pv, q, gv = self._views()
            mat = self.lam * q - pv if self.parametrisation == "plain" else q
            cache = self.__dict__["_cache"] = (self._version, q @ gv, mat, None)
        return cache[1], cache[2]

    def _scoring_matrix(self) -> Tensor:
        """``W`` such that one product ``W k_Z`` gives mean and variance (built once per state,
        ``O(m³)``, so it pays when many candidates are scored per state, e.g. BKB's fixed arms).

        whitened (``P = L⁻¹``, ``Q = A⁻¹``): ``W = [P; (λQ − I)P; wᵀP]``, so with ``f = P k_Z``
        and ``h = (λQ − I) f``: ``μ̃ = wᵀf``, ``λσ̃² = k + fᵀh = k − ‖f‖² + λ fᵀQf``.
        plain (``P = K_ZZ⁻¹``): ``W = [λΛ − P; wᵀ]``, ``λσ̃² = k + k_Zᵀ(λΛ − K_ZZ⁻¹)k_Z``."""
        w, mat = self._round_cache()
        cache = self._cache
        assert cache is not None
        if cache[3] is None:
            _, pv, q, _ = self._views()
            if self.parametrisation == "plain":
                big = torch.cat([mat, w[None]])
            else:
                big = torch.cat([pv, torch.addmm(pv, q, pv, beta=-1.0, alpha=self.lam), (w @ pv)[None]])
            cache = self.__dict__["_cache"] = (cache[0], w, mat, big)
        return cache[3]

    @torch.no_grad()
    def mean_var(self, candidates: Tensor, reg: float | None = None) -> tuple[Tensor, Tensor]:
        """Mean ``μ̃`` and GP-scale variance ``λσ̃²`` (clamped to ``[0, k(x,x)]``) at ``candidates``.

        ``reg`` must be ``None`` or ``λ`` (the projection is maintained at one regulariser only).
        """
        cand = as_matrix("candidates", candidates, dtype=self.dtype, device=self.device, dim=self.dim)
        if reg is not None and float(reg) != self.lam:
            raise ValueError(f"reg must be None or lam={self.lam} for a Nyström model, got {reg}")
        return self._mean_var(cand)

    def _mean_var(self, cand: Tensor, kz: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """:meth:`mean_var` without validation (hot path): one kernel call (skipped when ``kz`` =
        ``k_Z(cand)`` ``[m, A]`` is given), then with ``A ≥ m`` candidates the single product
        :meth:`_scoring_matrix` ``× k_Z``, else (EK-UCB's ten actions, a new state every round)
        ``f = L⁻¹k_Z`` and ``A⁻¹f`` (whitened) or ``(λΛ − K_ZZ⁻¹)k_Z`` (plain)."""
        m, kc = self._m, self._kconst
        kdiag: Tensor | float = self._kdiag(cand) if kc is None or m == 0 else kc
        if m == 0:
            return cand.new_zeros(cand.shape[0]), kdiag  # type: ignore[return-value]
        if kz is None:
            kz = self._k(self._views()[0], cand)
        vecdot = torch.linalg.vecdot
        whitened = self.parametrisation == "whitened"
        if cand.shape[0] >= m:
            out = self._scoring_matrix() @ kz
            if whitened:
                f = out[:m]
                var = vecdot(f, out[m:2 * m], dim=0).add_(kdiag)
                mean = out[2 * m]
            else:
                f = kz
                var = vecdot(kz, out[:m], dim=0).add_(kdiag)
                mean = out[m]
        else:
            w, mat = self._round_cache()
            if whitened:
                f = self._views()[1] @ kz
                mean = w @ f
                var = (kdiag - vecdot(f, f, dim=0)).clamp_(min=0.0)
                var.add_(vecdot(f, mat @ f, dim=0), alpha=self.lam)
            else:
                f = kz
                mean = w @ kz
                var = vecdot(kz, mat @ kz, dim=0).add_(kdiag)
        # remembered so that the update of a just-scored candidate can reuse its column
        self.__dict__["_last_scored"] = (self._version, cand, kz, f)
        if kc is not None:
            return mean, var.clamp_(0.0, kc)
        return mean, torch.minimum(var.clamp_(min=0.0), kdiag)

    def _data_var_buffer(self, n: int) -> Tensor:
        hv = self._hv
        if hv is None or hv.shape[0] < n or hv.device != self._c.device or hv.dtype != self.dtype:
            new = self._c.new_zeros(max(16, 2 * n))
            if hv is not None and hv.device == new.device:
                new[: hv.shape[0]] = hv[: new.shape[0]].to(new.dtype)
            hv = self.__dict__["_hv"] = new
        return hv

    @torch.no_grad()
    def data_variances(self) -> Tensor:
        """GP-scale variances ``λσ̃²`` at the stored data points ``[n]`` (clamped to ``[0, k]``).
        With ``track_data_variances`` they are kept current by the incremental updates (``O(nm)``
        each, whitened); otherwise, and after :meth:`rebuild`, they cost one ``O(nm²)`` pass."""
        n = self._n
        if self._hv_version != self._version or self._hv is None:
            var = self._mean_var(self.x)[1] if n else self._c.new_zeros(0)
            if not self.track_data_variances:
                return var
            self._data_var_buffer(n)[:n] = var
            self.__dict__["_hv_version"] = self._version
        var = self._hv[:n].clamp(min=0.0)  # type: ignore[index]
        kc = self._kconst
        return var.clamp_(max=kc) if kc is not None else torch.minimum(var, self._kdiag(self.x))

    @torch.no_grad()
    def log_det(self, reg: float | None = None) -> Tensor:
        """``log det(I + K̃/λ)`` of the Nyström approximation ``K̃ = K_SZ K_ZZ⁻¹ K_ZS`` (weighted by
        the counts): ``log det(A) − m log λ``, tracked incrementally. It is a lower bound of the
        exact ``log det(I + K/λ)``."""
        if reg is not None and float(reg) != self.lam:
            raise ValueError(f"reg must be None or lam={self.lam} for a Nyström model, got {reg}")
        return torch.tensor(self._logdet_a - self._m * math.log(self.lam), dtype=self.dtype)

    @property
    def log_det_running(self) -> float:
        """``Σ_i log(1 + σ̃²_{i−1}(x_i))`` over the appended points (ridge variance before each
        append). Since ``σ̃² ≥ σ̂²`` it upper-bounds the exact ``log det(I + K/λ)`` when the data
        were appended one by one (seed 000 eq. 27); :meth:`rebuild` does not change it."""
        return self._logdet_running

    @property
    def Lambda(self) -> Tensor:
        """``Λ = (K_ZS C K_SZ + λ K_ZZ)⁻¹`` (a new tensor; for tests and inspection)."""
        m = self._m
        if self.parametrisation == "plain":
            return self._q[:m, :m].clone()
        linv = self._p[:m, :m]
        return linv.mT @ self._q[:m, :m] @ linv

    @property
    def Gamma(self) -> Tensor:
        """``Γ = K_ZS s`` (a new tensor)."""
        m = self._m
        if self.parametrisation == "plain":
            return self._g[:m].clone()
        return torch.linalg.solve_triangular(self._p[:m, :m], self._g[:m, None], upper=False)[:, 0]

    @property
    def kzz_inverse(self) -> Tensor:
        """``(K_ZZ + ηI)⁻¹`` (a new tensor)."""
        m = self._m
        if self.parametrisation == "plain":
            return self._p[:m, :m].clone()
        linv = self._p[:m, :m]
        return linv.mT @ linv

    def extra_repr(self) -> str:
        return f"lam={self.lam}, m={self._m}, n={self._n}, parametrisation={self.parametrisation!r}"


@torch.no_grad()
def nystrom_posterior_reference(
    kernel: Kernel,
    dictionary: Tensor,
    x: Tensor,
    target_sums: Tensor,
    candidates: Tensor,
    lam: float,
    counts: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Textbook Prop. 4.2 from scratch with explicit inverses: ``(μ̃, λσ̃²)`` (tests only)."""
    c = torch.ones(x.shape[0], dtype=x.dtype) if counts is None else counts
    kzz = kernel_matrix(kernel, dictionary, dictionary)
    ksz = kernel_matrix(kernel, x, dictionary)
    lam_m = torch.linalg.inv(ksz.mT @ (c[:, None] * ksz) + lam * kzz)
    gam = ksz.mT @ target_sums
    kz = kernel_matrix(kernel, dictionary, candidates)
    mean = kz.mT @ (lam_m @ gam)
    var = kernel_diag(kernel, candidates) / lam + (kz * ((lam_m - torch.linalg.inv(kzz) / lam) @ kz)).sum(0)
    return mean, lam * var
