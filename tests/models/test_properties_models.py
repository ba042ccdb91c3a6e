"""Property-based tests (hypothesis) of the incremental posterior models: any sequence of appends,
removals, refreshes and dictionary growth ends at the posterior computed from scratch on the data
the model holds.

* ``ExactKernelRidge`` (two regularisers, bordered Cholesky append, rank-one remove-oldest,
  ``refresh``) and ``SlidingWindowKernelRidge`` (candidate cache carried through removals): mean,
  variance at both regularisers and ``log det(I + K/λ)`` against one fresh factorisation;
* ``NystromKernelRidge`` (Sherman–Morrison appends, bordered dictionary growth, whitened and
  plain parametrisations): against the textbook projected posterior with explicit inverses;
* ``FiniteArmRidge`` (primal appends, windowed removals, discounting): against ``V`` and ``b``
  summed from the weighted history.

``max_examples`` is small so that the file runs in seconds.
"""

from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchbandits.kernels import kernel_matrix, make_kernel
from torchbandits.models import ExactKernelRidge
from torchbandits.models.exact import exact_posterior_reference
from torchbandits.models.features import kernel_features
from torchbandits.models.finite_arm import FiniteArmRidge
from torchbandits.models.nystrom import NystromKernelRidge, nystrom_posterior_reference
from torchbandits.models.window import SlidingWindowKernelRidge

POINTS = torch.rand(40, 2, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
CAND = torch.rand(12, 2, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
SETTINGS = settings(max_examples=12, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])

op = st.tuples(st.sampled_from(["append", "append", "append", "remove", "refresh", "score"]),
               st.integers(0, POINTS.shape[0] - 1), st.floats(-2.0, 2.0))
ops = st.lists(op, min_size=1, max_size=25)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / max(float(b.abs().max()), 1.0))


def _exact_ops(model, seq, *, window: int | None = None) -> None:
    for kind, i, y in seq:
        if kind == "append":
            model.append(POINTS[i], y)
            if window is not None and model.n > window:
                model.remove_oldest(model.n - window)
        elif kind == "remove" and model.n:
            model.remove_oldest(1 + i % model.n)
        elif kind == "refresh" and model.n and hasattr(model, "refresh"):
            model.refresh()
        elif kind == "score":
            model.mean_var(CAND)       # fills the candidate caches that later updates carry


def _check_exact(model) -> None:
    if model.n == 0:
        mean, var = model.mean_var(CAND)
        assert float(mean.abs().max()) == 0.0
        return
    for reg in model.regularisers:
        mean, var = model.mean_var(CAND, reg=reg)
        ref_m, ref_v = exact_posterior_reference(model.kernel, model.x, model.y, CAND, reg)
        assert _rel(mean, ref_m) < 1e-8 and _rel(var, ref_v) < 1e-8
        gram = kernel_matrix(model.kernel, model.x, model.x)
        ld = torch.linalg.slogdet(torch.eye(model.n, dtype=gram.dtype) + gram / reg)[1]
        assert abs(float(model.log_det(reg)) - float(ld)) < 1e-8 * max(1.0, abs(float(ld)))


@SETTINGS
@given(seq=ops)
def test_exact_model_matches_scratch_after_any_sequence(seq):
    model = ExactKernelRidge(make_kernel("matern52", 0.4), 0.1, (0.5,))
    _exact_ops(model, seq)
    _check_exact(model)


@SETTINGS
@given(seq=ops, window=st.integers(1, 8))
def test_sliding_window_model_matches_scratch(seq, window):
    model = SlidingWindowKernelRidge(make_kernel("rbf", 0.3), 0.05)
    _exact_ops(model, seq, window=window)
    assert model.n <= window
    _check_exact(model)


grow = st.lists(st.tuples(st.sampled_from(["append", "append", "grow", "score"]),
                          st.integers(0, POINTS.shape[0] - 1), st.floats(-2.0, 2.0)),
                min_size=1, max_size=25)


@SETTINGS
@given(seq=grow, parametrisation=st.sampled_from(["whitened", "plain"]))
def test_nystrom_model_matches_scratch_under_dictionary_growth(seq, parametrisation):
    kernel = make_kernel("rbf", 0.4)
    model = NystromKernelRidge(kernel, 0.2, parametrisation=parametrisation)
    for kind, i, y in seq:
        if kind == "append":
            model.append(POINTS[i], y)
        elif kind == "grow":
            model.add_to_dictionary(POINTS[i])
        elif model.n:
            model.mean_var(CAND)
    if model.n == 0 or model.m == 0:
        return
    mean, var = model.mean_var(CAND)
    ref_m, ref_v = nystrom_posterior_reference(model.kernel, model.dictionary, model.x,
                                               model.target_sums, CAND, model.lam, model.counts)
    assert _rel(mean, ref_m) < 1e-7 and _rel(var, ref_v) < 1e-7


finite = st.lists(st.tuples(st.sampled_from(["append", "append", "append", "remove", "score"]),
                            st.integers(0, 9), st.floats(-2.0, 2.0)), min_size=1, max_size=25)


@SETTINGS
@given(seq=finite, discount=st.sampled_from([1.0, 0.9]))
def test_finite_arm_model_matches_weighted_history(seq, discount):
    arms = POINTS[:10]
    kernel = make_kernel("rbf", 0.4)
    lam = 0.3
    model = FiniteArmRidge(kernel, lam, discount=discount, arms=arms)
    held: list[tuple[int, float]] = []
    for kind, i, y in seq:
        if kind == "append":
            model.append(arms[i], y)
            held.append((i, y))
        elif kind == "remove" and held:
            k = 1 + i % len(held)
            model.remove_oldest(k)
            held = held[k:]
        elif kind == "score":
            model.mean_var(arms)
    phi = kernel_features(kernel, arms)
    v = lam * torch.eye(phi.shape[1], dtype=torch.float64)
    b = torch.zeros(phi.shape[1], dtype=torch.float64)
    for age, (i, y) in enumerate(reversed(held)):
        w = discount**age
        v += w * torch.outer(phi[i], phi[i])
        b += w * y * phi[i]
    ref_mean = phi @ torch.linalg.solve(v, b)
    ref_var = lam * (phi * torch.linalg.solve(v, phi.T).T).sum(1)
    mean, var = model.mean_var(arms)
    assert model.n == len(held)
    assert _rel(mean, ref_mean) < 1e-8 and _rel(var, ref_var) < 1e-8
    ld = float(torch.linalg.slogdet(v)[1]) - phi.shape[1] * math.log(lam)
    assert abs(float(model.log_det()) - ld) < 1e-8 * max(1.0, abs(ld))
