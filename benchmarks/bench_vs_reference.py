"""Our step against a numpy re-statement of the authors' per-step loop, side by side, one thread.

Two families, where the authors' code is a plain numpy loop (Flynn & Reeb 2024; Calandriello et
al. 2019) and a step is bound by call overhead rather than arithmetic at the papers' sizes:

* **Closed-form bounds** (Flynn & Reeb 2024, §7: Matérn-5/2, ℓ = 0.5, d = 3, 100 fresh
  candidates per step, ``c = T^{−d/(2d+2ν)}`` with T = 1000, σ = 0.1, B = 10, δ = 0.01). The
  re-statement keeps ``(K + αI)⁻¹`` by the bordered (Schur-complement) update and
  ``log det(I + K/α)`` by its increment, one pair per regulariser, and scores a candidate set by
  ``μ = k_Sᵀ (K+αI)⁻¹ y``, ``ρ² = k(x,x) − k_Sᵀ (K+αI)⁻¹ k_S``:

  - AMM: ``μ_{α₀} + sqrt(c log det(I + K/α₀) + 2c log(1/δ) + B²) ρ_{α₀}``, α₀ = σ²/c (§6.2);
  - AY: ``μ_{α₀} + (sqrt(c log det(I + K/α₀) + 2c log(1/δ)) + B) ρ_{α₀}`` (Abbasi-Yadkori 2013);
  - IGP: ``μ_{1+η} + (B + σ sqrt(log det(I + K/(1+η)) + 2 + 2 log(1/δ))) ρ_{1+η}``, η = 2/T
    (Chowdhury & Gopalan 2017, Thm 2);
  - DMM: the smallest over the grid α ∈ α₀·{0.1, 0.3, 1, 3, 10} of
    ``μ_α + sqrt(R̃²_α/α) ρ_α`` with ``R̃²_α = R² + αB² − α yᵀ(K+αI)⁻¹y`` and
    ``R² = α₀ yᵀ(K+α₀I)⁻¹y + σ² log det(I + K/α₀) + 2σ² log(1/δ)`` (Eq. 8, Cor. 4.3).

* **BKB** (Calandriello et al. 2019, Alg. 1 with the practical choices of §3.2): A = 1000 fixed
  arms in [0, 1]², RBF ℓ = 0.5, λ = ξ² = 0.01, counts and reward sums per arm; each round the
  re-statement embeds all arms against the dictionary (``eigh`` of ``K_D``, ``Z = K_AD U Ω^{-1/2}``),
  forms ``V = Zᵀ diag(n) Z + λI``, scores every arm (``μ̃ = Z V⁻¹ Zᵀ b``,
  ``σ̃² = (k − ‖z‖²)/λ + ‖L⁻¹z‖²``), plays the argmax of ``μ̃ + β̃ σ̃`` with the released code's
  ``β̃ = √λ F + ξ sqrt(log t Σ n_a σ̃²_a + log(1/δ))``, then resamples the dictionary with the
  released code's probabilities ``min(1, n_a q̄ σ̃²_a)``. Ours is ``BKB(beta_rule="authors_code",
  sampler="linearized")`` on the same arms; its round runs in the compiled kernel
  (``torchbandits.native.bkb``: the same BLAS/LAPACK calls as the torch path, the same bits)
  unless ``TORCHBANDITS_NATIVE=0`` (the torch path, for a before/after comparison).

Ours, on the CPU in float64, steps through the fused step of the exact model
(``torchbandits.models.exact_fused``: one compiled call per ``select``, one per ``update``).
Both sides are fed the same data first (untimed), then each timed step (``select`` + ``update``)
alternates ours / reference on the same fresh candidates; for the bounds, when the compiled step
is available, a second alternation on the same candidates times ours on its torch path
(``torchbandits.native`` off) against a copy of the reference, so each ratio comes from two runners
stepping in turn with nothing between them; process CPU time, medians. Before the
timing, the UCB vectors of the two sides on the same data are compared (max abs difference): the
re-statement computes what ours computes.

    python benchmarks/bench_vs_reference.py [--ts 50 100 200 1000] [--repeats 30] [--out DIR]
    python benchmarks/bench_vs_reference.py --methods bkb --bkb-horizon 1000   # BKB only
    python benchmarks/bench_vs_reference.py --quick       # small sizes (run by the tests)
    python benchmarks/bench_vs_reference.py --batched 64  # AMM, IGP, DMM: R = 64 runs batched,
        # per run-step, against the re-statement's step (t = 50, 100, 200; bounds_batched)
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from torchbandits import native  # noqa: E402
from torchbandits.confidence import KernelUCBTheoryBeta  # noqa: E402
from torchbandits.confidence.mixture import DMM_GRID, default_c  # noqa: E402
from torchbandits.envs.rkhs import RKHSFunctionEnv  # noqa: E402
from torchbandits.kernels import make_kernel  # noqa: E402
from torchbandits.policies import AMMUCB, AYGPUCB, BKB, DMMUCB, GPUCB, IGPUCB, KernelUCB  # noqa: E402

SIGMA, NORM, DELTA, HORIZON, DIM, ELL = 0.1, 10.0, 0.01, 1000, 3, 0.5


# ----------------------------------------------------------------------------- numpy kernels
def matern52(a: np.ndarray, b: np.ndarray, ell: float) -> np.ndarray:
    """``(1 + √5 r/ℓ + 5r²/(3ℓ²)) exp(−√5 r/ℓ)``, ``[n, m]``."""
    r = np.sqrt(np.maximum(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1), 0.0)) * (math.sqrt(5.0) / ell)
    return (1.0 + r + r * r / 3.0) * np.exp(-r)


def rbf(a: np.ndarray, b: np.ndarray, ell: float) -> np.ndarray:
    """``exp(−‖a − b‖²/(2ℓ²))``, ``[n, m]``."""
    return np.exp(-((a[:, None, :] - b[None, :, :]) ** 2).sum(-1) / (2.0 * ell * ell))


# ----------------------------------------------------------------------------- bound loop
class RegularisedInverse:
    """``(K + αI)⁻¹``, ``(K + αI)⁻¹y`` and ``log det(I + K/α)`` grown by one point a step."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.inv = np.zeros((0, 0))
        self.logdet = 0.0

    def append(self, kcol: np.ndarray, kxx: float) -> None:
        """Bordered inverse: ``s = k + α − bᵀ(K+αI)⁻¹b`` and the block update."""
        u = self.inv @ kcol
        s = kxx + self.alpha - kcol @ u
        n = self.inv.shape[0]
        new = np.empty((n + 1, n + 1))
        new[:n, :n] = self.inv + np.outer(u, u) / s
        new[:n, n] = new[n, :n] = -u / s
        new[n, n] = 1.0 / s
        self.inv = new
        self.logdet += math.log(s / self.alpha)


