"""Run the app with ``flwr run .`` on a local simulation SuperLink, safely, in one command.

``flwr run .`` starts a detached local SuperLink that, by default, ``uv sync``s the app's
dependencies into a fresh environment (a multi-GB CUDA torch download) and keeps running after
the run. This launcher gives the run a private ``FLWR_HOME`` (``.flwr/`` in the project), starts
that SuperLink with ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1`` (so the app runs in the
environment where the project is installed), streams the logs, and stops the SuperLink after.

It then runs the same job uncoded (``code='uncoded' s=0``, same seeds) and ends with a
one-screen comparison (virtual time to the final accuracy, exact rounds, bytes uploaded) and a
PNG of accuracy vs virtual time for both runs (``results/run/comparison.png``).

The exit code is non-zero when a run's ServerApp did not complete (``flwr run --stream``
exits 0 even when the ServerApp raised; the run's status is read with ``flwr ls``:
:func:`run_flwr`).

Usage: ``python -m server.launch [--num-supernodes 12] [--run-config "num-rounds=5 s=2"]
[--no-compare]``.
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
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-supernodes", type=int, default=12)
    parser.add_argument("--run-config", default="", help="'key=value key2=value2' overrides")
    parser.add_argument("--results-dir", default="results/run")
    parser.add_argument("--home", default=str(ROOT / ".flwr"), help="private FLWR_HOME")
    parser.add_argument("--no-compare", action="store_true", help="skip the uncoded run")
    args = parser.parse_args(argv)
    results = Path(args.results_dir).resolve()
    code = flwr_run(args, results, args.run_config)
    if code != 0 or args.no_compare:
        return code
    baseline = results.with_name(results.name + "-uncoded")
    # uncoded FedAvg waits for every client: no virtual straggler deadline
    uncoded = f"{args.run_config} code='uncoded' s=0 straggler-timeout=1000000.0".strip()
    code = flwr_run(args, baseline, uncoded)
    if code == 0:
        print(compare(results, baseline), flush=True)
    return code


def flwr_run(args: argparse.Namespace, results: Path, overrides: str) -> int:
    """One ``flwr run .`` on a private local simulation SuperLink; results in ``results``."""

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
    run_config = f"results-dir='{results}' {overrides}".strip()
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


def compare(coded_dir: Path, uncoded_dir: Path) -> str:
    """A one-screen comparison of the coded and uncoded runs, and ``comparison.png``."""
    from fl_gradcode.results import read_rounds

    coded, uncoded = read_rounds(coded_dir), read_rounds(uncoded_dir)
    final = {name: rows[-1]["accuracy"] for name, rows in (("coded", coded), ("uncoded", uncoded))}
    # a value that is not a finite number is null in rounds.jsonl (an accuracy of NaN)
    target = min((a for a in final.values() if a is not None), default=0.0)
    lines = [
        "",
        f"coded vs uncoded, same seeds (time to accuracy {target:.3f}, the lower final one):",
        f"{'':10}{'final acc':>10}{'time to acc':>13}{'total time':>12}{'exact rounds':>14}"
        f"{'MB up':>9}",
    ]
    times = {}
    for name, rows in (("coded", coded), ("uncoded", uncoded)):
        t = _time_to(rows, target)
        times[name] = t
        exact = sum(r["decode"] == "exact" for r in rows)
        mb = sum(r.get("bytes_up", 0) for r in rows) / 1e6
        t_txt = "-" if t is None else f"{t:.2f} s"
        lines.append(
            f"{name:10}{'-' if final[name] is None else f'{final[name]:.3f}':>10}{t_txt:>13}"
            f"{rows[-1]['virtual_s']:>10.2f} s"
            f"{exact:>8}/{len(rows):<5}{mb:>9.2f}"
        )
    if times["coded"] and times["uncoded"]:
        lines.append(
            f"coding reached {target:.3f} {times['uncoded'] / times['coded']:.2f}x "
            "sooner in virtual time" if times["coded"] < times["uncoded"] else
            f"coding was {times['coded'] / times['uncoded']:.2f}x slower to {target:.3f}: "
            "here it does not pay"
        )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for name, rows in (("coded", coded), ("uncoded", uncoded)):
            ax.plot([0.0] + [r["virtual_s"] for r in rows],
                    [None] + [r["accuracy"] for r in rows], marker=".", label=name)
        ax.set_xlabel("virtual time (s)")
        ax.set_ylabel("test accuracy")
        ax.set_title("Gradient coding vs uncoded FedAvg, same seeds")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        png = coded_dir / "comparison.png"
        fig.savefig(png, dpi=120)
        plt.close(fig)
        lines.append(f"figure: {png}")
    except ImportError:
        pass
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
