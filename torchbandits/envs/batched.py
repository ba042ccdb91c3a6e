"""``R`` independent copies of one environment as stacked tensors: :class:`BatchedEnv`.

Run ``r`` is the environment reset with ``seeds[r]``: its instance (function, fixed arms) is
built by that copy's own ``reset``, and its per-round randomness (fresh arm sets, contexts, noise)
comes from that copy's generators through :class:`~torchbandits.batching.RunStreams`, so run
``r`` sees exactly the candidates, means and rewards of a sequential run with seed ``seeds[r]``.

An environment class takes part by declaring

* ``batch_fields`` — the names of its per-run tensors, stacked into ``fields[name]`` ``[R, ...]``;
* ``batch_generators()`` — its per-round generators after ``reset`` (name → generator);
* ``batch_round(b)`` — candidates ``[R, A, d]`` and means ``[R, A]`` of round ``b.t`` (0-based
  rounds played) from ``b.fields`` and ``b.streams``;
* ``batch_noise(b, means)`` — the noise ``[R]`` (float64) added to the chosen means ``[R]``;
* ``why_not_batched()`` — ``None``, or why this configuration cannot be batched;
* optionally ``batch_fresh = True`` (in the class defining ``batch_round``) — its candidates
  and means are never written after ``batch_round`` returns them (fresh tensors, or views of
  chunks nobody writes), so the runner may keep them unreduced until it folds its finite checks
  (:attr:`BatchedEnv.fresh`);
* optionally ``batch_reset(seeds)`` — the whole batch's setup at once: ``(fields, generators)``,
  the stacked ``batch_fields`` ``[R, ...]`` on the device and, per generator name, the ``R``
  generators as ``reset`` leaves them. Each run's draws still come from its own CPU generators in
  the order of ``reset(seed)``, on the host; the tensors made from them are stacked there and moved
  to the device with one non-blocking copy per kind, and the kernel evaluations and
  normalisations run once over the batch (a few device operations per batch instead of ~10–50
  per run, and no blocking copy). No copy of the environment is made (:attr:`BatchedEnv.copies`
  builds them on first use); its ``repr`` must not depend on the seed, or it declares
  ``batch_repr(b, r)`` (run ``r``'s ``repr``). It is used only while no method it mirrors
  (``_BATCH_RESET_MIRRORS``) is overridden below its class; otherwise the copies are reset one
  by one.

:func:`why_not_batchable` also refuses a subclass that overrides the round logic (``reset``,
``pull``, ``candidates``, ``mean_rewards``, ``means_at``; ``_means_at`` for ``batch_means``) below
the class whose hooks it inherits.

A round reads nothing back to the host: the streams hand out draws already on the environment's
device (one non-blocking copy per chunk), the chosen means are a ``gather``, and inside
:func:`~torchbandits.batching.deferred_checks` (the runner's trusted path) the index check of
:meth:`BatchedEnv.pull` is a device flag (the index clamped into range until the runner reads it).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..batching import RunStreams, check_batch_index, check_seeds, to_device

__all__ = ["BatchedEnv", "gaussian_noise", "has_batch_reset", "is_batchable", "stack_to",
           "tensor_version", "why_not_batchable"]

_HOOKS = ("batch_fields", "batch_generators", "batch_round", "batch_noise", "why_not_batched")
#: hook → the methods whose override below the hook's class would make the hook stale
_ROUND_LOGIC = {"batch_round": ("reset", "pull", "candidates", "mean_rewards", "means_at"),
                "batch_means": ("_means_at",)}


#: the methods whose ``reset``-time draws and arithmetic ``batch_reset`` repeats
_BATCH_RESET_MIRRORS = ("reset", "_draw_context", "_build", "_means_at", "_draw")


def _defining_class(cls: type, name: str) -> type | None:
    return next((k for k in cls.__mro__ if name in vars(k)), None)


def _overridden_below(cls: type, hook: str, names: Sequence[str]) -> str | None:
    """The first of ``names`` that ``cls`` overrides below the class defining ``hook``."""
    home = _defining_class(cls, hook)
    for name in names if home is not None else ():
        owner = _defining_class(cls, name)
        if owner is not None and owner is not home and issubclass(owner, home):
            return name
    return None


def has_batch_reset(env: Any) -> bool:
    """Whether ``env``'s ``batch_reset`` can stand for its copies' ``reset`` (declared, and none
    of the methods it mirrors overridden below it)."""
    return (callable(getattr(env, "batch_reset", None))
            and _overridden_below(type(env), "batch_reset", _BATCH_RESET_MIRRORS) is None)


def why_not_batchable(env: Any) -> str | None:
    """``None`` if ``env`` can run as a :class:`BatchedEnv`, else the reason in one sentence."""
    cls = type(env)
    reason_fn = getattr(env, "why_not_batched", None)
    if reason_fn is not None:
        reason = reason_fn()
        if reason:
            return str(reason)
    missing = [h for h in _HOOKS if not hasattr(env, h)]
    if missing:
        return f"{cls.__name__} declares no batch hooks ({', '.join(missing)})"
    for hook, names in _ROUND_LOGIC.items():
        name = _overridden_below(cls, hook, names)
        if name is not None:
            home = _defining_class(cls, hook)
            assert home is not None
            return (f"{cls.__name__} overrides {name} below {home.__name__}, whose {hook} "
                    "it would inherit")
    return None


def is_batchable(env: Any) -> bool:
    """Whether ``env`` can run as a :class:`BatchedEnv` (see :func:`why_not_batchable`)."""
    return why_not_batchable(env) is None


def gaussian_noise(b: BatchedEnv, noise_std: float, dtype: torch.dtype,
                   stream: str = "noise") -> Tensor:
    """``N(0, noise_std²)`` noise ``[R]`` (float64) from each run's ``stream``: the draw of
    :func:`~torchbandits.envs.base.gaussian_reward` (one ``dtype`` scalar per run, scaled in
    double precision as there)."""
    def scaled(z: Tensor) -> tuple[Tensor]:   # a chunk [K, R] at once (elementwise)
        return (z.to(b.device, torch.float64) * noise_std,)

    return b.streams[stream].mapped(scaled, ("gaussian", noise_std, b.device), "normal",
                                    dtype=dtype)[0]


def stack_to(rows: Sequence[Tensor], device: torch.device) -> Tensor:
    """The host tensors ``rows`` (one per run) stacked ``[R, ...]`` on the host and moved to
    ``device`` with one copy (non-blocking from the CPU to CUDA)."""
    return to_device(torch.stack(list(rows)), device)


def tensor_version(t: Tensor) -> int | None:
    """``t``'s in-place write counter (``None`` for a tensor without one: an inference tensor)."""
    try:
        return t._version
    except RuntimeError:
        return None


