"""Paper reproductions: one module per paper with ``main(argv) -> int``.

Each is reachable as ``torchbandits reproduce NAME`` (see ``experiments.registry.REPRODUCTIONS``)
and as ``python scripts/reproduce_NAME.py``. They are consumers of the library: every run goes
through :func:`~torchbandits.experiments.runner.run_jobs` / ``run_grid`` (one JSON per run,
finished runs read back), every figure through :mod:`torchbandits.experiments.figures`, and every
command line starts from :func:`~torchbandits.reproduce.common.reproduction_parser` (``--quick``,
run by the tests, ``--device``, ``--out`` (default ``results/<name>/``), ``--threads``,
``--no-progress``).
"""
