"""Shared plumbing of the experiment scripts: output paths, JSON, progress, figures."""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import re
import subprocess
import sys
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

T = TypeVar("T")


def progress(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """A progress bar on stderr (rich), silent when stderr is not a terminal."""
    from rich.progress import track

    items = list(items) if total is None else items
    yield from track(items, description=description, total=total, transient=True,
                     disable=not sys.stderr.isatty())


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


#: a JSON array of numbers (and nulls) only, as ``json.dumps(indent=...)`` spreads it: one
#: item per line (a raw newline never occurs inside a JSON string, so no string matches)
_FLAT_ARRAY = re.compile(r"\[\n\s*((?:-?[\d.eE+-]+|null)(?:,\n\s*(?:-?[\d.eE+-]+|null))*)\n\s*\]")


def dumps(value: Any) -> str:
    """``value`` as indented JSON with every array of numbers on one line (a curve is a
    line, not one number per line); ``json.loads`` reads back the same value."""
    text = json.dumps(value, indent=2)
    return _FLAT_ARRAY.sub(lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(","))
                           + "]", text)


def save(result: dict, out: str | Path, figure=None) -> Path:
    """Write ``out.json`` (with machine info) and ``out.png`` if a figure is given."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {**result, "machine": {"python": platform.python_version(),
                                    "cpu": platform.machine()}}
    out.with_suffix(".json").write_text(json.dumps(_jsonable(result), indent=2))
    if figure is not None:
        save_figure(figure, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')}" + (" and .png" if figure is not None else ""))
    return out


def save_figure(figure, path: str | Path) -> Path:
    """Write a figure as every experiment's figures are written (120 dpi, tight) and close it."""
    import matplotlib.pyplot as plt

    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return Path(path)


def quiet_flower() -> None:
    """Hide Flower's per-round INFO logs (thousands of lines in in-process runs)."""
    import logging

    logging.getLogger("flwr").setLevel(logging.WARNING)
    logging.getLogger().setLevel(logging.WARNING)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def quantile_deadline(latency: dict, load: float, seed: int, partition_cost: float,
                      q: float = 0.75, n: int = 256) -> float:
    """The ``q``-quantile of one client's time at ``load`` partitions under the latency model
    ``latency`` (run-config keys: ``{"latency": name, "latency-...": value}``) with
    ``partition_cost`` seconds per partition: a round deadline for the approximate and the
    drop-stragglers schemes (``n`` clients x 200 draws, seeded)."""
    from fl_gradcode.latency import client_times, make_latency

    args = {k.removeprefix("latency-").replace("-", "_"): v for k, v in latency.items()
            if k != "latency"}
    model = make_latency(latency["latency"], seed=seed, **args)
    t = client_times(model, n, load, partition_cost=partition_cost, samples=200,
                     rng=np.random.default_rng(seed))
    return float(np.quantile(t, q))


#: The drop-stragglers rival's round deadline over the 75th percentile of an uncoded client's
#: time (:func:`rival_deadline`).
RIVAL_SLACK = 3.0


def rival_deadline(latency: dict, seed: int, partition_cost: float) -> float:
    """The drop-stragglers rival's round deadline: :data:`RIVAL_SLACK` times the 75th
    percentile of an uncoded client's time (load 1). A deadline at the percentile itself
    drops a quarter of the replies of idle clients, and a late client starts its next round
    late (Flower's FedAvg does not cancel its work): at ``n = 100`` under bimodal straggling
    the rival then dropped 15 replies in round 1 and 99 in round 30 (a run kept out of the
    results). The slack is the user's: a deadline over the fast clients' time, as in the main
    job."""
    return RIVAL_SLACK * quantile_deadline(latency, 1, seed, partition_cost)


@contextlib.contextmanager
def harness_environment() -> Iterator[None]:
    """How the benchmark runs (``experiments.compare`` and the readings that pair with its
    runs): Flower's log at ERROR, torch and BLAS on one thread (small models: threads only
    contend; a reply's norm took 1.2 ms on two busy cores, 0.07 on one), and the warnings of
    the harness's own choices off: its counting mod sits inside the coding mod on purpose (it
    counts every partition computed), and its nodes have no partition key (public seeds: runs
    are paired across methods)."""
    import logging
    import warnings

    import torch

    from fl_gradcode.flower.blas import serial_blas

    flwr_logger, threads = logging.getLogger("flwr"), torch.get_num_threads()
    level = flwr_logger.level
    flwr_logger.setLevel(logging.ERROR)
    torch.set_num_threads(1)
    try:
        with serial_blas(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="ComputeCounter is listed after")
            warnings.filterwarnings("ignore", message="gradient_coding_mod: no partition key")
            yield
    finally:
        flwr_logger.setLevel(level)
        torch.set_num_threads(threads)


