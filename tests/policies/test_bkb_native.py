"""BKB's compiled round (Calandriello, Carratino, Lazaric, Valko & Rosasco, COLT 2019, §3.1 eq. 4,
§3.2) against the torch path: the C kernel makes the BLAS/LAPACK calls that torch makes for
:func:`~torchbandits.models.nystrom_arms.dtc_round`, so runs with and without it
(``torchbandits.native.disabled()``) choose the same arms, score the same UCBs and end in the
same state; the cases it leaves to torch (pivoted ``K_ZZ``, empty dictionary, float32, a
changing arm set) still run."""

from __future__ import annotations

import pytest
import torch

import torchbandits.native as native
from torchbandits.envs import RKHSFunctionEnv
from torchbandits.kernels import make_kernel
from torchbandits.models.nystrom import NystromKernelRidge
from torchbandits.models.nystrom_arms import dtc_round
from torchbandits.models.nystrom_updates import PIVOT_TOL
from torchbandits.models.rls import RLSResampler
from torchbandits.native import bkb as native_bkb
from torchbandits.policies import BKB

from ..batch_checks import equal_leaves

pytestmark = pytest.mark.skipif(not native_bkb.available(),
                                reason="no C compiler or BLAS symbols: only the torch path runs")
LAM = 0.01


