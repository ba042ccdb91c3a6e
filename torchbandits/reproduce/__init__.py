"""Paper reproductions: one module per paper with ``main(argv) -> int``.

Each is reachable as ``torchbandits reproduce NAME`` (see ``experiments.registry.REPRODUCTIONS``)
and as ``python scripts/reproduce_NAME.py``; every one has ``--quick`` (run by the tests),
``--device`` and ``--out`` (default ``results/<name>/``).
"""
