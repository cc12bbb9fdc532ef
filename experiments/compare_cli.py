"""The command line of ``python -m experiments.compare``: its flags, how each is parsed, and
which of them a cell takes (:func:`experiments.compare.main` runs what they name).

Every flag is checked before any run: a bad one is a message naming it, not a traceback
hours into a cell. An explicit flag always wins over ``--quick``'s slice, and ``--set
latency=REGIME`` names the regime that runs (and is recorded as ``settings.latency``)."""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "CELL_FLAGS",
    "DEFAULTS",
    "DEFAULT_LATENCY",
    "DEFAULT_METHODS",
    "DEFAULT_OUT",
    "DEFAULT_TASK",
    "GRID_OUT",
    "HARNESS_KEYS",
    "METHOD_KEYS",
    "QUICK",
    "RIVAL_RULES",
    "build_parser",
    "cell_latency",
    "check_out",
    "key_values",
    "parse_rules",
    "parse_seeds",
    "parse_sets",
    "split_methods",
]

DEFAULT_TASK = "digits-logreg"
DEFAULT_METHODS = ("auto", "wait-for-all", "deadline", "deadline-best", "first-k", "fedbuff")
#: The quick slice (< 60 s): every kind of method on a small federation, one seed. A flag
#: given with ``--quick`` replaces its entry.
QUICK = {"n": 6, "rounds": 3, "seeds": [0], "dev_seeds": [0], "target": 0.4,
         "methods": [*DEFAULT_METHODS, "grouped-rs:1"]}
#: Without ``--quick`` or the flag.
DEFAULTS = {"n": 20, "seeds": "10-19", "dev_seeds": "0-2"}
DEFAULT_LATENCY = "persistent"
#: Where ``--grid`` keeps the grid's cells, and where one cell goes without ``--out`` (never
#: the grid's file: one cell written there would replace every cell of the grid).
GRID_OUT = "results/compare.json"
DEFAULT_OUT = "results/compare_cell.json"
#: Run-config keys the harness sets for every run (``rival_runs.Cell.config`` and the
#: methods): ``--set`` refuses them, saying what to use instead (it would be overwritten).
HARNESS_KEYS = {"seed": "use --seeds", "num-rounds": "use --rounds", "num-clients": "use --n",
                "fraction-train": "use --cohort",
                "timing": "no flag: every run is in virtual time",
                "results-dir": "no flag: runs write no result files (the cell's JSON: --out)",
                "rival": "use --methods",
                "s": "use --methods (auto, or CODE:s such as grouped-rs:2)"}
#: Run-config keys a method sets for its own runs (``rival_runs.coded_config``): ``--set``
#: refuses them too (``auto`` would silently run as ``auto-approximate``).
METHOD_KEYS = {"auto-approximate": "use --methods auto-approximate (auto is the exact one)"}
#: The flags of one cell (``parse_cell``): ``--grid`` refuses them (its cells are the grid
#: file's).
CELL_FLAGS = ("task", "latency", "n", "cohort", "seeds", "dev_seeds", "rounds", "target",
              "set", "rule", "quick")
