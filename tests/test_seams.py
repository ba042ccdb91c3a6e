"""The seams of the house (docs/design.md): what each layer may touch.

* no module of the package ``torchbandits/`` (its models, environments and rules as well as its
  consumers ``policies/`` and ``reproduce/``), of ``benchmarks/`` or of ``scripts/`` reads or
  writes another object's ``_private`` name (torch's own tensor attributes ``_version`` and
  ``_base`` aside), or writes ``__dict__`` directly;
* ``experiments/`` never imports ``reproduce/``;
* no package file is longer than ~400 lines;
* the batched modules write no Python scalar through an index (on CUDA that copies from the
  host and synchronises);
* no code cites a document the project does not contain (the papers are cited by authors, year
  and section; working notes outside the repository are not).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "torchbandits"
MAX_LINES = 410   # "about 400"


def _py(*dirs: Path) -> list[Path]:
    return sorted(p for d in dirs if d.exists() for p in d.rglob("*.py"))


#: torch's own tensor attributes (a tensor's in-place write counter, the tensor a view views)
TENSOR_ATTRIBUTES = frozenset({"_version", "_base"})


def _private_touches(path: Path) -> list[str]:
    """``obj._name`` where ``obj`` is not ``self``/``cls``/``super()`` (``_name`` not one of
    :data:`TENSOR_ATTRIBUTES`), and ``x.__dict__[...] = ...``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name = node.attr
            if name.startswith("_") and not (name.startswith("__") and name.endswith("__")) \
                    and name not in TENSOR_ATTRIBUTES:
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) \
                        and owner.func.id == "super":
                    continue
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{name}")
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for tgt in targets:
                if isinstance(tgt, ast.Subscript) and isinstance(tgt.value, ast.Attribute) \
                        and tgt.value.attr == "__dict__":
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: __dict__[...] =")
    return bad


CHECKED = _py(PACKAGE, ROOT / "benchmarks", ROOT / "scripts")


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_access_or_dict_writes(path):
    assert _private_touches(path) == []


def test_the_private_access_check_covers_the_whole_package():
    checked = {p.relative_to(ROOT).as_posix() for p in CHECKED}
    for module in ("torchbandits/models/exact.py", "torchbandits/envs/switching_batch.py",
                   "torchbandits/confidence/base.py", "torchbandits/linalg.py",
                   "torchbandits/policies/kernel_ucb.py", "benchmarks/ekucb_ops.py",
                   "torchbandits/models/batched_nystrom_growth.py"):
        assert module in checked, module


def _scalar_item_writes(path: Path) -> list[str]:
    """``x[...] = <a number or bool literal>``: on a CUDA tensor such a write copies the scalar
    from pageable host memory, which synchronises (``fill_`` / ``zero_`` / ``index_fill_`` do
    not)."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Subscript) for t in node.targets):
            value = node.value.operand if isinstance(node.value, ast.UnaryOp) else node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, (int, float, bool)):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return bad


BATCHED = [p for p in _py(PACKAGE) if "batch" in p.name]


@pytest.mark.parametrize("path", BATCHED, ids=lambda p: str(p.relative_to(ROOT)))
def test_batched_modules_write_no_python_scalar_through_an_index(path):
    """The modules of the batched rounds (which run on a GPU without host synchronisation)."""
    assert _scalar_item_writes(path) == []


def _probe(check: Callable[[Path], list[str]], source: str) -> list[str]:
    """``check`` of a throw-away module holding ``source`` (inside the repository: the checks
    name paths relative to it)."""
    f = ROOT / ".seam_probe.py"
    f.write_text(source)
    try:
        return check(f)
    finally:
        f.unlink()


def test_the_scalar_write_check_can_fail():
    got = _probe(_scalar_item_writes, "def g(t, d):\n    t[0] = 1.0\n    t[1:] = -1\n"
                                      "    t[2].fill_(1.0)\n    d['k'] = 'v'\n")
    assert [g.rsplit(":", 1)[1] for g in got] == ["2", "3"]
    assert len(BATCHED) > 20 and any(p.name == "batched_nystrom_growth.py" for p in BATCHED)


def test_the_private_access_check_can_fail():
    got = _probe(_private_touches,
                 "def g(self, m, t):\n    m._k(1)\n    self._ok = 1\n    m.__dict__['a'] = 2\n"
                 "    super()._fine()\n    t._version, t._base\n    cls.x, t._base_of, type(m)._c\n")
    assert sorted(s.split(": ", 1)[1] for s in got) == ["._base_of", "._c", "._k", "__dict__[...] ="]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    pkg = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def test_experiments_never_import_reproduce():
    offenders = [str(p.relative_to(ROOT)) for p in _py(PACKAGE / "experiments")
                 if any(m.startswith("torchbandits.reproduce") for m in _imports(p))]
    assert offenders == []


def test_no_package_file_is_too_long():
    long = {str(p.relative_to(ROOT)): n for p in _py(PACKAGE)
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


# documents outside the project: the papers' digests ("seed 003", "spec §2.7", "(E22)") and the
# first design sketch ("DESIGN.md"; the project's own is docs/design.md)
FOREIGN = re.compile(r"\bseeds? 00[0-9]\b|\bspec(?:'s)? ?§|\bspec [AE]\d|\bDESIGN\.md\b|shared/spec"
                     r"|\((?:[AE]\d{1,2})(?:[,/ ]+[AE]\d{1,2})*\)")


def _code_files() -> list[Path]:
    files = _py(PACKAGE, ROOT / "tests", ROOT / "scripts", ROOT / "benchmarks", ROOT / "examples")
    files += sorted((ROOT / "notebooks").glob("*.ipynb"))
    return [f for f in files if f.name != "test_seams.py"]


def test_no_code_cites_a_document_the_project_does_not_contain():
    hits = [f"{p.relative_to(ROOT)}:{i}: {m.group(0)}" for p in _code_files()
            for i, line in enumerate(p.read_text().splitlines(), 1) if (m := FOREIGN.search(line))]
    assert hits == [], f"{len(hits)} citations of documents outside the project, e.g. {hits[:10]}"
