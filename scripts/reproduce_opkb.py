"""Reproduce seed 003 (OPKB / ADA-OPKB / OPNN, Figures 1-2): ``python scripts/reproduce_opkb.py [--quick]``.

A thin wrapper around :func:`torchbandits.reproduce.opkb.main` (also ``torchbandits reproduce opkb``).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import sys  # noqa: E402

from torchbandits.reproduce.opkb import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