#: The rules of experiments/grid.toml (the rivals', and auto's stop of its amendment 15) that
#: ``--rule`` may replace for one cell (a sensitivity reading or a rival tuned on development
#: seeds), with the values they take.
RIVAL_RULES = {
    "overcommit": ("first-k samples ceil(c K) to keep K: c >= 1", lambda v: v >= 1),
    "fedbuff_buffer_fraction": ("FedBuff's K over the cohort: in (0, 1]", lambda v: 0 < v <= 1),
    "fedbuff_server_lr": ("FedBuff's server learning rate: > 0", lambda v: v > 0),
    "fedbuff_staleness_exponent": ("FedBuff's weight (1 + staleness)^-e: e >= 0",
                                   lambda v: v >= 0),
    "rivals_stop_dropped_work": ("deadline, deadline-best and first-k stop a dropped client's "
                              "work when its round ends: 1, or 0 (it finishes it)",
                              lambda v: v in (0, 1)),
    "auto_stop_at_decode": ("auto and auto-approximate stop a client's late work when their "
                            "round ends (stop-late-work='decode'): 1, or 0 (at the round's "
                            "deadline)", lambda v: v in (0, 1)),
    "codes_stop_at_decode": ("the fixed codes (CODE:s) stop a client's late work when their "
                             "round ends (stop-late-work='decode'): 1, or 0 (at the round's "
                             "deadline)", lambda v: v in (0, 1)),
    "codes_own_deadline": ("each fixed code (CODE:s) stops waiting at the stated deadline "
                           "rule applied to its own client times: 1, or 0 (at the stated "
                           "deadline of wait-for-all's)", lambda v: v in (0, 1)),
    "deadline_grid_extend": ("how many times deadline-best's grid grows past an edge pick: "
                             "an integer >= 0 (0: the grid only)",
                             lambda v: v >= 0 and v == int(v)),
    "fedbuff_tune": ("FedBuff's server lr and K chosen on the development seeds from the grid "
                     "file's fedbuff_tune_* lists: 1, or 0 (fedbuff_server_lr and "
                     "fedbuff_buffer_fraction as they are)", lambda v: v in (0, 1)),
    "first_k_tune": ("first-k's over-commitment chosen on the development seeds from the grid "
                     "file's first_k_tune_overcommit list: 1, or 0 (overcommit as it is)",
                     lambda v: v in (0, 1)),
    "fedbuff_tune_extend": ("how many times FedBuff's tuning lists grow past an edge pick: "
                            "an integer >= 0 (0: the lists only)",
                            lambda v: v >= 0 and v == int(v)),
    "first_k_tune_extend": ("how many times first-k's over-commitment list grows past an "
                            "edge pick: an integer >= 0 (0: the list only)",
                            lambda v: v >= 0 and v == int(v)),
}


