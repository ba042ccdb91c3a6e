"""Paper reproductions: one module per paper with ``main(argv) -> int``.

Each is reachable as ``torchbandits reproduce NAME`` (the names are :data:`REPRODUCTIONS`)
and as ``python scripts/reproduce_NAME.py``. They are consumers of the library: every run goes
through :func:`~torchbandits.experiments.runner.run_jobs` / ``run_grid`` (one JSON per run,
finished runs read back), every figure through :mod:`torchbandits.experiments.figures`, and every
command line starts from :func:`~torchbandits.reproduce.common.reproduction_parser` (``--quick``,
run by the tests, ``--device``, ``--out`` (default ``results/<name>/``), ``--threads``,
``--no-progress``).
"""

from __future__ import annotations

from ..experiments.registry import Entry

__all__ = ["REPRODUCTIONS"]

#: reproduction name → ``main(argv) -> int`` of its module (resolved with
#: :func:`torchbandits.experiments.registry.resolve`)
REPRODUCTIONS: dict[str, Entry] = {
    "ekucb": Entry("torchbandits.reproduce.ekucb:main",
                   "Zenati et al. 2022: Figures 1-12 (EK-UCB, K-UCB, CBKB, CBBKB, SupK-UCB on three envs)"),
    "cmm": Entry("torchbandits.reproduce.cmm:main",
                 "Flynn & Reeb 2024: Table 1, Figures 1, 2, 4-7 (CMM/DMM/AMM-UCB, AY-GP-UCB, IGP-UCB)"),
    "bkb": Entry("torchbandits.reproduce.bkb:main",
                 "Calandriello et al. 2019: BKB vs exact GP-UCB vs Random on RKHS functions + Fig. 2 "
                 "(variance starvation)"),
    "tvbo": Entry("torchbandits.reproduce.tvbo:main",
                  "Zhou & Shroff 2021: dynamic regret vs t and vs P_T of R/SW/TV/W-GP-UCB, GP-UCB, Random"),
    "opkb": Entry("torchbandits.reproduce.opkb:main",
                  "Hong et al. 2023: Figures 1-2 (ADA-OPKB, ADA-OPNN, OPKB, OPNN(0), SW/W/GP-UCB)"),
}
