"""Presets: the registry's policies, as factories ``f(env, **kwargs) -> Policy``, one module per paper.

A preset builds a policy class of :mod:`torchbandits.policies` with the arguments a paper (or a
common baseline) uses, reading from the environment what the papers hand the algorithms — its
kernel, noise level, norm bound and horizon (:mod:`~torchbandits.presets.from_env`). Keyword
arguments override the preset's choices and reach the policy class.

| module | presets (registry names) |
|---|---|
| `baselines` | `gpucb`, `cgpucb`, `gpucb-srinivas`, `ay-gpucb`, `random` |
| `bo` | `gpucb-fit` (kernel unknown: marginal-likelihood refits) |
| `zenati2022` | `kucb`, `kucb-theory`, `ekucb`, `cbkb`, `cbbkb`, `supkernelucb` |
| `calandriello2019` | `bkb`, `bkb-const`, `bkb-sor`, `gpucb-ridge` |
| `flynn2024` | `cmm-ucb`, `dmm-ucb`, `amm-ucb`, `aygp-ucb`, `igp-ucb` |
| `zhou2021` | `r-gpucb`, `sw-gpucb`, `tv-gpucb`, `w-gpucb`, `gpucb-static` |
| `hong2023` | `opkb`, `ada-opkb`, `opnn`, `opnn0`, `ada-opnn` |
| `hong2023` (baselines) | `gpucb-alg8`, `sw-gpucb-finite`, `wgpucb-finite`, `master-gpucb` |

GP-UCB is one class, :class:`~torchbandits.policies.GPUCB` (exact posterior, β on the GP sd unless
the rule says otherwise); ``gpucb``, ``cgpucb``, ``gpucb-srinivas``, ``ay-gpucb``, ``gpucb-fit``,
``gpucb-ridge``, ``aygp-ucb`` and ``igp-ucb`` are presets of it that differ in the radius, λ and
refits only. ``gpucb-static`` (R-GP-UCB with no restart) and ``gpucb-alg8`` (the finite-arm primal
model) are GP-UCB on other posterior models.

The names are registered in :mod:`torchbandits.experiments.registry`. Presets sit above
``policies`` and below ``experiments``: they never import ``experiments`` or ``reproduce``, and the
reproductions take their policies from here. Importing this package imports no preset module.
"""
