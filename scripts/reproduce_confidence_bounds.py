"""Reproduce seed 002 (tighter confidence bounds): ``python scripts/reproduce_confidence_bounds.py``.

Add ``--quick`` for a small run. A thin wrapper around :func:`torchbandits.reproduce.cmm.main` (also
``torchbandits reproduce cmm``): Table 1 with the paper's numbers beside ours, Figures 1, 2, 4, 5/6, 7.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import sys  # noqa: E402

from torchbandits.reproduce.cmm import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