def reading_parser(prog: str, doc: str, order: str, compare: Path, out: Path
                   ) -> argparse.ArgumentParser:
    """The command line of a reading over finished cells of the benchmark (``--cells``
    patterns, ``--compare`` file, ``--out`` file); ``order``: the order the cells run in."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    parser.add_argument("--cells", default="*",
                        help="comma-separated patterns (fnmatch) of finished cells of "
                             f"--compare, run in {order}")
    parser.add_argument("--compare", type=Path, default=compare)
    parser.add_argument("--out", type=Path, default=out)
    return parser


def matching_cells(names: Iterable[str], patterns: str, prog: str) -> list[str]:
    """``names`` (in their order) that match one of the comma-separated fnmatch
    ``patterns``; none is a ``SystemExit`` naming what there is."""
    from fnmatch import fnmatch

    wanted = [p.strip() for p in patterns.split(",") if p.strip()]
    names = list(names)
    chosen = [c for c in names if any(fnmatch(c, p) for p in wanted)]
    if not chosen:
        raise SystemExit(f"python -m {prog}: no finished cell matches {patterns!r}; there "
                         f"are {sorted(names)}")
    return chosen


def save_reading(out: Path, settings: dict[str, Any], cell: tuple[str, Any] | None = None,
                 **top: Any) -> None:
    """Merge one reading into ``out`` (a JSON of ``cells`` by name and ``settings``): ``cell``
    ``(name, reading)`` into its ``cells``, ``top`` keys beside them, ``settings`` replaced;
    the other cells a previous run wrote are kept."""
    data = json.loads(out.read_text()) if out.exists() else {}
    if cell is not None:
        data.setdefault("cells", {})[cell[0]] = cell[1]
    data.update(top)
    data["settings"] = settings
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def checkout_commit(mark_changes: bool = False) -> str | None:
    """The short commit of this checkout (``None`` without git); ``mark_changes``: with
    ``+changes`` appended when tracked files differ from it."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD") or None
        dirty = mark_changes and commit and git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{commit}+changes" if dirty else commit


def launcher_setting(values: Mapping[str, Any], n: int, rounds: int, picked: Sequence[str],
                     unread: Collection[str], why: str
                     ) -> tuple[int, int, int, dict[str, Any]]:
    """``(nodes, cohort, rounds, keys)`` of the launcher's run-config ``values`` on ``n``
    SuperNodes as a main-job rule's runs take them (``python -m experiments.main_job_*
    --run-config``): ``num-clients`` nodes when set, a cohort of ``fraction-train`` of them,
    ``num-rounds`` when set (else ``rounds``), and the keys the runs read (not ``unread``,
    nor those the harness sets per run). A key in ``picked`` (what the rule picks: ``why``)
    and a wall-clock timing (the rules' runs are in virtual time) are refused, naming them."""
    from experiments.compare_cli import HARNESS_KEYS
    from fl_gradcode.config import merge_config
    from server.app import cohort_size

    given = [f"{k}={values[k]!r}" for k in picked if k in values]
    if given:
        raise ValueError(f"{', '.join(given)}: {why}; leave it out")
    cfg = merge_config(dict(values))
    if cfg["timing"] != "virtual":
        raise ValueError(f"timing={cfg['timing']!r}: the rule's runs are in virtual time; "
                         "leave timing out")
    nodes = int(cfg["num-clients"]) or n
    keys = {k: v for k, v in cfg.items() if k in values
            and k not in HARNESS_KEYS and k not in unread}
    return nodes, cohort_size(cfg, nodes), int(values.get("num-rounds", rounds)), keys


def add_setting_flags(parser: argparse.ArgumentParser, reads: str) -> None:
    """``--run-config`` and ``--num-supernodes`` of a main-job rule's command (``reads``:
    what of the launcher's keys its runs read, and what to do with its result)."""
    parser.add_argument("--run-config", default="",
                        help=f"another setting: the keys you give python -m server.launch "
                        f"({reads})")
    parser.add_argument("--num-supernodes", type=int, default=None,
                        help="the launcher's --num-supernodes (default: its own)")


def add_out_flag(parser: argparse.ArgumentParser, default: str, here: str) -> None:
    """A main-job rule's ``--out``: ``default`` (the committed file the launcher reads) in the
    main job's default setting, ``here`` in another one (:func:`out_path`), so that a pick made
    elsewhere does not replace the default one unless asked to."""
    parser.add_argument("--out", default=None,
                        help=f"the JSON written (default: {default} in the main job's "
                        f"default setting, {here} with --run-config, --num-supernodes or "
                        "--target)")
    parser.set_defaults(out_default=default, out_here=here)


def out_path(args: argparse.Namespace) -> Path:
    """:func:`add_out_flag`'s file: ``--out`` when given, else its ``default`` where no flag
    moves the rule out of the main job's default setting, else its ``here``."""
    from server.fedbuff_run import grid_target
    from server.launch import NUM_SUPERNODES

    if args.out is not None:
        return Path(args.out)
    target = getattr(args, "target", None)
    moved = (args.run_config.strip() or args.num_supernodes not in (None, NUM_SUPERNODES)
             or (target is not None and target != grid_target()))
    return Path(args.out_here if moved else args.out_default)


def setting_values(parser: argparse.ArgumentParser, args: argparse.Namespace,
                   check: Any) -> tuple[int, dict[str, Any]]:
    """``(n, values)`` of :func:`add_setting_flags`'s flags, ``check(values, n, 1)``
    (the command's ``setting``) refusing what the rule cannot run before any run (a
    ``parser.error`` naming it)."""
    from server.launch import NUM_SUPERNODES, override_values, parse_overrides

    n = NUM_SUPERNODES if args.num_supernodes is None else args.num_supernodes
    try:
        values = override_values(parse_overrides(args.run_config))
        if n < 1:
            raise ValueError(f"--num-supernodes {n}: expected at least 1")
        check(values, n, 1)
    except ValueError as exc:
        parser.error(str(exc))
    return n, values
