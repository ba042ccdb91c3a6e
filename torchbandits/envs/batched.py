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
* ``why_not_batched()`` — ``None``, or why this configuration cannot be batched.

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

from ..batching import RunStreams, check_batch_index, check_seeds

__all__ = ["BatchedEnv", "gaussian_noise", "is_batchable", "why_not_batchable"]

_HOOKS = ("batch_fields", "batch_generators", "batch_round", "batch_noise", "why_not_batched")
#: hook → the methods whose override below the hook's class would make the hook stale
_ROUND_LOGIC = {"batch_round": ("reset", "pull", "candidates", "mean_rewards", "means_at"),
                "batch_means": ("_means_at",)}


def _defining_class(cls: type, name: str) -> type | None:
    return next((k for k in cls.__mro__ if name in vars(k)), None)


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
        home = _defining_class(cls, hook)
        for name in names if home is not None else ():
            owner = _defining_class(cls, name)
            if owner is not None and owner is not home and issubclass(owner, home):
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
    return b.streams[stream].normal(dtype=dtype).to(b.device, torch.float64) * noise_std


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

    ``candidates()`` is ``[R, A, d]``, ``mean_rewards()`` ``[R, A]``; ``pull(index [R])`` returns
    the rewards ``[R]`` (float64, as the sequential ``pull``'s Python floats) and the
    pseudo-regrets ``max_a μ_r(a) − μ_r(index_r)`` ``[R]`` (on the environment's device) and
    advances every run by one round.
    """

    def __init__(self, env: Any, seeds: Sequence[int], *, chunk: int = 64) -> None:
        reason = why_not_batchable(env)
        if reason is not None:
            raise ValueError(f"{type(env).__name__} cannot be batched: {reason}")
        self.seeds = check_seeds(seeds)
        self.template = env
        self.copies = _reset_copies(env, self.seeds)
        self.fields: dict[str, Tensor] = {
            name: torch.stack([getattr(c, name) for c in self.copies]) for name in env.batch_fields}
        gens = [c.batch_generators() for c in self.copies]
        self.streams = {name: RunStreams([g[name] for g in gens], chunk=chunk, device=self.device)
                        for name in gens[0]}
        self.t = 0
        self._cands, self._means = env.batch_round(self)

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
        regret = self._means.max(dim=1).values - chosen
        reward = chosen.to(torch.float64) + self.template.batch_noise(self, chosen)
        self.t += 1
        self._cands, self._means = self.template.batch_round(self)
        return reward, regret

    def run_repr(self, r: int) -> str:
        """``repr`` of run ``r``'s environment (what the sequential runner records)."""
        return repr(self.copies[r])

    def __repr__(self) -> str:
        return f"BatchedEnv({self.template!r}, R={self.n_runs})"
