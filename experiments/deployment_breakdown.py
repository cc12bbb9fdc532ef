"""Where a round on Flower's deployment engine (localhost) spends its wall-clock time.

One SuperLink and ``n`` SuperNodes on loopback (as ``server.deploy_local``), and jobs of the
same small app (``experiments/deployment_app``: numpy softmax regression, one partition per
node) run one after the other on them:

* ``fedavg``: Flower's ``FedAvg`` alone (the ClientApp never imports ``fl_gradcode``);
* ``fedavg-torch`` (not run by default): the same, the ClientApp importing torch as a torch
  app does;
* ``coded``: ``FedAvg`` wrapped in ``GradientCoding`` (``grouped-rs``, ``s=1``, wallclock
  timing) with ``gradient_coding_mod`` on the clients, as shipped;
* ``coded-tuned``: the same with three changes tried from the app side: the wrapper's grid
  polls every 0.1 s instead of 5 ms, the handshake polls every 0.1 s instead of Flower's 3 s,
  and the ClientApp imports only ``fl_gradcode.flower.mod`` (not the package ``__init__``).

Timestamps come from three places, all ``time.time()`` on this machine:

* the ServerApp: every strategy call (configure_train, on_reply, aggregate_train), every push
  and every pulled reply;
* each ClientApp process (one per message): the process start (``/proc``), the app module's
  import, the handler's entry and exit, each train call, the ``fl_gradcode`` import (coded);
* each SuperNode's log (``FLWR_LOG_LEVEL=DEBUG`` adds timestamps): when it pulled a message
  from the SuperLink and when it finished pushing the reply there.

Every round is decomposed along its critical message (the reply the ServerApp pulled last
among those the round used; among one pull's replies, the one whose arrival at the SuperLink
came last): SuperNode poll wait, object fetch, SuperExec poll,
ClientApp process start, our mod's import / work, the train handler, the way back to the
SuperLink, the ServerApp's pull wait, the strategy's own calls, and the rest.

Run: ``nice -n 5 python -m experiments.deployment_breakdown [--nodes 3 5] [--rounds 4]
[--modes fedavg coded coded-tuned] [--out results/deployment_breakdown]``: about 4 minutes for
the default (``n=3``, three jobs of 4 rounds) on 2 shared cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from experiments.common import ROOT, save
from experiments.summary import median_known
from fl_gradcode.results import read_rounds
from server.deploy_local import flower_bin, free_port, signal_group, wait_for_port

APP = ROOT / "experiments" / "deployment_app"
MODES = {  # job -> extra run config
    "fedavg": "",
    "fedavg-torch": "app-imports-torch=true",
    "coded": "",
    "coded-tuned": "lean-import=true tuned-poll-s=0.1",
}

#: whose code each breakdown key runs (the train handler is the app's)
FLOWER_KEYS = (
    "push_s", "flower_poll_s", "superexec_poll_s", "clientapp_start_s", "reply_return_s",
    "server_pull_wait_s",
)
OURS_KEYS = ("handshake_s", "server_wrapper_s", "mod_import_s", "mod_overhead_s")
#: breakdown keys in the order of the critical message's path
KEYS = (
    "handshake_s", "server_configure_s", "push_s", "flower_poll_s", "superexec_poll_s",
    "clientapp_start_s", "app_import_s", "mod_import_s", "client_train_s", "mod_overhead_s",
    "reply_return_s", "server_pull_wait_s", "server_on_reply_s", "server_aggregate_s", "other_s",
)
DETAIL_KEYS = (
    "server_wrapper_s", "fetch_s", "clientapp_boot_s", "clientapp_pull_task_s",
    "clientapp_load_s", "mod_import_torch_s", "mod_import_rest_s", "supernode_reply_poll_s",
    "messages",
)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LINE = re.compile(r"^\w+\s+(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\s*:\s*(.*)$")
_RECEIVING = re.compile(r"Receiving: (\w+) message \(ID: (\w+)\)")
_SENDING = re.compile(r"Sending: (\w+) message \(ID: (\w+)\)")
#: DEBUG lines of the flwr-clientapp process (same log as its SuperNode) -> stamp name
_CLIENTAPP_POINTS = {
    "Start `flwr-clientapp` process": "clientapp_booted",  # interpreter + flwr imported
    "[flwr-clientapp] Start FAB installation.": "clientapp_task_pulled",
    "[flwr-clientapp] Start `ClientApp` Loading.": "clientapp_loading",
}


# ---------------------------------------------------------------------- the local deployment
class Cluster:
    """A SuperLink and ``n`` SuperNodes on 127.0.0.1, with private ``FLWR_HOME``s in ``workdir``.

    SuperNodes log at DEBUG (Flower then stamps each line with the time); every process gets
    the project root on ``PYTHONPATH`` so that ClientApp processes import ``fl_gradcode``.
    """

    def __init__(self, nodes: int, workdir: Path) -> None:
        self.nodes, self.workdir = nodes, workdir
        self.env = {
            **os.environ,
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        }
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Any] = []
        self.port = free_port()

    def _start(self, cmd: list[str], name: str, extra_env: dict[str, str]) -> subprocess.Popen:
        home = self.workdir / name
        home.mkdir(parents=True, exist_ok=True)
        log = (self.workdir / f"{name}.log").open("w")
        self.logs.append(log)
        proc = subprocess.Popen(
            cmd, env={**self.env, "FLWR_HOME": str(home), **extra_env}, stdout=log, stderr=log,
            cwd=self.workdir, start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def __enter__(self) -> Cluster:
        self.link = self._start(
            [flower_bin("flower-superlink"), "--insecure",
             "--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port",
             str(self.port)],
            "superlink", {},
        )
        wait_for_port(self.port)
        for i in range(self.nodes):
            self._start(
                [flower_bin("flower-supernode"), "--insecure", "--superlink",
                 f"127.0.0.1:{self.port}", "--host", "127.0.0.1", "--port", str(free_port()),
                 "--node-config", f"partition-id={i} num-partitions={self.nodes}"],
                f"supernode{i}", {"FLWR_LOG_LEVEL": "DEBUG"},
            )
        cli = self.workdir / "cli"
        cli.mkdir(parents=True, exist_ok=True)
        (cli / "config.toml").write_text(
            '[superlink]\ndefault = "deploy"\n\n'
            f'[superlink.deploy]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self.procs):
            signal_group(proc, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                signal_group(proc, signal.SIGKILL)
        for log in self.logs:
            log.close()

    def session_cpu_s(self) -> float:
        """CPU seconds so far of the live processes in the SuperLink's session (the SuperLink,
        its SuperExec and the ServerApp process)."""
        return _session_cpu_s(self.link.pid)

    def run(self, run_config: str, log_name: str, timeout: float = 300.0) -> int:
        cmd = [flower_bin("flwr"), "run", str(APP), "deploy", "--stream", "--run-config",
               run_config]
        print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
        with (self.workdir / log_name).open("w") as log:
            return subprocess.call(
                cmd, env={**self.env, "FLWR_HOME": str(self.workdir / "cli")}, cwd=ROOT,
                stdout=log, stderr=subprocess.STDOUT, timeout=timeout,
            )


def _session_cpu_s(sid: int) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # field 6: session id
            total += (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    return total


# ---------------------------------------------------------------------- reading the stamps
def supernode_events(log_path: Path) -> dict[str, dict[str, float]]:
    """Per message id: ``received`` / ``fetched`` (instructions), ``sending`` / ``sent``
    (replies), from a SuperNode's DEBUG log."""
    out: dict[str, dict[str, float]] = {}
    last_in = last_out = None
    for raw in log_path.read_text(errors="replace").splitlines():
        m = _LINE.match(_ANSI.sub("", raw).strip())
        if not m:
            continue
        t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        text = m.group(2)
        if hit := _RECEIVING.search(text):
            last_in = hit.group(2)
            out.setdefault(last_in, {})["received"] = t
        elif text.startswith("Received successfully") and last_in:
            out[last_in]["fetched"] = t
        elif last_in and (point := _CLIENTAPP_POINTS.get(text.split(" with ")[0])):
            out[last_in].setdefault(point, t)  # the ClientApp process of the last instruction
        elif hit := _SENDING.search(text):
            last_out = hit.group(2)
            out.setdefault(last_out, {})["sending"] = t
        elif text.startswith("Sent successfully") and last_out:
            out[last_out]["sent"] = t
    return out


