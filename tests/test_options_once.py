"""Each option's default is declared once, checked on the source.

An option is a keyword of ``GradientCoding``. Its default is declared by a literal: a
function's keyword default, a class-level field (the option groups' dataclass fields, a
class attribute named after the option), or the default of the run-config key that sets the
keyword (``fl_gradcode/config/keys.py``). Everywhere else the default is read from that one
declaration (``timing: str = TimingOptions.mode``; a group field from
``KEYWORD_DEFAULTS["timing"]``), which is not a literal. The test parses ``fl_gradcode/flower``
and ``fl_gradcode/config`` and fails when an option has two literal declarations (or a
run-config key repeats a Python declaration's value: the key and the group would then be two
copies held equal by tests, not by the code). Where the code does not follow the rule yet,
the offence is listed in ``KNOWN_TWICE`` with the reason, and the test asserts that the
offences found EQUAL the table (as ``tests/test_structure.py`` does).

``None`` for a keyword in :data:`NOT_GIVEN` means "not given" (what it resolves to is a rule,
written once, in ``Options.from_keywords``): it is not a declared default. A literal named
after an option that holds another fact (a protocol field's parse default, a clock's name, a
probe's secret seed) is listed in :data:`NOT_THE_OPTION` with the reason, by its place.
Outside the option layer a public class keeps a default by reading the declaration
(``seed: int = KEYWORD_DEFAULTS["seed"]``; a clock's ``TimingDefault``, read when used).
"""

from __future__ import annotations

import ast
import inspect
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*(ROOT / "fl_gradcode" / "flower").rglob("*.py"),
                  *(ROOT / "fl_gradcode" / "config").glob("*.py")])
OPTION_GROUPS = ROOT / "fl_gradcode" / "flower" / "options.py"
# an option group's field named otherwise than its keyword
FIELD_KEYWORD = {"mode": "timing", "nonce": "dp_run_nonce"}
# keywords whose None means "not given" (resolved by a rule), not a default value
NOT_GIVEN = {"busy", "dp", "server_noise", "code_options", "m", "results_dir", "evaluate_fn",
             "run_config", "code_policy", "num_partitions", "roster"}
_UNSET = object()

# option -> why a second literal declaration is still there (none left: collaborators
# receive the option's value from the wrapper, and the public DeadlineFedAvg rival and
# VirtualClock read their defaults from the one declaration)
KNOWN_TWICE: dict[str, str] = {}

_INSTRUCTION = ("the protocol's parse default of a field a message left out (the server "
                "always sends it): the wire format older peers rely on, not the option")
# "path qualified.name" -> why a literal named after an option is another fact, not a
# declaration of the option's default
NOT_THE_OPTION: dict[str, str] = {
    **{f"fl_gradcode/flower/protocol.py Instruction.{field}": _INSTRUCTION
       for field in ("seed", "timing", "dp", "wire")},
    "fl_gradcode/flower/clock.py VirtualClock.timing": "the clock's own name in the registry "
        "of timing modes (the values the option accepts), not a default",
    "fl_gradcode/flower/clock.py WallClock.timing": "the clock's own name in the registry "
        "of timing modes (the values the option accepts), not a default",
    "fl_gradcode/flower/integrity.py Probe.__init__()": "the probe's secret words (None: "
        "drawn from the OS), never the run's seed",
}


def gradient_coding_keywords() -> set[str]:
    from fl_gradcode.flower import GradientCoding

    return set(inspect.signature(GradientCoding.__init__).parameters) - {"self", "strategy"}


def literal(node: ast.expr | None) -> object:
    """The node's value if it is a literal, else ``_UNSET`` (a name, an attribute, a call)."""
    if node is None:
        return _UNSET
    try:
        return ast.literal_eval(node)
    except ValueError:
        return _UNSET


