"""The main job's FedBuff run beside a synchronous coded job: its server lr and buffer ``K`` as
the grid file's rule picked them on the development seeds in the main job's default setting
(``python -m experiments.main_job_fedbuff``, ``results/main_job_fedbuff.json``; the benchmark
tunes FedBuff in each cell the same way), what its label says of that choice, and where the
run departs from the setting it was tuned in. FedBuff: Nguyen et al., "Federated learning with
buffered asynchronous aggregation", AISTATS 2022, https://arxiv.org/abs/2106.06639."""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from fl_gradcode.config import merge_config
from fl_gradcode.rivals.fedbuff import buffer_size

__all__ = ["MAIN_JOB_FEDBUFF", "TUNED_KEYS", "async_tuned", "care", "departures", "grid_target",
           "pick_keys", "read_pick", "replaced", "retune_command", "tuned_keys", "tuned_where"]

ROOT = Path(__file__).resolve().parents[1]
#: FedBuff's server lr and buffer as the grid file's rule picked them (amendment 31)
MAIN_JOB_FEDBUFF = ROOT / "results" / "main_job_fedbuff.json"
#: the grid file, whose task table holds the target the main job's task is timed to
GRID = ROOT / "experiments" / "grid.toml"
#: the run-config keys the pick sets in FedBuff's run
TUNED_KEYS = ("server-lr", "buffer-size")