def breakdown(server: dict, clients: list[dict], nodes: dict[str, dict[str, float]]) -> dict:
    """Per-round decomposition along each round's critical message."""
    ev = server["events"]
    by = {name: [e for e in ev if e["event"] == name] for name in
          ("configure_train", "aggregate_train", "on_reply", "push", "pull", "send_and_receive")}
    client_of = {c["message_id"]: c for c in clients}
    rounds = []
    for cfg in by["configure_train"]:
        r = cfg["round"]
        agg = next(a for a in by["aggregate_train"] if a["round"] == r)
        pushes = [p for p in by["push"] if cfg["t1"] <= p["t0"] <= agg["t0"]]
        handshake = sum(s["t1"] - s["t0"] for s in by["send_and_receive"]
                        if cfg["t0"] <= s["t0"] and s["t1"] <= cfg["t1"])
        push_ids = {p["message_id"] for p in pushes}
        used = [p for p in by["pull"] if p["reply_to"] in push_ids and p["t1"] <= agg["t0"]]
        row: dict[str, Any] = {"round": r, "round_s": agg["t1"] - cfg["t0"],
                               "messages": len(pushes), "replies_used": len(used)}
        if not used:
            rounds.append(row)
            continue
        # the reply the aggregate waited for: the last pulled (a reply its node sent earlier
        # can be pulled a poll later), then the last its node sent among one pull's replies
        crit = max(used, key=lambda p: (p["t1"], nodes.get(p["message_id"], {}).get(
            "sent", p["t1"])))
        c = client_of.get(crit["reply_to"], {})
        ins = nodes.get(crit["reply_to"], {})
        out = nodes.get(crit["message_id"], {})
        push = next(p for p in pushes if p["message_id"] == crit["reply_to"])
        train = sum(t1 - t0 for t0, t1 in c.get("train_calls", []))
        imports = c.get("import_torch_s", 0.0) + c.get("import_gc_s", 0.0)
        app_import = c.get("app_import_s", 0.0)
        # on_reply of earlier replies overlaps the wait for the critical one: not on the path
        on_reply = sum(o["t1"] - o["t0"] for o in by["on_reply"]
                       if crit["t0"] <= o["t0"] <= agg["t0"])
        # the SuperLink stores a message before its push call returns, so a node may receive
        # it first: the push then ends, on the critical path, when the node received it
        received = ins.get("received", float("nan"))
        pushed = min(push["t1"], received) if received == received else push["t1"]
        parts = {
            "handshake_s": handshake,
            "server_configure_s": cfg["t1"] - cfg["t0"] - handshake,
            "push_s": pushed - cfg["t1"],
            "flower_poll_s": received - pushed,
            # the SuperNode creates the task before it fetches the message's objects, so the
            # SuperExec may start the ClientApp before the fetch ends: both from "received"
            "superexec_poll_s": c.get("process_start", float("nan"))
            - ins.get("received", float("nan")),
            "clientapp_start_s": c.get("entry", float("nan"))
            - c.get("process_start", float("nan")),
            "app_import_s": app_import,
            "mod_import_s": imports,
            "client_train_s": train,
            "mod_overhead_s": c.get("exit", float("nan")) - c.get("entry", float("nan"))
            - imports - train - app_import,
            "reply_return_s": out.get("sent", float("nan")) - c.get("exit", float("nan")),
            "server_pull_wait_s": crit["t1"] - out.get("sent", float("nan")),
            "server_on_reply_s": on_reply,
            "server_aggregate_s": agg["t1"] - agg["t0"],
        }
        parts["other_s"] = row["round_s"] - sum(parts.values())
        row.update({k: (None if v != v else v) for k, v in parts.items()})
        row["critical_node_partition"] = c.get("partition_id")
        row["clientapp_module_import_s"] = c.get("module_imported", 0) - c.get("module_start", 0)
        row["fetch_s"] = ins.get("fetched", float("nan")) - ins.get("received", float("nan"))
        row["mod_import_torch_s"] = c.get("import_torch_s", 0.0)
        row["mod_import_rest_s"] = c.get("import_gc_s", 0.0)
        row["supernode_reply_poll_s"] = out.get("sending", float("nan")) - c.get("exit", 0)
        # clientapp_start_s split: interpreter + flwr import, task/FAB pull, FAB install + app
        booted, pulled = ins.get("clientapp_booted"), ins.get("clientapp_task_pulled")
        if booted and pulled and c:
            row["clientapp_boot_s"] = booted - c["process_start"]
            row["clientapp_pull_task_s"] = pulled - booted
            row["clientapp_load_s"] = c["entry"] - pulled
        row["server_wrapper_s"] = (parts["server_configure_s"] + on_reply
                                   + parts["server_aggregate_s"])
        rounds.append(row)
    return {"rounds": rounds}


