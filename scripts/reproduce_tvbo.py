"""Reproduce seed 004 (time-varying BO): ``python scripts/reproduce_tvbo.py [--quick]``.

A thin wrapper around :func:`torchbandits.reproduce.tvbo.main` (also ``torchbandits reproduce tvbo``).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import sys  # noqa: E402

from torchbandits.reproduce.tvbo import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