def read_pick(path: Path | None = None) -> dict[str, Any]:
    """The committed pick (:data:`MAIN_JOB_FEDBUFF` unless ``path``), or a ``ValueError``
    naming the file and what is wrong with it (missing, not JSON, a bad or missing value)."""
    path = MAIN_JOB_FEDBUFF if path is None else path
    try:
        pick = json.loads(path.read_text())
        lr, fraction = float(pick["server_lr"]), float(pick["buffer_fraction"])
        settings = pick["settings"]
        n, seeds, config = int(settings["n"]), list(settings["dev_seeds"]), settings["run_config"]
        rounds = int(settings["rounds"])
        cohort = int(settings.get("cohort", n))
        target = None if settings.get("target") is None else float(settings["target"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"FedBuff's tuned settings cannot be read from {path} ({exc!r}); "
                         "run python -m experiments.main_job_fedbuff") from None
    if not (math.isfinite(lr) and lr > 0 and 0 < fraction <= 1 and n > 0
            and isinstance(config, dict)):
        raise ValueError(f"{path}: server_lr={lr!r} (expected > 0), buffer_fraction="
                         f"{fraction!r} (expected in (0, 1]), settings.n={n!r} (expected > 0) "
                         "and settings.run_config a table; run python -m "
                         "experiments.main_job_fedbuff")
    return {"server_lr": lr, "buffer_fraction": fraction, "n": n, "cohort": cohort,
            "rounds": rounds, "target": target, "dev_seeds": seeds, "run_config": config,
            "path": path}


def _cohort(cfg: Mapping[str, Any], n: int) -> int:
    """The run's cohort: ``fraction-train`` of its clients (``num-clients`` when set, as the
    ServerApp waits for, else the launcher's ``n`` SuperNodes)."""
    from server.app import cohort_size

    return cohort_size(dict(cfg), int(cfg["num-clients"]) or n)


def pick_keys(values: Mapping[str, object], n: int, path: Path | None = None,
              pick: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The pick (``pick``, as :func:`read_pick` gives it, else read from ``path``) as the
    run's keys (TOML text): ``server-lr``, and ``buffer-size`` the pick's fraction of the
    run's cohort (at least 1). ``ValueError`` (:func:`read_pick`) when it cannot be read."""
    pick = read_pick(path) if pick is None else pick
    k = buffer_size(pick["buffer_fraction"], _cohort(merge_config(dict(values)), n))
    return {"server-lr": repr(pick["server_lr"]), "buffer-size": str(k)}


def tuned_keys(values: Mapping[str, object], n: int, path: Path | None = None
               ) -> dict[str, str]:
    """The keys FedBuff's run of a synchronous coded job takes from the pick
    (:func:`pick_keys`); none beside an asynchronous coded job, whose FedBuff keeps that job's
    buffer and lr (its own baseline). ``ValueError`` when the pick cannot be read."""
    if merge_config(dict(values))["asynchronous"]:
        return {}
    return pick_keys(values, n, path)


def async_tuned(values: Mapping[str, object], n: int, path: Path | None = None
                ) -> str | None:
    """The ``--run-config`` text that gives the asynchronous mode suggested beside a
    synchronous job FedBuff's tuned server lr and buffer, as the benchmark's ``fedbuff-auto``
    runs (``None`` where the user set either key, or the pick cannot be read): without
    them that mode and its FedBuff baseline would run the key table's untuned ones."""
    if any(k in values for k in TUNED_KEYS):
        return None
    try:
        keys = pick_keys({**values, "asynchronous": True}, n, path)
    except ValueError:
        return None
    return " ".join(f"{k}={keys[k]}" for k in TUNED_KEYS)


def care(values: Mapping[str, object], n: int, unread: Collection[str],
         path: Path | None = None) -> str:
    """How the FedBuff run's server lr and buffer were chosen (its label), naming what of the
    run departs from the setting they were tuned in: its cohort, and each key FedBuff reads
    (not in ``unread``) set away from that setting's value. Beside an asynchronous coded job
    they are that job's own: tuned when they are the pick's keys at its cohort, else untuned,
    naming the pick's keys."""
    label, away = _care(values, n, unread, path)
    return label + (f"; run outside it: {', '.join(away)}" if away else "")


def _care(values: Mapping[str, object], n: int, unread: Collection[str],
          path: Path | None) -> tuple[str, list[str]]:
    """:func:`care`'s label without its departures, and the departures (none where the
    pick cannot be read, or an asynchronous job runs other keys than the pick's)."""
    cfg = merge_config(dict(values))
    try:
        pick = read_pick(path)
    except ValueError:
        return ("the coded job's own, untuned" if cfg["asynchronous"] else "untuned"), []
    where = pick["path"]
    shown = where.relative_to(ROOT) if where.is_relative_to(ROOT) else where
    if cfg["asynchronous"]:
        from server.asynchronous import AUTO_KEYS, run_buffer

        keys = pick_keys(values, n, pick=pick)

        k = run_buffer(cfg, _cohort(cfg, n))
        if float(cfg["server-lr"]) != float(keys["server-lr"]) or k != int(keys["buffer-size"]):
            return (f"the coded job's own, untuned (server lr {float(cfg['server-lr']):g}, K "
                    f"{k}; FedBuff's tuned ones, {shown}: add "
                    f"{' '.join(f'{key}={keys[key]}' for key in TUNED_KEYS)} to --run-config)"
                    ), []
        # what only the asynchronous job's replication reads is no departure of FedBuff's
        unread = {*unread, "asynchronous", "s", *AUTO_KEYS}
    label = (f"tuned on development seeds {', '.join(map(str, pick['dev_seeds']))} by the "
             f"benchmark's rule in {tuned_where(pick)} ({shown})")
    if cfg["asynchronous"]:
        label = f"the coded job's own, FedBuff's: {label}"
    return label, departures(values, n, pick, {*unread, *TUNED_KEYS})


def departures(values: Mapping[str, object], n: int, tuned: Mapping[str, Any],
               unread: Collection[str]) -> list[str]:
    """What of the run of the user's ``values`` on ``n`` SuperNodes departs from the setting
    a main-job rule ran in (``tuned``: its ``n``, ``cohort``, ``rounds`` and ``run_config``,
    in virtual time): its nodes, cohort, rounds, timing, and each key the rule's runs read
    (not in ``unread``) set away from that setting's value."""
    cfg = merge_config(dict(values))
    nodes, cohort = int(cfg["num-clients"]) or n, _cohort(cfg, n)
    return [text for text, differs in (
        (f"{nodes} nodes (tuned at {tuned['n']})", nodes != tuned["n"]),
        (f"a cohort of {cohort} (tuned at {tuned['cohort']})", cohort != tuned["cohort"]),
        (f"num-rounds={cfg['num-rounds']!r} (tuned at {tuned['rounds']})",
         cfg["num-rounds"] != tuned["rounds"]),
        (f"timing={cfg['timing']!r} (tuned in virtual time)", cfg["timing"] != "virtual"))
        if differs] + [f"{k}={cfg[k]!r}" for k, v in tuned["run_config"].items()
                       if k not in unread and k in cfg and cfg[k] != v]


def grid_target() -> float:
    """The accuracy the grid file times the main job's task to (its default pick's target)."""
    from fl_gradcode.config import DEFAULTS

    task = f"{DEFAULTS['dataset']}-{DEFAULTS['model']}"
    return float(tomllib.loads(GRID.read_text())["tasks"][task]["target"])


def tuned_where(pick: Mapping[str, Any]) -> str:
    """The setting a main-job rule's pick (its ``settings``: ``n``, ``cohort``, ``rounds``,
    ``run_config`` and, where it timed one, ``target``) was made in: the main job's default
    one (every key at the key table's default, its SuperNodes all in the cohort, its rounds,
    the grid file's target for the main job's task), else the one it records (``python -m
    experiments.main_job_fedbuff --run-config``, ``--target``), naming its target where that
    is not the grid's."""
    from fl_gradcode.config import DEFAULTS
    from server.launch import NUM_SUPERNODES

    grid = grid_target()
    target = pick.get("target")
    other = target is not None and target != grid
    default = (pick["n"] == pick["cohort"] == NUM_SUPERNODES
               and pick["rounds"] == DEFAULTS["num-rounds"] and not other
               and all(DEFAULTS.get(k) == v for k, v in pick["run_config"].items()))
    if default:
        return "the main job's default setting"
    return "the setting it records" + (f" (time to accuracy {target:g}, the grid's is "
                                       f"{grid:g})" if other else "")


def retune_command(values: Mapping[str, object], n: int, path: Path | None = None
                   ) -> str | None:
    """The commands that tune FedBuff in the run's own setting and run the launcher with
    that pick (``None`` where the pick was tuned in it, or cannot be read): where
    :func:`care` names a departure."""
    from server.launch import dropped, setting_flags

    cfg = merge_config(dict(values))
    # a wall-clock run's rivals cannot be tuned by the rule's virtual-time runs
    if cfg["timing"] != "virtual" or not _care(values, n, dropped("fedbuff"), path)[1]:
        return None
    out = "results/main_job_fedbuff_here.json"
    # an asynchronous job (and its FedBuff baseline) runs its own server-lr and buffer-size
    then = (f"then add --fedbuff-pick {out} to this command and set server-lr and "
            "buffer-size to the lr and K it prints" if cfg["asynchronous"]
            else f"then add --fedbuff-pick {out} to this command")
    return (f"to tune FedBuff in this setting: python -m experiments.main_job_fedbuff "
            f"{setting_flags(values, n, TUNED_KEYS)} --out {out}, {then}")


def replaced(values: Mapping[str, object], tuned: Mapping[str, str]) -> str | None:
    """The line saying which of the user's keys FedBuff's run replaces by its tuned value
    (``None``: none): they stay the coded run's."""
    swapped = [f"{k}={values[k]!r} (FedBuff runs {tuned[k]})" for k in TUNED_KEYS
               if k in values and k in tuned]
    if not swapped:
        return None
    return (f"the fedbuff run replaces {', '.join(swapped)} by its tuned settings; the coded "
            "run keeps yours")
