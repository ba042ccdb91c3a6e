"""Names of environments and policies, resolved lazily.

Each entry is ``"module:attribute"`` so that listing names imports nothing heavy (``torchbandits
list`` imports neither torch nor the policies) and one broken module cannot break the others.
Environment entries are the environments' own classes (or builders), called with keyword
arguments. Policy entries are presets ``f(env, **kwargs) -> Policy`` of :mod:`torchbandits.presets`,
one module per paper: they read the environment's kernel, noise level and norm bound, as the
papers give those to the algorithms. The paper reproductions (``main(argv) -> int``) are named
in :data:`torchbandits.reproduce.REPRODUCTIONS`; this module, like all of ``experiments``, never
imports ``reproduce``.

The names live in this one table rather than in decorators beside the definitions: a decorator
runs only when its module is imported, so listing would have to import every policy and
environment module (GPyTorch, BoTorch, CVXPY, scikit-learn).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

__all__ = ["ENVIRONMENTS", "POLICIES", "Entry", "make_env", "make_policy", "resolve"]


@dataclass(frozen=True)
class Entry:
    """A registry entry: ``target`` is ``"module:attribute"``, ``description`` one line."""

    target: str
    description: str


ENVIRONMENTS: dict[str, Entry] = {
    "rkhs": Entry("torchbandits.envs.rkhs:RKHSFunctionEnv",
                  "random RKHS function of norm B (Flynn & Reeb 2024 §7), fresh U[0,1]^d arms per round"),
    "bump": Entry("torchbandits.envs.contextual:BumpEnv",
                  "Zenati et al. 2022 §5: Bump, d_x = 5 contexts x 10-action grid, joint RBF σ_k = 0.1, "
                  "noise 0.1"),
    "chessboard": Entry("torchbandits.envs.contextual:ChessboardEnv",
                        "Zenati et al. 2022 App. F.2.2: 4x4 chessboard of 1 / 0.5 / 0 cells, 1-D context x "
                        "10 actions"),
    "step-diagonal": Entry("torchbandits.envs.contextual:StepDiagonalEnv",
                           "Zenati et al. 2022 App. F.2.2: two diagonal bands (1 and 0.5), 1-D context x "
                           "10 actions"),
    "tv-rotation": Entry("torchbandits.envs.time_varying:RotatingRKHSEnv",
                         "rotating RKHS function with an exact variation budget P_T (Zhou & Shroff 2021 "
                         "§II; env.budget, env.horizon)"),
    "tv-bump": Entry("torchbandits.envs.time_varying:MovingBumpEnv",
                     "moving bump B·k(·, c_t) with an exact budget P_T (Zhou & Shroff 2021 §II)"),
    "tv-switch": Entry("torchbandits.envs.time_varying:SwitchingRKHSEnv",
                       "abrupt switches between RKHS functions of norm B (env.n_switches; Zhou & Shroff "
                       "2021 §II)"),
    "tv-stationary": Entry("torchbandits.envs.time_varying:StationaryRKHSEnv",
                           "stationary control of the time-varying benchmark (P_T = 0)"),
    "tv-linear": Entry("torchbandits.envs.time_varying:LinearRotatingEnv",
                       "linear kernel, θ_t rotating on the sphere of radius B, unit-ball arms (Zhou & "
                       "Shroff 2021 §II)"),
    "switching-kernel": Entry("torchbandits.envs.nonstationary:SwitchingKernelEnv",
                              "Hong et al. 2023 §6: N(0,K) rewards on sphere arms, sign flips (Env 1/2)"),
    "branin": Entry("torchbandits.envs.test_functions:branin",
                    "BoTorch Branin (d = 2) on 2,000 fixed Sobol arms in [0,1]^2, noise 0.05 x range"),
    "hartmann6": Entry("torchbandits.envs.test_functions:hartmann6",
                       "BoTorch Hartmann-6 on 2,000 fixed Sobol arms, noise 0.05 x range"),
    "ackley": Entry("torchbandits.envs.test_functions:ackley",
                    "BoTorch Ackley-d (env.dim, default 6) on 2,000 fixed Sobol arms"),
    "levy": Entry("torchbandits.envs.test_functions:levy",
                  "BoTorch Levy-d (env.dim, default 4) on 2,000 fixed Sobol arms"),
    "rosenbrock": Entry("torchbandits.envs.test_functions:rosenbrock",
                        "BoTorch Rosenbrock-d (env.dim, default 4) on 2,000 fixed Sobol arms"),
    "michalewicz": Entry("torchbandits.envs.test_functions:michalewicz",
                         "BoTorch Michalewicz-d (env.dim, default 5) on 2,000 fixed Sobol arms"),
    "digits": Entry("torchbandits.envs.digits:DigitsEnv",
                    "scikit-learn digits: context = image, 10 class actions, reward 1[a = label]"),
    "cosine": Entry("torchbandits.envs.nonstationary:CosineBandit",
                    "Hong et al. 2023 App. J: 0.8 cos(3xᵀθ + φ(t)), phase 'stationary' or 'slow'"),
}

_P = "torchbandits.presets."

POLICIES: dict[str, Entry] = {
    # shared baselines (presets.baselines): GP-UCB with the standard radii, Random
    "gpucb": Entry(_P + "baselines:gpucb",
                   "GP-UCB with IGP-UCB's radius (Chowdhury & Gopalan 2017; GP sd, λ = 1 + η)"),
    "cgpucb": Entry(_P + "baselines:gpucb",
                    "CGP-UCB (Krause & Ong 2011) = GP-UCB on joint [context; action] features (GP sd)"),
    "gpucb-srinivas": Entry(_P + "baselines:gpucb_srinivas",
                            "GP-UCB with Srinivas et al. 2010's finite-arm β_t (GP sd, λ = σ²)"),
    "ay-gpucb": Entry(_P + "baselines:ay_gpucb",
                      "GP-UCB with the Abbasi-Yadkori 2012 radius (GP sd at λ = σ²)"),
    "random": Entry(_P + "baselines:random", "uniformly random arm"),
    # problems with an unknown kernel (presets.bo)
    "gpucb-fit": Entry(_P + "bo:gpucb_fit",
                       "GP-UCB, β = 2 on the GP sd, kernel + noise refit by marginal likelihood every round"),
    # Zenati et al. 2022 (presets.zenati2022)
    "kucb": Entry(_P + "zenati2022:kucb",
                  "K-UCB (Zenati et al. 2022, Alg. 3): exact posterior, constant β on the ridge sd"),
    "kucb-theory": Entry(_P + "zenati2022:kucb_theory",
                         "K-UCB with the radius of Zenati et al. 2022 Lemma 3.1 (log-det form, ridge sd)"),
    "ekucb": Entry(_P + "zenati2022:ekucb",
                   "EK-UCB (Zenati et al. 2022, Alg. 2): KORS Nystrom dictionary, μ = λ, γ = b·λ, "
                   "β = 0.1 on the ridge sd"),
    "cbkb": Entry(_P + "zenati2022:cbkb",
                  "CBKB (Zenati et al. 2022 §5): dictionary resampled every round, q̄ = 10 (ridge sd)"),
    "cbbkb": Entry(_P + "zenati2022:cbbkb",
                   "CBBKB (Zenati et al. 2022 §5): lazy resparsification when 1 + Σσ̃² > C_b, q̄ = 10 C_b "
                   "(ridge sd)"),
    "supkernelucb": Entry(_P + "zenati2022:supkernel",
                          "SupKernelUCB (Valko et al. 2013; baseline of Zenati et al. 2022, textbook levels; "
                          "η on the ridge sd)"),
    # Calandriello et al. 2019 (presets.calandriello2019)
    "bkb": Entry(_P + "calandriello2019:bkb",
                 "BKB (Calandriello et al. 2019, Alg. 1): RLS-resampled Nystrom/DTC posterior, β̃_t of "
                 "Thm 1 on the ridge sd"),
    "bkb-const": Entry(_P + "calandriello2019:bkb_constant",
                       "BKB with a constant β = 0.3 on the ridge sd (the BKB reproduction's convention)"),
    "bkb-sor": Entry(_P + "calandriello2019:bkb_sor",
                     "BKB ablation with the SoR variance (variance starvation, Calandriello et al. 2019 "
                     "Fig. 2; ridge sd)"),
    "gpucb-ridge": Entry(_P + "calandriello2019:gpucb_ridge",
                         "exact GP-UCB with BKB's convention: constant β = 0.3 on the ridge sd, λ = ξ²"),
    # Flynn & Reeb 2024 (presets.flynn2024)
    "cmm-ucb": Entry(_P + "flynn2024:cmm_ucb",
                     "Kernel CMM-UCB (Flynn & Reeb 2024 §5.3): exact martingale-mixture bound, 1-D dual "
                     "(GP sd)"),
    "dmm-ucb": Entry(_P + "flynn2024:dmm_ucb",
                     "Kernel DMM-UCB (Flynn & Reeb 2024 §5.4): mixture bound, min over 5 regularisers "
                     "(GP sd)"),
    "amm-ucb": Entry(_P + "flynn2024:amm_ucb",
                     "Kernel AMM-UCB (Flynn & Reeb 2024 §5.5): analytic mixture bound at σ²/c (GP sd)"),
    "aygp-ucb": Entry(_P + "flynn2024:aygp_ucb",
                      "AY-GP-UCB with λ = σ²/c (Flynn & Reeb 2024 §7; GP sd)"),
    "igp-ucb": Entry(_P + "flynn2024:igp_ucb",
                     "IGP-UCB, η = 2/T, constant 2 (Flynn & Reeb 2024 §7; GP sd at 1 + η)"),
    # Zhou & Shroff 2021 (presets.zhou2021)
    "r-gpucb": Entry(_P + "zhou2021:rgpucb",
                     "R-GP-UCB (Zhou & Shroff 2021, Alg. 1): restart every H (known-P_T rule), Lemma 1 "
                     "width (GP sd)"),
    "sw-gpucb": Entry(_P + "zhou2021:swgpucb",
                      "SW-GP-UCB (Zhou & Shroff 2021, Alg. 2): last w points (known-P_T rule), Lemma 2 "
                      "width (GP sd)"),
    "tv-gpucb": Entry(_P + "zhou2021:tvgpucb",
                      "TV-GP-UCB (Bogunovic et al. 2016): time-decay kernel, forgetting ε (GP sd)"),
    "w-gpucb": Entry(_P + "zhou2021:wgpucb",
                     "W-GP-UCB / discounted GP-UCB: weights γ^{t-s}, D-LinUCB sandwich width (GP sd)"),
    "gpucb-static": Entry(_P + "zhou2021:gpucb_static",
                          "GP-UCB without forgetting, Lemma 1 width (Zhou & Shroff 2021 baseline; GP sd)"),
    # Hong et al. 2023 (presets.hong2023)
    "opkb": Entry(_P + "hong2023:opkb",
                  "OPKB (Hong et al. 2023, Alg. 2): OP + optimal design, randomised (no β)"),
    "ada-opkb": Entry(_P + "hong2023:ada_opkb",
                      "ADA-OPKB (Hong et al. 2023, Alg. 3-4): OPKB with replays and change-test restarts"),
    "opnn": Entry(_P + "hong2023:opnn",
                  "OPNN (Hong et al. 2023, Alg. 5): OPKB on trained-NTK features"),
    "opnn0": Entry(_P + "hong2023:opnn0",
                   "OPNN0 (Hong et al. 2023, App. J.2): OPNN with features frozen at init"),
    "ada-opnn": Entry(_P + "hong2023:ada_opnn",
                      "ADA-OPNN (Hong et al. 2023, Alg. 7): ADA-OPKB on trained-NTK features"),
    "gpucb-alg8": Entry(_P + "hong2023:gp_ucb_alg8",
                        "GP-UCB, Hong et al. 2023 Alg. 8 radius × UCB scale, finite-arm primal (GP sd)"),
    "sw-gpucb-finite": Entry(_P + "hong2023:sw_gp_ucb",
                             "SW-GP-UCB with the Alg. 8 radius on a finite arm set (Hong et al. 2023 §6; "
                             "GP sd)"),
    "wgpucb-finite": Entry(_P + "hong2023:wgp_ucb",
                           "WGP-UCB, stable discount recursion, finite arm set (Hong et al. 2023 §6; GP sd)"),
    "master-gpucb": Entry(_P + "hong2023:master_gp_ucb",
                          "MASTER + GP-UCB (Hong et al. 2023 App. E; reconstructed from Wei & Luo 2021; "
                          "GP sd)"),
}


def resolve(entry: Entry) -> Any:
    """Import ``entry.target``'s module and return its attribute."""
    module, _, attr = entry.target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _lookup(table: dict[str, Entry], kind: str, name: str) -> Entry:
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; choose one of {sorted(table)}")
    return table[name]


def make_env(name: str, **kwargs: Any) -> Any:
    """Build the environment registered as ``name`` with keyword arguments."""
    return resolve(_lookup(ENVIRONMENTS, "environment", name))(**kwargs)


def make_policy(name: str, env: Any, **kwargs: Any) -> Any:
    """Build the policy registered as ``name`` for ``env`` with keyword arguments."""
    return resolve(_lookup(POLICIES, "policy", name))(env, **kwargs)
