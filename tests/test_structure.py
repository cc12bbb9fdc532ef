"""Rules of fl_gradcode's structure, checked on its source.

(a) no module over ``MAX_LINES`` lines; (b) no module reads another module's private
attributes; (c) the maths modules import no Flower. Where the code does not follow a rule yet,
the offence is listed in a ``KNOWN_*`` table with the reason, and the test asserts that the
offences found EQUAL the table: a new offence fails, and so does an entry that no longer
applies (delete it when the module is fixed).

What counts as a private read (b): ``x._name`` (one leading underscore, not a dunder) where
``x`` is not ``self``, ``cls`` or ``super()`` and ``_name`` is not defined in the same module
(as a module-level name, a class attribute or method, or a ``self._name`` assignment): reading
a private attribute of an object whose class is defined in the same module is the module's own
business. Also ``from m import _name`` from any other module. Reads of third-party private
attributes count as well (they break when that library changes).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fl_gradcode"
MAX_LINES = 600

# module -> why it is still over MAX_LINES
KNOWN_LONG: dict[str, str] = {}

# "module: expression" -> why the private read is still there
KNOWN_PRIVATE_READS: dict[str, str] = {
    "fl_gradcode/flower/compat.py: sys._getframe":
        "the composition check walks the calling frames (CPython's documented frame access)",
    "fl_gradcode/learning.py: gsm._close":
        "Opacus' GradSampleModule hooks are removed through its private _close",
}

# maths modules: numpy/scipy only, no Flower (imported in a fresh interpreter)
MATHS = ["fl_gradcode.codes", "fl_gradcode.latency", "fl_gradcode.privacy", "fl_gradcode.matmul",
         "fl_gradcode.adaptive", "fl_gradcode.devices", "fl_gradcode.tasks"]


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def defined_private_names(tree: ast.Module) -> set[str]:
    """Private attributes of the module's own classes: defined in a class body, or assigned as
    ``self._x`` / ``cls._x`` in its methods."""
    names: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
        for node in ast.walk(cls):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del))
                    and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                names.add(node.attr)
    return {n for n in names if is_private(n)}


def private_reads(path: Path) -> set[str]:
    """``"module: expression"`` for every read of another module's private attribute."""
    return private_reads_in(path.read_text(), rel(path))


def private_reads_in(source: str, name: str) -> set[str]:
    tree = ast.parse(source)
    own = defined_private_names(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if is_private(alias.name):
                    found.add(f"{name}: from {'.' * node.level}{node.module or ''} "
                              f"import {alias.name}")
        elif isinstance(node, ast.Attribute) and is_private(node.attr):
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
            if (isinstance(base, ast.Call) and isinstance(base.func, ast.Name)
                    and base.func.id == "super"):
                continue
            if node.attr in own:
                continue
            found.add(f"{name}: {ast.unparse(node)}")
    return found


def test_no_module_is_longer_than_the_limit_except_the_known_ones():
    long = {rel(p): lines(p) for p in modules() if lines(p) > MAX_LINES}
    assert set(long) == set(KNOWN_LONG), (
        f"modules over {MAX_LINES} lines: {long}; known: {sorted(KNOWN_LONG)} "
        "(a known module now short enough: delete its entry)"
    )


def test_no_module_reads_another_modules_private_attributes_except_the_known_ones():
    found = set().union(*(private_reads(p) for p in modules()))
    assert found == set(KNOWN_PRIVATE_READS), (
        f"new: {sorted(found - set(KNOWN_PRIVATE_READS))}; "
        f"no longer there (delete the entry): {sorted(set(KNOWN_PRIVATE_READS) - found)}"
    )


def test_the_maths_modules_import_no_flower():
    code = (f"import sys\nimport {', '.join(MATHS)}\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'flwr' "
            "or m.startswith('fl_gradcode.flower')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout
    for path in modules():
        if not any(rel(path).startswith(m.replace(".", "/")) for m in MATHS):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(("flwr", "fl_gradcode.flower")), (rel(path), name)
                assert not (isinstance(node, ast.ImportFrom) and node.level
                            and name.startswith("flower")), (rel(path), name)


def test_the_private_read_rule_sees_what_it_should():
    """The checker itself: a foreign read is found, reads of the module's own are not."""
    source = (
        "import other\nfrom other import _hidden\n"
        "class A:\n    def __init__(self):\n        self._mine = 1\n"
        "    def f(self, b):\n        return b._mine + other._theirs + super()._x + self._y\n"
    )
    assert private_reads_in(source, "m.py") == {"m.py: from other import _hidden",
                                                "m.py: other._theirs"}
