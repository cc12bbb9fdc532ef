"""Rules of fl_gradcode's structure, checked on its source ((a) also holds server/, clients/,
experiments/, tools/, examples/ and tests/ to the limit).

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
from collections.abc import Iterable
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


def on_own_instance(base: ast.expr) -> bool:
    """Whether an attribute is read on ``self``, ``cls`` or ``super()`` (its class's own)."""
    if isinstance(base, ast.Name) and base.id in ("self", "cls"):
        return True
    return (isinstance(base, ast.Call) and isinstance(base.func, ast.Name)
            and base.func.id == "super")


def bound_names(nodes: Iterable[ast.AST]) -> set[str]:
    """The names the functions, classes and plain assignments among ``nodes`` bind."""
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def defined_private_names(tree: ast.Module) -> set[str]:
    """Private attributes of the module's own classes: defined in a class body, or assigned as
    ``self._x`` / ``cls._x`` in its methods."""
    names: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        names |= bound_names(cls.body)
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
            if on_own_instance(node.value):
                continue
            if node.attr in own:
                continue
            found.add(f"{name}: {ast.unparse(node)}")
    return found


def product_modules() -> list[Path]:
    """The package and what ships beside it: the main job (server, clients), the benchmark
    and experiments, the tools, the examples and the tests."""
    dirs = [ROOT / d for d in ("server", "clients", "experiments", "tools", "examples", "tests")]
    assert all(d.is_dir() for d in dirs), [d for d in dirs if not d.is_dir()]
    return modules() + sorted(p for d in dirs for p in d.rglob("*.py"))


def test_no_module_is_longer_than_the_limit_except_the_known_ones():
    long = {rel(p): lines(p) for p in product_modules() if lines(p) > MAX_LINES}
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


# ---------------------------------------------------------------- experiments/ and tools/
# Packages run with ``python -m experiments.X`` / ``python -m tools.X`` from the repository root:
# no module edits ``sys.path`` or needs an import below code (``noqa: E402``); they read no
# private attribute (of fl_gradcode, server, Flower or each other), and no module outside
# ``experiments/`` reads one of ``experiments``.
SCRIPT_PACKAGES = [ROOT / "experiments", ROOT / "tools"]
OWN_DIRS = {"fl_gradcode", "experiments", "tools", "tests", "server", "clients", "examples"}


def script_modules() -> list[Path]:
    return sorted(p for pkg in SCRIPT_PACKAGES for p in pkg.rglob("*.py"))


def test_experiments_and_tools_edit_no_import_path():
    offences = []
    for path in script_modules():
        text = path.read_text()
        tree = ast.parse(text)
        offences += [f"{rel(path)}:{n.lineno}: sys.path" for n in ast.walk(tree)
                     if isinstance(n, ast.Attribute) and n.attr == "path"
                     and isinstance(n.value, ast.Name) and n.value.id == "sys"]
        offences += [f"{rel(path)}:{i}: noqa: E402" for i, line in
                     enumerate(text.splitlines(), 1) if "E402" in line]
    assert offences == []
    assert (ROOT / "experiments" / "__init__.py").is_file()
    assert (ROOT / "tools" / "__init__.py").is_file()


def test_experiments_and_tools_read_no_private_attribute():
    found = set().union(*(private_reads(p) for p in script_modules()))
    assert found == set()


def package_imports(tree: ast.Module, package: str, name: str) -> tuple[set[str], set[str]]:
    """``(bound, found)``: the names the file binds to ``package``'s modules or objects, and
    ``"file: import ..."`` for each import of a private name of it (``from package... import
    _x``, ``import package._x``)."""
    bound: set[str] = set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (
                node.module or "").split(".")[0] == package:
            for alias in node.names:
                if is_private(alias.name) or any(map(is_private, node.module.split("."))):
                    found.add(f"{name}: from {node.module} import {alias.name}")
                bound.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] != package:
                    continue
                if any(map(is_private, parts)):
                    found.add(f"{name}: import {alias.name}")
                bound.add(alias.asname or parts[0])
    return bound, found


def experiments_private_reads_in(source: str, name: str) -> set[str]:
    """Reads of a private name of the ``experiments`` package: ``from experiments... import
    _x``, ``import experiments._x``, and ``m._x`` where ``m`` was imported from it."""
    tree = ast.parse(source)
    bound, found = package_imports(tree, "experiments", name)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and is_private(node.attr)
                and isinstance(node.value, ast.Name) and node.value.id in bound):
            found.add(f"{name}: {ast.unparse(node)}")
    return found


def test_no_module_outside_experiments_reads_its_private_attributes():
    outside = [p for d in sorted(OWN_DIRS - {"experiments"}) for p in (ROOT / d).rglob("*.py")]
    found = set().union(*(experiments_private_reads_in(p.read_text(), rel(p)) for p in outside))
    assert found == set()


def test_the_experiments_private_read_rule_sees_what_it_should():
    source = ("from experiments import _common, compare as c\nimport experiments.first_hour\n"
              "from experiments.time_to_accuracy import ratio_ci\n"
              "x = c._cells + experiments._y + c.cells + ratio_ci\n")
    assert experiments_private_reads_in(source, "t.py") == {
        "t.py: from experiments import _common", "t.py: c._cells", "t.py: experiments._y"}


