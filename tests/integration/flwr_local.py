"""Run ``flwr run APP`` on a private local simulation SuperLink, and stop it afterwards.

As ``server.launch`` does for this project's own app: a private ``FLWR_HOME`` (so the user's
``~/.flwr`` is neither read nor changed), ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``
(the local SuperLink that ``flwr run`` starts would otherwise ``uv sync`` the app's dependencies,
a multi-GB CUDA torch), and the detached SuperLink / SuperExec that mention that home in their
command line are stopped by PID when the run ends.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from server.launch import stop_local_superlink

ROOT = Path(__file__).resolve().parents[2]


def flwr_executable() -> str | None:
    local = Path(sys.executable).with_name("flwr")
    return str(local) if local.exists() else shutil.which("flwr")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def flwr_run(
    app_dir: Path,
    *,
    home: Path,
    num_supernodes: int,
    run_config: str = "",
    cwd: Path | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess:
    """``flwr run app_dir --stream`` with ``num_supernodes`` SuperNodes; stdout+stderr captured."""
    flwr = flwr_executable()
    if flwr is None:
        raise FileNotFoundError("the flwr CLI is not installed")
    home = Path(home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        # our own local SuperLink, not one another session started on the default 39091/39093
        # (``flwr run`` would reuse that one, with whatever settings it was started with)
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
        # the app processes import fl_gradcode from this checkout, whatever is pip-installed
        # (with another checkout installed in editable mode, the example-app test failed when
        # run alone and passed only after other tests had run)
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    cmd = [
        flwr,
        "run",
        str(Path(app_dir).resolve()),
        "--stream",
        "--federation-config",
        f"num-supernodes={num_supernodes}",
    ]
    if run_config:
        cmd += ["--run-config", run_config]
    stop_local_superlink(home)
    try:
        return subprocess.run(
            cmd,
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )
    finally:
        stop_local_superlink(home)
