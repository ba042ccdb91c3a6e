"""Names of environments, policies and paper reproductions, resolved lazily.

Each entry is ``"module:attribute"`` so that listing names imports nothing heavy and one broken
module cannot break the others. Environment entries are classes called with keyword arguments;
policy entries are factories ``f(env, **kwargs) -> Policy`` (they read the environment's kernel,
noise level and norm bound, as the papers give those to the algorithms); reproduction entries are
``main(argv) -> int`` functions of the scripts in ``torchbandits/reproduce``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

__all__ = ["ENVIRONMENTS", "POLICIES", "REPRODUCTIONS", "Entry", "make_env", "make_policy", "resolve"]


@dataclass(frozen=True)
class Entry:
    target: str
    description: str


ENVIRONMENTS: dict[str, Entry] = {
    "rkhs": Entry("torchbandits.envs.rkhs:RKHSFunctionEnv",
                  "random RKHS function of norm B (seed 002 §5.1), fresh U[0,1]^d arms per round"),
    "bump": Entry("torchbandits.envs.contextual:BumpEnv",
                  "seed 000 §4.2: Bump, d_x = 5 contexts x 10-action grid, joint RBF σ_k = 0.1, noise 0.1"),
    "chessboard": Entry("torchbandits.envs.contextual:ChessboardEnv",
                        "seed 000 §4.3: 4x4 chessboard of 1 / 0.5 / 0 cells, 1-D context x 10 actions"),
    "step-diagonal": Entry("torchbandits.envs.contextual:StepDiagonalEnv",
                           "seed 000 §4.4: two diagonal bands (1 and 0.5), 1-D context x 10 actions"),
    "tv-rotation": Entry("torchbandits.envs.time_varying:RotatingRKHSEnv",
                         "seed 004 §4: rotating RKHS function, exact budget P_T (env.budget, env.horizon)"),
    "tv-bump": Entry("torchbandits.envs.time_varying:MovingBumpEnv",
                     "seed 004 §4: moving bump B·k(·, c_t) with exact budget P_T"),
    "tv-switch": Entry("torchbandits.envs.time_varying:SwitchingRKHSEnv",
                       "seed 004 §4: abrupt switches between RKHS functions of norm B (env.n_switches)"),
    "tv-stationary": Entry("torchbandits.envs.time_varying:StationaryRKHSEnv",
                           "seed 004 §4: stationary control (P_T = 0)"),
    "tv-linear": Entry("torchbandits.envs.time_varying:LinearRotatingEnv",
                       "seed 004 §4: linear kernel, θ_t rotating on the sphere of radius B, unit-ball arms"),
    "switching-kernel": Entry("torchbandits.envs.nonstationary:SwitchingKernelEnv",
                              "seed 003 §5.1: N(0,K) rewards on sphere arms, sign flips (Env 1/2)"),
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
                    "seed 003 App. J: 0.8 cos(3xᵀθ + φ(t)), phase 'stationary' or 'slow'"),
}

POLICIES: dict[str, Entry] = {
    "kucb": Entry("torchbandits.experiments.factories:kucb",
                  "K-UCB (seed 000): exact posterior, constant β on the ridge sd"),
    "kucb-theory": Entry("torchbandits.experiments.factories:kucb_theory",
                         "K-UCB with the Lemma 3.1 radius (log-det form, ridge sd)"),
    "gpucb": Entry("torchbandits.experiments.factories:gpucb",
                   "GP-UCB / CGP-UCB with IGP-UCB's radius (GP sd, λ = 1 + η)"),
    "gpucb-srinivas": Entry("torchbandits.experiments.factories:gpucb_srinivas",
                            "GP-UCB with Srinivas et al.'s finite-arm β_t (GP sd)"),
    "ay-gpucb": Entry("torchbandits.experiments.factories:ay_gpucb",
                      "AY-GP-UCB (Abbasi-Yadkori radius, GP sd at λ = σ²)"),
    "gpucb-fit": Entry("torchbandits.experiments.factories_bo:gpucb_fit",
                       "GP-UCB, β = 2 on the GP sd, kernel + noise refit by marginal likelihood every round"),
    "random": Entry("torchbandits.experiments.factories:random",
                    "uniformly random arm"),
    "cgpucb": Entry("torchbandits.experiments.factories:gpucb",
                    "CGP-UCB (seed 000 baseline) = GP-UCB on joint [context; action] features (GP sd)"),
    "ekucb": Entry("torchbandits.reproduce.ekucb:ekucb_policy",
                   "EK-UCB (seed 000): KORS Nystrom dictionary, μ = λ, γ = b·λ, β = 0.1 on the ridge sd"),
    "cbkb": Entry("torchbandits.reproduce.ekucb:cbkb_policy",
                  "CBKB (seed 000): dictionary resampled every round, q̄ = 10 (ridge sd)"),
    "cbbkb": Entry("torchbandits.reproduce.ekucb:cbbkb_policy",
                   "CBBKB (seed 000): lazy resparsification when 1 + Σσ̃² > C_b, q̄ = 10 C_b (ridge sd)"),
    "supkernelucb": Entry("torchbandits.reproduce.ekucb:supkernel_policy",
                          "SupKernelUCB (seed 000 baseline, textbook levels; η on the ridge sd)"),
    "bkb": Entry("torchbandits.reproduce.bkb:bkb_policy",
                 "BKB (seed 001): RLS-resampled Nystrom/DTC posterior, paper β̃_t on the ridge sd"),
    "bkb-const": Entry("torchbandits.reproduce.bkb:bkb_constant",
                       "BKB with a constant β = 0.3 on the ridge sd (seed 001 reproduction)"),
    "bkb-sor": Entry("torchbandits.reproduce.bkb:bkb_sor",
                     "BKB ablation with the SoR variance (variance starvation; ridge sd)"),
    "gpucb-ridge": Entry("torchbandits.reproduce.bkb:gpucb_same_beta",
                         "exact GP-UCB with BKB's convention: constant β = 0.3 on the ridge sd, λ = ξ²"),
    "cmm-ucb": Entry("torchbandits.policies.confidence_presets:cmm_ucb",
                     "Kernel CMM-UCB (seed 002): exact martingale-mixture bound, 1-D dual (GP sd)"),
    "dmm-ucb": Entry("torchbandits.policies.confidence_presets:dmm_ucb",
                     "Kernel DMM-UCB (seed 002): mixture bound, min over 5 regularisers (GP sd)"),
    "amm-ucb": Entry("torchbandits.policies.confidence_presets:amm_ucb",
                     "Kernel AMM-UCB (seed 002): analytic mixture bound at σ²/c (GP sd)"),
    "aygp-ucb": Entry("torchbandits.policies.confidence_presets:aygp_ucb",
                      "AY-GP-UCB with λ = σ²/c (seed 002 experiments; GP sd)"),
    "igp-ucb": Entry("torchbandits.policies.confidence_presets:igp_ucb",
                     "IGP-UCB, η = 2/T, constant 2 (seed 002 experiments; GP sd at 1 + η)"),
    "r-gpucb": Entry("torchbandits.experiments.factories_tv:rgpucb",
                     "R-GP-UCB (seed 004): restart every H (known-P_T rule), Lemma 1 width (GP sd)"),
    "sw-gpucb": Entry("torchbandits.experiments.factories_tv:swgpucb",
                      "SW-GP-UCB (seed 004): last w points (known-P_T rule), Lemma 2 width (GP sd)"),
    "tv-gpucb": Entry("torchbandits.experiments.factories_tv:tvgpucb",
                      "TV-GP-UCB (Bogunovic et al. 2016): time-decay kernel, forgetting ε (GP sd)"),
    "w-gpucb": Entry("torchbandits.experiments.factories_tv:wgpucb",
                     "W-GP-UCB / discounted GP-UCB: weights γ^{t-s}, D-LinUCB sandwich width (GP sd)"),
    "gpucb-static": Entry("torchbandits.experiments.factories_tv:gpucb_static",
                          "GP-UCB without forgetting, Lemma 1 width (seed 004 baseline; GP sd)"),
    "opkb": Entry("torchbandits.experiments.factories_opkb:opkb",
                  "OPKB (seed 003 Alg. 2): OP + optimal design, randomised (no β)"),
    "ada-opkb": Entry("torchbandits.experiments.factories_opkb:ada_opkb",
                      "ADA-OPKB (seed 003 Alg. 3-4): OPKB with replays and change-test restarts"),
    "opnn": Entry("torchbandits.experiments.factories_opkb:opnn",
                  "OPNN (seed 003 Alg. 5): OPKB on trained-NTK features"),
    "opnn0": Entry("torchbandits.experiments.factories_opkb:opnn0",
                   "OPNN0 (seed 003 App. J.2): OPNN with features frozen at init"),
    "ada-opnn": Entry("torchbandits.experiments.factories_opkb:ada_opnn",
                      "ADA-OPNN (seed 003 Alg. 7): ADA-OPKB on trained-NTK features"),
    "gpucb-alg8": Entry("torchbandits.experiments.factories_opkb:gp_ucb_alg8",
                        "GP-UCB, seed 003 Alg. 8 radius × UCB scale, finite-arm primal (GP sd)"),
    "sw-gpucb-finite": Entry("torchbandits.experiments.factories_opkb:sw_gp_ucb",
                             "SW-GP-UCB with the Alg. 8 radius on a finite arm set (seed 003; GP sd)"),
    "wgpucb-finite": Entry("torchbandits.experiments.factories_opkb:wgp_ucb",
                           "WGP-UCB, stable discount recursion, finite arm set (seed 003; GP sd)"),
    "master-gpucb": Entry("torchbandits.experiments.factories_opkb:master_gp_ucb",
                          "MASTER + GP-UCB (seed 003 App. E; reconstructed from Wei & Luo; GP sd)"),
}

REPRODUCTIONS: dict[str, Entry] = {
    "ekucb": Entry("torchbandits.reproduce.ekucb:main",
                   "seed 000: Figures 1-12 (EK-UCB, K-UCB, CBKB, CBBKB, SupK-UCB on three envs)"),
    "cmm": Entry("torchbandits.reproduce.cmm:main",
                 "seed 002: Table 1, Figures 1, 2, 4-7 (CMM/DMM/AMM-UCB, AY-GP-UCB, IGP-UCB)"),
    "bkb": Entry("torchbandits.reproduce.bkb:main",
                 "seed 001: BKB vs exact GP-UCB vs Random on RKHS functions + Fig. 2 (variance starvation)"),
    "tvbo": Entry("torchbandits.reproduce.tvbo:main",
                  "seed 004: dynamic regret vs t and vs P_T of R/SW/TV/W-GP-UCB, GP-UCB, Random"),
    "opkb": Entry("torchbandits.reproduce.opkb:main",
                  "seed 003: Figures 1-2 (ADA-OPKB, ADA-OPNN, OPKB, OPNN(0), SW/W/GP-UCB)"),
}


def resolve(entry: Entry) -> Any:
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
