"""Martingale-mixture confidence bounds of Flynn & Reeb (2024): AMM, DMM and CMM (re-exports).

The bounds with an explicit α (AMM, DMM) and the radius pieces are in :mod:`.amm_dmm`; the exact
CMM bound by its 1-D dual in :mod:`.cmm_dual`, its α search in :mod:`.alpha_search`, the bordered
eigenbasis in :mod:`.cmm_border` and the SOCP reference in :mod:`.cmm_socp`. This module keeps
the old import path.
"""

from __future__ import annotations

from .amm_dmm import (
    DMM_GRID,
    AMMBound,
    DMMBound,
    MixtureBound,
    amm_beta,
    default_c,
    radius_sq,
    rtilde_sq,
    rtilde_sq_matched,
)
from .cmm_dual import CMMBound, Spectrum, dual_bounds, spectrum

__all__ = [
    "DMM_GRID",
    "AMMBound",
    "CMMBound",
    "DMMBound",
    "MixtureBound",
    "Spectrum",
    "amm_beta",
    "default_c",
    "dual_bounds",
    "radius_sq",
    "rtilde_sq",
    "rtilde_sq_matched",
    "spectrum",
]
