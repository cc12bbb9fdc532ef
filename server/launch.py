"""Run the app with ``flwr run .`` on a local simulation SuperLink, safely, in one command.

``flwr run .`` starts a detached local SuperLink that, by default, ``uv sync``s the app's
dependencies into a fresh environment (a multi-GB CUDA torch download) and keeps running after
the run. This launcher gives the run a private ``FLWR_HOME`` (``.flwr/`` in the project), starts
that SuperLink with ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1`` (so the app runs in the
environment where the project is installed), streams the logs, and stops the SuperLink after.

It then runs three rivals on the same seeds and latency model: wait-for-all FedAvg (``code=
'uncoded' s=0``, no straggler deadline; ``results/run-uncoded``), Flower's own FedAvg that
drops the replies later than the same ``straggler-timeout`` (``rival='drop-stragglers'``;
``results/run-drop-stragglers``) and FedBuff (``asynchronous=true s=0``, its server lr and
buffer tuned by the grid file's rule in the main job's default setting, :mod:`server.fedbuff_run`;
``results/run-fedbuff``; for an asynchronous coded run, its own baseline), and ends with a
one-screen table (virtual time to a common target accuracy, the lowest final one but
FedBuff's, final accuracy, exact rounds, MB uploaded, client compute) and a PNG of accuracy vs
virtual time for all of them (``results/run/comparison.png``). ``--run-config`` overrides
reach every run once each, but FedBuff's tuned ``server-lr`` (said when it replaces the user's,
which the coded run keeps); the rivals' runs leave out the keys only a coded run means
(:data:`CODED_ONLY`; FedBuff's, :data:`FEDBUFF_DROPS`; beside an asynchronous job, whose
``server-lr`` is FedBuff's server step, the synchronous rivals leave that out too, said at
launch), and a rival that cannot run with them (e.g. under DP, or FedBuff with coded rounds'
faults) is skipped, saying why. ``--fedbuff-pick FILE`` runs another FedBuff pick (``python
-m experiments.main_job_fedbuff --run-config ... --out FILE``); where the run departs from the
setting its FedBuff or its round deadline was tuned in, the launcher prints the command that
tunes it in the run's own setting.

The exit code is non-zero when a run's ServerApp did not complete (``flwr run --stream``
exits 0 even when the ServerApp raised; the run's status is read with ``flwr ls``:
:func:`run_flwr`).

With no options the coded run is the latency regime the first-hour experiment
(``experiments/first_hour.py``, ``results/first_hour.json``, 3 seeds) recommends: the
run-config defaults are its regime (persistent stragglers, compute charged per partition,
``s='auto'`` up to 4), with the round deadline (``straggler-timeout``) of the grid file's rule
(``experiments/main_job_deadline.py``). ``--preset coding-loses`` runs the regime where it
found coding not recommended, and says so; ``--preset coding-wins`` runs the regime it
recommended as it ran it (with its hand-set 2.0 s deadline).

Usage: ``python -m server.launch [--num-supernodes 12] [--run-config "num-rounds=5 s=2"]
[--preset coding-wins|coding-loses] [--fedbuff-pick FILE] [--no-compare]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path

from fl_gradcode.config import coded_only_keys, merge_config
from server.asynchronous import SYNCHRONOUS_KEYS
from server.comparison import (  # noqa: F401 (its API)
    ASYNC_HINT,
    LEGEND,
    compare,
    render_table,
    summarize,
)
from server.fedbuff_run import (  # noqa: F401
    MAIN_JOB_FEDBUFF,
    async_tuned,
    care,
    replaced,
    retune_command,
    tuned_keys,
)
from server.rival_config import rival_refusal as _rival_refusal
from server.rival_config import shared_keys

ROOT = Path(__file__).resolve().parents[1]
#: SuperNodes the main job starts (``--num-supernodes``), every one in each round's cohort
NUM_SUPERNODES = 12

#: ``flwr run`` prints this when the SuperLink accepted the run.
_STARTED = re.compile(r"Successfully started run (\d+)")
#: ``flwr ls`` status of a run whose ServerApp returned normally.
COMPLETED = "finished:completed"
#: Exit code of ``run_flwr`` when the run did not complete (the ServerApp raised, was
#: stopped, or its status could not be read).
RUN_FAILED = 1


def _processes_using(home: Path) -> list[int]:
    """PIDs of processes whose command line mentions ``home`` (the local SuperLink, SuperExec)."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="ignore")
        except OSError:
            continue
        if str(home) in cmdline and int(proc.name) != os.getpid():
            pids.append(int(proc.name))
    return pids


