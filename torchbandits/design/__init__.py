"""Convex programs of Hong, Li & Tewari (AISTATS 2023): OP (Algorithm 1), the kernel optimal
design π(A), the information gain γ_T, their KKT certificates, with a torch barrier-Newton solver
(default) and CVXPY (reference)."""

from .kkt import (
    Certificate,
    design_matrix,
    ips_matrix,
    kkt_certificate,
    lemma44_check,
    leverages,
    logdet_design,
)
from .logdet import LogDetSolution, low_rank_factor, solve_cvxpy, solve_logdet_program
from .newton import NewtonInfo, barrier_newton
from .op import OPResult, solve_op
from .optimal_design import DesignResult, information_gain, information_gain_at, optimal_design

__all__ = [
    "Certificate",
    "DesignResult",
    "LogDetSolution",
    "NewtonInfo",
    "OPResult",
    "barrier_newton",
    "design_matrix",
    "information_gain",
    "information_gain_at",
    "ips_matrix",
    "kkt_certificate",
    "lemma44_check",
    "leverages",
    "logdet_design",
    "low_rank_factor",
    "optimal_design",
    "solve_cvxpy",
    "solve_logdet_program",
    "solve_op",
]
