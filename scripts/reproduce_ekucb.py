"""Reproduce seed 000 (Efficient Kernel UCB): ``python scripts/reproduce_ekucb.py [--quick]``.

Thin wrapper around :func:`torchbandits.reproduce.ekucb.main` (also ``torchbandits reproduce ekucb``).
"""

import sys

from torchbandits.reproduce.ekucb import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