def stop_local_superlink(home: Path) -> None:
    for pid in _processes_using(home):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


#: Run-config keys that only mean something to a coded run (the table's ``coded_only``): the
#: rivals' runs drop them (the user's values stay in the coded run).
CODED_ONLY = coded_only_keys()
#: The runs of the main job: name -> keys that replace the user's (values as TOML text).
RUNS: dict[str, dict[str, str]] = {
    "coded": {},
    # wait-for-all FedAvg (through the wrapper with the identity code): no straggler deadline
    "uncoded": {"code": "'uncoded'", "s": "0", "straggler-timeout": "1000000.0"},
    # Flower's own FedAvg, dropping replies later than the same straggler-timeout
    "drop-stragglers": {"rival": "'drop-stragglers'"},
    # FedBuff (s = 0): the rival the benchmark found fastest, and an asynchronous coded run's
    # own baseline (what replication adds over asynchrony alone)
    "fedbuff": {"asynchronous": "true", "s": "0"},
}
#: Keys the FedBuff run leaves out: what only coded or synchronous rounds read (it keeps the
#: asynchronous run's buffer and handshake timeout)
FEDBUFF_DROPS = (set(CODED_ONLY) | set(SYNCHRONOUS_KEYS)) - {"buffer-size", "warmup-timeout"}
#: ``flwr``'s own pattern for ``--run-config`` pairs (flwr.common.config.parse_config_args).
_PAIR = re.compile(r"(\S+?)=(\'[^\']*\'|\"[^\"]*\"|\S+)")


def parse_overrides(text: str) -> dict[str, str]:
    """``"k=v k2='x'"`` -> ``{"k": "v", "k2": "'x'"}`` (each value as written, TOML); a key
    given twice keeps its last value. Text that is not ``key=value`` pairs, or a value that is
    not a TOML bool, int, float or quoted string, raises ``ValueError`` naming it."""
    pairs: dict[str, str] = {}
    pos = 0
    for match in _PAIR.finditer(text):
        if text[pos:match.start()].strip():
            raise ValueError(f"{text[pos:match.start()].strip()!r} is not a key=value pair")
        key, value = match.group(1), match.group(2)
        try:
            tomllib.loads(f"v = {value}")
        except tomllib.TOMLDecodeError:
            raise ValueError(
                f"{key}={value}: the value must be a bool, int, float or quoted string, "
                f"e.g. {key}='{value.strip(chr(39) + chr(34))}'") from None
        pairs.pop(key, None)
        pairs[key] = value
        pos = match.end()
    if text[pos:].strip():
        raise ValueError(f"{text[pos:].strip()!r} is not a key=value pair")
    return pairs


def override_values(pairs: Mapping[str, str]) -> dict[str, object]:
    """The Python values of :func:`parse_overrides`'s pairs."""
    return {k: tomllib.loads(f"v = {v}")["v"] for k, v in pairs.items()}


def run_config_for(run: str, overrides: str, results: Path, n: int = NUM_SUPERNODES,
                   pick: Path | None = None) -> str:
    """The ``--run-config`` string of one run of the main job (a name in :data:`RUNS`) on
    ``n`` SuperNodes: the user's ``overrides`` (a rival's run without :data:`CODED_ONLY`
    keys), the run's own keys replacing the user's (FedBuff's tuned settings too:
    :func:`server.fedbuff_run.tuned_keys`, from ``pick``, default :data:`MAIN_JOB_FEDBUFF`),
    ``results-dir`` set to ``results``. Every key appears once (``flwr run`` refuses a key
    given twice)."""
    if run not in RUNS:
        raise ValueError(f"run={run!r}; expected one of {sorted(RUNS)}")
    if "'" in str(results):
        raise ValueError(f"results directory {str(results)!r} contains a single quote")
    user = parse_overrides(overrides)
    values = override_values(user)
    own = tuned_keys(values, n, pick) if run == "fedbuff" else {}
    pairs = {"results-dir": f"'{results}'", **{k: v for k, v in user.items()
                                               if k not in dropped(run, values) | set(own)},
             **RUNS[run], **own}
    return " ".join(f"{k}={v}" for k, v in pairs.items())


