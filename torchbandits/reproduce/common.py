"""What every reproduction shares: its command line's common flags and its quick-mode labels.

Each reproduction builds its parser with :func:`reproduction_parser` (``--quick``, ``--device``,
``--out``, ``--threads``, ``--run-threads``, ``--no-progress``), adds its own options, and calls
:func:`start` after parsing. ``torchbandits reproduce NAME --help`` prints both kinds of option.
"""

from __future__ import annotations

import argparse

import torch

from ..cli import count_arg
from ..native import use_threads

__all__ = ["QUICK_NOTE", "quick_banner", "reproduction_parser", "start"]

#: said wherever a quick run's numbers are printed or written
QUICK_NOTE = ("quick run: small sizes for a smoke test; its numbers are not comparable with the "
              "paper's")


def reproduction_parser(name: str, doc: str, *, quick: str, out: str | None = None,
                        threads: int = 1) -> argparse.ArgumentParser:
    """The parser of ``torchbandits reproduce NAME`` with the common flags: ``--quick`` (help
    text ``quick``: the sizes it uses), ``--device``, ``--out`` (default ``results/NAME``),
    ``--threads`` (default ``threads``), ``--no-progress`` and ``--batch`` (``auto``, ``on``,
    ``off``: :func:`~torchbandits.experiments.batch.run_jobs_batched`; the runs are the same).
    ``doc`` (the module docstring) is the description, printed as written."""
    p = argparse.ArgumentParser(prog=f"torchbandits reproduce {name}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common = p.add_argument_group("common options (every reproduction)")
    common.add_argument("--quick", action="store_true", help=quick)
    common.add_argument("--device", default="cpu", help="torch device of the policies (cpu, cuda)")
    common.add_argument("--out", default=out or f"results/{name}", help="output folder")
    common.add_argument("--threads", type=count_arg, default=threads,
                        help=f"torch threads (default {threads}; 0: torch's default)")
    common.add_argument("--run-threads", type=count_arg, default=0,
                        help="threads over a CPU batch's runs in the compiled calls (0: "
                             "$TORCHBANDITS_THREADS or 1; docs/batch.md)")
    common.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    common.add_argument("--batch", default="auto", choices=["auto", "on", "off"],
                        help="run a setting's seeds as one batch where the policy and environment "
                             "can (auto, default: from the policy family's measured crossover, "
                             "2-4 seeds on the CPU, 2 on CUDA; off: one at a time)")
    return p


def start(args: argparse.Namespace) -> None:
    """Check ``--device`` and apply ``--threads`` and ``--run-threads`` (the global settings a
    run changes, at run time, never at import: :func:`~torchbandits.native.use_threads`)."""
    if str(args.device).startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda requested but CUDA is not available on this machine")
    use_threads(int(args.threads), int(getattr(args, "run_threads", 0)))


def quick_banner(settings: str) -> str:
    """The first line a quick run prints: ``"QUICK RUN (T = 25, 2 seeds): …not comparable…"``."""
    return f"QUICK RUN ({settings}): {QUICK_NOTE}."
