"""Reproduce seed 001 (BKB): ``python scripts/reproduce_bkb.py [--quick]``.

A thin wrapper around :func:`torchbandits.reproduce.bkb.main` (also ``torchbandits reproduce bkb``).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import sys  # noqa: E402

from torchbandits.reproduce.bkb import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
