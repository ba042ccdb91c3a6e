"""State of the Nyström (DTC) kernel ridge model: buffers, scalars and the kernel fast path.

The model itself (:class:`~torchbandits.models.nystrom.NystromKernelRidge`, whose docstring
states the math) is built in three layers: this module holds the storage and the kernel
evaluations, :mod:`~torchbandits.models.nystrom_updates` the incremental and from-scratch
updates, :mod:`~torchbandits.models.nystrom` the queries.

Buffers (capacity-doubling, so ``.to()``/``state_dict()`` see all state):

* ``_z`` ``[cap_m, d]`` dictionary, ``_x`` ``[cap_n, d]`` data points, ``_c`` ``[cap_n]`` pull
  counts (1 beyond ``n``: an append is one pull), ``_s`` ``[cap_n]`` reward sums;
* named by their role, the same in both parametrisations: ``_coord_map`` (kernel column →
  coordinates), ``_system_inv`` (inverse of the ridge system), ``_rhs`` (its right-hand side),
  ``_feats`` ``[cap_n, cap_m]`` (every stored point's features);
* whitened: ``_coord_map = L⁻¹`` (``L`` the lower Cholesky factor of ``K_ZZ + ηI``),
  ``_system_inv = A⁻¹`` with ``A = EᵀCE + λI``, ``_rhs = Eᵀs``, ``_feats = E`` (embeddings
  ``e(x) = L⁻¹k_Z(x)``);
* plain: ``_coord_map = (K_ZZ + ηI)⁻¹``, ``_system_inv = Λ``, ``_rhs = Γ``, ``_feats = K_SZ``.

The plain-Python scalars (sizes, log-determinants, counters, caches) live in one slotted
:class:`NystromScalars` object: they change every round, and ``nn.Module.__setattr__`` costs
about 5 µs per write, ~2% of an EK-UCB step each.
"""

from __future__ import annotations

from typing import Literal

import torch
from gpytorch.kernels import Kernel, MaternKernel, RBFKernel, ScaleKernel
from torch import Tensor

from ..buffers import ResizableModule, grow_rows
from ..kernels import kernel_bound, kernel_diag, kernel_matrix, pairwise_sq_dist
from ..validation import as_point, check_positive

__all__ = ["NystromScalars", "NystromState", "Parametrisation"]

Parametrisation = Literal["whitened", "plain"]


class NystromScalars:
    """The mutable plain-Python state of a Nyström model (slotted: cheap writes, no ``__dict__``).

    ``n``/``m``: rows and anchors in use; ``logdet_a``: ``log det A`` (whitened) or
    ``log det Λ⁻¹ − log det K_ZZ`` (plain); ``logdet_running``: ``Σ log(1 + σ̃²_{i−1}(x_i))`` over
    appends; ``refused``: anchors refused by the ``min_residual`` guard; ``last_residual``: ``ω``
    of the last appended point; ``version``: bumped by every change (keys the caches below);
    ``hv``/``hv_version``: variances at the data points and the version they hold for; ``cache``,
    ``last_scored``, ``view_cache``, ``row_cap``: per-version caches of the queries."""

    __slots__ = (
        "cache",
        "hv",
        "hv_version",
        "last_residual",
        "last_scored",
        "logdet_a",
        "logdet_running",
        "m",
        "n",
        "refused",
        "row_cap",
        "version",
        "view_cache",
    )

    def __init__(self) -> None:
        self.n = 0
        self.m = 0
        self.logdet_a = 0.0
        self.logdet_running = 0.0
        self.refused = 0
        self.last_residual = float("nan")
        self.version = 0
        self.hv: Tensor | None = None
        self.hv_version = -1
        self.cache: tuple[int, Tensor, Tensor, Tensor | None] | None = None
        self.last_scored: tuple[int, Tensor, Tensor, Tensor] | None = None
        self.view_cache: tuple[Tensor, Tensor, Tensor, Tensor] | None = None
        self.row_cap: tuple[int, int] | None = None


