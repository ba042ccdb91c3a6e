"""Every Python example that the README and the docs' home page show with its printed output
prints exactly that output (the ```python block is run as a script; the ```text block that follows
it is what it must print). In a printed markdown table the timing columns (a header naming time
or ms) depend on the machine and are not compared."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "docs" / "index.md", ROOT / "docs" / "getting-started.md"]
PAIR = re.compile(r"```python\n((?:(?!```).)*?)```\s*\n```text\n((?:(?!```).)*?)```", flags=re.S)


def _examples() -> list[tuple[str, str, str]]:
    out = []
    for page in PAGES:
        for k, m in enumerate(PAIR.finditer(page.read_text())):
            out.append((f"{page.relative_to(ROOT)}#{k}", m.group(1), m.group(2)))
    return out


def _comparable(text: str) -> list[str]:
    """The printed lines, with the timing columns of markdown tables blanked."""
    out, timing = [], set()
    for line in text.strip().splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not set("".join(cells)) <= set("-: "):
                if not timing and any(c and not c[0].isdigit() for c in cells) and "policy" in cells:
                    timing = {i for i, c in enumerate(cells) if "time" in c or "ms" in c}
                cells = ["*" if i in timing else c for i, c in enumerate(cells)]
            line = "|".join(cells)
        out.append(line)
    return out


def test_the_readme_shows_an_example_with_its_output():
    assert any(label.startswith("README.md") for label, _, _ in _examples())


@pytest.mark.parametrize(("label", "code", "printed"), _examples(), ids=[e[0] for e in _examples()])
def test_example_prints_what_the_page_shows(label, code, printed, tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _comparable(proc.stdout) == _comparable(printed), label


def test_the_readme_is_for_users():
    """Under 250 lines; the lab notes live on the docs pages."""
    assert len((ROOT / "README.md").read_text().splitlines()) < 250
