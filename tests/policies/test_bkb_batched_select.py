"""Batched BKB's choice in the compiled round (Calandriello, Carratino, Lazaric, Valko & Rosasco,
COLT 2019, eq. 4 and Theorem 2 / App. D.1): :func:`torchbandits.native.bkb.select_rounds` takes
every run's width β̃_t and UCB argmax in the loop of the compiled rounds. Its width is the
sequential rule's :meth:`BKBBeta.radius <torchbandits.confidence.bkb.BKBBeta.radius>` bit for bit
(folded by :func:`~torchbandits.confidence.bkb_batched.radius_terms`), its σ̃ ``torch.sqrt``'s
(the same vector routine), its choice the first argmax of the fused UCB; batched runs with it
are the sequential runs bit for bit under every width rule, and without it (no such square
root) the batch makes the same choices."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from torchbandits.confidence.bkb import BKBBeta
from torchbandits.confidence.bkb_batched import radius_offsets, radius_terms
from torchbandits.envs.batched import BatchedEnv
from torchbandits.experiments.registry import make_env, make_policy
from torchbandits.models.nystrom_updates import PIVOT_TOL
from torchbandits.native import bkb as native_bkb

from ..batch_checks import lockstep, seeded
from .test_bkb_batched_native import _batch

pytestmark = pytest.mark.skipif(not native_bkb.available() or native_bkb.vector_sqrt() is None,
                                reason="no compiled library or no vector sqrt of torch's")
F64 = torch.float64
RULES = [BKBBeta("paper", norm_bound=3.0, noise_std=0.2, eps=0.3, delta=0.05, beta_scale=0.7),
         BKBBeta("authors_code", norm_bound=2.0, noise_std=0.5, delta=0.2)]


@pytest.mark.parametrize("rule", RULES, ids=["paper", "authors_code"])
@pytest.mark.parametrize("t", [1, 2, 37, 1999])
def test_folded_width_is_the_rule_bit_for_bit(rule: BKBBeta, t: int) -> None:
    """``(c_r + k1·sqrt(k2·max(S, 0) + log(1/δ)))·scale`` against ``rule.radius`` for S of many
    magnitudes, 0, −0.0, a negative S (clamped) and per-run λ: equal floats (NaN stays NaN)."""
    lam = [1e-4, 0.01, 0.3, 7.0]
    c = radius_offsets(rule, lam)
    k1, k2, log_delta, scale = radius_terms(rule, t, 1.0)
    g = torch.Generator().manual_seed(t)
    spread = torch.rand(200, generator=g, dtype=F64) * 10 ** torch.randint(-8, 8, (200,),
                                                                           generator=g)
    values = [0.0, -0.0, -3.0, 1e-300, 5e300, *spread.tolist()]
    for s in values:
        for r, v in enumerate(lam):
            want = rule.radius(s, t, 1.0, v)
            got = (c[r] + k1 * math.sqrt(k2 * max(s, 0.0) + log_delta)) * scale
            assert got == want, (s, v)
    assert math.isnan(rule.radius(math.nan, t, 1.0, 0.1))
    with pytest.raises(ValueError, match="rule"):
        radius_terms(BKBBeta("constant", beta=2.0), t, 1.0)


def _dtc(b: dict[str, Any], width: int) -> tuple:
    return (b["rows"], b["idx"], b["in_dict"], b["counts"], b["sums"], b["n_distinct"], b["lam"],
            width, 1.0, 0.0, PIVOT_TOL)


@pytest.mark.parametrize("rule", [*RULES, None], ids=["paper", "authors_code", "given"])
def test_select_rounds_are_dtc_rounds_then_the_rule_and_the_argmax(rule: BKBBeta | None) -> None:
    """The same posterior as :func:`dtc_rounds` (bit for bit), β̃_t of every run equal to the
    rule's (or the given widths), and the choice of :func:`ucb_argmax_rounds` on ``torch.sqrt``
    of the variances; a run with a singular ``K_ZZ`` is reported failed, the others set."""
    sizes, masks = [30, 5, 50, 12], [list(range(0, 30, 3)), [], list(range(1, 50, 2)), [0, 11]]
    for b, width in ((_batch(0.3, sizes, masks), 50),
                     (_batch(1.5, [40, 40], [list(range(40)), [0]]), 40)):
        r = b["lam"].shape[0]
        lam = b["lam"].tolist()
        if rule is None:
            given = torch.linspace(0.5, 3.0, r, dtype=F64)
            out = native_bkb.select_rounds(*_dtc(b, width), given, None, 0.0, 0.0, 0.0, 1.0)
        else:
            terms = radius_terms(rule, 25, 1.0)
            c = torch.tensor(radius_offsets(rule, lam), dtype=F64)
            out = native_bkb.select_rounds(*_dtc(b, width), None, c, *terms)
        ref = native_bkb.dtc_rounds(*_dtc(b, width))
        assert out is not None and ref is not None
        failed = [] if ref[4] is None else ref[4].tolist()
        assert ([] if out[4] is None else out[4].tolist()) == failed
        beta, choice = out[5], out[6]
        for j in range(r):
            if j in failed:
                continue
            for a, e in zip(out[:4], ref[:4], strict=True):
                assert torch.equal(a[j], e[j])
            want = float(given[j]) if rule is None else rule.radius(float(ref[3][j]), 25, 1.0,
                                                                    lam[j])
            assert float(beta[j]) == want
            mean, var = ref[0][j:j + 1], ref[1][j:j + 1]
            pick = native_bkb.ucb_argmax_rounds(mean, torch.sqrt(var), beta[j:j + 1])
            assert pick is not None and int(choice[j]) == int(pick[0])
            ucb = torch.addcmul(mean[0], torch.sqrt(var[0]), beta[j])
            assert int(choice[j]) == int(torch.argmax(ucb))
    b = _batch(0.3, sizes, masks)
    assert native_bkb.select_rounds(*_dtc(b, 50), None, None, 0.0, 0.0, 0.0, 1.0) is None
    assert native_bkb.select_rounds(*_dtc(b, 50), torch.ones(3, dtype=F64), None, 0.0, 0.0, 0.0,
                                    1.0) is None


@pytest.mark.parametrize("options", [{"beta_rule": "authors_code"},
                                     {"beta_rule": "constant", "beta": 2.5},
                                     {"qbar": 1.0}], ids=["authors_code", "constant", "qbar1"])
def test_batched_runs_are_the_sequential_runs_under_every_width_rule(options: dict) -> None:
    """Lockstep against the sequential compiled runs (``atol = 0``, 120 rounds, R = 6): the widths
    and choices made in C are the sequential rule's and argmax's."""
    env = make_env("rkhs", dim=2, n_arms=300, fixed_arms=True)
    seeds = list(range(6))
    batch = make_policy("bkb", env, **options)
    batch.reset(seed=seeds)
    seqs = [seeded(make_policy("bkb", env, **options), s) for s in seeds]
    lockstep(env, seeds, 120, batch, seqs, atol=0.0)
    diag = batch.diagnostics()
    assert diag["beta"].tolist() == [pol.diagnostics()["beta"] for pol in seqs]


def test_without_the_vector_sqrt_the_batch_chooses_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """No vector square root (``vector_sqrt() is None``): ``select_rounds`` declines, the round
    takes :func:`dtc_rounds` and the argmax after it — the same choices and widths."""
    env = make_env("rkhs", dim=2, n_arms=300, fixed_arms=True)
    seeds = list(range(5))

    def play() -> tuple[list[torch.Tensor], torch.Tensor]:
        pol = make_policy("bkb", env)
        benv = BatchedEnv(env, seeds)
        pol.reset(seed=seeds)
        acts = []
        for _ in range(80):
            cand = benv.candidates()
            idx = pol.select(cand)
            acts.append(idx)
            reward, _ = benv.pull(idx)
            pol.update(cand[torch.arange(len(seeds)), idx], reward)
        return acts, pol.diagnostics()["beta"]

    acts, beta = play()
    monkeypatch.setattr(native_bkb, "vector_sqrt", lambda: None)
    calls = []
    inner = native_bkb.dtc_rounds
    monkeypatch.setattr(native_bkb, "dtc_rounds", lambda *a: calls.append(1) or inner(*a))
    acts_off, beta_off = play()
    assert len(calls) == 80 - 1                         # every scored round by dtc_rounds
    assert all(torch.equal(a, b) for a, b in zip(acts, acts_off, strict=True))
    assert torch.equal(beta, beta_off)