def _versions(tensors: Sequence[Tensor]) -> list[int]:
    return [t._version for t in tensors]


def _reset_copies(env: Any, seeds: Sequence[int]) -> list[Any]:
    """``R`` deep copies of ``env``, copy ``r`` reset with ``seeds[r]``.

    A deep copy per run cost ~4 ms (a GPyTorch kernel module, tensors that ``reset`` replaces
    anyway), most of a large batch's setup. So the template's top-level modules and tensors are
    shared by the copies while each copy's ``reset`` runs; every tensor that ``reset`` did not
    rebind is then cloned (what a deep copy gives), modules stay shared (an environment's kernel
    is read-only). Version counters guard the sharing: if a ``reset`` wrote into a shared tensor
    in place, the template is restored and every copy is made by a full deep copy.
    """
    top = {k: v for k, v in vars(env).items() if isinstance(v, (Tensor, torch.nn.Module))}
    watched = [t for v in top.values() for t in ((v,) if isinstance(v, Tensor) else
                                                 (*v.parameters(), *v.buffers()))]
    before = _versions(watched)
    saved = [t.detach().clone() for t in watched]
    memo = {id(v): v for v in top.values()}
    copies = []
    for s in seeds:
        run = copy.deepcopy(env, dict(memo))
        run.reset(s)
        if _versions(watched) != before:   # an in-place write: undo, and copy fully
            with torch.no_grad():
                for t, old in zip(watched, saved, strict=True):
                    t.copy_(old)
            copies = []
            for s2 in seeds:
                full = copy.deepcopy(env)
                full.reset(s2)
                copies.append(full)
            return copies
        for k, v in top.items():
            if isinstance(v, Tensor) and getattr(run, k, None) is v:
                setattr(run, k, v.clone())
        copies.append(run)
    return copies


