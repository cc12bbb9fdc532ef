"""Run a coded job on Flower's deployment engine on localhost: one SuperLink, n SuperNodes.

Each SuperNode learns its worker index from ``--node-config "partition-id=i"``; node
``--slow-node`` also gets ``extra-delay-s`` so it sleeps that long on every message (a
deliberately slow machine). Processes get private ``FLWR_HOME`` directories under ``--workdir``
and are stopped at the end. Only loopback addresses are used. The exit code is non-zero when
the run's ServerApp did not complete (``flwr run --stream`` itself exits 0 even then: the status
is read with ``flwr ls``; :func:`server.launch.run_flwr`).

Usage: ``python -m server.deploy_local --nodes 3 --slow-node 2 --slow-delay 30 \\
    --run-config "num-rounds=2 s=1 timing='wallclock'"``
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from server.launch import run_flwr

ROOT = Path(__file__).resolve().parents[1]


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _bin(name: str) -> str:
    path = Path(sys.executable).with_name(name)
    return str(path) if path.exists() else name


def wait_for_port(port: int, timeout: float = 60.0) -> None:
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def run(
    nodes: int,
    run_config: str,
    *,
    slow_node: int | None = None,
    slow_delay: float = 0.0,
    workdir: Path | None = None,
    timeout: float = 600.0,
) -> int:
    """Start the SuperLink and SuperNodes, ``flwr run`` the app against them, stop everything."""
    workdir = Path(workdir or tempfile.mkdtemp(prefix="flgc-deploy-"))
    workdir.mkdir(parents=True, exist_ok=True)
    base_env = {
        **os.environ,
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    }
    link_port = free_port()  # one HTTP port serves the Runtime, Control and Fleet APIs
    procs: list[subprocess.Popen] = []
    logs = []

    def start(cmd: list[str], home: Path, name: str) -> None:
        home.mkdir(parents=True, exist_ok=True)
        log = (workdir / f"{name}.log").open("w")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                cmd,
                env={**base_env, "FLWR_HOME": str(home)},
                stdout=log,
                stderr=log,
                cwd=ROOT,
                start_new_session=True,  # own process group: its ClientApp processes die with it
            )
        )

    try:
        start(
            [
                _bin("flower-superlink"),
                "--insecure",
                "--disable-runtime-dependency-installation",
                "--host",
                "127.0.0.1",
                "--port",
                str(link_port),
            ],
            workdir / "superlink",
            "superlink",
        )
        wait_for_port(link_port)
        for i in range(nodes):
            node_config = f"partition-id={i} num-partitions={nodes}"
            if i == slow_node:
                node_config += f" extra-delay-s={float(slow_delay)}"
            start(
                [
                    _bin("flower-supernode"),
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{link_port}",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(free_port()),
                    "--node-config",
                    node_config,
                ],
                workdir / f"supernode{i}",
                f"supernode{i}",
            )
        cli_home = workdir / "cli"
        cli_home.mkdir(parents=True, exist_ok=True)
        (cli_home / "config.toml").write_text(
            '[superlink]\ndefault = "deploy"\n\n'
            f'[superlink.deploy]\naddress = "127.0.0.1:{link_port}"\ninsecure = true\n'
        )
        cmd = [_bin("flwr"), "run", str(ROOT), "deploy", "--stream", "--run-config", run_config]
        print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
        # non-zero unless the run's ServerApp completed (flwr run itself exits 0 either way)
        return run_flwr(cmd, env={**base_env, "FLWR_HOME": str(cli_home)}, cwd=ROOT,
                        timeout=timeout, connection="deploy")
    finally:
        for proc in reversed(procs):
            _signal_group(proc, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
        for log in logs:
            log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--slow-node", type=int, default=None)
    parser.add_argument("--slow-delay", type=float, default=30.0)
    parser.add_argument("--run-config", default="num-rounds=3 s=1 timing='wallclock'")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    return run(
        args.nodes,
        args.run_config,
        slow_node=args.slow_node,
        slow_delay=args.slow_delay,
        workdir=Path(args.workdir) if args.workdir else None,
    )


if __name__ == "__main__":
    sys.exit(main())