#: What an asynchronous coded job reads as FedBuff's server step: the synchronous rivals
#: (wait-for-all, drop-stragglers) leave it out there and run plain FedAvg, as the
#: benchmark's wait-for-all and deadline do (the coded run and FedBuff keep the user's)
ASYNC_STEP = frozenset({"server-lr"})


def dropped(run: str, values: Mapping[str, object] | None = None) -> set[str]:
    """The user's keys run ``run`` of :data:`RUNS` leaves out: its own and ``results-dir``
    (it sets them), and a rival's the keys it does not read (:data:`CODED_ONLY`; FedBuff's,
    :data:`FEDBUFF_DROPS`); beside an asynchronous job (the user's ``values``), the
    synchronous rivals also :data:`ASYNC_STEP`."""
    rival = (FEDBUFF_DROPS if run == "fedbuff" else set(CODED_ONLY) if run != "coded"
             else set())
    step = (ASYNC_STEP if run in ("uncoded", "drop-stragglers") and values is not None
            and merge_config(dict(values))["asynchronous"] else set())
    return set(RUNS[run]) | {"results-dir"} | rival | step


def rival_refusal(values: Mapping[str, object]) -> str | None:
    """Why the drop-stragglers run cannot run with these overrides (``None``: it can;
    :func:`server.rival_config.rival_refusal` on them without the keys it leaves out)."""
    kept = {k: v for k, v in values.items() if k not in dropped("drop-stragglers", values)}
    return _rival_refusal(merge_config(shared_keys(kept)), "drop-stragglers")


def step_left_out(values: Mapping[str, object]) -> str | None:
    """The line saying the synchronous rivals leave out an asynchronous job's server step
    (``None``: the user set none, or the job is synchronous)."""
    left = [f"{k}={values[k]!r}" for k in sorted(ASYNC_STEP)
            if k in values and k in dropped("uncoded", values)]
    if not left:
        return None
    return (f"the uncoded and drop-stragglers runs leave out {', '.join(left)}: in an "
            "asynchronous job it is FedBuff's server step; they run plain FedAvg, as the "
            "benchmark's wait-for-all and deadline do")


#: ``--preset`` names -> the regime of ``results/first_hour.json`` (experiments/first_hour.py,
#: 3 seeds) it runs: where that experiment found coding recommended (the defaults' latency
#: regime), and where it found it not
PRESETS = {"coding-wins": "recommended", "coding-loses": "losing_preset"}
FIRST_HOUR = ROOT / "results" / "first_hour.json"


def fedbuff_refusal(values: Mapping[str, object], n: int = NUM_SUPERNODES,
                    path: Path | None = None) -> str | None:
    """Why the FedBuff run cannot run with the user's run-config ``values`` (``None``: it
    can), e.g. DP or a server optimiser other than plain SGD, which it refuses by name."""
    from server.asynchronous import async_refusal
    from server.rival_config import FAULT_KEYS

    try:
        tuned = tuned_keys(values, n, path)
    except ValueError as exc:  # the pick cannot be read: FedBuff does not run untuned
        return str(exc)
    kept = {k: v for k, v in values.items() if k not in dropped("fedbuff")}
    cfg = merge_config({**kept, **override_values({**RUNS["fedbuff"], **tuned})})
    faults = ", ".join(f"{k}={cfg[k]!r}" for k in FAULT_KEYS if str(cfg[k]).strip())
    if faults and not merge_config(values)["asynchronous"]:
        return (f"{faults}: coded rounds name a faulty worker by its position in the round's "
                "cohort, FedBuff by its partition id, so FedBuff would be faulted on other "
                "clients; run without faults, or with asynchronous=true (both name partitions)")
    return async_refusal(cfg)


def async_hint(values: Mapping[str, object]) -> str | None:
    """What to add to ``--run-config`` to run this library's asynchronous mode instead of
    rounds (``None`` where the asynchronous app would refuse the user's other keys)."""
    from server.asynchronous import async_refusal

    keys = {"asynchronous": True, "s": "auto"}
    if merge_config(dict(values))["asynchronous"] or async_refusal(
            merge_config({**values, **keys})) is not None:
        return None
    return ASYNC_HINT