def qualified_names(tree: ast.Module) -> dict[ast.AST, str]:
    """Each class and function of ``tree`` -> its qualified name (``Probe.__init__``)."""
    names: dict[ast.AST, str] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                names[child] = prefix + child.name
                visit(child, names[child] + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return names


def declarations(path: Path, options: set[str]) -> list[tuple[str, object, str]]:
    """``(option, literal default, where)`` for each literal default of an option in
    ``path``: keyword defaults, class-level fields and run-config keys (``Key(...)``);
    ``where`` is ``"path:line qualified.name"``."""
    found = []
    tree = ast.parse(path.read_text())
    name = path.relative_to(ROOT).as_posix()
    qualified = qualified_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            with_default = positional[len(positional) - len(args.defaults):]
            pairs = [*zip(with_default, args.defaults, strict=True),
                     *zip(args.kwonlyargs, args.kw_defaults, strict=True)]
            for arg, default in pairs:
                value = literal(default)
                if arg.arg in options and value is not _UNSET:
                    found.append((arg.arg, value,
                                  f"{name}:{node.lineno} {qualified[node]}()"))
        elif isinstance(node, ast.ClassDef):
            for statement in node.body:
                if isinstance(statement, ast.AnnAssign):
                    targets, value_node = [statement.target], statement.value
                elif isinstance(statement, ast.Assign):
                    targets, value_node = statement.targets, statement.value
                else:
                    continue
                for target in targets:
                    if not isinstance(target, ast.Name):
                        continue
                    option = target.id
                    if path == OPTION_GROUPS:
                        option = FIELD_KEYWORD.get(option, option)
                    value = literal(value_node)
                    if option in options and value is not _UNSET:
                        found.append((option, value,
                                      f"{name}:{statement.lineno} {qualified[node]}."
                                      f"{target.id}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "Key"):
            words = {k.arg: k.value for k in node.keywords}
            keyword = literal(words.get("keyword"))
            if keyword in options and len(node.args) >= 2:
                value = literal(node.args[1])
                if value is not _UNSET and literal(words.get("none_when")) == value:
                    value = None  # the key's none_when: the keyword's None
                if value is not _UNSET:
                    found.append((keyword, value, f"{name}:{node.lineno} Key({keyword!r})"))
    return found


def site(where: str) -> str:
    """``"path qualified.name"``: a declaration's place without its line number."""
    path_line, _, qualified = where.partition(" ")
    return f"{path_line.rpartition(':')[0]} {qualified}"


def twice(sources: list[Path]) -> dict[str, list[tuple[object, str]]]:
    """Options declared twice: two Python declarations, or a run-config key whose default
    equals a Python declaration's (sites in :data:`NOT_THE_OPTION` left out)."""
    options = gradient_coding_keywords()
    sites: dict[str, list[tuple[object, str]]] = defaultdict(list)
    for path in sources:
        for option, value, where in declarations(path, options):
            if (value is None and option in NOT_GIVEN) or site(where) in NOT_THE_OPTION:
                continue
            sites[option].append((value, where))
    offences = {}
    for option, found in sites.items():
        python = [(v, w) for v, w in found if " Key(" not in w]
        keys = [(v, w) for v, w in found if " Key(" in w]
        if len(python) > 1 or any(v == p for v, _ in keys for p, _ in python):
            offences[option] = found
    return offences


def test_no_option_default_is_declared_twice():
    found = twice(SOURCES)
    described = {option: sorted(where for _, where in sites) for option, sites in found.items()}
    assert set(found) == set(KNOWN_TWICE), described


def test_every_site_that_is_not_the_option_is_still_there():
    options = gradient_coding_keywords()
    seen = {site(where) for path in SOURCES for _, _, where in declarations(path, options)}
    assert set(NOT_THE_OPTION) <= seen, set(NOT_THE_OPTION) - seen


def test_the_rule_sees_a_default_declared_twice(tmp_path):
    copy = tmp_path / "copy.py"
    copy.write_text("from dataclasses import dataclass\n\n"
                    "def policy(*, stop_late_work=False, straggler_timeout=10.0, s_max=None,\n"
                    "           busy=None):\n    pass\n\n"
                    "@dataclass\nclass Group:\n    stop_late_work: bool = False\n"
                    "    s_max: int | None = None\n    busy: str | None = None\n\n"
                    "KEYS = (Key('straggler-timeout', 10.0, 'x', keyword='straggler_timeout'),\n"
                    "        Key('s-max', 4, 'x', keyword='s_max', none_when=0))\n")
    real_root = ROOT
    globals()["ROOT"] = tmp_path  # the sites are named relative to ROOT
    try:
        found = twice([copy])
    finally:
        globals()["ROOT"] = real_root
    # busy=None is "not given"; the key's s-max default (4) is another value than None
    assert set(found) == {"stop_late_work", "straggler_timeout", "s_max"}
    assert [v for v, _ in found["straggler_timeout"]] == [10.0, 10.0]


def test_an_assigned_accountant_is_the_one_the_options_hold():
    from flwr.serverapp.strategy import FedAvg

    from fl_gradcode.flower import GradientCoding
    from fl_gradcode.privacy import DPConfig, PrivacyAccountant

    strategy = GradientCoding(FedAvg(), dp=DPConfig(mode="central"))
    accountant = PrivacyAccountant(DPConfig(mode="central"), [(1.0, 1.0, 1)])
    strategy.accountant = accountant
    assert strategy.accountant is accountant
    assert strategy.options.privacy.accountant is accountant  # no stale privacy group
    assert strategy.options.get("accountant") is accountant


def test_the_other_option_attributes_are_read_only():
    from flwr.serverapp.strategy import FedAvg

    from fl_gradcode.flower import GradientCoding

    strategy = GradientCoding(FedAvg(), timing="virtual")
    with pytest.raises(AttributeError, match="timing is an option"):
        strategy.timing = "wallclock"
    assert strategy.timing == "virtual" and strategy.options.timing.mode == "virtual"