class NystromState(ResizableModule):
    """Storage, sizes and kernel evaluations of :class:`~torchbandits.models.NystromKernelRidge`
    (see there for the arguments)."""

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
        self.register_buffer("_z", torch.zeros(0, 0, **z))
        self.register_buffer("_x", torch.zeros(0, 0, **z))
        self.register_buffer("_c", torch.ones(16, **z))
        self.register_buffer("_s", torch.zeros(16, **z))
        self.register_buffer("_coord_map", torch.zeros(16, 16, **z))
        self.register_buffer("_system_inv", torch.zeros(16, 16, **z))
        self.register_buffer("_rhs", torch.zeros(16, **z))
        self.register_buffer("_feats", torch.zeros(16, 16, **z))
        self._sc = NystromScalars()
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

    # ------------------------------------------------------------------ kernel fast path
    def kernel_block(self, a: Tensor, b: Tensor) -> Tensor:
        """``k(a, b)`` ``[na, nb]`` for trusted ``[na, d]``, ``[nb, d]`` tensors of the model's
        dtype/device (the one kernel evaluation path of the model: a plain isotropic RBF is
        ``exp(−‖a_i − b_j‖²/(2ℓ²))`` by
        :func:`~torchbandits.kernels.pairwise_sq_dist`, anything else goes through GPyTorch)."""
        if self._rbf_c is not None:
            return pairwise_sq_dist(a, b).mul_(self._rbf_c).exp_()
        return kernel_matrix(self.kernel, a, b)

    def kernel_column(self, x: Tensor) -> Tensor:
        """``k_Z(x) = [k(z_i, x)]_i`` ``[m]`` of one trusted point ``x`` ``[d]``."""
        if self._sc.m == 0:
            return x.new_zeros(0)
        return self.kernel_block(self._views()[0], x[None])[:, 0]

    def kernel_diagonal(self, a: Tensor) -> Tensor:
        """``k(a_i, a_i)`` ``[na]`` (a constant vector for stationary kernels)."""
        if self._kconst is not None:
            return a.new_full((a.shape[0],), self._kconst)
        return kernel_diag(self.kernel, a)

    @property
    def kernel_constant(self) -> float | None:
        """``k(x, x)`` when the kernel is stationary (the same for every ``x``), else ``None``."""
        return self._kconst

    def prior_variance(self, x: Tensor) -> float:
        """``k(x, x)`` of one trusted point ``x`` ``[d]`` (no kernel call for stationary kernels)."""
        kc = self._kconst
        return kc if kc is not None else float(self.kernel_diagonal(x[None])[0])

    # ------------------------------------------------------------------ properties / state
    @property
    def lam(self) -> float:
        """The ridge regulariser λ."""
        return self.regularisers[0]

    @property
    def n(self) -> int:
        """Number of stored data points (rows; a row may carry a count > 1 after a rebuild)."""
        return self._sc.n

    @property
    def m(self) -> int:
        """Dictionary size."""
        return self._sc.m

    @property
    def refused(self) -> int:
        """Anchors refused by the ``min_residual`` guard since the last :meth:`reset`."""
        return self._sc.refused

    @property
    def last_residual(self) -> float:
        """``ω = k(x,x) + η − k_Zᵀ(K_ZZ + ηI)⁻¹k_Z`` of the last appended point, before its append
        (``nan`` before the first append)."""
        return self._sc.last_residual

    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype of the model's tensors."""
        return self._c.dtype

    @property
    def device(self) -> torch.device:
        """Device of the model's tensors."""
        return self._c.device

    @property
    def dim(self) -> int | None:
        """Input dimension d of the stored points (None while empty)."""
        if self._sc.n:
            return self._x.shape[1]
        if self._sc.m:
            return self._z.shape[1]
        return None

    @property
    def dictionary(self) -> Tensor:
        """Anchor points ``[m, d]`` (a view)."""
        return self._views()[0]

    @property
    def x(self) -> Tensor:
        """Stored data points ``[n, d]`` (a view)."""
        return self._x[: self._sc.n]

    @property
    def counts(self) -> Tensor:
        """Multiplicity of each distinct stored point, shape ``[n]``."""
        return self._c[: self._sc.n]

    @property
    def target_sums(self) -> Tensor:
        """Sum of the rewards observed at each distinct stored point, shape ``[n]``."""
        return self._s[: self._sc.n]

    def get_extra_state(self) -> dict:
        sc = self._sc
        return {"n": sc.n, "m": sc.m, "lam": self.lam, "logdet_a": sc.logdet_a,
                "logdet_running": sc.logdet_running,
                "refused": sc.refused, "parametrisation": self.parametrisation}

    def set_extra_state(self, state: dict) -> None:
        sc = self._sc
        sc.n, sc.m = int(state["n"]), int(state["m"])
        self.regularisers = (float(state["lam"]),)
        sc.logdet_a = float(state["logdet_a"])
        sc.logdet_running = float(state["logdet_running"])
        sc.refused = int(state["refused"])
        self.parametrisation = state["parametrisation"]
        self._touch()

    def _apply(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._touch()
        out = super()._apply(fn, *args, **kwargs)
        self._setup_fast_kernel()
        return out

    def _touch(self) -> None:
        """A new version: every cache keyed on the old one is stale."""
        sc = self._sc
        sc.version += 1
        sc.cache = sc.last_scored = sc.view_cache = sc.row_cap = None

    def _views(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(Z, P, Q, G)`` = the live ``[:m]`` views of the dictionary and the three matrices,
        cached until the dictionary or the buffers change (saves ~10 slicing ops per round)."""
        sc = self._sc
        v = sc.view_cache
        if v is None:
            m = sc.m
            v = sc.view_cache = (self._z[:m], self._coord_map[:m, :m], self._system_inv[:m, :m],
                                 self._rhs[:m])
        return v

    def reset(self) -> None:
        """Forget the data and the dictionary."""
        sc = self._sc
        sc.n = sc.m = sc.refused = 0
        sc.logdet_a = sc.logdet_running = 0.0
        self._c.fill_(1.0)
        self._touch()

    def features(self, points: Tensor) -> Tensor:
        """``k_Z`` of ``points`` ``[m, A]`` (plain) or the embeddings ``L⁻¹ k_Z`` (whitened)."""
        if self._sc.m == 0:
            return points.new_zeros(0, points.shape[0])
        zv, pv, _, _ = self._views()
        kz = self.kernel_block(zv, points)
        if self.parametrisation == "whitened":
            return pv @ kz
        return kz

    # ------------------------------------------------------------------ capacity
    def _check_point(self, name: str, x: Tensor) -> Tensor:
        return as_point(name, x, dtype=self.dtype, device=self.device, dim=self.dim)

    def _ensure_rows(self, n: int, d: int) -> None:
        sc = self._sc
        cap = sc.row_cap  # (rows, d) of the current buffers: no Module lookups
        if cap is not None and n <= cap[0] and d == cap[1]:
            return
        if n <= self._x.shape[0] and self._x.shape[1] == d and n <= self._feats.shape[0]:
            sc.row_cap = (min(self._x.shape[0], self._feats.shape[0], self._c.shape[0]), d)
            return
        if self._x.shape[0] == 0 or self._x.shape[1] != d:
            self._x = self._c.new_zeros(16, d)
        self._x = grow_rows(self._x, n)
        old = self._c.shape[0]
        self._c = grow_rows(self._c, n)
        self._c[old:].fill_(1.0)
        self._s = grow_rows(self._s, n)
        self._feats = grow_rows(self._feats, n)
        sc.row_cap = None

    def _ensure_anchors(self, m: int, d: int) -> None:
        if m <= self._z.shape[0] and self._z.shape[1] == d and m <= self._coord_map.shape[0] \
                and m <= self._feats.shape[1]:
            return
        if self._z.shape[0] == 0 or self._z.shape[1] != d:
            self._z = self._c.new_zeros(16, d)
        self._z = grow_rows(self._z, m)
        self._coord_map = grow_rows(self._coord_map, m, dims=(0, 1))
        self._system_inv = grow_rows(self._system_inv, m, dims=(0, 1))
        self._rhs = grow_rows(self._rhs, m)
        self._feats = grow_rows(self._feats, m, dims=(1,))

    def _data_var_buffer(self, n: int) -> Tensor:
        """The buffer of the variances at the data points, with room for ``n`` of them."""
        sc = self._sc
        hv = sc.hv
        if hv is None or hv.shape[0] < n or hv.device != self._c.device or hv.dtype != self.dtype:
            new = self._c.new_zeros(max(16, 2 * n))
            if hv is not None and hv.device == new.device:
                new[: hv.shape[0]] = hv[: new.shape[0]].to(new.dtype)
            hv = sc.hv = new
        return hv