class ReferenceBound:
    """The per-step loop of a closed-form bound: one :class:`RegularisedInverse` per α."""

    def __init__(self, method: str, c: float) -> None:
        self.method, self.c = method, c
        self.a0 = SIGMA**2 / c
        alphas = {"AMM": [self.a0], "AY": [self.a0], "IGP": [1.0 + 2.0 / HORIZON],
                  "CONST": [self.a0], "KUCB": [_BOUNDS_KUCB_LAM],
                  "DMM": sorted({self.a0, *(g * self.a0 for g in DMM_GRID)})}[method]
        self.inv = {a: RegularisedInverse(a) for a in alphas}
        self.x = np.zeros((0, DIM))
        self.y = np.zeros(0)

    def ucb(self, cand: np.ndarray) -> np.ndarray:
        ks = matern52(self.x, cand, ELL)                       # [n, A]
        out = []
        log1d = math.log(1.0 / DELTA)
        if self.method == "DMM":
            r0 = self.inv[self.a0]
            r2 = (self.a0 * self.y @ r0.inv @ self.y + SIGMA**2 * r0.logdet + 2 * SIGMA**2 * log1d)
        for a, r in self.inv.items():
            if self.method == "DMM" and a not in [g * self.a0 for g in DMM_GRID]:
                continue
            w = r.inv @ ks
            mu = w.T @ self.y
            rho = np.sqrt(np.maximum(1.0 - (ks * w).sum(0), 0.0))
            if self.method == "AMM":
                beta = math.sqrt(self.c * r.logdet + 2 * self.c * log1d + NORM**2)
            elif self.method == "AY":
                beta = math.sqrt(self.c * r.logdet + 2 * self.c * log1d) + NORM
            elif self.method == "IGP":
                beta = NORM + SIGMA * math.sqrt(r.logdet + 2.0 + 2.0 * log1d)
            elif self.method == "CONST":
                beta = _BOUNDS_CONST_BETA
            elif self.method == "KUCB":  # Zenati et al. 2022, Lemma 3.1, on the ridge sd ρ/√λ
                beta = (math.sqrt(a) * NORM + SIGMA * math.sqrt(2.0 * log1d + r.logdet)) / math.sqrt(a)
            else:
                rt2 = max(r2 + a * NORM**2 - a * self.y @ r.inv @ self.y, 0.0)
                beta = math.sqrt(rt2 / a)
            out.append(mu + beta * rho)
        return np.min(out, axis=0)

    def update(self, x: np.ndarray, y: float) -> None:
        kcol = matern52(self.x, x[None], ELL)[:, 0]
        for r in self.inv.values():
            r.append(kcol, 1.0)
        self.x = np.vstack([self.x, x])
        self.y = np.append(self.y, y)

    def step(self, cand: np.ndarray, means: np.ndarray) -> int:
        """Play the argmax of the UCBs on ``cand`` ``[A, d]``, observe its mean; its index."""
        i = int(np.argmax(self.ucb(cand)))
        self.update(cand[i], float(means[i]))
        return i


