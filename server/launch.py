"""Run the app with ``flwr run .`` on a local simulation SuperLink, safely, in one command.

``flwr run .`` starts a detached local SuperLink that, by default, ``uv sync``s the app's
dependencies into a fresh environment (a multi-GB CUDA torch download) and keeps running after
the run. This launcher gives the run a private ``FLWR_HOME`` (``.flwr/`` in the project), starts
that SuperLink with ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1`` (so the app runs in the
environment where the project is installed), streams the logs, and stops the SuperLink after.

Usage: ``python -m server.launch [--num-supernodes 12] [--run-config "num-rounds=5 s=2"]``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
    args = parser.parse_args(argv)

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
    results = Path(args.results_dir).resolve()
    run_config = f"results-dir='{results}' {args.run_config}".strip()
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
        code = subprocess.call(cmd, env=env, cwd=ROOT)
    finally:
        stop_local_superlink(home)
    print(f"results: {results}/rounds.jsonl, final_model.npz, config.json", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
