"""Run a coded job on Flower's deployment engine on localhost: one SuperLink, n SuperNodes.

Each SuperNode learns its worker index from ``--node-config "partition-id=i"``; node
``--slow-node`` also gets ``extra-delay-s`` so it sleeps that long on every message (a
deliberately slow machine). Processes get private ``FLWR_HOME`` directories under ``--workdir``
and are stopped at the end. Only loopback addresses are used. The exit code is non-zero when
the run's ServerApp did not complete (``flwr run --stream`` itself exits 0 even then: the status
is read with ``flwr ls``; :func:`server.launch.run_flwr`).

After the coded run it runs plain Flower FedAvg (``rival='fedavg'``: no wrapper, waiting for
every reply) on the same SuperLink and SuperNodes with the same run config, and prints and saves
(``overhead_vs_fedavg.json`` in the coded run's ``results-dir``) both runs' per-round wall time
and the overhead ratio, coded over FedAvg (medians over the rounds after the first; the first
round also starts every ClientApp). With ``--slow-node`` FedAvg waits for the slow node and the
coded run does not: the ratio then shows what coding saves, not what it costs.
``--no-compare`` runs the coded job only.

Usage: ``python -m server.deploy_local --nodes 3 --slow-node 2 --slow-delay 30 \\
    --run-config "num-rounds=2 s=1 timing='wallclock' latency='none' straggler-timeout=60.0"``
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from server.launch import RUN_FAILED, override_values, parse_overrides, run_flwr

ROOT = Path(__file__).resolve().parents[1]


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to ``proc``'s process group (started with ``start_new_session=True``); a
    group already gone is no error."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def flower_bin(name: str) -> str:
    """The path of Flower's command ``name`` next to this interpreter, else ``name`` (PATH)."""
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
    compare: bool = True,
) -> int:
    """Start the SuperLink and SuperNodes, ``flwr run`` the app against them (and, with
    ``compare``, plain Flower FedAvg after it: :func:`fedavg_run_config`), stop everything."""
    check_slow_node(run_config, slow_node, slow_delay)
    workdir = Path(workdir or tempfile.mkdtemp(prefix="flgc-deploy-"))
    workdir.mkdir(parents=True, exist_ok=True)
    run_config, results = with_results_dir(run_config, workdir / "results")
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
                flower_bin("flower-superlink"),
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
                    flower_bin("flower-supernode"),
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
        def flwr_run(config: str) -> int:
            cmd = [flower_bin("flwr"), "run", str(ROOT), "deploy", "--stream", "--run-config",
                   config]
            print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
            # non-zero unless the run's ServerApp completed (flwr run itself exits 0 either way)
            return run_flwr(cmd, env={**base_env, "FLWR_HOME": str(cli_home)}, cwd=ROOT,
                            timeout=timeout, connection="deploy")

        code = flwr_run(run_config)
        if code != 0 or not compare:
            return code
        fedavg = results.with_name(f"{results.name}-fedavg")
        code = flwr_run(fedavg_run_config(run_config, fedavg))
        if code == 0:
            from fl_gradcode.results import read_rounds

            try:
                report = overhead(read_rounds(results), read_rounds(fedavg))
            except (OSError, ValueError) as exc:
                print(f"no overhead report: the runs' rounds.jsonl could not be read: {exc}",
                      flush=True)
                return RUN_FAILED
            report.update({"nodes": nodes, "slow_node": slow_node, "slow_delay_s": slow_delay,
                           "run_config": run_config, "fedavg_results": str(fedavg),
                           "loadavg": list(os.getloadavg())})
            out = results / "overhead_vs_fedavg.json"
            out.write_text(json.dumps(report, indent=2))
            print(render_overhead(report), flush=True)
            print(f"saved: {out}", flush=True)
        return code
    finally:
        for proc in reversed(procs):
            signal_group(proc, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                signal_group(proc, signal.SIGKILL)
        for log in logs:
            log.close()


def check_slow_node(run_config: str, slow_node: int | None, slow_delay: float) -> None:
    """Refuse a slow node the run would not see: its ``extra-delay-s`` is slept, which virtual
    timing charges only with ``virtual-compute='measured'`` (else the node is as fast as the
    others in the run's clock)."""
    if slow_node is None or not slow_delay > 0:
        return
    from fl_gradcode.config import charges_sleep, merge_config

    cfg = merge_config(override_values(parse_overrides(run_config)))
    if not charges_sleep(cfg):
        raise ValueError(
            f"--slow-node {slow_node} --slow-delay {slow_delay:g}: the node sleeps on every "
            f"message, which timing='virtual' with virtual-compute={cfg['virtual-compute']!r} "
            "does not charge (it would not be slower in the run's clock); add timing='wallclock'"
            " or virtual-compute='measured' to --run-config")


def with_results_dir(run_config: str, default: Path) -> tuple[str, Path]:
    """``run_config`` with an absolute ``results-dir`` (``default`` when it sets none), and
    that directory (relative paths would resolve in the ServerApp process's directory)."""
    pairs = parse_overrides(run_config)
    given = override_values(pairs).get("results-dir")
    results = Path(str(given) if given else default).expanduser().resolve()
    if "'" in str(results):
        raise ValueError(f"results directory {str(results)!r} contains a single quote")
    pairs["results-dir"] = f"'{results}'"
    return " ".join(f"{k}={v}" for k, v in pairs.items()), results


def fedavg_run_config(run_config: str, results: Path) -> str:
    """The baseline's ``--run-config``: ``run_config`` with ``rival='fedavg'`` (plain Flower
    FedAvg) and its own ``results-dir``; every key once (``flwr run`` refuses a key twice)."""
    pairs = parse_overrides(run_config)
    if override_values(pairs).get("rival"):
        raise ValueError(f"rival={pairs['rival']} in --run-config: deploy_local compares the "
                         "coded run with rival='fedavg'; leave rival out (or use --no-compare)")
    pairs.update({"rival": "'fedavg'", "results-dir": f"'{results}'"})
    return " ".join(f"{k}={v}" for k, v in pairs.items())


def overhead(coded: list[dict], fedavg: list[dict]) -> dict:
    """Per-round wall seconds of the coded run and of plain FedAvg, their medians over the
    rounds after the first (over every round when there is one) and ``overhead_ratio`` =
    coded median / FedAvg median."""
    def median(rows: list[dict]) -> float:
        walls = [float(r["wall_s"]) for r in rows]
        return statistics.median(walls[1:] if len(walls) > 1 else walls)

    if not coded or not fedavg:
        raise ValueError(f"no rounds to compare: coded {len(coded)}, fedavg {len(fedavg)}")
    coded_s, fedavg_s = median(coded), median(fedavg)
    return {
        "coded_wall_s": [float(r["wall_s"]) for r in coded],
        "fedavg_wall_s": [float(r["wall_s"]) for r in fedavg],
        "coded_decode": [r["decode"] for r in coded],
        "median_coded_s": coded_s,
        "median_fedavg_s": fedavg_s,
        "median_over": "rounds 2.." if len(coded) > 1 and len(fedavg) > 1 else "round 1",
        "overhead_ratio": coded_s / fedavg_s if fedavg_s > 0 else None,
    }


def render_overhead(report: dict) -> str:
    """The per-round comparison :func:`overhead` measured, one line per round."""
    lines = [f"{'round':>5}{'coded wall s':>14}{'FedAvg wall s':>15}"]
    coded, fedavg = report["coded_wall_s"], report["fedavg_wall_s"]
    for i in range(max(len(coded), len(fedavg))):
        c = f"{coded[i]:.2f}" if i < len(coded) else "-"
        f = f"{fedavg[i]:.2f}" if i < len(fedavg) else "-"
        lines.append(f"{i + 1:>5}{c:>14}{f:>15}")
    ratio = report["overhead_ratio"]
    lines.append(f"median ({report['median_over']}): coded {report['median_coded_s']:.2f} s, "
                 f"plain FedAvg {report['median_fedavg_s']:.2f} s: overhead ratio "
                 f"{'-' if ratio is None else format(ratio, '.2f')}x")
    if report.get("slow_node") is not None:
        lines.append(f"(node {report['slow_node']} is slow: FedAvg waits for it, the coded run "
                     "does not, so this ratio shows what coding saves, not what it costs)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--slow-node", type=int, default=None)
    parser.add_argument("--slow-delay", type=float, default=30.0)
    parser.add_argument("--run-config", default="num-rounds=3 s=1 timing='wallclock' "
                        "latency='none' straggler-timeout=60.0")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--no-compare", action="store_true",
                        help="skip the plain Flower FedAvg run after the coded one")
    args = parser.parse_args(argv)
    return run(
        args.nodes,
        args.run_config,
        slow_node=args.slow_node,
        slow_delay=args.slow_delay,
        workdir=Path(args.workdir) if args.workdir else None,
        compare=not args.no_compare,
    )


if __name__ == "__main__":
    sys.exit(main())