class BatchedEnv:
    """``R`` copies of ``env``, reset with ``seeds``, stepped together.

    Args:
        env: the template (left unchanged: the runs are deep copies of it).
        seeds: one seed per run (``R = len(seeds)``).
        chunk: rounds drawn at once by each run's generators.
        draw_threads: threads that draw a refill of the streams (:class:`RunStreams`; ``None``:
            its default, threads only for large batches of large draws).
        draw_ahead: the streams draw their next chunk on a background thread while a round
            uses the open one (``None``: on a GPU, for large generator calls); the
            same numbers either way. :meth:`close` stops it when the batch ends.

    ``candidates()`` is ``[R, A, d]``, ``mean_rewards()`` ``[R, A]``; ``pull(index [R])`` returns
    the rewards ``[R]`` (float64, as the sequential ``pull``'s Python floats) and the
    pseudo-regrets ``max_a μ_r(a) − μ_r(index_r)`` ``[R]`` (on the environment's device) and
    advances every run by one round.
    """

    def __init__(self, env: Any, seeds: Sequence[int], *, chunk: int = 64,
                 draw_threads: int | None = None, draw_ahead: bool | None = None) -> None:
        reason = why_not_batchable(env)
        if reason is not None:
            raise ValueError(f"{type(env).__name__} cannot be batched: {reason}")
        self.seeds = check_seeds(seeds)
        self.template = env
        self._copies: list[Any] | None = None
        self.fields: dict[str, Tensor]
        if has_batch_reset(env):
            self.fields, by_name = env.batch_reset(self.seeds)
        else:
            self._copies = _reset_copies(env, self.seeds)
            self.fields = {name: torch.stack([getattr(c, name) for c in self._copies])
                           for name in env.batch_fields}
            gens = [c.batch_generators() for c in self._copies]
            by_name = {name: [g[name] for g in gens] for name in gens[0]}
        self.streams = {name: RunStreams(g, chunk=chunk, device=self.device,
                                         draw_threads=draw_threads, draw_ahead=draw_ahead)
                        for name, g in by_name.items()}
        self.t = 0
        self._cands, self._means = env.batch_round(self)

    @property
    def copies(self) -> list[Any]:
        """Run ``r``'s environment as its ``reset(seeds[r])`` leaves it (copies of the template;
        made on first use when ``batch_reset`` set the batch up)."""
        if self._copies is None:
            self._copies = _reset_copies(self.template, self.seeds)
        return self._copies

    @property
    def fresh(self) -> bool:
        """Whether the class defining the template's ``batch_round`` declares ``batch_fresh``
        (this round's candidates are never written afterwards; not for a ``batch_round`` set on
        the instance)."""
        home = _defining_class(type(self.template), "batch_round")
        return (home is not None and bool(vars(home).get("batch_fresh", False))
                and "batch_round" not in vars(self.template))

    # ------------------------------------------------------------------ shape and place
    @property
    def n_runs(self) -> int:
        """``R``, the number of runs (one per seed)."""
        return len(self.seeds)

    @property
    def device(self) -> torch.device:
        """Device of the template environment (CPU when it names none)."""
        return torch.device(getattr(self.template, "device", "cpu"))

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the template environment (float64 when it names none)."""
        return getattr(self.template, "dtype", torch.float64)

    # ------------------------------------------------------------------ the batched contract
    def candidates(self) -> Tensor:
        """This round's candidates of every run ``[R, A, d]``."""
        return self._cands

    def mean_rewards(self) -> Tensor:
        """Noiseless means of this round's candidates ``[R, A]``."""
        return self._means

    def pull(self, index: Any) -> tuple[Tensor, Tensor]:
        """Rewards ``[R]`` and pseudo-regrets ``[R]`` of candidates ``index`` ``[R]``; every run
        moves to its next round. A bad ``index`` raises before anything is drawn."""
        idx = check_batch_index("index", index, self.n_runs, self._means.shape[1],
                                self._means.device)
        chosen = self._means.gather(1, idx[:, None])[:, 0]
        regret = self._best_means() - chosen
        reward = chosen.to(torch.float64) + self.template.batch_noise(self, chosen)
        self.t += 1
        self._cands, self._means = self.template.batch_round(self)
        return reward, regret

    def keep_best(self, means: Tensor, best: Tensor) -> None:
        """For ``batch_round``: ``best`` ``[R]`` is ``max_a`` of ``means`` ``[R, A]`` (made with
        them, e.g. once per chunk), so :meth:`pull` reads it instead of reducing the means."""
        self._best = (means, tensor_version(means), best)

    def _best_means(self) -> Tensor:
        """``max_a`` of this round's means ``[R]``, kept while the means are the same unchanged
        tensor (a fixed arm set: one reduction per batch instead of one per round)."""
        means, kept = self._means, getattr(self, "_best", None)
        version = tensor_version(means)
        if kept is None or kept[0] is not means or version is None or kept[1] != version:
            kept = self._best = (means, version, means.max(dim=1).values)
        return kept[2]

    def close(self) -> None:
        """Stop the streams' chunks being drawn ahead (:meth:`RunStreams.cancel_ahead`): at the
        end of a batch, so that no background draw outlives it."""
        for stream in self.streams.values():
            stream.cancel_ahead()

    def run_repr(self, r: int) -> str:
        """``repr`` of run ``r``'s environment (what the sequential runner records; the
        template's, or its ``batch_repr(self, r)``, when ``batch_reset`` set the batch up)."""
        if self._copies is not None:
            return repr(self._copies[r])
        hook = getattr(self.template, "batch_repr", None)   # a repr that depends on the draws
        return repr(self.template) if hook is None else hook(self, r)

    def __repr__(self) -> str:
        return f"BatchedEnv({self.template!r}, R={self.n_runs})"
