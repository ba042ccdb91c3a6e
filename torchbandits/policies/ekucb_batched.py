"""Batched mode of EK-UCB (Zenati et al. 2022, Algorithms 2 and 4): ``R`` runs, each with its own
KORS-grown dictionary, stepped together.

``reset(seed=[s_1, …, s_R])`` starts a batch: the ``R`` posteriors are one
:class:`~torchbandits.models.batched_nystrom.BatchedNystrom` and the ``R`` samplers one
:class:`~torchbandits.models.batched_kors.BatchedKORS`, dictionaries padded to a common capacity
(sizes ``[R]``; padded rows of the whitening factor and of the inverses are zero, so padded anchors
are exact no-ops). A round: ``select(candidates [R, A, d])`` scores all runs with one batched kernel
block and two batched products per chunk of runs — 16 runs sorted by dictionary size on the CPU, the
whole batch as one padded program on a GPU (:attr:`BatchedNystrom.CHUNK`); on the CPU in float64,
once a dictionary reaches :attr:`BatchedNystrom.COMPILED_MIN_WIDTH` anchors, one compiled per-run
kernel instead (:mod:`torchbandits.native.ekucb`) — (``LongTensor [R]``, first index on ties);
``update(x [R, d], reward [R])`` appends to every run, computes every run's
KORS probability, hands out the coins of the runs with ``p̃ < 1`` from their own streams
(:class:`RunCoins`, exactly the sequential draws) and grows the dictionaries of the accepted runs
that pass the ``min_residual`` guard. Run ``r`` plays what the sequential EK-UCB reset with
``seed=s_r`` plays.

**No host read inside a round** (a synchronisation on a GPU): the coins are drawn ahead on the host
and consumed by device counters; the growth is one masked border of every run (a run that does not
grow writes zeros into its zero padding; ``Q`` and KORS's ``N`` bordered by one rank-one update
each); the chunk widths are host-side upper bounds that grow by one per round, read exactly (with
the re-sort by dictionary size) once every :data:`CHECK_EVERY` rounds — the only read. On the CPU,
where a read is not a synchronisation, a round whose masked border would touch more than
:data:`CPU_COMPACT_ABOVE` entries compacts the growing runs with one read instead (the border costs
``O(n·M)`` per run, so only the few runs that grow pay it); ``policy.cpu_compact_above = None``
keeps every round read-free on the CPU too. Warm-up rounds beyond the first (``n_warmup > 1``)
rewind the coin streams with one read before their ``randint`` draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..batching import (
    RunDrawsAhead,
    check_batch_points,
    check_batch_rewards,
    check_batched_candidates,
)
from ..buffers import set_plain
from ..confidence import ConstantBeta
from ..models.batched_kors import BatchedKORS
from ..models.batched_nystrom import BatchedNystrom
from .batch_mode import BatchModeMixin

__all__ = ["CHECK_EVERY", "CPU_COMPACT_ABOVE", "RESORT_EVERY", "EKUCBBatchMixin", "RunCoins"]

#: rounds between two reads of the dictionary sizes in a sync-free batch (exact chunk widths,
#: and the storage order: runs sorted by dictionary size); in between, every width is an upper
#: bound that grows by one per round
CHECK_EVERY = 64
RESORT_EVERY = CHECK_EVERY

#: on the CPU, where reading a value is not a synchronisation, a round whose masked dictionary
#: growth would touch more than this many entries (``R·n·M``: the embeddings of every run)
#: compacts the accepting runs with one read instead (``None`` on the class attribute: never)
CPU_COMPACT_ABOVE = 1 << 15


def _coins(gen: torch.Generator, count: int) -> Tensor:
    """The next ``count`` coins of ``gen``: one ``torch.rand(count)`` (CPU ``rand`` fills element
    by element: the same numbers as ``count`` single draws)."""
    return torch.rand(count, generator=gen, dtype=torch.float64)


class RunCoins(RunDrawsAhead):
    """Per-run uniform coins for the KORS decisions, handed out on the device without a host
    read: run ``r``'s ``j``-th coin is its generator's ``j``-th ``torch.rand((), float64)``, the
    sequential EK-UCB's ``j``-th coin (it draws only where ``0 < p̃ < 1``). A
    :class:`~torchbandits.batching.RunDrawsAhead` of ``torch.rand`` draws (a run uses at most
    one coin per round).

    Args:
        generators: one ``torch.Generator`` per run (used from their current state).
        block: the least number of coins drawn per run at a refill (64).
        device: where the coins are handed out.
    """

    def __init__(self, generators: Sequence[torch.Generator], *, block: int = 64,
                 device: torch.device | str | None = None) -> None:
        super().__init__(generators, _coins, device=device, block=block)

    def draw(self, need: Tensor) -> Tensor:  # type: ignore[override]
        """Coins ``[R]`` (float64, on the device); a run's entry is its next coin where ``need``
        ``[R]`` (bool) is set, and is not consumed elsewhere. No host read."""
        return self.take(need)


class EKUCBBatchMixin(BatchModeMixin):
    """The batched branch of :class:`~torchbandits.policies.EKUCB` (module docstring); the
    single-run calls go to the next class of the MRO unchanged."""

    coins: RunCoins | None = None
    _batch_streams = "coins"
    #: see :data:`CPU_COMPACT_ABOVE` (``None``: every round sync-free, also on the CPU)
    cpu_compact_above: int | None = CPU_COMPACT_ABOVE
    _perm: Tensor | None = None
    _inv: Tensor | None = None

    # ---------------------------------------------------------------- eligibility
    def why_not_batched(self) -> str | None:
        """``None`` if this policy can step a batch of runs, else the reason."""
        from .ekucb import EKUCB
        if type(self) is not EKUCB:
            return f"{type(self).__name__} changes EKUCB's steps (runs sequentially)"
        if type(self.rule) is not ConstantBeta:  # type: ignore[attr-defined]
            return (f"{type(self.rule).__name__} has no batched width for EK-UCB (batched: a "  # type: ignore[attr-defined]
                    "constant β); EKUCB runs sequentially")
        if self.model.parametrisation != "whitened":  # type: ignore[attr-defined]
            return "the plain parametrisation runs sequentially (batched: whitened)"
        return None

    @property
    def batch_kors(self) -> BatchedKORS | None:
        """The ``R`` KORS samplers in batched mode (a submodule), else ``None``."""
        return self._modules.get("batched_kors")  # type: ignore[attr-defined]

    # ---------------------------------------------------------------- start / leave
    def _install_batch(self, gens: list[torch.Generator]) -> None:
        model, kors, r = self.model, self.kors, len(gens)  # type: ignore[attr-defined]
        opts = dict(dtype=self.dtype, device=self.device)  # type: ignore[attr-defined]
        self.batched = BatchedNystrom(model.kernel, model.lam, r, jitter=model.jitter,
                                      min_residual=model.min_residual, **opts)
        self.batched_kors = BatchedKORS(kors.mu, kors.eps, kors.gamma, kors.score, r, **opts)
        self.coins = RunCoins(gens, device=self.device)  # type: ignore[attr-defined]
        zeros = torch.zeros(r, **opts)  # type: ignore[arg-type]
        self._batch_stats = {"last_p": torch.full_like(zeros, float("nan")),
                             "sum_p": zeros.clone(), "sum_pq": zeros.clone()}
        self._set_order(None)

    def _apply(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        """``.to(device / dtype)``: the batch's state outside the submodules follows (the
        statistics, the run order, the coins' device)."""
        out = super()._apply(fn, *args, **kwargs)  # type: ignore[misc]
        if getattr(self, "coins", None) is not None:
            self.coins.move_to(self.device)  # type: ignore[attr-defined]
        if getattr(self, "_batch_stats", None):
            self._batch_stats = {k: fn(v) for k, v in self._batch_stats.items()}
        if getattr(self, "_perm", None) is not None:
            self._perm, self._inv = fn(self._perm), fn(self._inv)
        return out

    def named_buffers(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        """``nn.Module.named_buffers`` (and ``buffers``) with the batch posterior's deferred step
        of ``Q`` applied first (this traversal reads the submodules' buffers directly)."""
        model = self.batch_model
        if model is not None:
            model.apply_deferred()
        return super().named_buffers(*args, **kwargs)  # type: ignore[misc]

    # ---------------------------------------------------------------- run order
    def _set_order(self, perm: Tensor | None) -> None:
        """Storage order of the runs: slot ``i`` holds run ``perm[i]`` (``None``: identity).
        The batched state is kept sorted by dictionary size (re-sorted every
        :data:`RESORT_EVERY` rounds when that cuts the chunked work by 15 %), so that each chunk
        of :attr:`BatchedNystrom.CHUNK` runs works at its own width; inputs and outputs stay in
        run order."""
        if perm is not None:
            perm = perm.to(self.device)  # type: ignore[attr-defined]
        self._perm = perm
        self._inv = None if perm is None else torch.argsort(perm)

    def _to_slots(self, t: Tensor) -> Tensor:
        return t if self._perm is None else t[self._perm]

    def _to_runs(self, t: Tensor) -> Tensor:
        return t if self._inv is None else t[self._inv]

    def _compacts(self) -> bool:
        """Whether this round compacts the accepting runs with a host read (the CPU, past
        :attr:`cpu_compact_above` entries), else grows every dictionary with masked writes."""
        model = self.batch_model
        limit = self.cpu_compact_above
        return (limit is not None and model.device.type == "cpu"
                and model.n_runs * model.n * max(model.max_size, 1) > limit)

    def _all_have_anchors(self) -> bool:
        """Whether every run has an anchor, known on the host: after the first update, when a
        first point always passes the ``min_residual`` guard — a constant ``k(x, x) > 0`` and
        ``min_residual < 1`` (``ω = k + η > min_residual·k``, and its Schur complements
        ``e² + λ`` and ``k + μ`` are positive). Then no run takes the first point's ``p̃ = 1``,
        and the round needs no mask of the empty dictionaries."""
        model = self.batch_model
        const = model.kernel_constant
        return (model.max_size > 0 and const is not None and const > 0
                and model.min_residual < 1.0)

    def _check_sizes(self) -> None:
        """Every :data:`CHECK_EVERY` rounds (the only host read of a sync-free batch): exact
        widths, and the runs re-sorted by dictionary size when that cuts the chunked work by
        15 % — or, once the posterior scores by its compiled per-run products (which no order
        speeds up), put back in run order, so that no round gathers its inputs and outputs."""
        model, kors = self.batch_model, self.batch_kors
        assert model is not None and kors is not None
        if self.t % CHECK_EVERY != CHECK_EVERY - 1:  # type: ignore[attr-defined]
            return
        model.refresh_widths()
        if model.compiled_scores():   # per-run products: no order pays, so none (no gathers)
            if self._inv is not None:
                self._reorder(self._inv)
            return
        if model.n_runs <= model.CHUNK:
            return
        order = torch.argsort(model.sizes, descending=True, stable=True)
        if model.chunked_cost(order) >= 0.85 * model.chunked_cost():
            return
        self._reorder(order)

    def _reorder(self, order: Tensor) -> None:
        """Storage slot ``i`` takes the run of slot ``order[i]`` (posterior, KORS, statistics)."""
        model, kors = self.batch_model, self.batch_kors
        assert model is not None and kors is not None
        model.permute(order)
        kors.permute(order)
        self._batch_stats = {k: v[order] for k, v in self._batch_stats.items()}
        perm = order if self._perm is None else self._perm[order]
        identity = torch.arange(len(perm), device=perm.device)
        self._set_order(None if bool((perm == identity).all()) else perm)   # (a host read)

    def run_dictionary(self, run: int) -> Tensor:
        """Anchors of run ``run`` of the batch ``[m_r, d]``."""
        model = self.batch_model
        assert model is not None
        return model.dictionary(run if self._inv is None else int(self._inv[run]))

    def run_kors_probabilities(self, run: int) -> Tensor:
        """KORS acceptance probabilities ``p̃`` of run ``run``'s anchors ``[m_r]``."""
        kors = self.batch_kors
        assert kors is not None
        return kors.probabilities(run if self._inv is None else int(self._inv[run]))

    def _leave_batch(self) -> None:
        for name in ("batched", "batched_kors"):
            if name in self._modules:  # type: ignore[attr-defined]
                delattr(self, name)
        self.coins = None

    def _begin_batch(self, seeds: list[int], prepared: Any) -> None:
        self._install_batch([torch.Generator().manual_seed(s) for s in seeds])

    def _restart_batch(self) -> None:
        assert self.coins is not None
        self._install_batch(self.coins.sync())   # the runs' generators where they stand

    # ---------------------------------------------------------------- rounds
    def _check_batch(self, candidates: Any) -> Tensor:
        assert self.coins is not None
        return check_batched_candidates("candidates", candidates, self.coins.n_runs,
                                        dtype=self.dtype, device=self.device,  # type: ignore[attr-defined]
                                        dim=self.dim)  # type: ignore[attr-defined]

    def _batch_ucb(self, cand: Tensor) -> Tensor:
        """UCB ``[R, A]`` of checked candidates ``[R, A, d]``: ``μ̃ + β·sd`` (ridge sd
        ``= GP sd/√λ`` unless ``variance="gp"``)."""
        model, rule = self.batch_model, self.rule  # type: ignore[attr-defined]
        assert model is not None
        mean, var = model.score(self._to_slots(cand))
        scale = rule.beta / model.lam ** 0.5 if rule.variance == "ridge" else rule.beta
        return self._to_runs(mean.add_(var.sqrt_(), alpha=scale))

    def forward(self, candidates: Tensor) -> Tensor:
        """UCB ``[A]`` of candidates ``[A, d]``; in batched mode ``[R, A]`` of ``[R, A, d]``."""
        if self.coins is None:
            return super().forward(candidates)  # type: ignore[misc]
        return self._batch_ucb(self._check_batch(candidates))

    def select(self, candidates: Any) -> Any:
        """One index (single run), or a ``LongTensor [R]`` for candidates ``[R, A, d]``: each
        run's UCB argmax (first index on ties), uniform from its own stream in the warm-up."""
        coins = self.coins
        if coins is None:
            return super().select(candidates)  # type: ignore[misc]
        cand = self._check_batch(candidates)
        dev = self.device  # type: ignore[attr-defined]
        if self.t < self.n_warmup:  # type: ignore[attr-defined]
            index = self.warmup_index  # type: ignore[attr-defined]
            if index is None:
                draws = [torch.randint(cand.shape[1], (1,), generator=g) for g in coins.sync()]
                return torch.cat(draws).to(dev, non_blocking=True)
            if index >= cand.shape[1]:
                raise ValueError(f"warmup_index {index} is out of range for {cand.shape[1]} "
                                 f"candidates")
            return torch.full((cand.shape[0],), index, dtype=torch.long, device=dev)
        with torch.no_grad():
            return torch.argmax(self._batch_ucb(cand), dim=1)

    def update(self, x: Any, reward: Any) -> None:
        """Single run: as before. Batch: ``x [R, d]`` and ``reward [R]``, both checked before any
        run's state changes (``ValueError`` naming the argument); then the data update of every
        run, the KORS decisions (coins from each run's stream where ``0 < p̃ < 1``; a run's
        first point is its first anchor with ``p̃ = 1``), and the growth of the accepted runs."""
        coins = self.coins
        if coins is None:
            super().update(x, reward)  # type: ignore[misc]
            return
        model, kors = self.batch_model, self.batch_kors
        assert model is not None and kors is not None
        n = coins.n_runs
        opts = dict(dtype=self.dtype, device=self.device)  # type: ignore[attr-defined]
        xv = check_batch_points("x", x, n, dim=self.dim, **opts)  # type: ignore[attr-defined,arg-type]
        y = check_batch_rewards("reward", reward, n, **opts)  # type: ignore[arg-type]
        with torch.no_grad():
            xv, y = self._to_slots(xv), self._to_slots(y)    # storage order from here on
            first = None if self._all_have_anchors() else model.sizes == 0
            const = model.kernel_constant    # k(x, x) a float when constant: no tensor
            kss = const if const is not None else model.prior_variance(xv)
            chunks = model.chunks()
            # the played candidates' columns come from the last select's score
            kz, f, omega = model.append_scored(xv, y)
            p = kors.probability(kz, kss, chunks)
            if first is not None:
                p = torch.where(first, 1.0, p)
            need = p < 1.0                 # a first point has p̃ = 1: no coin, accepted
            coin = self._to_slots(coins.draw(self._to_runs(need))).to(p)
            # p̃ ≥ 1 or coin < p̃: every run's coin is its next draw in [0, 1) (consumed only
            # where p̃ < 1), so coin < p̃ holds wherever p̃ ≥ 1
            accept = coin < p
            stats = self._batch_stats
            stats["sum_p"].add_(p if first is None else p.masked_fill(first, 0.0))
            stats["sum_pq"].add_(p * (1.0 - p))   # 0 at a first point (p̃ = 1)
            stats["last_p"] = p
            if self._compacts():   # CPU: one read, only the runs that grow are bordered
                runs = model.guard(omega, accept).nonzero()[:, 0]
                if runs.numel():
                    added = model.add_last(f[runs], omega[runs], accept[runs], runs)
                    kors.add(kz[runs], kss if isinstance(kss, float) else kss[runs], p[runs],
                             added, runs=runs)
            else:                  # sync-free: every run, masked writes, KORS's border with it
                model.grow_masked(f, omega, accept, kors, kz, kss, p)
            self._check_sizes()
        set_plain(self, "dim", xv.shape[1])   # (plain attributes: past nn.Module's checks)
        set_plain(self, "t", self.t + 1)  # type: ignore[attr-defined]

    def batch_diagnostics(self) -> dict[str, Any]:
        """Per-run ``[R]`` tensors: dictionary size, KORS counters, refused anchors; ``n``, β."""
        model = self.batch_model
        assert model is not None
        st = {k: self._to_runs(v) for k, v in self._batch_stats.items()}
        dt = self.dtype  # type: ignore[attr-defined]
        return {"dict_size": self._to_runs(model.sizes).to(dt), "n": float(model.n),
                "kors_prob": st["last_p"], "kors_prob_sum": st["sum_p"],
                "kors_prob_var_sum": st["sum_pq"], "refused": self._to_runs(model.refused).to(dt),
                **self.rule.diagnostics()}  # type: ignore[attr-defined]

    # ---------------------------------------------------------------- state
    def batch_state(self) -> dict[str, Any] | None:
        """The batch's picklable state (generators, KORS counters), or ``None`` for one run."""
        if self.coins is None:
            return None
        return {"rng": [g.get_state() for g in self.coins.sync()],
                "stats": {k: v.detach().cpu().clone() for k, v in self._batch_stats.items()},
                "perm": None if self._perm is None else self._perm.cpu()}

    def load_batch_state(self, batch: dict[str, Any] | None) -> None:
        """Install an empty batch of the saved ``R`` (its buffers load right after: children
        load after their parent's extra state), or leave batched mode for ``None``."""
        self._leave_batch()
        if batch is None:
            return
        gens = [torch.Generator() for _ in batch["rng"]]
        for g, s in zip(gens, batch["rng"], strict=True):
            g.set_state(s)
        self._install_batch(gens)
        self._batch_stats = {k: v.to(dtype=self.dtype, device=self.device)  # type: ignore[attr-defined]
                             for k, v in batch["stats"].items()}
        self._set_order(batch.get("perm"))
