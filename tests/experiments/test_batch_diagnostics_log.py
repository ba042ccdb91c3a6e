"""The runner's bookkeeping of a batch: the diagnostics log (one stack per round, one host copy
at the end) equals the per-round split it replaced, and the finite checks kept unreduced until
the fold still name the run, seed and round."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torchbandits.batching import BatchCheckError, DeferredChecks
from torchbandits.envs import ChessboardEnv
from torchbandits.experiments import simulate_batch
from torchbandits.experiments.batch_diagnostics import DiagnosticsLog, per_run
from torchbandits.experiments.registry import make_policy

R = 4


def _reference(rounds: list[dict[str, Any]]) -> list[dict[str, list[float]]]:
    """The per-round split of the runner before the log (values copied when logged)."""
    out: list[dict[str, list[float]]] = [{} for _ in range(R)]
    for raw in rounds:
        for k, v in raw.items():
            for r, value in enumerate(per_run(v, R)):
                out[r].setdefault(k, []).append(value)
    return out


def _rounds(kind: str) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(1)
    live = torch.zeros(R, dtype=torch.float64)
    rounds = []
    for t in range(30):
        live.add_(torch.rand(R, generator=g, dtype=torch.float64))   # a running sum, in place
        values: dict[str, Any] = {"sum": live, "size": torch.arange(R) + t, "n": float(t),
                                  "p": torch.rand(R, generator=g, dtype=torch.float64),
                                  "scalar": torch.tensor(0.5 * t), "flag": torch.arange(R) > t % 3}
        if kind == "mixed":   # another dtype among the per-run values, a column [R, 1]
            values["p32"] = torch.rand(R, generator=g).to(torch.float32)
            values["col"] = torch.rand(R, 1, generator=g, dtype=torch.float64)
        if kind == "ragged" and t % 4 == 0:
            values.pop("p")                  # a key missing in some rounds
            values["late"] = torch.full((R,), float(t), dtype=torch.float64)
        rounds.append(values)
    return rounds


@pytest.mark.parametrize("kind", ["uniform", "mixed", "ragged"])
def test_the_log_equals_the_per_round_split(kind: str) -> None:
    """Same floats (types too), same key order, same steps; live buffers are copied when
    logged, not read at the end."""
    log = DiagnosticsLog(R)
    copies = []
    for t, values in enumerate(_rounds(kind)):
        log.add(t + 1, values)
        copies.append({k: v.clone() if isinstance(v, torch.Tensor) else v
                       for k, v in values.items()})
    got, want = log.per_run(), _reference(copies)
    assert log.steps == list(range(1, 31))
    assert [list(d) for d in got] == [list(d) for d in want]
    for a, b in zip(got, want, strict=True):
        for k in a:
            assert a[k] == b[k] and [type(x) for x in a[k]] == [type(x) for x in b[k]], k
    assert len({id(d["n"]) for d in got}) == R   # each run its own list


def test_an_empty_log_gives_empty_dicts() -> None:
    assert DiagnosticsLog(3).per_run() == [{}, {}, {}]


def test_kept_finite_flags_name_the_first_failing_round() -> None:
    """``flag_finite(kept=True)``: the tensors filed as they are, reduced at the fold — the same
    (check, run, first round) as the eager flags, across folds and with eager entries mixed in."""
    kept, eager = DeferredChecks(), DeferredChecks()
    g = torch.Generator().manual_seed(0)
    for t in range(150):
        x = torch.rand(R, 3, 2, generator=g, dtype=torch.float64)
        if t in (3, 70):
            x[1, 2, 0] = float("nan") if t == 3 else float("inf")
        if t == 70:
            x[3, 0, 1] = float("-inf")
        y = torch.rand(R, generator=g, dtype=torch.float64)
        if t == 100:
            y[2] = float("nan")
        for checks in (kept, eager):
            checks.round = t
            on = checks is kept
            checks.flag_finite("x", x, kept=on and t % 5 != 0)   # some eager entries mixed in
            checks.flag_finite("y", y, kept=on)
    assert sorted(kept.failures()) == sorted(eager.failures()) == [
        ("x", 1, 3), ("x", 3, 70), ("y", 2, 100)]


def test_kept_values_fold_beside_masks_and_scalars() -> None:
    """One label holding kept values, bool masks and a one-run scalar: the same failures."""
    checks = DeferredChecks()
    for t in range(5):
        checks.round = t
        checks.flag_finite("z", torch.tensor([1.0, float("nan") if t == 2 else 0.0]), kept=True)
        checks.flag("z", torch.tensor([t == 4, False]))
        checks.flag_finite("one", torch.tensor(float("inf") if t == 3 else 1.0), kept=True)
    assert sorted(checks.failures()) == [("one", 0, 3), ("z", 0, 4), ("z", 1, 2)]


class _NaNRoundChessboard(ChessboardEnv):
    """Chessboard whose candidates of run 2 hold a NaN at round 12 (in the chunk's tensor: the
    class keeps ``batch_round``, so the runner keeps them unreduced until the fold)."""

    def _chunk_candidates(self, ctx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cands, means, best = super()._chunk_candidates(ctx)
        if not hasattr(self, "_poisoned"):   # the first chunk starts at round 1
            self._poisoned = True
            cands = cands.clone()
            cands[11, 2, 4, 0] = float("nan")
        return cands, means, best


@pytest.mark.parametrize("sync_every", [0, 5])
def test_a_nan_candidate_of_a_fresh_round_is_named(sync_every: int) -> None:
    env = _NaNRoundChessboard()
    with pytest.raises(BatchCheckError, match=r"candidates must be finite: failed in run 2 "
                                              r"\(seed 7\) at round 12"):
        simulate_batch(make_policy("random", env), env, 40, [3, 5, 7], sync_every=sync_every)