_BOUNDS_CONST_BETA = 2.0   # constant β on the GP sd at λ = σ²/c
_BOUNDS_KUCB_LAM = 1.0     # K-UCB's ridge λ (theory radius of Zenati et al. 2022, Lemma 3.1)


def our_bound(method: str, c: float):
    k = make_kernel("matern52", ELL)
    kw = dict(noise_std=SIGMA, norm_bound=NORM, delta=DELTA)
    return {"AMM": lambda: AMMUCB(k, c=c, **kw), "AY": lambda: AYGPUCB(k, c=c, **kw),
            "IGP": lambda: IGPUCB(k, eta=2.0 / HORIZON, **kw), "DMM": lambda: DMMUCB(k, c=c, **kw),
            "CONST": lambda: GPUCB(k, lam=SIGMA**2 / c, beta=_BOUNDS_CONST_BETA),
            "KUCB": lambda: KernelUCB(k, lam=_BOUNDS_KUCB_LAM, beta=KernelUCBTheoryBeta(
                NORM, delta=DELTA, noise_scale=SIGMA))}[method]()


class _OpCounter(TorchDispatchMode):
    """Counts the ATen operations dispatched while active (``ops``) and, among them, the host
    syncs: scalar reads to Python (``_local_scalar_dense``: ``item``/``int``/``float``/``bool``),
    exact tensor comparisons (``equal``) and data-dependent shapes (``nonzero``)."""

    SYNCS = ("_local_scalar_dense", "equal", "nonzero")

    def __init__(self) -> None:
        super().__init__()
        self.ops = self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops += 1
        self.syncs += func.overloadpacket.__name__ in self.SYNCS
        return func(*args, **(kwargs or {}))


def step_ops(policy, cand: torch.Tensor, means: torch.Tensor) -> tuple[int, int]:
    """ATen operations of one ``select`` and of the ``update`` of its choice (a step of the run)."""
    with _OpCounter() as sel:
        i = policy.select(cand)
    row, mean = cand[i], means[i]
    with _OpCounter() as upd:
        policy.update(row, mean)
    return sel.ops, upd.ops


