"""The compiled growth of batched EK-UCB's dictionaries (``ekucb_grow``, ``ekucb_kors_grow`` and
``ekucb_kors_prob`` in ``torchbandits/native/ekucb_batch.c``; Zenati et al. 2022, Algorithms 4
and 5, §4.2): the border of the posterior and of KORS of the growing runs, each in place at its
own size, against the torch border on random batches (every state tensor to ~1e-12 relative:
another order of summation, not the same bits), the error contract of a Schur complement that is
not positive (raised with nothing bordered, or flagged under deferred checks, as the torch path),
KORS's compiled probability against its tensor operations to the bit, and a whole Chessboard
batch grown by the compiled border from the first round in lockstep with the sequential runs.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import pytest
import torch

from torchbandits import native
from torchbandits.batching import deferred_checks
from torchbandits.experiments.registry import make_env, make_policy
from torchbandits.kernels import make_kernel
from torchbandits.models.batched_kors import BatchedKORS
from torchbandits.models.batched_nystrom import BatchedNystrom
from torchbandits.native import ekucb as native_ekucb

from ..batch_checks import lockstep, seeded
from .test_ekucb_growth import random_round

F64 = torch.float64
pytestmark = pytest.mark.skipif(native.library("ekucb_batch") is None,
                                reason="no C compiler: the compiled path is not built")


@contextlib.contextmanager
def _counting(calls: dict[str, int]) -> Iterator[None]:
    """Count the compiled growth calls that ran (returned a result): ``grow``, ``kors_grow``."""
    real = {name: getattr(native_ekucb, name) for name in ("grow", "kors_grow")}

    def spy(name: str):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            out = real[name](*args, **kwargs)
            calls[name] = calls.get(name, 0) + (out is not None)
            return out
        return call

    for name in real:   # the model looks the functions up at each call
        setattr(native_ekucb, name, spy(name))
    try:
        yield
    finally:
        for name, fn in real.items():
            setattr(native_ekucb, name, fn)


def _leaves(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in module.state_dict().items() if isinstance(v, torch.Tensor)}


def _batch(kernel_name: str, r: int = 6) -> tuple[BatchedNystrom, BatchedKORS]:
    return (BatchedNystrom(make_kernel(kernel_name, 0.3), 0.5, r),
            BatchedKORS(0.5, 0.5, 1.0, "correct", r))


@pytest.mark.parametrize(("kernel_name", "counts"), [("rbf", False), ("rbf", True),
                                                     ("matern52", False)])
def test_compiled_border_equals_the_torch_border(kernel_name: str, counts: bool) -> None:
    """R = 6 runs, 40 rounds of random points: each round the compiled border of the accepting
    runs (posterior: guard, deferred step of ``Q``, ``E``'s column, ``P``'s row, ``Q``, ``g``,
    ``Z``, log-determinant, sizes, refusals; KORS: ``N``, ``p̃``, sizes) and the torch border
    (``native.disabled()``) from the same state: the same mask and sizes, every float state
    tensor within 5e-12 of the largest entry of that tensor (the two sum in other orders; 7e-13
    measured, in ``E``'s new column ``(k_S(z) − E f)/d`` where ``ω`` is small). The
    RBF's kernel row is computed in C; the Matérn's comes from torch; ``counts``: a rebuild with
    counts 1–3 at round 20 (then ``C e ≠ e``)."""
    torch.manual_seed(5)
    model, kors = _batch(kernel_name)
    calls: dict[str, int] = {}
    worst = 0.0
    for t in range(40):
        if counts and t == 20:
            sizes, n = model.sizes.clone(), model.n
            dicts = torch.zeros(6, int(sizes.max()), 2, dtype=F64)
            for j in range(6):
                dicts[j, : int(sizes[j])] = model.dictionary(j)
            model.rebuild(dicts, sizes, model.x.clone(), model._s[:, :n].clone(),
                          torch.randint(1, 4, (6, n)).to(F64))
            assert not model._unit_counts
        kz, f, omega, p, accept = random_round(model, kors, t)
        runs = accept.nonzero()[:, 0]
        twin, twin_kors = copy.deepcopy(model), copy.deepcopy(kors)
        with _counting(calls):
            added = model.add_last(f[runs], omega[runs], accept[runs], runs)
            kors.add(kz[runs], 1.0, p[runs], added, runs=runs)
        with native.disabled():
            want = twin.add_last(f[runs], omega[runs], accept[runs], runs)
            twin_kors.add(kz[runs], 1.0, p[runs], want, runs=runs)
        assert torch.equal(added, want)
        for mine, theirs in ((model, twin), (kors, twin_kors)):
            a, b = _leaves(mine), _leaves(theirs)
            assert a.keys() == b.keys()
            for key in a:
                if not a[key].is_floating_point():
                    assert torch.equal(a[key], b[key]), (t, key)
                    continue
                scale = float(b[key].abs().max()) if b[key].numel() else 0.0
                torch.testing.assert_close(a[key], b[key], rtol=0, atol=5e-12 * max(scale, 1.0),
                                           msg=lambda m, t=t, key=key: f"{t} {key}: {m}")
                if scale:
                    worst = max(worst, float((a[key] - b[key]).abs().max()) / scale)
    assert calls == {"grow": 40, "kors_grow": 40}
    assert int(model.refused.sum()) >= 4 and len(set(model.sizes.tolist())) > 2
    assert worst > 0.0   # (another order of summation: not bit for bit)


def _failing(kind: str) -> tuple[BatchedNystrom, BatchedKORS, tuple[torch.Tensor, ...]]:
    """A batch after 8 rounds and one more append whose border has a Schur complement that is
    not positive in run 2 (``kind``: the posterior's, through λ; KORS's, through μ)."""
    torch.manual_seed(2)
    model, kors = _batch("rbf")
    for t in range(8):
        kz, f, omega, p, accept = random_round(model, kors, t)
        runs = accept.nonzero()[:, 0]
        kors.add(kz[runs], 1.0, p[runs], model.add_last(f[runs], omega[runs], accept[runs], runs),
                 runs=runs)
    kz, f, omega, p, _ = random_round(model, kors, 8)
    if kind == "posterior":
        model.lam = -1e6   # s = eᵀe + λ − bᵀQb < 0 in every growing run
    else:
        kors.mu = -1e6     # s' = k(z,z) + μp̃ − kᵀNk < 0
    return model, kors, (kz, f, omega, p, torch.tensor([1, 2, 4]))


@pytest.mark.parametrize("use_native", [False, True])
@pytest.mark.parametrize("kind", ["posterior", "kors"])
def test_a_non_positive_schur_complement_raises_and_borders_nothing(kind: str,
                                                                    use_native: bool) -> None:
    """A Schur complement that is not positive: ``ValueError`` naming the first bad run, and no
    run is bordered (``P``, ``Q``, ``E``, ``g``, ``Z``, sizes, log-determinant; KORS's ``N``,
    ``p̃``, sizes) — on the compiled path as on the torch path. Under deferred checks the runs
    are flagged (the failure reported at the end, naming the run) instead."""
    model, kors, (kz, f, omega, p, runs) = _failing(kind)
    accept = torch.ones(3, dtype=torch.bool)
    before = (_leaves(model), _leaves(kors))
    calls: dict[str, int] = {}
    with contextlib.nullcontext() if use_native else native.disabled(), _counting(calls):
        if kind == "posterior":
            with pytest.raises(ValueError, match=r"add_last: a Schur complement is not positive "
                                                 r"\(run 1\)"):
                model.add_last(f[runs], omega[runs], accept, runs)
        else:
            with pytest.raises(ValueError, match=r"KORS add: a Schur complement is not positive "
                                                 r"\(run 1\)"):
                kors.add(kz[runs], 1.0, p[runs], accept, runs=runs)
        after = (_leaves(model), _leaves(kors))
        for old, new in zip(before, after, strict=True):
            for key in old:
                assert torch.equal(old[key], new[key]), key
        with deferred_checks() as checks:
            if kind == "posterior":
                model.add_last(f[runs], omega[runs], accept, runs)
            else:
                kors.add(kz[runs], 1.0, p[runs], accept, runs=runs)
            with pytest.raises(ValueError, match="Schur complement"):
                checks.raise_if_failed(list(range(6)))
    assert calls.get("grow" if kind == "posterior" else "kors_grow", 0) == (2 if use_native else 0)


@pytest.mark.parametrize("score", ["correct", "reference"])
@pytest.mark.parametrize("const", [True, False])
def test_compiled_kors_probability_is_the_torch_operations_to_the_bit(score: str,
                                                                       const: bool) -> None:
    """``ekucb_kors_prob``: ``p̃ = min(γτ̃, 1)`` from the compiled ``kᵀNk`` equals the torch
    path's tensor operations on the same ``u`` bit for bit (``k(s,s)`` a float or a tensor;
    both leverage scores; some ``ρ`` clamped at 0 and some ``p̃`` at 1), at sizes 0 to the full
    width."""
    gen = torch.Generator().manual_seed(4)
    r, w = 7, 9
    sizes = torch.tensor([0, 1, 3, 5, 8, 9, 9])
    a = torch.randn(r, w, w, generator=gen, dtype=F64)
    n = a @ a.mT / w
    kz = torch.rand(r, w, generator=gen, dtype=F64)
    for j, m in enumerate(sizes.tolist()):
        n[j, m:] = 0.0
        n[j, :, m:] = 0.0
    kss = 1.0 if const else 0.5 + torch.rand(r, generator=gen, dtype=F64)
    kz[6] *= 30.0   # a quadratic form above k(s,s): ρ clamped at 0
    kors = BatchedKORS(0.3, 0.5, 2.5 if score == "correct" else 0.25, score, r)
    kors.reserve(w)
    kors._nz[:, :w, :w] = n
    kors._m.copy_(sizes)
    got = kors.probability(kz, kss)
    compiled = native_ekucb.kors_probability(kz, kors._nz, kors._m, kss, kors.mu, kors.eps,
                                             kors.gamma, score == "reference")
    assert compiled is not None
    u = compiled[0]
    assert torch.equal(compiled[1], got)
    # u: the quadratic form over each run's own size (zero at size 0), to rounding
    want_u = torch.stack([kz[j, :m] @ n[j, :m, :m] @ kz[j, :m] for j, m in enumerate(sizes.tolist())])
    torch.testing.assert_close(u, want_u, rtol=1e-13, atol=1e-13)
    rho = (kss - u).clamp_(min=0.0)
    tau = (1.0 + kors.eps) * rho / (rho + kors.mu)
    if score == "reference":
        tau = ((1.0 + kors.eps) * kss / kors.mu - tau).clamp_(min=0.0)
    want = (kors.gamma * tau).clamp_(max=1.0)
    assert torch.equal(got, want)
    assert bool((got == 1.0).any()) and bool((got < 1.0).any())


def test_chessboard_batch_grown_by_the_compiled_border_equals_the_sequential_runs() -> None:
    """Chessboard (γ = λ = 10, cond(K_ZZ) up to ~1e12), 6 runs × 240 rounds, every growth by
    the compiled border from the first round (``cpu_compact_above = 0``; asserted: it ran,
    posterior and KORS, 160 times here: every round where a run grew): the same actions as the
    sequential runs every round, UCBs to 1e-6 (as the torch path's Chessboard lockstep: rounding
    amplified by the conditioning; 1.5e-7 measured, as with the torch border), and at the end the
    same dictionaries, sizes and KORS probabilities (to 1e-12)."""
    env = make_env("chessboard")
    seeds = [3, 0, 11, 5, 7, 2]
    batch = make_policy("ekucb", env)
    batch.reset(seed=seeds)
    batch.cpu_compact_above = 0
    seqs = [seeded(make_policy("ekucb", env), s) for s in seeds]
    calls: dict[str, int] = {}
    with _counting(calls):
        lockstep(env, seeds, 240, batch, seqs, atol=1e-6)
    sizes = batch.diagnostics()["dict_size"]
    assert sizes.tolist() == [pol.diagnostics()["dict_size"] for pol in seqs]
    assert calls["grow"] == calls["kors_grow"] >= 150   # (160 here: every round a run grew)
    for r, pol in enumerate(seqs):
        assert torch.equal(batch.run_dictionary(r), pol.model.dictionary)
        torch.testing.assert_close(batch.run_kors_probabilities(r), pol.kors.probabilities,
                                   atol=1e-12, rtol=0)