def summarise(mode: str, rounds: list[dict]) -> dict:
    steady = [r for r in rounds if r["round"] > 1 and "flower_poll_s" in r] or rounds
    med = {k: median_known([r.get(k) for r in steady]) for k in
           ("round_s", *KEYS, *DETAIL_KEYS)}
    flower = sum(med[k] or 0.0 for k in FLOWER_KEYS)
    ours = sum(med[k] or 0.0 for k in OURS_KEYS) if mode.startswith("coded") else 0.0
    return {
        "median_steady": med,
        "round1_s": rounds[0]["round_s"] if rounds else None,
        "round1_handshake_s": rounds[0].get("handshake_s") if rounds else None,
        "flower_share_s": flower,
        "ours_share_s": ours,
        "ours_over_flower": ours / flower if flower else None,
    }


def run_nodes(nodes: int, rounds: int, workdir: Path, modes: list[str]) -> dict:
    """Run the jobs on one local deployment; every stamp stays in ``workdir``."""
    with Cluster(nodes, workdir) as cluster:
        for mode in modes:
            stamps = workdir / f"stamps-{mode}"
            stamps.mkdir(parents=True, exist_ok=True)
            cpu0, t0 = cluster.session_cpu_s(), time.time()
            code = cluster.run(
                f"mode='{mode}' num-rounds={rounds} num-clients={nodes} "
                f"stamp-dir='{stamps}' {MODES[mode]}",
                f"flwr-run-{mode}.log",
            )
            job = {"exit": code, "job_s": time.time() - t0, "t_run": t0,
                   "superlink_session_cpu_s": cluster.session_cpu_s() - cpu0}
            (stamps / "job.json").write_text(json.dumps(job))
            if code != 0 or not (stamps / f"server-{mode}.json").exists():
                raise RuntimeError(f"{mode} job failed (exit {code}); logs in {workdir}")
    return analyse(workdir, nodes, modes)


