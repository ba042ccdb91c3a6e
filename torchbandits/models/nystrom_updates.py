"""Updates of the Nyström (DTC) kernel ridge model: rank-one data appends, dictionary growth by
bordering, and the from-scratch rebuild (Zenati et al., AISTATS 2022, Algorithms 2 and 4, steps
"data update" and "dictionary update"; App. E.2 cases (i) and (ii)).

* :meth:`NystromUpdates.append` — one data point with the current dictionary, Sherman–Morrison,
  ``O(m²)``;
* :meth:`NystromUpdates.add_to_dictionary` — one anchor (bordered inverses with the cached
  ``E``/``K_SZ``), ``O(nm + m²)`` plus ``n`` kernel evaluations; refused (returns ``False``) when
  the anchor's unregularised residual ``ω = k(z,z) − k_Zᵀ K_ZZ⁻¹ k_Z`` is below
  ``min_residual·k(z,z)``;
* :meth:`NystromUpdates.rebuild` — from scratch on a dictionary and (possibly weighted) data,
  ``O(nm² + m³)``.

The bordered inverses are written into the capacity buffers in place (:func:`border_prepare`,
:func:`border_apply`): the same result as :func:`torchbandits.linalg.bordered_inverse`, which
allocates an ``(m+1)²`` matrix and is 2× (m = 200) to 6× (m = 500) slower per border.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..linalg import pivoted_cholesky, safe_cholesky
from ..validation import as_matrix, as_point, as_scalar_reward
from .nystrom_state import NystromState

__all__ = ["NystromUpdates", "border_apply", "border_prepare", "whitened_system", "whitening"]

#: pivots of ``K_ZZ`` below this fraction of its largest diagonal send the rebuild to the pivoted
#: factorisation (the anchors left out lie in the span of the others to that accuracy)
PIVOT_TOL = 1e-14


def whitening(kzz: Tensor, eye: Tensor, scale: float | None = None, compact: bool = False) -> Tensor:
    """``P`` ``[m, m]`` with ``e(x) = P k_Z(x)`` the whitened embedding of the span of the anchors:
    ``P = L⁻¹`` for the lower Cholesky factor ``L`` of ``K_ZZ`` (``eye`` = ``I_m``; ``scale`` =
    ``max k(z,z)`` when known, e.g. the constant of a stationary kernel, else read off ``K_ZZ``).

    When ``K_ZZ`` is numerically singular (plain Cholesky fails, or a pivot² falls below
    ``PIVOT_TOL·max k(z,z)``: on dense dictionaries, e.g. every pulled arm of 260 in [0, 1]² with
    an RBF of lengthscale 0.2, ``cond(K_ZZ) ≈ 6e18``), a nugget would change the model (1e-10 of
    jitter moved the posterior mean by 8e-8). Instead the greedy pivoted factor
    (:func:`~torchbandits.linalg.pivoted_cholesky`) keeps the ``r`` anchors that span the others
    to within ``PIVOT_TOL``: ``P[:r, piv] = L_r⁻¹`` and the other ``m − r`` rows of ``P`` are zero
    (those embedding coordinates are 0 for every point, so ``A`` is ``λ`` there and they drop out
    of every query). The full-dictionary posterior then matches the exact kernel ridge one to
    ~1e-10 instead of ~1e-7. ``compact=True`` leaves those zero rows out: ``P`` is ``[r, m]``
    (``r = m`` when plain Cholesky succeeds), the same embedding without its null coordinates."""
    chol, info = torch.linalg.cholesky_ex(kzz)
    if not int(info):
        if scale is None:
            scale = float(torch.diagonal(kzz).max())
        if float(torch.diagonal(chol).min()) ** 2 > PIVOT_TOL * scale:
            return torch.linalg.solve_triangular(chol, eye, upper=False)
    chol_r, piv = pivoted_cholesky(kzz, PIVOT_TOL)
    r = piv.shape[0]
    out = eye.new_zeros(r, eye.shape[0]) if compact else torch.zeros_like(eye)
    out[:r].index_copy_(1, piv, torch.linalg.solve_triangular(chol_r, eye[:r, :r], upper=False))
    return out


def whitened_system(kxz: Tensor, linv: Tensor, counts: Tensor, sums: Tensor,
                    lam: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The whitened ridge system of a from-scratch rebuild: with the embeddings ``E = K_SZ Pᵀ``
    ``[n, m]`` (``kxz = K_SZ`` ``[n, m]``, ``linv = P`` ``[m, m]`` from :func:`whitening`),
    ``A = EᵀCE + λI`` (eigenvalues ≥ λ: no nugget can be needed), returns ``(E, chol(A), A⁻¹,
    Eᵀs)`` (``counts = diag C`` and ``sums = s`` ``[n]``), for
    :meth:`NystromUpdates.rebuild_from_counts`; BKB's fused round
    (:func:`~torchbandits.models.nystrom_arms.dtc_round`) states it on ``Eᵀ`` without ``A⁻¹``."""
    feat = kxz @ linv.mT  # E = K_SZ L⁻ᵀ
    a = (feat.mT * counts) @ feat
    a.diagonal().add_(lam)  # + λI (the off-diagonal zeros of λI add nothing)
    chol_a = torch.linalg.cholesky_ex(a)[0]
    return feat, chol_a, torch.cholesky_inverse(chol_a), feat.mT @ sums


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
    capacity of ``buf`` must exceed ``m``); equals :func:`~torchbandits.linalg.bordered_inverse`."""
    inv_s = 1.0 / float(s)
    if m:
        buf[:m, :m].addr_(q, q, alpha=inv_s)
        buf[:m, m] = q * -inv_s
        buf[m, :m] = q * -inv_s
    buf[m, m] = inv_s


class NystromUpdates(NystromState):
    """The updates of :class:`~torchbandits.models.NystromKernelRidge` (see the module docstring)."""

    # ------------------------------------------------------------------ data
    @torch.no_grad()
    def append(self, x: Tensor, y: float | Tensor, *, kz: Tensor | None = None) -> Tensor:
        """Add one observation with the current dictionary (Sherman–Morrison, ``O(m²)``).

        ``kz`` may pass a precomputed ``k_Z(x)`` ``[m]``. Also accumulates
        ``Σ log(1 + σ̃²_{i−1}(x_i))`` (see :attr:`log_det_running`). Returns the point's feature
        column (``k_Z(x)`` plain, ``e(x)`` whitened).
        """
        x = self._check_point("x", x)
        yv = as_scalar_reward("y", y)
        if kz is not None and kz.shape != (self.m,):
            raise ValueError(f"kz must have shape ({self.m},), got {tuple(kz.shape)}")
        return self.append_column(x, yv, kz)

    def append_column(self, x: Tensor, y: float, kz: Tensor | None = None,
                      features: Tensor | None = None) -> Tensor:
        """:meth:`append` without validation (the policies' fast path): ``x`` ``[d]`` of the
        model's dtype/device, ``kz = k_Z(x)`` ``[m]`` and ``features`` (``e(x)`` whitened,
        ``k_Z(x)`` plain) as returned by :meth:`scored_column`, when known. Leaves the point's
        residual ``ω`` (before the append) in :attr:`last_residual`, so that the caller can apply
        the ``min_residual`` guard for free (:meth:`add_last_to_dictionary`)."""
        sc = self._sc
        n, m, lam = sc.n, sc.m, self.lam
        kxx = self._kconst if self._kconst is not None else float(self.kernel_diagonal(x[None])[0])
        if m:
            zv, pv, q, gv = self._views()
            if kz is None:
                kz = self.kernel_block(zv, x[None])[:, 0]
            whitened = self.parametrisation == "whitened"
            f = features
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
            track = sc.hv_version == sc.version and whitened
            if track:  # Q' = Q − ggᵀ/(1+fg): var_i −= λ (f_iᵀg)²/(1+fg), O(nm)
                hv = self._data_var_buffer(n + 1)
                hv[:n].sub_((self._feats[:n, :m] @ g).square_(), alpha=lam / (1.0 + fg))
                hv[n] = kxx - ff + lam * fg / (1.0 + fg)
            q.addr_(g, g, alpha=-1.0 / (1.0 + fg))
            gv.add_(f, alpha=y)
            logdet_a = sc.logdet_a + math.log1p(fg)
        else:
            f = x.new_zeros(0)
            omega = kxx + self.jitter
            ridge_var = kxx / lam
            logdet_a = sc.logdet_a
            track = sc.hv_version == sc.version
            if track:
                self._data_var_buffer(n + 1)[n] = kxx
        self._ensure_rows(n + 1, x.shape[0])
        self._x[n] = x  # (_c[n] is already 1)
        self._s[n] = y
        if m:
            self._feats[n, :m] = f
        sc.logdet_a = logdet_a
        sc.last_residual = omega
        sc.logdet_running += math.log1p(max(ridge_var, 0.0))
        sc.n = n + 1
        sc.version += 1
        if track:
            sc.hv_version = sc.version
        return f

    # ------------------------------------------------------------------ dictionary
    @torch.no_grad()
    def add_to_dictionary(self, z: Tensor, *, kz: Tensor | None = None) -> bool:
        """Add the anchor ``z``: ``O(nm + m²)`` and ``n`` kernel evaluations.

        Returns ``False`` (and changes nothing but the ``refused`` counter) when the residual
        ``ω = k(z,z) + η − k_Zᵀ (K_ZZ + ηI)⁻¹ k_Z`` is below ``min_residual · k(z,z)``.
        ``kz`` may pass a precomputed ``k_Z(z)`` ``[m]``.
        """
        z = as_point("z", z, dtype=self.dtype, device=self.device, dim=self.dim)
        m = self._sc.m
        if kz is None:
            kz = self.kernel_block(self._z[:m], z[None])[:, 0] if m else z.new_zeros(0)
        elif kz.shape != (m,):
            raise ValueError(f"kz must have shape ({m},), got {tuple(kz.shape)}")
        return self._add_anchor(z, kz)

    def add_last_to_dictionary(self, kz: Tensor) -> bool:
        """Make the last appended point an anchor (EK-UCB's accepted KORS draw), ``kz`` = its
        ``k_Z`` ``[m]`` over the dictionary it was appended with. The ``min_residual`` guard reads
        :attr:`last_residual` first (a refusal then costs nothing); returns whether it was added."""
        sc = self._sc
        x = self._x[sc.n - 1]
        if sc.last_residual <= self.min_residual * self.prior_variance(x):
            sc.refused += 1
            return False
        return self._add_anchor(x, kz)

    def _add_anchor(self, z: Tensor, kz: Tensor) -> bool:
        sc = self._sc
        n, m, lam = sc.n, sc.m, self.lam
        kzz_raw = self.kernel_diagonal(z[None])[0]
        kzz = kzz_raw + self.jitter
        xs, cs, ss = self._x[:n], self._c[:n], self._s[:n]
        track = False
        if self.parametrisation == "whitened":
            linv = self._coord_map[:m, :m]
            l_vec = linv @ kz
            omega = kzz - l_vec @ l_vec
            if not bool(omega > self.min_residual * kzz_raw):  # guard first: a refusal is O(m²)
                sc.refused += 1
                return False
            gs = self.kernel_block(xs, z[None])[:, 0] if n else kz.new_zeros(0)
            d = torch.sqrt(omega)
            new_row = torch.cat([-(linv.mT @ l_vec) / d, (1.0 / d).reshape(1)])
            e_all = self._feats[:n, :m]
            e_new = (gs - e_all @ l_vec) / d if n else gs
            ce = cs * e_new
            border_q = border_prepare(self._system_inv[:m, :m], e_all.mT @ ce, e_new @ ce + lam)
            schur = border_q[1]
            track = sc.hv_version == sc.version and n > 0
            if track:  # f' = [f, e], Q' bordered: var_i += −e_i² + λ (f_iᵀq − e_i)²/s, O(nm)
                hv = self._data_var_buffer(n)
                hv[:n].add_((e_all @ border_q[0] - e_new).square_(), alpha=lam / float(schur))
                hv[:n].sub_(e_new.square())
            self._ensure_anchors(m + 1, z.shape[0])
            self._coord_map[m, : m + 1] = new_row
            self._coord_map[:m, m].zero_()
            border_apply(self._system_inv, m, *border_q)
            self._rhs[m] = e_new @ ss
            self._feats[:n, m] = e_new
        else:
            kinv = self._coord_map[:m, :m]
            q_p = kinv @ kz
            omega = kzz - kz @ q_p
            if not bool(omega > self.min_residual * kzz_raw):
                sc.refused += 1
                return False
            gs = self.kernel_block(xs, z[None])[:, 0] if n else kz.new_zeros(0)
            ksz = self._feats[:n, :m]
            b_l = ksz.mT @ (cs * gs) + lam * kz
            c_l = gs @ (cs * gs) + lam * kzz
            q_l = self._system_inv[:m, :m] @ b_l
            s_l = c_l - b_l @ q_l
            if not bool(s_l > 0):  # ill-conditioning broke the plain form: refuse the anchor
                sc.refused += 1
                return False
            # log det A = log det Λ⁻¹ − log det K_ZZ: the two Schur complements
            schur = s_l / omega
            self._ensure_anchors(m + 1, z.shape[0])
            border_apply(self._coord_map, m, q_p, omega)
            border_apply(self._system_inv, m, q_l, s_l)
            self._rhs[m] = gs @ ss
            self._feats[:n, m] = gs
        self._z[m] = z
        sc.logdet_a += float(torch.log(schur))
        sc.m = m + 1
        self._touch()
        if track:
            sc.hv_version = sc.version
        return True

    # ------------------------------------------------------------------ from scratch
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
        self.rebuild_from_counts(zs, x, s, c, kzz, kxz)

    def rebuild_from_counts(self, dictionary: Tensor, x: Tensor, target_sums: Tensor,
                            counts: Tensor, kzz: Tensor | None = None,
                            kxz: Tensor | None = None) -> None:
        """:meth:`rebuild` without validation (BKB's fast path, once per round): trusted tensors of
        the model's dtype/device, ``dictionary`` ``[m, d]``, ``x`` ``[n, d]``, ``target_sums`` and
        ``counts`` ``[n]``, optional kernel blocks ``kzz`` ``[m, m]`` and ``kxz`` ``[n, m]``."""
        zs, s, c = dictionary, target_sums, counts
        n, d = x.shape
        m, lam = zs.shape[0], self.lam
        sc = self._sc
        self._ensure_rows(n, d)
        self._ensure_anchors(max(m, 1), d)
        if sc.n > n:  # rows beyond n count as one pull each (see _c)
            self._c[n:].fill_(1.0)
        self._x[:n] = x
        self._c[:n] = c
        self._s[:n] = s
        self._z[:m] = zs
        sc.n, sc.m = n, m
        if m:
            kzz = self.kernel_block(zs, zs) if kzz is None else kzz
            eye = torch.eye(m, dtype=self.dtype, device=self.device)
            kzz_j = kzz + self.jitter * eye if self.jitter else kzz
            kxz = self.kernel_block(x, zs) if kxz is None else kxz
            if self.parametrisation == "whitened":
                kc = self._kconst
                linv = whitening(kzz_j, eye, None if kc is None else kc + self.jitter)
                feat, chol_a, a_inv, rhs = whitened_system(kxz, linv, c, s, lam)
                self._coord_map[:m, :m] = linv
            else:
                chol, _ = safe_cholesky(kzz_j)
                linv = torch.linalg.solve_triangular(chol, eye, upper=False)
                feat = kxz
                chol_a = safe_cholesky(feat.mT @ (c[:, None] * feat) + lam * kzz_j)[0]
                a_inv, rhs = torch.cholesky_inverse(chol_a), feat.mT @ s
                self._coord_map[:m, :m] = linv.mT @ linv
            self._system_inv[:m, :m] = a_inv
            self._rhs[:m] = rhs
            self._feats[:n, :m] = feat
            logdet_a = 2.0 * torch.log(torch.diagonal(chol_a)).sum()
            if self.parametrisation == "plain":
                logdet_a = logdet_a - 2.0 * torch.log(torch.diagonal(chol)).sum()  # type: ignore[possibly-undefined]
            sc.logdet_a = float(logdet_a)
            hv = None
            if self.track_data_variances and self.parametrisation == "whitened":
                # λσ̃²(x_j) = k − ‖e_j‖² + λ e_jᵀA⁻¹e_j from the embeddings at hand (one n×m×m product)
                qa = self._system_inv[:m, :m]
                hv = torch.linalg.vecdot(feat, torch.addmm(feat, feat, qa, beta=-1.0, alpha=lam))
                hv = hv.add_(self.kernel_diagonal(x) if self._kconst is None else self._kconst)
        else:
            sc.logdet_a = 0.0
            hv = self.kernel_diagonal(x) if self.track_data_variances else None
        self._touch()
        if hv is not None:
            self._data_var_buffer(n)[:n] = hv
            sc.hv_version = sc.version
