"""Reproduce the tighter confidence bounds of Flynn & Reeb (2024): Table 1, Figures 1, 2, 4-7.

``python scripts/reproduce_confidence_bounds.py [--quick]``
= ``torchbandits reproduce cmm [--quick]``
(``--help`` lists the options); BLAS threads default to one.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import sys  # noqa: E402

from torchbandits.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(["reproduce", "cmm", *sys.argv[1:]]))