def _alternate(ours, ref: ReferenceBound, cands: list[torch.Tensor], env: RKHSFunctionEnv,
               context=contextlib.nullcontext) -> tuple[list[float], list[float]]:
    """Process CPU seconds of ``ours`` (a policy: ``select`` + ``update``, inside ``context()``)
    and of ``ref`` stepping on the same candidates, alternating step by step."""
    t_ours, t_ref = [], []
    for cand in cands:
        means = env.f(cand)
        with context():
            t0 = time.process_time()
            i = ours.select(cand)
            ours.update(cand[i], means[i])
            t_ours.append(time.process_time() - t0)
        cn, mn = cand.numpy(), means.numpy()
        t0 = time.process_time()
        ref.step(cn, mn)
        t_ref.append(time.process_time() - t0)
    return t_ours, t_ref


def bounds(ts: list[int], repeats: int, methods: list[str]) -> list[dict]:
    c = default_c("matern52", DIM, HORIZON)
    env = RKHSFunctionEnv("matern52", dim=DIM, lengthscale=ELL, noise_std=SIGMA)
    env.reset(0)
    rows = []
    for t in ts:
        gen = torch.Generator().manual_seed(t)
        x = torch.rand(t - 1, DIM, generator=gen, dtype=torch.float64)
        y = env.f(x) + SIGMA * torch.randn(t - 1, generator=gen, dtype=torch.float64)
        cands = [torch.rand(100, DIM, generator=gen, dtype=torch.float64) for _ in range(repeats + 1)]
        for m in methods:
            ours, ref = our_bound(m, c), ReferenceBound(m, c)
            # the same policy on its torch path (torchbandits.native off), timed in the same
            # alternation when the compiled step is available (else it is the same path)
            twin = our_bound(m, c) if native.library("exact_step") is not None else None
            for pol in (ours, twin):
                if pol is not None:
                    pol.reset(seed=0)
            for xi, yi in zip(x, y):
                ours.update(xi, float(yi))
                if twin is not None:
                    with native.disabled():
                        twin.update(xi, float(yi))
                ref.update(xi.numpy(), float(yi))
            err = float(np.abs(ours(cands[0]).numpy() - ref.ucb(cands[0].numpy())).max())
            # two A/B alternations on copies fed the same data: ours against the reference,
            # then (when the compiled step exists) the torch path against the reference, so that
            # no third runner sits between the two steps being compared
            twin_ref = copy.deepcopy(ref)
            t_ours, t_ref = _alternate(ours, ref, cands[1:], env)
            t_twin, t_ref2 = _alternate(twin, twin_ref, cands[1:], env, native.disabled) \
                if twin is not None else ([], [])
            a, b = statistics.median(t_ours) * 1e3, statistics.median(t_ref) * 1e3
            ops = step_ops(ours, cands[0], env.f(cands[0]))  # after the timing (it takes a step)
            row = {"family": "bound", "method": m, "t": t, "ours_ms": a, "reference_ms": b,
                   "speedup": b / a, "max_abs_ucb_diff": err, "ops_select": ops[0],
                   "ops_update": ops[1]}
            extra = ""
            if twin is not None:
                with native.disabled():
                    ops_t = step_ops(twin, cands[0], env.f(cands[0]))
                tt, b2 = statistics.median(t_twin) * 1e3, statistics.median(t_ref2) * 1e3
                row.update(torch_path_ms=tt, torch_path_speedup=b2 / tt,
                           torch_path_ops=ops_t[0] + ops_t[1])
                extra = f"; torch path {tt:.3f} ms, ×{b2 / tt:.2f}, {ops_t[0]} + {ops_t[1]} ops"
            rows.append(row)
            print(f"{m:4s} t={t:5d}: ours {a:.3f} ms, reference {b:.3f} ms, ×{b / a:.2f} "
                  f"(UCBs {err:.1e} apart; {ops[0]} + {ops[1]} torch ops per select + update"
                  f"{extra})", flush=True)
    return rows