def build_parser(doc: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments.compare", description=doc)
    parser.add_argument("--task", default=None,
                        help="a task of experiments/grid.toml (digits-logreg, mnist1d-cnn, "
                             "natural-noniid); default: digits-logreg, the main job's")
    parser.add_argument("--latency", default=None,
                        help="a latency regime of experiments/grid.toml ('': the key table's "
                             f"defaults); default: the regime --set latency=... names, else "
                             f"{DEFAULT_LATENCY}")
    parser.add_argument("--n", type=int, default=None, help=f"default: {DEFAULTS['n']}")
    parser.add_argument("--cohort", type=int, default=None,
                        help="clients sampled each round (1..n); default: n")
    parser.add_argument("--methods", default="",
                        help="comma list of auto, auto-approximate, wait-for-all (under --set "
                             "dp=...: the wrapper with the identity code), deadline, "
                             "deadline-best, first-k, fedbuff, fedbuff-replicated (FedBuff "
                             "over partitions held by s + 1 clients, s picked on the "
                             "development seeds), fedbuff-auto (the main job's "
                             "asynchronous=true s='auto': s = 1 with the replication rule "
                             "picked on development seeds, docs/adaptive.md; FedBuff's K and "
                             "server lr) and fixed codes CODE:s, any registry code "
                             "(exact: grouped-rs, crc, frc, comm-efficient, ...; approximate: "
                             "bgc, expander, ignore-stragglers; e.g. grouped-rs:2); "
                             f"default: {','.join(DEFAULT_METHODS)} (with --grid: the "
                             "grid's default list and its fixed codes)")
    parser.add_argument("--seeds", default=None,
                        help="evaluation seeds, e.g. 0,1,2 or 10-19 (non-negative); "
                             f"default: {DEFAULTS['seeds']}")
    parser.add_argument("--dev-seeds", default=None,
                        help="seeds whose wait-for-all runs fix the stated deadline; "
                             f"default: {DEFAULTS['dev_seeds']}")
    parser.add_argument("--rounds", type=int, default=None, help="default: grid.toml's")
    parser.add_argument("--target", type=float, default=None, help="default: the task's")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a run-config key of the main job (fl_gradcode/config/keys.py, "
                             "docs/options.md), repeatable, e.g. --set latency=bimodal --set "
                             "latency-p=0.1; the keys the harness sets itself (seed, "
                             "num-rounds, num-clients, fraction-train, s, ...) are refused, "
                             "naming the flag to use")
    parser.add_argument("--rule", action="append", default=[], metavar="KEY=VALUE",
                        help="replace a rival's rule of experiments/grid.toml for this cell "
                             "(repeatable; recorded as settings.rules_set): "
                             f"{', '.join(RIVAL_RULES)}; e.g. --rule "
                             "fedbuff_staleness_exponent=0")
    parser.add_argument("--out", default=None,
                        help=f"default: {GRID_OUT} with --grid, else {DEFAULT_OUT} (one cell "
                             "is never written over a grid's file; an existing file is "
                             "replaced when the comparison ends); a comparison cut off "
                             "resumes from OUT.journal.jsonl when run again with the same "
                             "flags and code (a journal another cell, seeds or code left is "
                             "set aside as OUT.journal.jsonl.stale); the file's keys: "
                             "docs/results.md#one-comparisons-file")
    parser.add_argument("--grid", action="store_true",
                        help="run the cells of experiments/grid.toml on its evaluation "
                             "seeds, merging each finished cell into --out")
    parser.add_argument("--cells", default="*",
                        help="with --grid: comma-separated patterns (fnmatch) of cell ids "
                             "TASK/LATENCY/NxCOHORT, e.g. 'digits-logreg/*/20x20' (with "
                             "--merge: the cells merged)")
    parser.add_argument("--rerun", action="store_true",
                        help="with --grid and --methods: cells already in --out run only "
                             "--methods again (their runs replaced); other cells run fully")
    parser.add_argument("--merge", default=None,
                        help="with --grid: comma-separated grid files (each the --out of a "
                             "run in parallel) whose cells are merged into --out; runs nothing; "
                             "with --methods, only those methods of each cell's last re-run "
                             "(every other method as --out has it)")
    parser.add_argument("--quick", action="store_true",
                        help=f"the quick slice (flags given with it replace its entries): "
                             f"{QUICK}")
    return parser


def key_values(pairs: Sequence[str], flag: str) -> list[tuple[str, str, str]]:
    """``(pair, key, value text)`` of each ``KEY=VALUE`` given to ``flag`` (one without ``=``
    is refused, naming it)."""
    out: list[tuple[str, str, str]] = []
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep:
            raise ValueError(f"{flag} {pair!r}: expected KEY=VALUE")
        earlier = [p for p, n, _ in out if n == name]
        if earlier:  # the last would win and the first be lost without a word
            raise ValueError(f"{flag} {pair!r}: {name} is already given ({earlier[0]!r}); "
                             "give each key once")
        out.append((pair, name, text))
    return out


def parse_sets(pairs: Sequence[str]) -> dict[str, Any]:
    """``["latency-p=0.1", ...]`` -> run-config values, each parsed as its key's type."""
    from fl_gradcode.config.keys import key

    out: dict[str, Any] = {}
    for pair, name, text in key_values(pairs, "--set"):
        try:
            entry = key(name)
        except KeyError:
            raise ValueError(f"--set {pair!r}: unknown run-config key {name!r} (see "
                             "fl_gradcode/config/keys.py)") from None
        if name in HARNESS_KEYS:
            raise ValueError(f"--set {pair!r}: the harness sets {name} for every run (it "
                             f"would be overwritten); {HARNESS_KEYS[name]}")
        if name in METHOD_KEYS:
            raise ValueError(f"--set {pair!r}: the methods set {name} themselves; "
                             f"{METHOD_KEYS[name]}")
        if text in entry.also:
            out[name] = text
            continue
        kind = entry.value_type
        if kind is bool:
            if text.lower() not in ("true", "false"):
                raise ValueError(f"--set {pair!r}: {name} takes true or false")
            out[name] = text.lower() == "true"
        else:
            try:
                out[name] = kind(text)
            except ValueError:
                raise ValueError(f"--set {pair!r}: {name} takes a {kind.__name__}") from None
    return out


def parse_rules(pairs: Sequence[str]) -> dict[str, float]:
    """``["fedbuff_server_lr=2", ...]`` -> rival rules (:data:`RIVAL_RULES`), each checked."""
    out: dict[str, float] = {}
    for pair, name, text in key_values(pairs, "--rule"):
        if name not in RIVAL_RULES:
            raise ValueError(f"--rule {pair!r}: {name!r} is not a rival's rule; expected one of "
                             f"{list(RIVAL_RULES)}")
        what, ok = RIVAL_RULES[name]
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"--rule {pair!r}: expected a number ({what})") from None
        if not (math.isfinite(value) and ok(value)):
            raise ValueError(f"--rule {pair!r}: {what}")
        out[name] = value
    return out