# ---------------------------------------------------------------- outside the package
# No module outside fl_gradcode reads a private attribute of it: tests go through the public
# API, a collaborator's public interface or the documented test helpers (tests/doubles.py,
# tests/flower/harness.py); experiments, tools, examples and the apps through the public API.
# A read is ``from fl_gradcode... import _x`` (or ``import fl_gradcode.m._x``); ``x._name`` where
# fl_gradcode defines the private name ``_name`` (module-level, in a class body, or as
# ``self._name``) and ``x`` is bound to an fl_gradcode import or the reading file does not define
# ``_name`` itself (its own doubles may); and the same name as a string: ``getattr``, ``setattr``,
# ``hasattr``, ``delattr`` (``monkeypatch.setattr`` too) of ``"_name"``, or a dotted
# ``"fl_gradcode.m._name"`` target.
OUTSIDE = ["tests", "experiments", "tools", "examples", "server", "clients"]
_BY_STRING = {"getattr", "setattr", "hasattr", "delattr"}

# "file: expression" -> why the read stays (no public alternative); none in experiments/
KNOWN_OUTSIDE_READS: dict[str, str] = {
    "tests/flower/test_collaborators.py: setattr(blas, '_blas')":
        "the loaded BLAS libraries are replaced by a double: the machine's own (threadpoolctl's) "
        "cannot be set to a known thread count, and no public seam chooses them",
    "tests/codes/test_codes_fast_decoders.py: setattr(GradientCode, '_least_squares')":
        "the dense fallback is made to fail, to show the fast CRC decoder answers alone (a "
        "speed property: its result equals the dense one by design)",
}


def package_private_names() -> set[str]:
    """Every private name fl_gradcode defines: module-level names (functions, classes,
    assignments, import aliases) and its classes' private attributes."""
    names: set[str] = set()
    for path in modules():
        tree = ast.parse(path.read_text())
        names |= defined_private_names(tree) | bound_names(tree.body)
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update(a.asname for a in node.names if a.asname)
    return {n for n in names if is_private(n)}


def _own_names(tree: ast.Module) -> set[str]:
    """Private names the file defines itself (module level or in its classes)."""
    own = defined_private_names(tree) | bound_names(ast.walk(tree))
    return {n for n in own if is_private(n)}


def package_private_reads_in(source: str, name: str, private: set[str]) -> set[str]:
    """``"file: expression"`` for each read of one of fl_gradcode's ``private`` names."""
    tree = ast.parse(source)
    own = _own_names(tree)
    bound, found = package_imports(tree, "fl_gradcode", name)  # bound: to its modules/objects
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in private:
            base = node.value
            if on_own_instance(base):
                continue
            if node.attr not in own or (isinstance(base, ast.Name) and base.id in bound):
                found.add(f"{name}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else (
                func.attr if isinstance(func, ast.Attribute) else "")
            if called not in _BY_STRING or not node.args:
                continue
            strings = [a for a in node.args[:2] if isinstance(a, ast.Constant)
                       and isinstance(a.value, str)]
            for arg in strings:
                parts = arg.value.split(".")
                if len(parts) > 1 and parts[0] == "fl_gradcode" and any(map(is_private, parts)):
                    found.add(f"{name}: {called}({arg.value!r})")
                elif len(parts) == 1 and arg.value in private and len(node.args) >= 2:
                    found.add(f"{name}: {called}({ast.unparse(node.args[0])}, {arg.value!r})")
    return found


def outside_modules() -> list[Path]:
    return sorted(p for d in OUTSIDE for p in (ROOT / d).rglob("*.py"))


def test_no_module_outside_the_package_reads_its_private_attributes_except_the_known_ones():
    private = package_private_names()
    found = set().union(*(package_private_reads_in(p.read_text(), rel(p), private)
                          for p in outside_modules()))
    assert found == set(KNOWN_OUTSIDE_READS), (
        f"new: {sorted(found - set(KNOWN_OUTSIDE_READS))}; "
        f"no longer there (delete the entry): {sorted(set(KNOWN_OUTSIDE_READS) - found)}"
    )
    assert not any(k.startswith("experiments/") for k in KNOWN_OUTSIDE_READS)


def test_the_outside_private_read_rule_sees_what_it_should():
    source = (
        "import fl_gradcode.flower.decoder as dec\n"
        "from fl_gradcode.codes.cyclic_solver import _refine, refine\n"
        "from fl_gradcode.flower import blas\n"
        "class Double:\n    def __init__(self):\n        self._round = 1\n"
        "def f(strategy, double, monkeypatch):\n"
        "    monkeypatch.setattr(blas, '_blas', list)\n"
        "    monkeypatch.setattr('fl_gradcode.flower.blas._blas', list)\n"
        "    getattr(strategy, '_probe')\n"
        "    return strategy._probe + double._round + dec._round + dec.BLOCK + refine\n"
    )
    found = package_private_reads_in(source, "t.py", {"_refine", "_blas", "_probe", "_round"})
    assert found == {
        "t.py: from fl_gradcode.codes.cyclic_solver import _refine",
        "t.py: setattr(blas, '_blas')", "t.py: setattr('fl_gradcode.flower.blas._blas')",
        "t.py: getattr(strategy, '_probe')", "t.py: strategy._probe", "t.py: dec._round"}