def async_without(values: Mapping[str, object], preset: str | None = None) -> str | None:
    """The user's round deadline (``straggler-timeout=...``) where it alone keeps the
    asynchronous app from the job (it has no rounds), so the hint can say to leave it out;
    ``None`` elsewhere, and under a ``preset`` (whose regime is its deadline's)."""
    if preset is not None or "straggler-timeout" not in values or async_hint(values):
        return None
    rest = {k: v for k, v in values.items() if k != "straggler-timeout"}
    if async_hint(rest) is None:
        return None
    return f"straggler-timeout={toml_value(values['straggler-timeout'])}"


def preset_regime(name: str, path: Path = FIRST_HOUR) -> tuple[str, dict[str, object], dict]:
    """``(regime name, run config, its entry)`` of preset ``name``: the run config the committed
    first-hour experiment ran for it (its ``base`` with the regime's overrides; ``ValueError``
    naming the presets for another name)."""
    if name not in PRESETS:
        raise ValueError(f"--preset {name!r}; expected one of {sorted(PRESETS)}")
    from server.app import unread_latency_keys

    data = json.loads(path.read_text())
    regime = data[PRESETS[name]]
    entry = data["regimes"][regime]
    config = {**data.get("base", {}), **entry["run_config"]}
    # the base's latency parameters a regime's own latency model does not read (the
    # ServerApp refuses them since) are left out: the regime ran without reading them
    unread = unread_latency_keys(str(merge_config(config)["latency"]), list(config))
    return regime, {k: v for k, v in config.items() if k not in unread}, entry


def preset_overrides(name: str, path: Path = FIRST_HOUR) -> str:
    """The ``--run-config`` text of preset ``name`` (:func:`preset_regime`)."""
    _, config, _ = preset_regime(name, path)
    return " ".join(f"{key}={toml_value(value)}" for key, value in config.items())


def preset_note(name: str, path: Path = FIRST_HOUR) -> str:
    """What preset ``name`` is, as the first-hour experiment measured it (one line)."""
    regime, _, entry = preset_regime(name, path)

    def x(value: object) -> str:
        return "-" if value is None else f"{value:.2f}x"

    verdict = ("coding is recommended here: it met the goal on every seed"
               if entry["wins"] else
               "coding is NOT recommended here: it missed the goal, expect it to lose")
    return (f"preset {name} = regime {regime!r} of {path.name}: {verdict} (median "
            f"{x(entry['median_speedup_vs_wait'])} vs wait-for-all, "
            f"{x(entry['median_speedup_vs_drop'])} vs drop-stragglers)")


