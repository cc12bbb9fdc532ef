"""Run the app with ``flwr run .`` on a local simulation SuperLink, safely, in one command.

``flwr run .`` starts a detached local SuperLink that, by default, ``uv sync``s the app's
dependencies into a fresh environment (a multi-GB CUDA torch download) and keeps running after
the run. This launcher gives the run a private ``FLWR_HOME`` (``.flwr/`` in the project), starts
that SuperLink with ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1`` (so the app runs in the
environment where the project is installed), streams the logs, and stops the SuperLink after.

It then runs three rivals on the same seeds and latency model: wait-for-all FedAvg (``code=
'uncoded' s=0``, no straggler deadline; ``results/run-uncoded``), Flower's own FedAvg that
drops the replies later than the same ``straggler-timeout`` (``rival='drop-stragglers'``;
``results/run-drop-stragglers``) and FedBuff (``asynchronous=true s=0``, untuned;
``results/run-fedbuff``; for an asynchronous coded run, its own baseline), and ends with a
one-screen table (virtual time to a common target accuracy, the lowest final one but
FedBuff's, final accuracy, exact rounds, MB uploaded, client compute) and a PNG of accuracy vs
virtual time for all of them (``results/run/comparison.png``). ``--run-config`` overrides
reach every run once each; the rivals' runs leave out the keys only a coded run means
(:data:`CODED_ONLY`; FedBuff's, :data:`FEDBUFF_DROPS`), and a rival that cannot run with them
(e.g. under DP, or FedBuff with coded rounds' faults) is skipped, saying why.

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
[--preset coding-wins|coding-loses] [--no-compare]``.
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


def run_config_for(run: str, overrides: str, results: Path) -> str:
    """The ``--run-config`` string of one run of the main job (a name in :data:`RUNS`): the
    user's ``overrides`` (a rival's run without :data:`CODED_ONLY` keys), the run's own keys
    replacing the user's, ``results-dir`` set to ``results``. Every key appears once
    (``flwr run`` refuses a key given twice)."""
    if run not in RUNS:
        raise ValueError(f"run={run!r}; expected one of {sorted(RUNS)}")
    if "'" in str(results):
        raise ValueError(f"results directory {str(results)!r} contains a single quote")
    user = parse_overrides(overrides)
    pairs = {"results-dir": f"'{results}'",
             **{k: v for k, v in user.items() if k not in dropped(run)}, **RUNS[run]}
    return " ".join(f"{k}={v}" for k, v in pairs.items())


def dropped(run: str) -> set[str]:
    """The user's keys run ``run`` of :data:`RUNS` leaves out: its own and ``results-dir``
    (it sets them), and a rival's the keys it does not read (:data:`CODED_ONLY`; FedBuff's,
    :data:`FEDBUFF_DROPS`)."""
    rival = (FEDBUFF_DROPS if run == "fedbuff" else set(CODED_ONLY) if run != "coded"
             else set())
    return set(RUNS[run]) | {"results-dir"} | rival


def rival_refusal(values: Mapping[str, object]) -> str | None:
    """Why the drop-stragglers run cannot run with these overrides (``None``: it can;
    :func:`server.rival_config.rival_refusal` on them without the coded-only keys)."""
    return _rival_refusal(merge_config(shared_keys(values)), "drop-stragglers")


#: ``--preset`` names -> the regime of ``results/first_hour.json`` (experiments/first_hour.py,
#: 3 seeds) it runs: where that experiment found coding recommended (the defaults' latency
#: regime), and where it found it not
PRESETS = {"coding-wins": "recommended", "coding-loses": "losing_preset"}
FIRST_HOUR = ROOT / "results" / "first_hour.json"


def fedbuff_refusal(values: Mapping[str, object]) -> str | None:
    """Why the FedBuff run cannot run with the user's run-config ``values`` (``None``: it
    can), e.g. DP or a server optimiser other than plain SGD, which it refuses by name."""
    from server.asynchronous import async_refusal
    from server.rival_config import FAULT_KEYS

    kept = {k: v for k, v in values.items() if k not in dropped("fedbuff")}
    cfg = merge_config({**kept, **override_values(RUNS["fedbuff"])})
    faults = ", ".join(f"{k}={cfg[k]!r}" for k in FAULT_KEYS if str(cfg[k]).strip())
    if faults and not merge_config(values)["asynchronous"]:
        return (f"{faults}: coded rounds name a faulty worker by its position in the round's "
                "cohort, FedBuff by its partition id, so FedBuff would be faulted on other "
                "clients; run without faults, or with asynchronous=true (both name partitions)")
    return async_refusal(cfg)


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
    return " ".join(f"{key}={_toml(value)}" for key, value in config.items())


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


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"'{value}'"
    return repr(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-supernodes", type=int, default=NUM_SUPERNODES)
    parser.add_argument("--run-config", default="", help="'key=value key2=value2' overrides")
    parser.add_argument("--results-dir", default="results/run")
    parser.add_argument("--home", default=str(ROOT / ".flwr"), help="private FLWR_HOME")
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
    # FedBuff too, unless the coded run is FedBuff itself (asynchronous with s = 0)
    itself = bool(values.get("asynchronous")) and str(values.get("s", "")) == "0"
    for name in ("uncoded", "drop-stragglers", "fedbuff")[:2 if itself else 3]:
        out = results.with_name(f"{results.name}-{name}")
        refusal = {"drop-stragglers": rival_refusal, "fedbuff": fedbuff_refusal}.get(
            name, lambda _: None)(values)
        if refusal:
            print(f"the {name} run is skipped: {refusal}", flush=True)
            continue
        run_code = flwr_run(args, out, run_config_for(name, args.run_config, out))
        if run_code == 0:
            runs[name] = out
        code = code or run_code
    if len(runs) > 1:
        print(compare(results, runs.get("uncoded"), runs.get("drop-stragglers"),
                      runs.get("fedbuff")), flush=True)
    return code


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


def _time_to(rows: list[dict], target: float) -> float | None:
    for row in rows:
        if row["accuracy"] is not None and row["accuracy"] >= target - 1e-12:
            return float(row["virtual_s"])
    return None


#: What each run of the main job is, for the table's legend.
LEGEND = {
    "coded": "gradient coding",
    "uncoded": "FedAvg waiting for every client (code='uncoded', no deadline)",
    "drop-stragglers": "Flower FedAvg averaging the replies in by the deadline, dropping the rest",
    "fedbuff": "FedBuff (buffered asynchronous aggregation, s = 0: each client its own "
               "partition)",
}


def summarize(name: str, rows: list[dict], target: float) -> dict[str, object]:
    """One run's line of the table: final accuracy, virtual time to ``target`` and in all,
    exact rounds (coded runs only), MB uploaded, client compute seconds, dropped replies."""
    final = rows[-1]["accuracy"] if rows else None
    return {
        "name": name,
        "final": final,
        "time_to": _time_to(rows, target),
        "total_s": float(rows[-1]["virtual_s"]) if rows else 0.0,
        # asynchronous runs have server steps, not rounds: none is exact or approximate
        "exact": (sum(r["decode"] == "exact" for r in rows), len(rows))
        if name == "coded" and not any(r["decode"] == "buffered" for r in rows) else None,
        "mb_up": sum(r.get("bytes_up") or 0 for r in rows) / 1e6,
        # rows of runs from before compute was recorded have none: shown as missing
        "compute_s": sum(r["compute_s"] for r in rows)
        if rows and all(r.get("compute_s") is not None for r in rows) else None,
        "dropped": sum(int(r.get("late_dropped") or 0) for r in rows),
        "rounds_dropping": sum(int(r.get("late_dropped") or 0) > 0 for r in rows),
        "rounds": len(rows),
    }


def render_table(summaries: list[Mapping[str, object]], target: float,
                 labels: Mapping[str, str] | None = None, clock: str = "virtual time") -> str:
    """The one-screen comparison of :func:`summarize`'s lines (the first is the coded run);
    ``labels``: what each run is (default :data:`LEGEND`); ``clock``: what the times are."""
    def opt(value: object, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    buff = len(summaries) > 2 and any(row["name"] == "fedbuff" for row in summaries)
    lines = [
        "",
        f"{len(summaries)} runs, same seeds and latency draws "
        f"(time to accuracy {target:.3f}, the lowest final one; {clock}):",
        *(["(but FedBuff's, whose run ends when its updates are spent, at another time)"]
          if buff else []),
        f"{'run':17}{'final acc':>10}{'time to ' + format(target, '.3f'):>15}"
        f"{'total time':>12}{'exact rounds':>14}{'MB up':>9}{'client compute':>16}",
    ]
    for row in summaries:
        exact = row["exact"]
        exact_txt = "n/a" if exact is None else f"{exact[0]}/{exact[1]}"
        time_txt = "-" if row["time_to"] is None else f"{row['time_to']:.2f} s"
        compute_txt = "-" if row["compute_s"] is None else f"{row['compute_s']:.2f} s"
        lines.append(
            f"{row['name']:17}{opt(row['final'], '.3f'):>10}{time_txt:>15}"
            f"{row['total_s']:>10.2f} s{exact_txt:>14}{row['mb_up']:>9.2f}{compute_txt:>16}"
        )
    for row in summaries:
        label = {**LEGEND, **(labels or {})}.get(str(row["name"]), "")
        lines.append(f"  {row['name']}: {label}")
    coded = summaries[0]
    for row in summaries[1:]:
        if row["name"] == "drop-stragglers" and row["dropped"]:
            lines.append(
                f"drop-stragglers dropped {row['dropped']} late replies in "
                f"{row['rounds_dropping']} of {row['rounds']} rounds "
                "(non-IID: biased to the fast clients)")
        if coded["time_to"] and row["time_to"]:
            ratio = row["time_to"] / coded["time_to"]
            lines.append(
                f"coding reached {target:.3f} {ratio:.2f}x sooner than {row['name']}"
                if coded["time_to"] < row["time_to"] else
                f"coding was {1 / ratio:.2f}x slower to {target:.3f} than {row['name']} "
                f"(finals {opt(coded['final'], '.3f')}, {opt(row['final'], '.3f')}): "
                "here it does not pay")
        elif row["name"] == "fedbuff" and row["time_to"] is None:
            lines += [f"fedbuff did not reach {target:.3f}: its run ends when its updates are "
                      "spent (num-rounds times", f"  the cohort), here at {row['total_s']:.2f} s "
                      f"of virtual time, final accuracy {opt(row['final'], '.3f')}"]
    return "\n".join(lines)


def _bar(cfg: dict) -> str:
    """How an asynchronous run's clients served their neighbours' partitions (its label)."""
    bar = float(cfg.get("replicate-below", 1.0))
    z = float(cfg.get("replicate-margin", 0.0))
    need = float(cfg.get("need-ratio", 0.0))
    asked = " (s='auto')" if cfg.get("s-asked") == "auto" else ""
    if int(cfg["s"]) == 0:
        return ""
    if bar >= 1.0 and z == 0.0:  # the least-served rule: the label says so only when asked
        return f", the held partition served least so far{asked}" if asked else ""
    margin = f" by more than {z:g} sd" if z else ""
    once = " once" if cfg.get("need-latch") else ""
    against = {"era": "its recent updates were over {:g}x their era's",
               "cohort": "its recent updates were over {:g}x their cohort's era's"}.get(
        str(cfg.get("need-reference")), "its last update was over {:g}x the own's")
    prior = ", and until read twice" if cfg.get("need-prior") else ""
    lifted = f" (1x{once} when {against.format(need)}{prior})" if need else ""
    return (f", a neighbour's partition served while below {bar:g}x a client's own"
            f"{lifted}{margin}{asked}")


def compare(coded_dir: Path, uncoded_dir: Path | None, drop_dir: Path | None = None,
            fedbuff_dir: Path | None = None) -> str:
    """The one-screen comparison of the main job's runs (coded, and FedBuff, uncoded and
    drop-stragglers when given), and ``comparison.png`` (accuracy vs virtual time) in
    ``coded_dir``."""
    from fl_gradcode.results import read_rounds

    dirs = {name: d for name, d in (("coded", coded_dir), ("uncoded", uncoded_dir),
                                    ("drop-stragglers", drop_dir), ("fedbuff", fedbuff_dir))
            if d is not None}
    rows = {name: read_rounds(d) for name, d in dirs.items()}
    # a value that is not a finite number is null in rounds.jsonl (an accuracy of NaN); the
    # target is the runs' lowest final but FedBuff's, whose run ends when its updates are
    # spent, at another virtual time (it would set the bar of every other row)
    finals = [r[-1]["accuracy"] for name, r in rows.items() if r
              and (name != "fedbuff" or len(rows) == 2)]
    target = min((a for a in finals if a is not None), default=0.0)
    labels, clock, asynchronous = {}, "virtual time", False
    try:
        cfg = json.loads((Path(coded_dir) / "config.json").read_text())
        asynchronous = bool(cfg.get("asynchronous"))
        if cfg.get("timing") == "wallclock":
            clock = "wall-clock time"
        labels["coded"] = (
            f"asynchronous: FedBuff over partitions held by s + 1 = {int(cfg['s']) + 1} "
            f"clients{_bar(cfg)}, a server step every {cfg['buffer-size']} updates, "
            f"{cfg['server-steps']} steps" if cfg.get("asynchronous")
            else f"gradient coding, code={cfg['code']} s={cfg['s']}")
        labels["drop-stragglers"] = (
            f"Flower FedAvg averaging the replies in by {cfg['straggler-timeout']} s "
            "(virtual), dropping the rest")
        if fedbuff_dir is not None and asynchronous:
            labels["fedbuff"] = ("FedBuff itself (asynchronous, s = 0: each client its own "
                                 "partition), the same buffer, steps and seeds")
        elif fedbuff_dir is not None:
            buff = json.loads((Path(fedbuff_dir) / "config.json").read_text())
            labels["fedbuff"] = (
                "FedBuff (buffered asynchronous aggregation, Nguyen et al. 2022), a server "
                f"step every {buff['buffer-size']} updates at server lr "
                f"{buff['server-lr']}, {buff['server-steps']} steps, untuned")
    except (OSError, ValueError, KeyError):
        pass
    lines = [render_table([summarize(n, r, target) for n, r in rows.items()], target,
                          labels, clock)]
    if "fedbuff" in rows and len(rows) > 2 and asynchronous:
        lines.append("(against uncoded and drop-stragglers the gain is asynchrony's and "
                     "replication's together; against fedbuff, replication's alone)")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for name, run_rows in rows.items():
            ax.plot([0.0] + [r["virtual_s"] for r in run_rows],
                    [None] + [r["accuracy"] for r in run_rows], marker=".", label=name)
        ax.axhline(target, color="grey", lw=0.8, ls=":")
        ax.set_xlabel(f"{clock} (s)")
        ax.set_ylabel("test accuracy")
        ax.set_title("Gradient coding vs Flower FedAvg, same seeds and latency draws",
                     fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        png = Path(coded_dir) / "comparison.png"
        fig.savefig(png, dpi=120)
        plt.close(fig)
        lines.append(f"figure: {png}")
    except ImportError:
        pass
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
