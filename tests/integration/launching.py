"""Helpers of the launcher's tests: ``server.launch.main`` with ``flwr run`` replaced, and the
first-hour experiment's regimes read from its results file."""

from __future__ import annotations


def launch_main(tmp_path, monkeypatch, argv):
    """``launch.main(argv)`` with ``flwr run`` replaced: the commands it would run (the
    table's arguments: ``launch_main.compared``, its keywords ``launch_main.keywords``)."""
    from server import launch

    commands = []
    monkeypatch.setattr(launch, "run_flwr", lambda cmd, **kw: commands.append(list(cmd)) or 0)
    monkeypatch.setattr(launch, "stop_local_superlink", lambda home: None)
    compared, keywords = [], []
    monkeypatch.setattr(launch, "compare", lambda *dirs, **kw: compared.append(dirs)
                        or keywords.append(kw) or "compared")
    monkeypatch.setenv("FL_GRADCODE_DP_KEY_FILE", str(tmp_path / "unused-keys.json"))
    code = launch.main(["--home", str(tmp_path / "home"), "--results-dir",
                        str(tmp_path / "run"), *argv])
    launch_main.compared, launch_main.keywords = compared, keywords
    return code, [c[c.index("--run-config") + 1] for c in commands]


def first_hour_regime(role):
    """The run config the committed first-hour experiment ran for ``role``: its base with the
    regime's overrides (read here from the JSON directly, not through the launcher), but the
    latency parameters its latency model does not read (the ServerApp now refuses them)."""
    import json
    from pathlib import Path

    from fl_gradcode.config import DEFAULTS
    from fl_gradcode.latency import LATENCY_PARAMETERS

    data = json.loads((Path(__file__).resolve().parents[2] / "results" / "first_hour.json")
                      .read_text())
    run = {**data["base"], **data["regimes"][data[role]]["run_config"]}
    reads = LATENCY_PARAMETERS[run.get("latency", DEFAULTS["latency"])]
    return {k: v for k, v in run.items() if not k.startswith("latency-") or k == "latency-state"
            or k.removeprefix("latency-").replace("-", "_") in reads}