class _Spy:
    """Counts the compiled rounds that ran (returned a result)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rounds = 0
        inner = native_bkb.dtc_round

        def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
            out = inner(*args, **kwargs)
            self.rounds += out is not None
            return out

        monkeypatch.setattr(native_bkb, "dtc_round", counted)


def _run(n_arms: int, horizon: int, qbar: float, sampler: str, ell: float = 0.5, seed: int = 0,
         dtype: torch.dtype = torch.float64) -> tuple[list[int], list[torch.Tensor], BKB]:
    env = RKHSFunctionEnv("rbf", dim=2, lengthscale=ell, n_arms=n_arms, fixed_arms=True,
                          noise_std=0.1, norm=1.0)
    env.reset(seed)
    cand, means = env.candidates().to(dtype), env.mean_rewards().to(dtype)
    policy = BKB(make_kernel("rbf", ell), LAM, noise_std=0.1, qbar=qbar, beta_rule="authors_code",
                 sampler=sampler, seed=seed, dtype=dtype)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(seed + 1)
    actions, scores = [], []
    for t in range(horizon):
        noise = float(0.1 * torch.randn((), generator=gen, dtype=torch.float64))
        if t:
            scores.append(policy(cand).clone())
        i = policy.select(cand)
        actions.append(i)
        policy.update(cand[i], means[i] + noise)
    return actions, scores, policy


def _same_state(a: BKB, b: BKB) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key, va in sa.items():
        assert equal_leaves(va, sb[key]), key


@pytest.mark.parametrize(("n_arms", "qbar", "sampler", "ell"), [
    (1000, 1.0, "linearized", 0.5), (1000, 5.0, "linearized", 0.5), (60, 1.0, "binomial", 0.5),
    (100, 5.0, "binomial", 0.2), (60, 5.0, "linearized", 1.5)])
def test_native_round_equals_torch_path(n_arms: int, qbar: float, sampler: str, ell: float,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """300 rounds, every one resampling the dictionary from scratch: identical actions, UCBs
    within 1e-10 (the same bits in practice), the same state after the run; the compiled round
    ran on most rounds (ℓ = 1.5: pivoted ``K_ZZ`` rounds take the torch route in between)."""
    spy = _Spy(monkeypatch)
    acts, ucbs, pol = _run(n_arms, 300, qbar, sampler, ell)
    native_rounds = spy.rounds
    with native.disabled():
        acts_t, ucbs_t, pol_t = _run(n_arms, 300, qbar, sampler, ell)
    assert spy.rounds == native_rounds  # nothing compiled ran inside disabled()
    assert native_rounds > (100 if ell == 1.5 else 500)  # forward + select per round
    assert acts == acts_t
    assert max(float((u - v).abs().max()) for u, v in zip(ucbs, ucbs_t, strict=True)) <= 1e-10
    _same_state(pol, pol_t)
    assert pol.dictionary_size == pol_t.dictionary_size


@pytest.mark.parametrize(("ell", "m", "n", "jitter"), [(0.5, 25, 223, 0.0), (0.5, 50, 300, 0.0),
                                                       (0.2, 60, 240, 0.0), (0.5, 30, 120, 1e-6),
                                                       (0.5, 1, 4, 0.0), (0.5, 2, 2, 0.0)])
def test_native_dtc_round_is_the_torch_round_bit_for_bit(ell: float, m: int, n: int,
                                                         jitter: float) -> None:
    """The kernel against :func:`dtc_round` on random dictionaries (m = 1, 2: the smallest
    products; a jitter on ``K_ZZ``): the same mean and variance bits, ``S_t`` of the same
    ``dot``."""
    g = torch.Generator().manual_seed(m)
    arms = torch.rand(1000, 2, generator=g, dtype=torch.float64)
    idx = torch.randperm(1000, generator=g)[:n]
    sel = torch.randperm(n, generator=g)[:m].sort().values
    counts = torch.randint(1, 20, (n,), generator=g).double()
    sums = counts * torch.sin(4 * arms[idx, 0]) + 0.1 * torch.randn(n, generator=g,
                                                                    dtype=torch.float64)
    rows = NystromKernelRidge(make_kernel("rbf", ell), LAM).kernel_block(arms[idx], arms)
    kza = rows.index_select(0, sel)
    mean, var = dtc_round(kza, kza.index_select(1, idx), sel, counts, sums, LAM, 1.0, jitter)
    out = native_bkb.dtc_round(rows, idx, sel, counts, sums, LAM, 1.0, jitter, PIVOT_TOL)
    assert out is not None
    assert torch.equal(out[0], mean) and torch.equal(out[1], var)
    assert out[2] == float(torch.dot(counts, var.index_select(0, idx)))


def test_native_round_leaves_pivoted_and_empty_cases_to_torch() -> None:
    """A numerically singular ``K_ZZ`` (ℓ = 1.5: the torch path factors it with pivoting) and an
    empty dictionary return ``None``."""
    g = torch.Generator().manual_seed(0)
    arms = torch.rand(300, 2, generator=g, dtype=torch.float64)
    idx = torch.arange(120)
    rows = NystromKernelRidge(make_kernel("rbf", 1.5), LAM).kernel_block(arms[idx], arms)
    counts, sums = torch.ones(120, dtype=torch.float64), torch.zeros(120, dtype=torch.float64)
    assert native_bkb.dtc_round(rows, idx, torch.arange(40), counts, sums, LAM, 1.0, 0.0,
                                PIVOT_TOL) is None
    assert native_bkb.dtc_round(rows, idx, torch.arange(0), counts, sums, LAM, 1.0, 0.0,
                                PIVOT_TOL) is None


def test_ucb_argmax_is_torch_add_and_argmax() -> None:
    """``μ̃ + β̃ σ̃`` with the bits of ``torch.add(alpha=β̃)`` (A = 1003: a tail past the vector
    width), the first index on ties, a NaN wins as in ``torch.argmax``."""
    g = torch.Generator().manual_seed(1)
    mean = torch.randn(1003, generator=g, dtype=torch.float64)
    sd = torch.sqrt(torch.rand(1003, generator=g, dtype=torch.float64))
    ucb, i = native_bkb.ucb_argmax(mean, sd, 1.2345678901234)  # type: ignore[misc]
    ref = torch.add(mean, sd, alpha=1.2345678901234)
    assert torch.equal(ucb, ref) and i == int(torch.argmax(ref))
    tie = torch.tensor([0.0, 2.0, 1.0, 2.0], dtype=torch.float64)
    assert native_bkb.ucb_argmax(tie, torch.zeros(4, dtype=torch.float64), 1.0)[1] == 1  # type: ignore[index]
    nan = torch.tensor([0.0, 2.0, float("nan"), 3.0], dtype=torch.float64)
    assert native_bkb.ucb_argmax(nan, torch.zeros(4, dtype=torch.float64), 1.0)[1] == int(  # type: ignore[index]
        torch.argmax(nan))
    assert native_bkb.ucb_argmax(mean.float(), sd.float(), 1.0) is None


@pytest.mark.parametrize("qbar", [1.0, 3.0])
def test_linearized_draw_is_the_resamplers_draw(qbar: float) -> None:
    """The same uniforms from the same generator state and the same kept points as
    :meth:`RLSResampler.draw`, the mask written in place; nothing drawn when inputs do not
    qualify."""
    g = torch.Generator().manual_seed(2)
    var = torch.rand(500, generator=g, dtype=torch.float64) * 0.3
    idx = torch.randperm(500, generator=g)[:80]
    counts = torch.randint(1, 5, (80,), generator=g).double()
    gen_a, gen_b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    mask = torch.zeros(80, dtype=torch.bool)
    sel = native_bkb.linearized_draw(gen_a, counts, var, idx, qbar, mask)
    ref, _ = RLSResampler(qbar, "linearized").draw(var[idx], counts, gen_b)
    assert sel is not None and torch.equal(mask, ref) and torch.equal(sel, ref.nonzero()[:, 0])
    assert torch.equal(gen_a.get_state(), gen_b.get_state())
    state = gen_a.get_state()
    assert native_bkb.linearized_draw(gen_a, counts.float(), var, idx, qbar, mask) is None
    assert torch.equal(gen_a.get_state(), state)


def test_first_rounds_and_other_dtypes_and_arm_sets_run_on_the_torch_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """t = 1 (one pulled point), float32 (torch only: no compiled round) and a new arm set every
    round (no fixed arm set) give the same actions with and without the library."""
    spy = _Spy(monkeypatch)
    acts, _, _ = _run(40, 3, 1.0, "linearized")
    with native.disabled():
        assert acts == _run(40, 3, 1.0, "linearized")[0]
    before = spy.rounds
    acts32, _, _ = _run(40, 30, 1.0, "linearized", dtype=torch.float32)
    assert spy.rounds == before
    with native.disabled():
        assert acts32 == _run(40, 30, 1.0, "linearized", dtype=torch.float32)[0]

    def contextual() -> list[int]:
        g = torch.Generator().manual_seed(3)
        pol = BKB(make_kernel("rbf", 0.5), LAM, sampler="linearized", beta_rule="authors_code")
        out = []
        for _ in range(25):
            cand = torch.rand(30, 2, generator=g, dtype=torch.float64)
            i = pol.select(cand)
            pol.update(cand[i], float(cand[i].sum()))
            out.append(i)
        return out

    acts_c = contextual()
    with native.disabled():
        assert acts_c == contextual()


@pytest.mark.parametrize("ell", [0.3])
def test_full_dictionary_native_scores_match_exact(ell: float, monkeypatch: pytest.MonkeyPatch
                                                   ) -> None:
    """``sampler="all"`` (the exact-GP limit) scored by the compiled round: the UCBs with β = 0
    (the mean) and β = 1 give ``μ̃`` and the ridge ``σ̃``, within 1e-9 of the exact kernel ridge
    posterior (80 arms, each pulled once or twice)."""
    spy = _Spy(monkeypatch)
    g = torch.Generator().manual_seed(4)
    arms = torch.rand(80, 2, generator=g, dtype=torch.float64)
    counts = torch.randint(1, 3, (80,), generator=g).double()
    rewards = torch.sin(3 * arms[:, 0]) + torch.cos(2 * arms[:, 1])
    scores = {}
    for beta in (0.0, 1.0):
        pol = BKB(make_kernel("rbf", ell), LAM, sampler="all", beta_rule="constant", beta=beta)
        pol.select(arms)
        for rep in range(2):
            for a in torch.nonzero(counts > rep)[:, 0].tolist():
                pol.select(arms)
                pol.update(arms[a], float(rewards[a]))
        before = spy.rounds
        scores[beta] = pol(arms)
        assert spy.rounds == before + 1 and pol.dictionary_size == 80
    k = pol.model.kernel_block(arms, arms)
    system = counts[:, None] * k + LAM * torch.eye(80, dtype=torch.float64)  # CK + λI
    mean = k @ torch.linalg.solve(system, counts * rewards)
    var_gp = torch.diagonal(k - k @ torch.linalg.solve(system, counts[:, None] * k))
    assert float((scores[0.0] - mean).abs().max()) < 1e-9
    sd = scores[1.0] - scores[0.0]
    assert float((sd**2 * LAM - var_gp).abs().max()) < 1e-9
