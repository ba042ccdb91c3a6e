"""Reproduce OPKB / ADA-OPKB / OPNN, Hong, Li & Tewari (2023): Figures 1-2.

``python scripts/reproduce_opkb.py [--quick]``
= ``torchbandits reproduce opkb [--quick]``
(``--help`` lists the options); BLAS threads default to one.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import sys  # noqa: E402

from torchbandits.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(["reproduce", "opkb", *sys.argv[1:]]))