#: The most seeds one flag takes (a run each per method: far more than a machine runs).
MAX_SEEDS = 10_000


def parse_seeds(text: str, flag: str = "--seeds") -> list[int]:
    """``"0,1,2"`` or ``"10-19"`` (or both, comma separated): non-negative integers, at least
    one, none twice (a ``ValueError`` naming ``flag`` otherwise)."""
    seeds: list[int] = []
    def digits(t: str) -> bool:  # ASCII: "²".isdigit() holds, int("²") fails
        return t.isascii() and t.isdigit()

    for part in (p.strip() for p in text.split(",") if p.strip()):
        lo, sep, hi = part.partition("-")
        if sep and digits(lo) and digits(hi) and int(lo) <= int(hi):
            span = range(int(lo), int(hi) + 1)
        elif digits(part):
            span = range(int(part), int(part) + 1)
        else:
            raise ValueError(f"{flag} {text!r}: expected non-negative integers like 0,1,2 or "
                             "ranges like 10-19 (low-high)")
        # counted before the range is listed: a huge one is refused, not built
        if len(seeds) + len(span) > MAX_SEEDS:
            raise ValueError(f"{flag} {text!r}: {len(seeds) + len(span)} seeds; expected at "
                             f"most {MAX_SEEDS}")
        seeds.extend(span)
    if not seeds:
        raise ValueError(f"{flag} {text!r}: expected at least one seed")
    if too_large := [seed for seed in seeds if seed >= 2**63]:
        raise ValueError(f"{flag} {text!r}: seed {too_large[0]} is too large; expected "
                         "seeds below 2**63")
    if twice := repeated(seeds):
        raise ValueError(f"{flag} {text!r}: seeds {twice} given twice")
    return seeds


def repeated(items: Sequence[Any]) -> list[Any]:
    """The items given more than once, sorted."""
    return sorted(item for item, times in Counter(items).items() if times > 1)


def split_methods(text: str) -> list[str]:
    """``"auto, fedbuff"`` -> ``["auto", "fedbuff"]``; a method named twice, or a list that
    names none (``","``), is refused."""
    methods = [m.strip() for m in text.split(",") if m.strip()]
    if text.strip() and not methods:
        raise ValueError(f"--methods {text!r}: names no method (leave it out for the default "
                         "list)")
    if twice := repeated(methods):
        raise ValueError(f"--methods {text!r}: {twice} named twice")
    return methods


def cell_latency(flag: str | None, sets: Mapping[str, Any], tables: Mapping[str, Any]) -> str:
    """The grid's latency table a cell takes: ``--latency`` when given; else the table of the
    regime ``--set latency=...`` names ('' , the key table's defaults, when the grid has no
    table of that name: the other regime's keys must not ride along); else the default."""
    if flag is not None:
        return flag
    if "latency" in sets:
        name = str(sets["latency"])
        return name if name in tables else ""
    return DEFAULT_LATENCY


def check_out(out: Path) -> None:
    """Refuse, before any run, to write one cell over a file holding a grid's cells, or to
    a directory."""
    if out.is_dir():
        raise ValueError(f"--out {out} is a directory: pass a file name (e.g. {out}/cell.json)")
    try:  # the directory the run writes in (and its journal): made now, or refused now
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {out}: its directory cannot be made ({exc.strerror}: "
                         f"{exc.filename})") from None
    try:
        held = json.loads(out.read_text())
    except (OSError, ValueError):
        return
    if isinstance(held, dict) and "cells" in held:
        raise ValueError(f"--out {out} holds a grid ({len(held['cells'])} cells) that one "
                         "cell would replace: pass another --out (or run it with --grid)")
