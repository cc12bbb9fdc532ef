"""The mutation runner's test map (``tests/mutation_map.toml``): every path it names exists,
every module of fl_gradcode with code in it is mutated by exactly one entry, and the runner
reads this map and no other."""

from __future__ import annotations

import ast
import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "tests" / "mutation_map.toml"


def entries() -> dict[str, dict[str, list[str]]]:
    return tomllib.loads(MAP.read_text())


def sources() -> list[str]:
    """fl_gradcode's .py files that define a function (mutmut mutates function bodies only)."""
    out = []
    for path in sorted((ROOT / "fl_gradcode").rglob("*.py")):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(tree)):
            out.append(path.relative_to(ROOT).as_posix())
    return out


def test_every_mapped_test_file_exists_and_every_entry_mutates_some_file():
    files = sources()
    for module, entry in entries().items():
        assert set(entry) == {"mutate", "tests"}, module
        assert entry["tests"], f"{module}: no test file"
        missing = [t for t in entry["tests"] if not (ROOT / t).is_file()]
        assert not missing, f"{module}: test files that do not exist: {missing}"
        assert len(set(entry["tests"])) == len(entry["tests"]), f"{module}: a file twice"
        matched = [f for f in files if any(fnmatch.fnmatch(f, g) for g in entry["mutate"])]
        assert matched, f"{module}: {entry['mutate']} match no module of fl_gradcode"


def test_every_module_of_fl_gradcode_is_mutated_by_exactly_one_entry():
    owners = {
        f: [m for m, e in entries().items() if any(fnmatch.fnmatch(f, g) for g in e["mutate"])]
        for f in sources()
    }
    unmapped = sorted(f for f, o in owners.items() if not o)
    twice = {f: o for f, o in owners.items() if len(o) > 1}
    assert not unmapped, f"modules with no entry in {MAP.name}: {unmapped}"
    assert not twice, f"modules mutated by several entries: {twice}"


def test_the_mutation_runner_reads_this_map():
    from tools import mutation as runner

    assert runner.TEST_MAP == MAP
    assert runner.MODULES == {m: (e["mutate"], e["tests"]) for m, e in entries().items()}
    # a mutant is attributed to the entry of its file, not to a package around it
    assert runner.module_of("fl_gradcode.flower.wrapper.x_f__mutmut_1") == "wrapper"
    assert runner.module_of("fl_gradcode.flower.x___getattr____mutmut_1") == "flower_package"
    assert runner.module_of("fl_gradcode.codes.base.x_f__mutmut_1") == "codes"