def toml_value(value: object) -> str:
    """``value`` as ``--run-config`` text (TOML; a string in single quotes, or in double
    quotes with TOML's escapes where it holds a single quote or a control character; a
    double quote as ``\\u0022``, which :func:`parse_overrides` reads)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        if "'" not in value and value.isprintable():
            return f"'{value}'"
        return '"' + "".join("\\\\" if c == "\\" else c if c != '"' and c.isprintable()
                             else f"\\u{ord(c):04x}" if ord(c) < 0x10000
                             else c for c in value) + '"'
    return repr(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-supernodes", type=int, default=NUM_SUPERNODES)
    parser.add_argument("--run-config", default="", help="'key=value key2=value2' overrides")
    parser.add_argument("--results-dir", default="results/run")
    parser.add_argument("--home", default=str(ROOT / ".flwr"), help="private FLWR_HOME")
    parser.add_argument("--fedbuff-pick", type=Path, default=None,
                        help="FedBuff's server lr and buffer as python -m "
                        "experiments.main_job_fedbuff picked them (default: "
                        "results/main_job_fedbuff.json, the main job's default setting)")
    parser.add_argument("--no-compare", action="store_true",
                        help="skip the comparison runs (wait-for-all, drop-stragglers, FedBuff)")
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="coding-wins: the regime the first-hour experiment recommends "
                        "coding for (persistent stragglers, its 2.0 s deadline); coding-loses: "
                        "no stragglers, where it does not (results/first_hour.json); "
                        "--run-config keys override the preset's")
    args = parser.parse_args(argv)
    if args.preset:
        print(preset_note(args.preset), flush=True)
        args.run_config = f"{preset_overrides(args.preset)} {args.run_config}".strip()
        print(f"preset {args.preset}: {args.run_config}", flush=True)
    try:
        values = override_values(parse_overrides(args.run_config))
        merge_config(values)  # unknown keys and wrong types: refused before any run
    except ValueError as exc:
        print(f"--run-config: {exc}", file=sys.stderr, flush=True)
        return 2
    # results-dir in --run-config is the coded run's directory, as --results-dir is
    given = str(values.get("results-dir", args.results_dir))
    if not given:
        print("--run-config: results-dir='' writes no records, and the main job compares its "
              "runs' records: give a directory (or leave results-dir out: "
              f"{args.results_dir})", file=sys.stderr, flush=True)
        return 2
    results = Path(given).expanduser().resolve()
    code = flwr_run(args, results, run_config_for("coded", args.run_config, results))
    if code != 0 or args.no_compare:
        return code
    runs = {"coded": results}
    n, pick = args.num_supernodes, args.fedbuff_pick
    if note := step_left_out(values):
        print(note, flush=True)
    # FedBuff too, unless the coded run is FedBuff itself (asynchronous with s = 0)
    itself = bool(values.get("asynchronous")) and str(values.get("s", "")) == "0"
    for name in ("uncoded", "drop-stragglers", "fedbuff")[:2 if itself else 3]:
        out = results.with_name(f"{results.name}-{name}")
        refusal = {"drop-stragglers": rival_refusal,
                   "fedbuff": lambda v: fedbuff_refusal(v, n, pick)}.get(
            name, lambda _: None)(values)
        if refusal:
            print(f"the {name} run is skipped: {refusal}", flush=True)
            continue
        if name == "fedbuff" and (note := replaced(values, tuned_keys(values, n, pick))):
            print(note, flush=True)
        run_code = flwr_run(args, out, run_config_for(name, args.run_config, out, n, pick))
        if run_code == 0:
            runs[name] = out
        code = code or run_code
    if len(runs) > 1:
        care_of = (care(values, n, dropped("fedbuff"), pick)
                   if "fedbuff" in runs else "untuned")
        without = async_without(values, args.preset)
        hint = ASYNC_HINT if without else async_hint(values)
        print(compare(results, runs.get("uncoded"), runs.get("drop-stragglers"),
                      runs.get("fedbuff"), fedbuff_care=care_of, async_hint=hint,
                      async_tuned=async_tuned(values, n, pick), async_without=without),
              flush=True)
        if "fedbuff" in runs and (command := retune_command(values, n, pick)):
            print(command, flush=True)
        if command := deadline_retune(values, n):
            print(command, flush=True)
    return code


#: The round deadline as the stated rule picked it in the main job's default setting
MAIN_JOB_DEADLINE = ROOT / "results" / "main_job_deadline.json"


def deadline_retune(values: Mapping[str, object], n: int,
                    path: Path = MAIN_JOB_DEADLINE) -> str | None:
    """Where a synchronous run in virtual time leaves ``straggler-timeout`` at its default and
    departs from the setting the stated rule picked it in (``path``): that setting's
    departures and the command that picks the deadline in the run's own setting (``None``:
    nothing to say)."""
    from server.fedbuff_run import departures, tuned_where

    cfg = merge_config(dict(values))
    # a wall-clock deadline is real seconds, the user's to set (the rule runs in virtual time)
    if "straggler-timeout" in values or cfg["asynchronous"] or cfg["timing"] != "virtual":
        return None
    try:
        settings = json.loads(path.read_text())["settings"]
        away = departures(values, n, settings, dropped("uncoded", values))
        where = tuned_where(settings)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not away:
        return None
    return (f"the round deadline, straggler-timeout={cfg['straggler-timeout']!r} (the coded "
            f"run's and drop-stragglers'), was picked by the stated rule in {where}; run "
            f"outside it: {', '.join(away)}. To pick it in this "
            "setting: python -m experiments.main_job_deadline "
            f"{setting_flags(values, n, ('straggler-timeout',))}"
            " --out results/main_job_deadline_here.json, then add the straggler-timeout it "
            "prints to --run-config")


def setting_flags(values: Mapping[str, object], n: int, picked: tuple[str, ...]) -> str:
    """The ``--run-config`` (and ``--num-supernodes``) of a main-job rule's command that runs
    it in the setting of the user's ``values`` on ``n`` SuperNodes: every key but the ones
    the rule picks (``picked``), ``results-dir`` and ``timing`` (its runs are in virtual
    time)."""
    keys = " ".join(f"{k}={toml_value(v)}" for k, v in values.items()
                    if k not in (*picked, "results-dir", "timing"))
    nodes = "" if n == NUM_SUPERNODES else f" --num-supernodes {n}"
    # a shell expands $, `, \\ and ! in double quotes: such text goes in single quotes
    quoted = shlex.quote(keys) if re.search(r'[$`"\\!]', keys) else f'"{keys}"'
    return f"--run-config {quoted}{nodes}"


def flwr_run(args: argparse.Namespace, results: Path, run_config: str) -> int:
    """One ``flwr run .`` on a private local simulation SuperLink with ``run_config`` (from
    :func:`run_config_for`: its ``results-dir`` is ``results``)."""

    home = Path(args.home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
    }
    # DP partition keys are client-side secrets: simulated clients read them from this file
    # (in deployment each SuperNode gets its own via --node-config "dp-key-file=...")
    if "FL_GRADCODE_DP_KEY_FILE" not in os.environ:
        from fl_gradcode.privacy import write_key_file

        key_file = home / "dp-keys.json"
        if not key_file.exists():
            write_key_file(key_file)
        env["FL_GRADCODE_DP_KEY_FILE"] = str(key_file)
    # a SuperLink left from an earlier run may have been started without the variable above
    stop_local_superlink(home)
    flwr = Path(sys.executable).with_name("flwr")
    cmd = [
        str(flwr) if flwr.exists() else "flwr",
        "run",
        str(ROOT),
        "--stream",
        "--federation-config",
        f"num-supernodes={args.num_supernodes}",
        "--run-config",
        run_config,
    ]
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    try:
        code = run_flwr(cmd, env=env, cwd=ROOT)  # the status is read before the link stops
    finally:
        stop_local_superlink(home)
    print(f"results: {results}/rounds.jsonl, final_model.npz, config.json", flush=True)
    return code


def run_flwr(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    timeout: float | None = None,
    connection: str | None = None,
) -> int:
    """Run ``cmd`` (``flwr run ... --stream``), echoing its output, and return 0 only if the
    run's ServerApp completed.

    ``flwr run --stream`` exits 0 however the ServerApp ended: Flower records an exception in
    the ServerApp as the run's status ``finished:failed`` (the ServerApp process exits with
    Flower's code 201, ``SERVERAPP_EXCEPTION``) and the log stream simply ends. So the run id
    is read from ``flwr run``'s output and the run's status from ``flwr ls --run-id ID
    --format json`` (against ``connection``, or the default SuperLink connection): anything
    but ``finished:completed``, or a status that cannot be read, returns :data:`RUN_FAILED`;
    a non-zero exit of ``flwr run`` itself is returned as is. ``timeout``: seconds before
    ``flwr run`` is killed (``subprocess.TimeoutExpired`` is raised).
    """
    proc = subprocess.Popen(list(cmd), env=dict(env), cwd=cwd, stdout=subprocess.PIPE,
                            text=True, errors="replace")
    run_ids: list[int] = []

    def echo() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            match = _STARTED.search(line)
            if match and not run_ids:
                run_ids.append(int(match.group(1)))

    reader = threading.Thread(target=echo, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    finally:
        reader.join(timeout=10)
    if code != 0:
        return code
    if not run_ids:
        print("flwr run printed no run id: the ServerApp's outcome is unknown", flush=True)
        return RUN_FAILED
    status, details = run_status(cmd[0], run_ids[0], env=env, cwd=cwd, connection=connection)
    if status != COMPLETED:
        print(f"run {run_ids[0]} ended with status {status!r}"
              f"{': ' + details if details else ''}", flush=True)
        return RUN_FAILED
    return 0


def run_status(
    flwr: str, run_id: int, *, env: Mapping[str, str], cwd: Path, connection: str | None = None
) -> tuple[str, str]:
    """``(status, details)`` of run ``run_id`` as ``flwr ls`` reports it (``"unknown"`` and the
    reason when it cannot be read)."""
    cmd = [flwr, "ls", *([connection] if connection else []), "--run-id", str(run_id),
           "--format", "json"]
    try:
        out = subprocess.run(cmd, env=dict(env), cwd=cwd, capture_output=True, text=True,
                             timeout=120)
        text = out.stdout
        data = json.loads(text[text.index("{"): text.rindex("}") + 1])
        run = next(r for r in data["runs"] if str(r["run-id"]) == str(run_id))
        return str(run["status"]), str(run.get("status-details", ""))
    except (OSError, ValueError, KeyError, TypeError, StopIteration,
            subprocess.SubprocessError) as exc:
        return "unknown", f"could not read it with {' '.join(cmd)}: {exc}"


if __name__ == "__main__":
    sys.exit(main())
