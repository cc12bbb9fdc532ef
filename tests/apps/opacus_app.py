"""Flower's ``opacus`` example client (sample-level DP-SGD), unmodified except its data.

As in Flower's example: ``PrivacyEngine(secure_mode=False).make_private`` with Poisson sampling,
noise multiplier 1.0 on even and 1.5 on odd partitions, ``max-grad-norm`` / ``target-delta``
from the run config, an ``epsilon`` metric and ``_unwrap_state_dict``. Data: 8x8 digits, offline.
Two differences, both for test speed: a tiny CNN, and epsilon is memoized by the accountant's
history (a pure function of it; Opacus takes ~0.3 s per call and the tests make ~70 calls).
``app_plain`` is the example's app, ``app`` the same handlers under ``gradient_coding_mod``.
"""

import warnings
from functools import lru_cache

import torch
import torch.nn as nn
import torch.nn.functional as F
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from opacus import PrivacyEngine
from torch.utils.data import DataLoader

from fl_gradcode.flower import gradient_coding_mod

from . import digits

warnings.filterwarnings("ignore", category=UserWarning, module=r"opacus(\.|$)")
warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)

BATCH_SIZE = 16
LR = 0.05


class Net(nn.Module):
    """Tiny CNN for 1x8x8 digits (conv-pool-fc); every layer is supported by Opacus."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1 = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        return self.fc1(x.flatten(1))


def initial_arrays() -> ArrayRecord:
    torch.manual_seed(0)
    return ArrayRecord(Net().state_dict())


# ------------------------------------------------------------------------------- task.py
def load_data(partition_id: int, num_partitions: int):
    train_set, test_set = digits.partition(partition_id, num_partitions)
    train_loader = DataLoader(train_set, batch_size=BATCH_SIZE, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=BATCH_SIZE)
    return train_loader, test_loader


@lru_cache(maxsize=64)
def _epsilon(accountant: str, history: tuple, delta: float) -> float:
    engine = PrivacyEngine(accountant=accountant, secure_mode=False)
    engine.accountant.history = list(history)
    return float(engine.get_epsilon(delta=delta))


def get_epsilon(privacy_engine: PrivacyEngine, delta: float) -> float:
    """``privacy_engine.get_epsilon(delta)``, memoized by the accountant's history."""
    accountant = privacy_engine.accountant
    return _epsilon(accountant.mechanism(), tuple(accountant.history), float(delta))


def train(net, train_loader, privacy_engine, optimizer, target_delta, device, epochs=1):
    criterion = torch.nn.CrossEntropyLoss()
    net.to(device)
    net.train()
    for _ in range(epochs):
        for batch in train_loader:
            images = batch["img"]
            labels = batch["label"]
            optimizer.zero_grad()
            criterion(net(images.to(device)), labels.to(device)).backward()
            optimizer.step()
    return get_epsilon(privacy_engine, target_delta)


def test(net, test_loader, device):
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for batch in test_loader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (torch.max(outputs.data, 1)[1] == labels).sum().item()
    return loss, correct / len(test_loader.dataset)


# ------------------------------------------------------------------------- client_app.py
def _device() -> torch.device:
    return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")


def _partition_loaders(context: Context):
    pid = context.node_config["partition-id"]
    n = context.node_config["num-partitions"]
    noise = 1.0 if pid % 2 == 0 else 1.5
    train_loader, test_loader = load_data(partition_id=pid, num_partitions=n)
    return pid, noise, train_loader, test_loader


def _unwrap_state_dict(model: torch.nn.Module) -> dict:
    # Return the plain state_dict even if Opacus wrapped the model
    return model._module.state_dict() if hasattr(model, "_module") else model.state_dict()


def train_message(msg: Message, context: Context) -> Message:
    _, noise_multiplier, train_loader, _ = _partition_loaders(context)
    device = _device()

    target_delta = float(context.run_config["target-delta"])
    max_grad_norm = float(context.run_config["max-grad-norm"])

    model = Net().to(device)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict(), strict=True)

    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)

    privacy_engine = PrivacyEngine(secure_mode=False)
    private_model, optimizer, private_train_loader = privacy_engine.make_private(
        module=model,
        optimizer=optimizer,
        data_loader=train_loader,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
    )

    epsilon = train(
        private_model,
        private_train_loader,
        privacy_engine,
        optimizer,
        target_delta,
        device=device,
        epochs=1,
    )

    out_arrays = ArrayRecord(_unwrap_state_dict(private_model))
    out_metrics = MetricRecord(
        {
            "num-examples": len(private_train_loader.dataset),
            "epsilon": float(epsilon),
            "target_delta": float(target_delta),
            "noise_multiplier": float(noise_multiplier),
            "max_grad_norm": float(max_grad_norm),
        }
    )
    return Message(
        content=RecordDict({"arrays": out_arrays, "metrics": out_metrics}),
        reply_to=msg,
    )


def evaluate_message(msg: Message, context: Context) -> Message:
    _, _, _, test_loader = _partition_loaders(context)
    device = _device()

    model = Net().to(device)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict(), strict=True)

    loss, accuracy = test(model, test_loader, device)

    out_metrics = MetricRecord(
        {
            "loss": float(loss),
            "accuracy": float(accuracy),
            "num-examples": len(test_loader.dataset),
        }
    )
    return Message(content=RecordDict({"metrics": out_metrics}), reply_to=msg)


app_plain = ClientApp()
app = ClientApp(mods=[gradient_coding_mod])
for _app in (app_plain, app):
    _app.train()(train_message)
    _app.evaluate()(evaluate_message)


# ------------------------------------------------------------------------- server_app.py
def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """Evaluate the model on the held-out digits."""
    model = Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    loader = DataLoader(digits.central(), batch_size=128)
    loss, accuracy = test(model, loader, torch.device("cpu"))
    return MetricRecord({"accuracy": accuracy, "loss": loss / len(loader)})
