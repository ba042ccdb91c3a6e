"""The README's command and its table: the command shown produces the table shown (regret columns
exactly; the two timing columns are the machine's)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from torchbandits.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
MAKEFILE = Path(__file__).resolve().parents[1] / "Makefile"


def _blocks(text: str) -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)


def _run_command(text: str) -> list[str]:
    """The ``torchbandits run`` command of the README's command block (continuations joined)."""
    for block in _blocks(text):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split("#")[0].strip()
            if line.startswith("torchbandits run "):
                return shlex.split(line)[1:]
    raise AssertionError("no `torchbandits run` command in the README")


def _table(text: str) -> list[list[str]]:
    """Rows of the first markdown table that follows 'Its output' in the README."""
    tail = text.split("Its output", 1)[1]
    block = _blocks(tail)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in block.splitlines()
            if line.startswith("|") and not line.startswith("|---")]
    return rows[1:]  # without the header


def test_readme_run_command_produces_the_readme_table(tmp_path, capsys):
    text = README.read_text()
    argv = _run_command(text)
    # the README's command is make demo's (same policies, envs, horizon, seeds and settings)
    demo = MAKEFILE.read_text().split("demo: install", 1)[1]
    for token in ("--env rkhs", "--policy kucb,gpucb,random", "--horizon 300", "--seeds 0 1 2",
                  "--set env.dim=2"):
        assert token in " ".join(argv) and token in demo
    out = tmp_path / "demo"
    argv = [a if a != "results/demo" else str(out) for a in argv]
    assert main([*argv, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    got = [[c.strip() for c in line.strip().strip("|").split("|")] for line in printed.splitlines()
           if line.startswith("| rkhs")]
    want = _table(text)
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        assert g[:6] == w[:6]   # env, policy, seeds, T, regret at T (mean ± std), regret at T/2


def test_cli_docstring_examples_use_the_readme_command():
    import torchbandits.cli as cli

    doc = " ".join(cli.__doc__.replace("\\\n", " ").split())
    readme_cmd = " ".join(["torchbandits", *_run_command(README.read_text())])
    assert readme_cmd.replace("results/demo", "") in doc.replace("results/demo", "")
