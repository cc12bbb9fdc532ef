"""Mutation testing of fl_gradcode with mutmut 3: an optional diagnostic, run when you want it.

It is not a gate (no test checks a score or that every module is covered) and not a source of
test names: a survivor is a prompt to read its diff and ask whether a user could observe the
change; if so, write a behaviour test named after what it checks, otherwise note why not.

How to run it (needs ``pip install mutmut``; minutes to hours per module on two cores)::

    python -m tools.mutation --module privacy --max-mutants 50   # a quick look at one module
    python -m tools.mutation --module codes --module adaptive    # every mutant of two
    python -m tools.mutation                                     # every preset (hours)
    python -m tools.mutation --module privacy --recheck          # after writing new tests

Options: ``[--module M ...] [--max-mutants N] [--full-up-to N] [--seed S]
[--max-children C] [--deselect TEST_ID ...] [--workdir DIR] [--out FILE]``.

``M`` is a preset of ``tools/mutation_map.toml`` (``codes``, ``privacy``, ``wrapper``,
``adaptive``, ...; default: all): the files it mutates and the FAST test files run against
them (``-m "not simulation and not deployment"``); mutmut runs, per mutant, only the tests
that executed the mutated function. Edit or add a preset to mutate something else; a listed
test file that does not exist is skipped with a note.

mutmut writes a ``mutants/`` tree into the directory it runs in, so the run happens in a scratch
copy of the project (``--workdir``, default a temporary directory): the working tree is never
touched. Each module gets its own copy, ``only_mutate`` and test selection.

``--max-mutants N`` tests a fixed-seed random sample of N mutants per module (the JSON then says
``"sampled": true`` and gives the ``population``). Results go to ``results/mutation.json``::

    {"<module>": {"killed": k, "total": t, "sampled": bool, "population": P,
                  "survived": [{"mutant": name, "diff": "...", "reason": "..."}], ...}, ...}

``killed`` counts mutmut's "killed" and "timeout" verdicts; ``total`` counts every tested
mutant (survivors, mutants no selected test executes, suspicious ones). A survivor's
``reason`` is a reviewer's note written into that JSON after reading the diff (an equivalent
mutant and why, or the test that now kills it); a later run carries the note over only while
the same mutant has the same diff (mutmut's names are numbered per function, so a name alone
may denote another change after an edit), and says ``"not reviewed"`` otherwise.
``--full-up-to N`` runs every mutant of a module with at most N.

``--recheck`` (after writing tests for the survivors): re-runs, in a fresh scratch copy (the new
tests collected, their stats gathered), only the mutants the module's entry in ``--out`` lists
as survivors, and replaces their verdicts with mutmut's (``"rechecked"`` records it); it refuses
if a listed mutant's diff changed (the source moved on: re-run the sample). Every ``timeout``
verdict is confirmed by applying the mutant alone to the scratch copy and running its tests
without mutmut's CPU limit (``--alone-timeout`` seconds): a hang stays killed, a pass becomes a
survivor (a timeout on a loaded machine is not a kill).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAST = ["-m", "not simulation and not deployment", "-n", "0", "-p", "no:cacheprovider",
        "-p", "no:randomly",
        "-W", "ignore::DeprecationWarning", "-x", "-q"]
TEST_MAP = Path(__file__).resolve().with_name("mutation_map.toml")
UNREVIEWED = "not reviewed"


def load_test_map(path: Path = TEST_MAP) -> dict[str, tuple[list[str], list[str]]]:
    """module -> (files mutated, its fast test files), from the presets (``path``)."""
    table = tomllib.loads(path.read_text())
    return {module: (list(entry["mutate"]), list(entry["tests"]))
            for module, entry in table.items()}


def existing_tests(tests: list[str]) -> list[str]:
    """``tests`` without the files that do not exist (each named on stderr)."""
    missing = [t for t in tests if not (ROOT / t).is_file()]
    for t in missing:
        print(f"note: {t} (in {TEST_MAP.name}) does not exist; skipped", file=sys.stderr)
    return [t for t in tests if t not in missing]


def reason_of(previous: dict, name: str, diff: str) -> str:
    """The reviewer's note on survivor ``name`` from the previous result of its module
    (``previous``), if it recorded the same diff; else ``UNREVIEWED``."""
    for s in previous.get("survived", []):
        if s.get("mutant") == name and s.get("diff") == diff:
            return s.get("reason", UNREVIEWED)
    return UNREVIEWED


# one mutmut run (scratch copy) per module
MODULES: dict[str, tuple[list[str], list[str]]] = load_test_map()
KILLED = {"killed", "timeout"}


def _mutmut_section(only_mutate: list[str], tests: list[str], extra: list[str]) -> str:
    q = lambda xs: "[" + ", ".join(json.dumps(x) for x in xs) + "]"  # noqa: E731
    return (
        "[tool.mutmut]\n"
        'source_paths = ["fl_gradcode"]\n'
        f"only_mutate = {q(only_mutate)}\n"
        # results: tests that check the committed results/*.json read them from mutants/
        'also_copy = ["server", "clients", "examples", "experiments", "tools", "docs", "results"]\n'
        f"pytest_add_cli_args_test_selection = {q(tests)}\n"
        f"pytest_add_cli_args = {q(FAST + extra)}\n"
        "use_git_change_detection = false\n"
        # fork each mutant from a server that only collected the tests, never from the
        # process that ran them (torch's thread pools make a forked worker deadlock, which
        # mutmut would then report as a "timeout", i.e. killed)
        'process_isolation = "forkserver"\n'
    )


def prepare(workdir: Path, group: str, modules: list[str], extra: list[str]) -> Path:
    """A scratch copy of the project whose ``[tool.mutmut]`` mutates ``modules`` only."""
    dst = workdir / group
    if dst.exists():
        shutil.rmtree(dst)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "results", "mutants", ".git",
                                    "*.png", "*.npz", ".flwr")
    for name in ("fl_gradcode", "tests", "server", "clients", "examples", "experiments", "tools",
                 "docs"):
        if (ROOT / name).exists():
            shutil.copytree(ROOT / name, dst / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dst / name)
    (dst / "results").mkdir()
    for js in (ROOT / "results").glob("*.json"):  # tests that check the committed results
        shutil.copy2(js, dst / "results" / js.name)
    globs = [g for m in modules for g in MODULES[m][0]]
    text = (dst / "pyproject.toml").read_text()
    tests = existing_tests(list(dict.fromkeys(t for m in modules for t in MODULES[m][1])))
    if not tests:
        raise SystemExit(f"{group}: none of its test files exists; edit {TEST_MAP}")
    section = _mutmut_section(globs, tests, extra)
    if "[tool.mutmut]" in text:
        text = re.sub(r"\[tool\.mutmut\]\n(?:(?!\[).*\n)*", section + "\n", text)
    else:
        text += "\n" + section
    (dst / "pyproject.toml").write_text(text)
    return dst


def mutmut(cwd: Path, *names: str, log: Path, max_children: int = 1) -> int:
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *names]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with open(log, "a") as out:
        return subprocess.call(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env)


def load_meta(cwd: Path) -> dict[str, int | None]:
    codes: dict[str, int | None] = {}
    for meta in (cwd / "mutants").rglob("*.py.meta"):
        codes.update(json.loads(meta.read_text())["exit_code_by_key"])
    return codes


def module_of(name: str) -> str | None:
    """The module whose mutated files hold mutant ``name`` (the longest matching prefix)."""
    best, length = None, -1
    for module, (globs, _) in MODULES.items():
        for g in globs:
            prefix = g.removesuffix(".py").removesuffix("/*").removesuffix("/__init__")
            prefix = prefix.replace("/", ".")
            if name.startswith(prefix + ".") and len(prefix) > length:
                best, length = module, len(prefix)
    return best


def diff_of(cwd: Path, name: str) -> str:
    out = subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=cwd,
                         capture_output=True, text=True).stdout
    lines = [ln for ln in out.splitlines()
             if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    return " | ".join(ln.strip() for ln in lines)[:300]


def run_group(group: str, modules: list[str], args: argparse.Namespace,
              previous: dict | None = None) -> dict:
    from mutmut.stats import status_by_exit_code

    extra = [f"--deselect={t}" for t in args.deselect]
    cwd = prepare(args.workdir, group, modules, extra)
    log = args.workdir / f"{group}.log"
    # 1. generate every mutant and collect test<->function stats (nothing is run yet: the
    #    filter matches no mutant, mutmut stops after the stats run)
    mutmut(cwd, "__generate_only__", log=log, max_children=args.max_children)
    population = {name: module_of(name) for name in load_meta(cwd)}
    if not population:
        raise SystemExit(f"mutmut generated no mutants for {group}; see {log}")
    chosen: dict[str, list[str]] = {}
    rng = random.Random(args.seed)
    for module in modules:
        names = sorted(n for n, m in population.items() if m == module)
        if args.max_mutants and len(names) > max(args.max_mutants, args.full_up_to):
            names = sorted(rng.sample(names, args.max_mutants))
        chosen[module] = names
    # 2. run the chosen mutants (explicit names: mutmut tests exactly these)
    todo = [n for names in chosen.values() for n in names]
    for start in range(0, len(todo), 200):  # keep the command line short
        mutmut(cwd, *todo[start : start + 200], log=log, max_children=args.max_children)
    codes = load_meta(cwd)
    if all(codes.get(n) is None for n in todo):
        raise SystemExit(f"mutmut tested no mutant of {group} (stats or clean run failed?); "
                         f"see {log}")
    out = {}
    for module in modules:
        names = chosen[module]
        status = {n: status_by_exit_code[codes.get(n)] for n in names}
        survivors = [n for n, s in status.items() if s not in KILLED]
        total_pop = sum(1 for m in population.values() if m == module)
        diffs = {n: diff_of(cwd, n) for n in survivors}
        before = (previous or {}).get(module, {})
        out[module] = {
            "killed": sum(s in KILLED for s in status.values()),
            "total": len(names),
            "sampled": len(names) < total_pop,
            "population": total_pop,
            "by_status": {s: list(status.values()).count(s) for s in sorted(set(status.values()))},
            "timeouts": sorted(n for n, s in status.items() if s == "timeout"),
            "survived": [
                {"mutant": n, "status": status[n], "diff": diffs[n],
                 "reason": reason_of(before, n, diffs[n])}
                for n in survivors
            ],
        }
    return out


def tests_of(cwd: Path, name: str) -> list[str]:
    """The test ids mutmut runs for mutant ``name`` (those that executed its function)."""
    out = subprocess.run([sys.executable, "-m", "mutmut", "tests-for-mutant", name], cwd=cwd,
                         capture_output=True, text=True).stdout
    return [ln.strip() for ln in out.splitlines() if "::" in ln]


def alone(cwd: Path, name: str, wall_s: float = 120.0) -> str:
    """Apply mutant ``name`` alone to the scratch copy's source, run its tests without mutmut's
    CPU limit, restore the source. 'killed' (a test fails), 'survived' (all pass), 'timeout'
    (still running after ``wall_s`` seconds: a real hang, which counts as killed)."""
    tests = tests_of(cwd, name)
    if not tests:
        return "no tests"
    src = cwd / "fl_gradcode"
    backup = cwd / "_pristine_fl_gradcode"
    shutil.copytree(src, backup)
    try:
        subprocess.run([sys.executable, "-m", "mutmut", "apply", name], cwd=cwd, check=True,
                       capture_output=True)
        env = {**os.environ, "PYTHONPATH": str(cwd), "OMP_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1"}
        try:
            rc = subprocess.run([sys.executable, "-m", "pytest", *FAST, *tests], cwd=cwd, env=env,
                                capture_output=True, timeout=wall_s).returncode
        except subprocess.TimeoutExpired:
            return "timeout"
        return "survived" if rc == 0 else "killed"
    finally:
        shutil.rmtree(src)
        backup.rename(src)


def recheck(module: str, entry: dict, args: argparse.Namespace) -> dict:
    """Re-run, in a fresh scratch copy (new tests collected, stats gathered anew), only the
    mutants ``entry`` lists as survivors, and confirm each timeout verdict by running the
    mutant alone (a timeout on a loaded machine is not a kill); returns the updated entry."""
    from mutmut.stats import status_by_exit_code

    t0 = time.monotonic()
    extra = [f"--deselect={t}" for t in args.deselect]
    cwd = prepare(args.workdir, module, [module], extra)
    log = args.workdir / f"{module}.recheck.log"
    mutmut(cwd, "__generate_only__", log=log, max_children=args.max_children)
    population = load_meta(cwd)
    old = {s["mutant"]: s for s in entry["survived"]}
    changed = [n for n, s in old.items()
               if n not in population or diff_of(cwd, n) != s["diff"]]
    if changed:
        raise SystemExit(f"{module}: the source changed since the run; these mutants are no "
                         f"longer the ones recorded: {changed}; re-run the sample instead")
    names = sorted(old)
    if names:
        mutmut(cwd, *names, log=log, max_children=args.max_children)
    codes = load_meta(cwd)
    status = {n: status_by_exit_code[codes.get(n)] for n in names}
    # a timeout is confirmed (or not) by the mutant alone, without mutmut's CPU limit
    timeouts = sorted(set(entry.get("timeouts", [])) | {n for n, s in status.items()
                                                        if s == "timeout"})
    alone_verdicts = {n: alone(cwd, n, args.alone_timeout) for n in timeouts}
    for n, v in alone_verdicts.items():
        if v not in ("killed", "timeout"):
            status[n] = f"timeout, {v} alone"
    out = dict(entry)
    by_status = dict(entry["by_status"])
    for n, s in status.items():
        before = old[n]["status"] if n in old else "timeout"
        by_status[before] -= 1
        by_status[s] = by_status.get(s, 0) + 1
    out["by_status"] = {k: v for k, v in sorted(by_status.items()) if v}
    survivors = [n for n in sorted(set(names) | set(timeouts)) if status.get(n, "killed")
                 not in KILLED]
    out["killed"] = entry["total"] - len(survivors)
    diffs = {n: old[n]["diff"] if n in old else diff_of(cwd, n) for n in survivors}
    out["survived"] = [
        {"mutant": n, "status": status[n], "diff": diffs[n],
         "reason": reason_of(entry, n, diffs[n])}
        for n in survivors
    ]
    out["rechecked"] = {
        "mutants": len(names), "killed": sum(status[n] in KILLED for n in names),
        "timeouts_confirmed_alone": alone_verdicts,
        "killed_before": entry["killed"], "runtime_s": round(time.monotonic() - t0, 1),
        "command": "python -m tools.mutation " + " ".join(sys.argv[1:]),
    }
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--module", action="append", choices=sorted(MODULES),
                   help="module to mutate (repeatable; default: all)")
    p.add_argument("--max-mutants", type=int, default=0,
                   help="sample at most N mutants per module (fixed seed); 0 = all")
    p.add_argument("--full-up-to", type=int, default=0,
                   help="run every mutant of a module whose population is at most this size "
                        "(sample --max-mutants only above it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-children", type=int, default=1,
                   help="mutmut worker processes (default 1: the machine is shared)")
    p.add_argument("--deselect", action="append", default=[],
                   help="test node id to leave out (e.g. a test broken in the working tree)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="scratch directory for the project copies (default: a temp dir)")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "mutation.json")
    p.add_argument("--recheck", action="store_true",
                   help="re-run only the survivors each module's entry in --out lists (after "
                        "new tests), confirm its timeouts alone, and update its verdicts")
    p.add_argument("--alone-timeout", type=float, default=120.0,
                   help="seconds a timeout mutant's tests may run alone before the timeout "
                        "is confirmed as a hang (--recheck)")
    args = p.parse_args(argv)
    modules = args.module or list(MODULES)
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fl-gradcode-mutation-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    if args.recheck:
        for module in modules:
            if module not in result:
                raise SystemExit(f"--recheck {module}: {args.out} has no entry for it")
            result[module] = recheck(module, result[module], args)
            r = result[module]
            print(f"{module:10s} recheck: killed {r['rechecked']['killed_before']} -> "
                  f"{r['killed']}/{r['total']}")
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        return
    for module in modules:
        mods = [module]
        t1 = time.monotonic()
        result.update(run_group(module, mods, args, previous=result))
        for m in mods:  # each module keeps the settings it was last run with
            result[m]["run"] = {"seed": args.seed, "max_mutants": args.max_mutants,
                                "deselected": args.deselect,
                                "runtime_s": round(time.monotonic() - t1, 1),
                                "command": "python -m tools.mutation "
                                           + " ".join(argv or sys.argv[1:])}
        for m in mods:
            r = result[m]
            print(f"{m:10s} killed {r['killed']}/{r['total']}"
                  + (f" (sampled from {r['population']})" if r["sampled"] else ""))
    meta = result.setdefault("_meta", {})
    import mutmut

    meta.update({"tool": f"mutmut {mutmut.__version__}", "seed": args.seed,
                 "max_mutants": args.max_mutants, "deselected": args.deselect,
                 "command": "python -m tools.mutation " + " ".join(argv or sys.argv[1:]),
                 "last_runtime_s": round(time.monotonic() - t0, 1)})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out} in {time.monotonic() - t0:.0f} s (workdir {args.workdir})")


if __name__ == "__main__":
    main()