def bounds_batched(ts: list[int], repeats: int, methods: list[str], n_runs: int) -> list[dict]:
    """Per run-step time of ``n_runs`` runs batched (``policy.reset(seed=[0..R−1])``; ``select``
    on candidates ``[R, 100, d]``, ``update`` with the ``R`` chosen rows: the batched API
    ``simulate_batch`` drives) against the re-statement's step on run 0's candidates, alternating
    step by step, process CPU time, medians. Each run and the re-statement are first fed
    ``t − 1 − repeats//2`` points (untimed; run 0 and the re-statement the same ones), so the
    ``repeats`` timed steps sit at ``t − repeats//2 … t + repeats//2`` around ``t``. Checked: run
    0's UCBs against the re-statement's (max abs difference) and its actions (the same arm)."""
    c = default_c("matern52", DIM, HORIZON)
    env = RKHSFunctionEnv("matern52", dim=DIM, lengthscale=ELL, noise_std=SIGMA)
    env.reset(0)
    rows, runs = [], torch.arange(n_runs)
    for t in ts:
        gen = torch.Generator().manual_seed(t)
        n0 = max(t - 1 - repeats // 2, 0)
        x = torch.rand(n_runs, n0, DIM, generator=gen, dtype=torch.float64)
        y = env.f(x) + SIGMA * torch.randn(n_runs, n0, generator=gen, dtype=torch.float64)
        cands = [torch.rand(n_runs, 100, DIM, generator=gen, dtype=torch.float64)
                 for _ in range(repeats + 1)]
        for m in methods:
            batch, ref = our_bound(m, c), ReferenceBound(m, c)
            batch.reset(seed=list(range(n_runs)))
            for i in range(n0):
                batch.update(x[:, i], y[:, i])
                ref.update(x[0, i].numpy(), float(y[0, i]))
            err = float(np.abs(batch(cands[0])[0].numpy() - ref.ucb(cands[0][0].numpy())).max())
            t_batch, t_ref, same = [], [], True
            for cand in cands[1:]:
                means = env.f(cand)
                t0 = time.process_time()
                idx = batch.select(cand)
                batch.update(cand[runs, idx], means[runs, idx])
                t_batch.append((time.process_time() - t0) / n_runs)
                cn, mn = cand[0].numpy(), means[0].numpy()
                t0 = time.process_time()
                i_ref = ref.step(cn, mn)
                t_ref.append(time.process_time() - t0)
                same = same and i_ref == int(idx[0])
            a, b = statistics.median(t_batch) * 1e3, statistics.median(t_ref) * 1e3
            rows.append({"family": "bound-batched", "method": m, "t": t, "R": n_runs,
                         "ours_ms": a, "reference_ms": b, "speedup": b / a,
                         "max_abs_ucb_diff": err, "same_actions": same})
            print(f"{m:4s} t={t:5d} R={n_runs}: batched {a:.4f} ms per run-step, re-statement "
                  f"{b:.3f} ms, ×{b / a:.2f} (run 0: UCBs {err:.1e} apart, "
                  f"{'same' if same else 'DIFFERENT'} actions)", flush=True)
    return rows


def markdown_batched(rows: list[dict]) -> str:
    """Markdown table of :func:`bounds_batched` rows."""
    lines = ["| method | t | R | batched ms / run-step | re-statement ms / step | ratio | "
             "UCB max abs diff |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['t']} | {r['R']} | {r['ours_ms']:.4f} | "
                     f"{r['reference_ms']:.3f} | ×{r['speedup']:.1f} | {r['max_abs_ucb_diff']:.1e} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- BKB loop
class ReferenceBKB:
    """Calandriello et al. (2019), Alg. 1 as released: per-round rebuild from counts."""

    def __init__(self, arms: np.ndarray, ell: float, lam: float, qbar: float, norm: float,
                 xi: float, delta: float, seed: int) -> None:
        self.arms, self.ell, self.lam, self.qbar = arms, ell, lam, qbar
        self.norm, self.xi, self.delta = norm, xi, delta
        self.n = np.zeros(len(arms))
        self.b = np.zeros(len(arms))
        self.dict = np.zeros(0, dtype=int)
        self.rng = np.random.default_rng(seed)
        self.var = np.ones(len(arms)) / lam

    def posterior(self) -> tuple[np.ndarray, np.ndarray]:
        if self.dict.size == 0:
            return np.zeros(len(self.arms)), np.ones(len(self.arms)) / self.lam
        kd = rbf(self.arms[self.dict], self.arms[self.dict], self.ell)
        om, u = np.linalg.eigh(kd)
        keep = om > len(om) * np.finfo(float).eps * om.max()
        z = rbf(self.arms, self.arms[self.dict], self.ell) @ (u[:, keep] / np.sqrt(om[keep]))
        p = self.n > 0
        v = (z[p].T * self.n[p]) @ z[p] + self.lam * np.eye(z.shape[1])
        chol = np.linalg.cholesky(v)
        w = np.linalg.solve(v, z[p].T @ self.b[p])
        mu = z @ w
        lz = np.linalg.solve(chol, z.T)
        var = np.maximum(1.0 - (z * z).sum(1), 0.0) / self.lam + (lz * lz).sum(0)
        return mu, var

    def step(self, means: np.ndarray, noise: float) -> None:
        mu, var = self.posterior()
        t = max(self.n.sum(), 1.0)
        beta = math.sqrt(self.lam) * self.norm + self.xi * math.sqrt(
            max(math.log(t), 0.0) * (self.n * var).sum() + math.log(1.0 / self.delta))
        a = int(np.argmax(mu + beta * np.sqrt(var)))
        self.n[a] += 1
        self.b[a] += means[a] + noise
        pulled = np.flatnonzero(self.n)
        prob = np.minimum(1.0, self.n[pulled] * self.qbar * var[pulled])
        self.dict = pulled[self.rng.random(len(pulled)) < prob]


def bkb(horizon: int, n_arms: int, checkpoints: list[int], qbars: list[float], seed: int = 0) -> list[dict]:
    from torchbandits.native import bkb as native_bkb  # whether the compiled round runs
    rows = []
    ell, lam, xi, norm = 0.5, 0.01, 0.1, 1.0
    for qbar in qbars:
        env = RKHSFunctionEnv("rbf", dim=2, lengthscale=ell, n_arms=n_arms, fixed_arms=True,
                              noise_std=xi, norm=norm)
        env.reset(seed)
        cand = env.candidates()
        means = env.mean_rewards()
        ours = BKB(make_kernel("rbf", ell), lam, noise_std=xi, norm_bound=norm, qbar=qbar,
                   beta_rule="authors_code", sampler="linearized", seed=seed)
        ref = ReferenceBKB(cand.numpy(), ell, lam, qbar, norm, xi, 0.1, seed)
        gen = torch.Generator().manual_seed(seed)
        t_ours: dict[int, list[float]] = {c: [] for c in checkpoints}
        t_ref: dict[int, list[float]] = {c: [] for c in checkpoints}
        counts: dict[int, tuple[int, int]] = {}
        mn = means.numpy()
        for t in range(1, horizon + 1):
            noise = float(xi * torch.randn((), generator=gen, dtype=torch.float64))
            count_at = [c for c in checkpoints if t == c - max(c // 10, 1)]  # just before the window
            if count_at:
                with _OpCounter() as oc:
                    i = ours.select(cand)
                    ours.update(cand[i], means[i] + noise)
                counts[count_at[0]] = (oc.ops, oc.syncs)
                ref.step(mn, noise)
                continue
            t0 = time.process_time()
            i = ours.select(cand)
            ours.update(cand[i], means[i] + noise)
            d_ours = time.process_time() - t0
            t0 = time.process_time()
            ref.step(mn, noise)
            d_ref = time.process_time() - t0
            for c in checkpoints:
                if c - max(c // 10, 1) < t <= c:
                    t_ours[c].append(d_ours)
                    t_ref[c].append(d_ref)
        for c in checkpoints:
            a, b = statistics.median(t_ours[c]) * 1e3, statistics.median(t_ref[c]) * 1e3
            ops, syncs = counts.get(c, (-1, -1))
            compiled = native_bkb.available()  # the compiled round (else the torch path)
            rows.append({"family": "bkb", "method": f"BKB q̄={qbar:g}", "t": c, "ours_ms": a,
                         "reference_ms": b, "speedup": b / a, "torch_ops": ops, "host_syncs": syncs,
                         "dictionary": ours.diagnostics().get("dictionary_size", float("nan")),
                         "native": compiled})
            print(f"BKB q̄={qbar:g} t={c:5d}: ours {a:.3f} ms, reference {b:.3f} ms, ×{b / a:.2f} "
                  f"(ours: {ops} torch ops, {syncs} host syncs in round {c - max(c // 10, 1)}; "
                  f"{'compiled' if compiled else 'torch'} round)", flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| method | t | ours (ms/step) | reference (ms/step) | ours ahead by | UCB max abs diff |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        diff = f"{r['max_abs_ucb_diff']:.1e}" if "max_abs_ucb_diff" in r else "—"
        lines.append(f"| {r['method']} | {r['t']} | {r['ours_ms']:.3f} | {r['reference_ms']:.3f} | "
                     f"×{r['speedup']:.2f} | {diff} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="t ∈ {20, 40}, 5 repeats, BKB A = 100, T = 60")
    ap.add_argument("--ts", type=int, nargs="+", default=None,
                    help="50 100 200 1000 (50 100 200 with --batched)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--methods", nargs="+", default=None,
                    help="AMM AY IGP DMM BKB (AMM IGP DMM with --batched); any of AMM AY IGP "
                         "DMM CONST KUCB (the bound family) and BKB (case-insensitive)")
    ap.add_argument("--bkb-horizon", type=int, default=2000)
    ap.add_argument("--bkb-arms", type=int, default=1000)
    ap.add_argument("--qbar", type=float, nargs="+", default=[1.0, 5.0])
    ap.add_argument("--batched", type=int, default=None, metavar="R",
                    help="the bounds' policies with R runs batched (per run-step) against the "
                         "re-statement; methods AMM IGP DMM and t ∈ {50, 100, 200} unless given")
    ap.add_argument("--out", type=Path, default=Path("results/bench_vs_reference"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    batched = args.batched is not None
    if batched and args.batched < 1:
        raise SystemExit(f"--batched takes R ≥ 1, got {args.batched}")
    args.ts = args.ts or ([50, 100, 200] if batched else [50, 100, 200, 1000])
    args.methods = args.methods or (["AMM", "IGP", "DMM"] if batched else
                                    ["AMM", "AY", "IGP", "DMM", "BKB"])
    if args.quick:
        args.ts, args.repeats, args.bkb_horizon, args.bkb_arms = [20, 40], 5, 60, 100
    methods = [m.upper() for m in args.methods]
    bound_methods = [m for m in methods if m != "BKB"]
    rows = (bounds_batched(args.ts, args.repeats, bound_methods, args.batched) if batched
            else bounds(args.ts, args.repeats, bound_methods))
    if "BKB" in methods:
        checkpoints = sorted({c for c in (500, 1000, 2000) if c <= args.bkb_horizon} or {args.bkb_horizon})
        rows += bkb(args.bkb_horizon, args.bkb_arms, checkpoints, args.qbar)
    args.out.mkdir(parents=True, exist_ok=True)
    in_batch = [r for r in rows if r["family"] == "bound-batched"]
    others = [r for r in rows if r["family"] != "bound-batched"]
    table = "\n\n".join(([markdown(others)] if others else [])
                         + ([markdown_batched(in_batch)] if in_batch else []))
    tmp = args.out / "bench.json.tmp"
    tmp.write_text(json.dumps({"rows": rows, "threads": 1, "clock": "process_time"}, indent=1))
    tmp.replace(args.out / "bench.json")
    (args.out / "bench.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
