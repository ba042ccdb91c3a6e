"""The pruned fused select of a bound over several terms (DMM's grid, Flynn & Reeb 2024, Eq. (14);
``native/exact_prune.h``) against the full select: the same choice and minimising term, bit for
bit, from every starting term, with ties and with a term that is not finite; and DMM-UCB's runs
on fresh candidates the same with and without it."""

from __future__ import annotations

import pytest
import torch

from torchbandits.confidence.base import UCBForm
from torchbandits.envs import RKHSFunctionEnv
from torchbandits.experiments import simulate
from torchbandits.kernels import make_kernel
from torchbandits.models import ExactKernelRidge
from torchbandits.models.exact_fused import full_select, pruned_select
from torchbandits.native import exact as nx
from torchbandits.policies import DMMUCB

pytestmark = pytest.mark.skipif(nx.available() is None, reason="no compiled library (no C compiler)")

REGS = (0.01, 0.03, 0.1, 0.3, 1.0)


def _model(n: int, seed: int = 0) -> ExactKernelRidge:
    model = ExactKernelRidge(make_kernel("matern52", 0.5), REGS[2], REGS, cache_candidates=False)
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, generator=gen, dtype=torch.float64)
    model.extend(x, torch.sin(4.0 * x.sum(1)) + 0.1 * torch.randn(n, generator=gen,
                                                                  dtype=torch.float64))
    return model


def _choose(model: ExactKernelRidge, cand: torch.Tensor, form: UCBForm) -> tuple[int, int]:
    """``(index, minimising term there)`` of one fused select."""
    seen: list[torch.Tensor] = []
    done = UCBForm(form.regs, form.betas, form.divisors,
                   done=lambda _ucb, arg: seen.append(arg.clone()))
    best = model.fused_select(cand, lambda: done)
    assert best is not None and len(seen) == 1
    return best, int(seen[0][0])


@pytest.mark.parametrize("n_arms", [1, 5, 16, 17, 40, 100, 130])
def test_the_pruned_fused_select_is_the_full_select(n_arms: int) -> None:
    """From every starting term (and out of range: S // 2), random widths (several terms minimal
    somewhere) and a duplicated candidate (a tie: the first index), the pruned select chooses as
    the full one with the same minimising term, and leaves that term as the next start."""
    model = _model(40, seed=n_arms)
    gen = torch.Generator().manual_seed(200 + n_arms)
    for trial in range(8):
        cand = torch.rand(n_arms, 3, dtype=torch.float64, generator=gen)
        if n_arms > 3:
            cand[n_arms // 2] = cand[1]
        betas = tuple((0.05 + 3.0 * torch.rand(5, dtype=torch.float64, generator=gen)).tolist())
        divs = tuple((0.5 + torch.rand(5, dtype=torch.float64, generator=gen)).tolist())
        form = UCBForm(REGS, betas, divs)
        with full_select():
            want = _choose(model, cand, form)
        for start in range(-1, 6):
            model._fused.hint[0] = start
            with pruned_select():
                assert _choose(model, cand, form) == want, (trial, start)
            assert model._fused.hint[0] == want[1]
            assert model._fused.hint[1] == 1             # the chosen candidate's pieces kept


def test_a_term_not_finite_takes_the_full_select() -> None:
    """A NaN in one term's whitened targets: no pruning (its bound would be NaN, which counts as
    the largest); the choice is the full select's."""
    model = _model(30, seed=3)
    cand = torch.rand(50, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    form = UCBForm(REGS, (1.0, 2.0, 0.5, 1.5, 3.0), (1.0,) * 5)
    model._buffers["_z"][model.regularisers.index(REGS[3]), 7] = float("nan")  # one term's
    with full_select():
        want = _choose(model, cand, form)
    model._fused.hint[0] = 0
    assert _choose(model, cand, form) == want
    assert model._fused.hint[1] == 0                     # (no pieces: the full select ran)


def test_dmm_runs_the_same_pruned_or_not() -> None:
    """DMM-UCB on fresh candidates (100 a round): the same actions, rewards and diagnostic
    ``log(α/α₀)`` of the term that set each choice, and the same state bit for bit (the appends
    read the pruned select's pieces), with the pruned select and with the full one."""
    def run():
        env = RKHSFunctionEnv("matern52", dim=3, lengthscale=0.5, noise_std=0.1)
        policy = DMMUCB(make_kernel("matern52", 0.5), noise_std=0.1, norm_bound=10.0, c=0.3)
        return simulate(policy, env, 120, 4, diagnostics_every=1), policy

    pruned, policy = run()
    assert policy.model._fused is not None                 # (the fused step ran)
    with full_select():
        full, reference = run()
    assert pruned.actions == full.actions
    assert pruned.rewards == full.rewards
    assert pruned.diagnostics == full.diagnostics
    state, want = policy.state_dict(), reference.state_dict()
    assert state.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(state[key], value), key


def test_appends_after_selects_over_some_of_the_factors() -> None:
    """A bound over two of the model's five factors: the append reads the select's pieces for
    those two and solves the other three; over 12 rounds the state equals, bit for bit, that of
    the same rounds under the full select (which keeps no pieces)."""
    models = [_model(25, seed=9), _model(25, seed=9)]
    gen = torch.Generator().manual_seed(12)
    for _ in range(12):
        cand = torch.rand(64, 3, dtype=torch.float64, generator=gen)
        form = UCBForm((REGS[0], REGS[3]), (2.0, 0.7), (1.0, 1.0))
        picks = []
        for model, full in zip(models, (False, True), strict=True):
            with full_select() if full else pruned_select():
                best = model.fused_select(cand, lambda f=form: f)
                assert best is not None
                assert model._fused.hint[1] == (0 if full else 1)
                assert model.fused_append(cand[best], 0.7 * best / 64, (cand, best))
            picks.append(best)
        assert picks[0] == picks[1]
    state, want = (m.state_dict() for m in models)
    tensors = [key for key, value in want.items() if isinstance(value, torch.Tensor)]
    assert len(tensors) >= 5
    for key in tensors:
        assert torch.equal(state[key], want[key]), key
