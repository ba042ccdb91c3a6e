"""Shared fixtures: float64, one thread, deterministic seeds."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


def rand(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=gen, dtype=torch.float64)


@pytest.fixture
def run_notebook(monkeypatch):
    """Execute ``notebooks/<name>`` at its quick size (``TORCHBANDITS_QUICK=1``, Agg backend) and
    return the text of every code cell's outputs."""
    from pathlib import Path

    import nbformat
    from nbclient import NotebookClient

    root = Path(__file__).resolve().parents[1] / "notebooks"

    def run(name: str, timeout: int = 300) -> str:
        monkeypatch.setenv("TORCHBANDITS_QUICK", "1")
        monkeypatch.setenv("MPLBACKEND", "Agg")
        nb = nbformat.read(root / name, as_version=4)
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(root)}}).execute()
        return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                       for o in c.get("outputs", []))

    return run


@pytest.fixture
def lockstep():
    """``run(policy_a, policy_b, env_a, env_b, steps, check=None) -> worst score difference``:
    two policies on twin environments (same seed), asserting the same candidates and the same
    action every round; ``check()`` runs after each pair of updates."""

    def run(pol_a, pol_b, env_a, env_b, steps: int, check=None) -> float:
        worst = 0.0
        for _ in range(steps):
            cand = env_a.candidates()
            assert torch.equal(cand, env_b.candidates())
            worst = max(worst, float((pol_a(cand) - pol_b(cand)).abs().max()))
            i, j = pol_a.select(cand), pol_b.select(cand)
            assert i == j
            pol_a.update(cand[i], env_a.pull(i))
            pol_b.update(cand[j], env_b.pull(j))
            if check is not None:
                check()
        return worst

    return run