def analyse(workdir: Path, nodes: int, modes: list[str]) -> dict:
    """The breakdown of the jobs whose stamps and logs are in ``workdir``."""
    node_events: dict[str, dict[str, float]] = {}
    for i in range(nodes):
        node_events.update(supernode_events(workdir / f"supernode{i}.log"))
    out = {}
    for mode in modes:
        stamps = workdir / f"stamps-{mode}"
        job = json.loads((stamps / "job.json").read_text())
        server = json.loads((stamps / f"server-{mode}.json").read_text())
        clients = [json.loads(p.read_text()) for p in sorted(stamps.glob("client-*.json"))]
        rows = breakdown(server, clients, node_events)["rounds"]
        decoded = stamps / "results-coded"  # the wrapper's rounds: how each one ended
        ended = {r["round"]: r.get("decode") for r in read_rounds(decoded)} \
            if (decoded / "rounds.jsonl").exists() else {}
        for row in rows:
            if row["round"] in ended:
                row["decode"] = ended[row["round"]]
        first_push = min((e["t0"] for e in server["events"] if e["event"] == "push"),
                         default=None)
        out[mode] = {
            "rounds": rows,
            **summarise(mode, rows),
            "job_s": job["job_s"],
            "serverapp_start_s": server["main_start"] - job["t_run"],
            "first_push_s": None if first_push is None else first_push - job["t_run"],
            "serverapp_cpu_s": server["serverapp_cpu_s"],
            "superlink_session_cpu_s": job["superlink_session_cpu_s"],
            "pull_calls": server["pull_calls"],
            "clientapp_processes": len(clients),
            "identify_messages": sum(c["kind"] == "identify" for c in clients),
            # a ClientApp process in which importing the mod brought torch in
            "mod_imported_torch": any(c.get("mod_imported_torch", False) for c in clients),
        }
    return out


def table(result: dict) -> str:
    lines = []
    for n, modes in result["runs"].items():
        lines.append(f"n={n} (medians over rounds 2..R, seconds; critical message per round)")
        lines.append(f"  {'':24s}" + "".join(f"{m:>13s}" for m in modes))
        for key in ("round_s", *KEYS, *DETAIL_KEYS):
            vals = [modes[m]["median_steady"].get(key) for m in modes]
            lines.append(f"  {key:24s}" + "".join(
                f"{v:13.3f}" if v is not None else f"{'-':>13s}" for v in vals))
        for key in ("flower_share_s", "ours_share_s", "ours_over_flower", "round1_s",
                    "round1_handshake_s",
                    "serverapp_start_s", "job_s", "serverapp_cpu_s",
                    "superlink_session_cpu_s", "pull_calls"):
            vals = [modes[m].get(key) for m in modes]
            lines.append(f"  {key:24s}" + "".join(
                f"{v:13.3f}" if isinstance(v, float) else f"{v!s:>13s}" for v in vals))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[3])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--modes", nargs="+", choices=list(MODES),
                        default=["fedavg", "coded", "coded-tuned"])
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--reanalyse", action="store_true",
                        help="only recompute the breakdown from an earlier run's --workdir")
    parser.add_argument("--out", default=str(ROOT / "results" / "deployment_breakdown"))
    args = parser.parse_args(argv)
    base = Path(args.workdir or tempfile.mkdtemp(prefix="flgc-breakdown-"))
    result: dict[str, Any] = {"rounds": args.rounds, "s": 1, "code": "grouped-rs", "runs": {}}
    for n in args.nodes:
        if args.reanalyse:
            result["runs"][str(n)] = analyse(base / f"n{n}", n, args.modes)
        else:
            result["runs"][str(n)] = run_nodes(n, args.rounds, base / f"n{n}", args.modes)
    print(table(result))
    save(result, args.out)
    return result


if __name__ == "__main__":
    main()
