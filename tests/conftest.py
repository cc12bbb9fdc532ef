"""Fixtures shared by the whole suite.

Shared helpers that are not fixtures live in modules the tests import:
``tests/apps/numpy_app.py`` (the small numpy app and its FedAvg oracle),
``tests/apps/vector_app.py`` (a one-array numpy app, its oracle and a reply-scaling mod),
``tests/flower/harness.py`` (``run``: rounds of ``GradientCoding`` on in-process nodes, with
faults injected from outside), ``tests/flower/messages.py`` (single messages and contexts for
the client mod), ``tests/doubles.py`` (test doubles used by several files: user strategies, and
an ``EarlyReturnGrid``'s fake time, scripted inner grid and round owner); per directory,
``tests/adaptive/support.py`` (runs of ``s="auto"`` on the vector app, one simulated round),
``tests/flower/decoder_support.py`` (decoders and their numpy problems),
``tests/flower/collaborators_support.py`` (plans, round states, verifiers and stub replies),
``tests/faults/fault_cases.py`` (fault scenarios run against their numpy oracle).
pytest rewrites the asserts of these modules too (``register_assert_rewrite`` below), so a
failing helper assert reports its values.
"""

from __future__ import annotations

import logging

import pytest

pytest.register_assert_rewrite(
    "tests.apps", "tests.doubles", "tests.flower.harness", "tests.flower.messages",
    "tests.adaptive.support", "tests.flower.decoder_support",
    "tests.flower.collaborators_support", "tests.faults.fault_cases",
)


@pytest.fixture(autouse=True)
def task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test may build Flower Messages (as inside a ServerApp) and reads no DP key file
    named by the environment of whoever runs the suite."""
    from fl_gradcode.flower.testing import set_task_identity

    monkeypatch.delenv("FL_GRADCODE_DP_KEY_FILE", raising=False)
    set_task_identity()


@pytest.fixture
def key_file(tmp_path) -> str:
    """A DP key file (JSON) holding the master key ``bytes(range(32))``; its path."""
    import json

    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"master": bytes(range(32)).hex()}))
    return str(path)


@pytest.fixture
def one_torch_thread():
    """Torch on one thread for the test (restored after it)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class _FlowerLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, record.getMessage()))


@pytest.fixture
def flwr_log():
    """The ``(level, message)`` lines logged on Flower's logger during the test (every level)."""
    handler = _FlowerLines()
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    yield handler.lines
    logger.removeHandler(handler)
    logger.setLevel(level)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``-n 2 --dist loadgroup``, pyproject.toml): the tests that start
    Flower's simulation engine (Ray) run one after another on one worker, as do those that
    start a SuperLink and SuperNodes, while the rest share the workers."""
    for item in items:
        for kind in ("simulation", "deployment"):
            if item.get_closest_marker(kind) is not None:
                item.add_marker(pytest.mark.xdist_group(kind))
