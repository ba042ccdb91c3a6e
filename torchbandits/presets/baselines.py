"""Presets shared by the papers: GP-UCB with the standard radii, and the uniformly random arm.

GP-UCB (:class:`~torchbandits.policies.GPUCB`, β on the **GP** sd ``ρ_λ``, noise variance λ) is
one class; its registry names are presets of it that differ only in the radius and λ:

* ``gpucb`` / ``cgpucb`` — IGP-UCB's radius (Chowdhury & Gopalan 2017, Thm 2) at ``λ = 1 + η``;
  CGP-UCB (Krause & Ong 2011) is the same policy on joint ``[context; action]`` features, which
  is what every contextual environment hands a policy;
* ``gpucb-srinivas`` — Srinivas et al. (2010, Thm 1)'s finite-arm ``β_t`` at ``λ = σ²``;
* ``ay-gpucb`` — Abbasi-Yadkori (2012, Thm 3.11)'s radius at ``λ = σ²``.

The other GP-UCB names are the settings of one paper and live in its module: ``gpucb-ridge``
(:mod:`~torchbandits.presets.calandriello2019`), ``aygp-ucb`` and ``igp-ucb``
(:mod:`~torchbandits.presets.flynn2024`), ``gpucb-fit`` (:mod:`~torchbandits.presets.bo`); and on
other posterior models, ``gpucb-static`` (R-GP-UCB without restarts,
:mod:`~torchbandits.presets.zhou2021`) and ``gpucb-alg8`` (finite-arm primal form,
:mod:`~torchbandits.presets.hong2023`).
"""

from __future__ import annotations

from typing import Any

from ..confidence import SrinivasBeta
from ..policies import AYGPUCB, GPUCB, Policy, RandomPolicy
from .from_env import env_kernel, env_noise, env_norm

__all__ = ["ay_gpucb", "gpucb", "gpucb_srinivas", "random"]


def gpucb(env: Any, **kwargs: Any) -> Policy:
    """GP-UCB / CGP-UCB with IGP-UCB's radius (``B``, ``σ`` from ``env``; λ = 1 + η)."""
    kwargs.setdefault("norm_bound", env_norm(env))
    kwargs.setdefault("noise_std", env_noise(env))
    return GPUCB(env_kernel(env), **kwargs)


def gpucb_srinivas(env: Any, delta: float = 0.1, **kwargs: Any) -> Policy:
    """GP-UCB with Srinivas et al.'s finite-arm ``β_t = 2 log(|D| t² π²/(6δ))`` at λ = σ²."""
    kwargs.setdefault("lam", env_noise(env) ** 2)
    return GPUCB(env_kernel(env), beta=SrinivasBeta(delta=delta), **kwargs)


def ay_gpucb(env: Any, delta: float = 0.01, lam: float | None = None, **kwargs: Any) -> Policy:
    """GP-UCB with Abbasi-Yadkori's radius at ``lam`` (default σ²): ``aygp-ucb`` at ``c = 1``."""
    return AYGPUCB(env_kernel(env), noise_std=env_noise(env), norm_bound=env_norm(env), delta=delta,
                   c=1.0, lam=lam, **kwargs)


def random(env: Any, **kwargs: Any) -> Policy:
    """The uniformly random arm (the environment is not read)."""
    return RandomPolicy(**kwargs)
