"""The compiled CPU step of :class:`~torchbandits.models.batched_exact.BatchedExactKernelRidge`:
all runs of a round scored in one C call and appended in one C call
(:mod:`torchbandits.native.exact_batch`, the single-run step's kernels looped over the runs).

:func:`mean_var_native` gives the GP mean and variance ``[R·G, A]`` of fresh candidates
``[R, A, d]`` (per run ``K_SC`` by the closed form, per member ``V = L⁻¹K_SC``, ``μ = zᵀV``,
``ρ² = max(k_CC − colsum(V ⊙ V), 0)``: the Cholesky form of the posterior, Flynn & Reeb 2024,
App. E.2), for the model (``G = 1``) or DMM's companion of ``R·G`` members (``G`` regularisers
per run sharing its points, Flynn & Reeb 2024, §5.4: the kernel rows evaluated once per run).
:func:`append_native` borders every member's factor with one point per run
(``l = L⁻¹k_S(x)``, ``d = sqrt(k(x, x) + λ − ‖l‖²)``, ``z_n = (y − zᵀl)/d``).

Both return ``None`` / ``False`` when the step does not qualify, and the caller takes its torch
path, which stays the reference (the tests hold the two to 1e-10) and is what runs on other
devices and dtypes: no compiled library (:func:`torchbandits.native.disabled`,
``TORCHBANDITS_NATIVE=0``, no compiler), a tensor that is not a contiguous float64 CPU tensor, a
kernel without a closed form (:class:`~torchbandits.kernel_fast.ScaledStationary`: RBF,
Matérn-1/2, 3/2, 5/2, one output scale), an empty model, more than
:data:`~torchbandits.native.exact.MAX_N` stored points, or (append) a pivot that is not positive
(the torch path then rejects the call or flags the run, as it does). Addresses and strides are
read from the model's buffers at every call (nothing is kept: a state load, ``.to()`` or a deep
copy replace the buffers freely).

A compiled append does not border the explicit ``L⁻¹`` of the torch path
(:class:`~torchbandits.models.batched_inverse.InverseFactor`): it is forgotten, and rebuilt from
the factor if the torch path needs it again (e.g. the second call of a fixed candidate set,
whose ``V`` the candidate cache keeps and extends by rows in O(n·A)).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..buffers import grow_rows
from ..native import exact as nx
from ..native import exact_batch as nb
from .batched_kernel import fast_kernel

if TYPE_CHECKING:
    from .batched_exact import BatchedExactKernelRidge

__all__ = ["append_native", "mean_var_native"]

_F64 = torch.float64


def _ok(t: Tensor) -> bool:
    """A contiguous float64 CPU tensor (what the C code reads)."""
    return t.dtype is _F64 and t.is_cpu and t.is_contiguous()


def _kernel(model: BatchedExactKernelRidge, like: Tensor
            ) -> tuple[Tensor, int, float | None, float] | None:
    """``(w, kind code, output scale or None, k(x, x))`` of the model's kernel, or ``None``
    without a closed form."""
    if not fast_kernel(model.kernel):
        return None
    form = model._scaled.stationary(model.kernel, like)
    if form is None:
        return None
    kind = nx.KINDS.get((form.kind, form.nu))
    if kind is None or not _ok(form.weight):
        return None
    return form.weight, kind, form.outputscale, form.diag_value


def _state_ok(model: BatchedExactKernelRidge) -> bool:
    return _ok(model._L) and _ok(model._x) and _ok(model._z) and _ok(model._y)


def mean_var_native(model: BatchedExactKernelRidge, cand: Tensor, groups: int = 1, *,
                    keep: bool = False) -> tuple[Tensor, ...] | None:
    """GP mean and variance (clamped at 0) ``[R·G, A]`` of the checked candidates ``cand``
    ``[R, A, d]`` of the ``R = n_runs / groups`` runs (member ``r·G + g`` is run ``r`` at its
    ``g``-th regulariser, sharing its points), with one compiled call; ``keep``: also
    ``V = L⁻¹K_SC`` ``[R·G, n, A]`` and ``colsum(V ⊙ V)`` ``[R·G, A]`` (new tensors, what a
    fixed set's cache keeps). ``None`` if the step does not qualify (module docstring)."""
    n = model.n
    if n == 0 or n > nx.MAX_N or cand.dtype is not _F64 or not cand.is_cpu \
            or cand.shape[0] * groups != model.n_runs:
        return None
    cand = cand.contiguous()   # (a batch's candidates may be a strided view: one small copy)
    lib = nb.available()
    if lib is None or not _state_ok(model) or model._x.shape[2] != cand.shape[2]:
        return None
    kern = _kernel(model, cand)
    if kern is None:
        return None
    shape = (model.n_runs, cand.shape[1])
    mean, var = cand.new_empty(shape), cand.new_empty(shape)
    kept = (cand.new_empty(shape[0], n, shape[1]), cand.new_empty(shape)) if keep else None
    nb.score(lib, groups, n, model._x, cand, kern, model._L, model._z, mean, var, kept)
    return (mean, var) if kept is None else (mean, var, *kept)


def append_native(model: BatchedExactKernelRidge, x: Tensor, y: Tensor, groups: int = 1) -> bool:
    """Append ``x`` ``[R, d]``, ``y`` ``[R]`` (checked) to every member of the ``R`` runs of
    ``groups`` members (all of a run's members get its point), with one compiled call and the
    model's bookkeeping; ``False`` (nothing changed) if the step does not qualify (module
    docstring)."""
    n = model.n
    if n == 0 or n >= nx.MAX_N or not (_ok(x) and _ok(y) and _ok(model._lam)):
        return False
    if x.shape[0] * groups != model.n_runs or model._x.shape[2] != x.shape[1]:
        return False
    lib = nb.available()
    if lib is None:
        return False
    kern = _kernel(model, x)
    if kern is None:
        return False
    model._L = grow_rows(model._L, n + 1, dims=(1, 2))
    model._x = grow_rows(model._x, n + 1, dims=(1,))
    model._y = grow_rows(model._y, n + 1, dims=(1,))
    model._z = grow_rows(model._z, n + 1, dims=(1,))
    if not _state_ok(model):
        return False
    work = model.workspace.get("native_append", (model.n_runs * (n + 2),), x)
    if nb.append(lib, groups, n, x, y, (model._x, model._y, model._L, model._z), kern,
                 model._lam, work):
        return False   # a pivot not positive: nothing written, the torch path rejects or flags
    if not model._inverse.off:
        model._inverse.restart()   # not bordered here: rebuilt from the factor if needed
    model._n = n + 1
    return True
