"""Flower's ``quickstart-pytorch`` client, unmodified except its data: 8x8 digits, offline.

The handlers are Flower's code shape: they read ``partition-id`` / ``num-partitions`` from the
node config, ``batch-size`` / ``local-epochs`` from the run config and ``lr`` from the train
config, train with SGD (momentum 0.9) over a shuffling DataLoader and reply with the arrays and
``train_loss`` / ``num-examples``. They are registered on two apps: ``app_plain`` (as in the
quickstart) and ``app`` (the same handlers under ``gradient_coding_mod``).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch.utils.data import DataLoader

from fl_gradcode.flower import gradient_coding_mod

from . import digits

# The oracle test sets this to False: local training then depends on no random number at all
SHUFFLE = True


class Net(nn.Module):
    """Tiny CNN for 1x8x8 digits (conv-pool-fc)."""

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
def load_data(partition_id: int, num_partitions: int, batch_size: int):
    train_set, test_set = digits.partition(partition_id, num_partitions)
    trainloader = DataLoader(train_set, batch_size=batch_size, shuffle=SHUFFLE)
    testloader = DataLoader(test_set, batch_size=batch_size)
    return trainloader, testloader


def load_centralized_dataset():
    return DataLoader(digits.central(), batch_size=128)


def train_fn(net, trainloader, epochs, lr, device):
    """Train the model on the training set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


def test_fn(net, testloader, device):
    """Validate the model on the test set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for batch in testloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (torch.max(outputs.data, 1)[1] == labels).sum().item()
    return loss / len(testloader), correct / len(testloader.dataset)


# ------------------------------------------------------------------------- client_app.py
def train(msg: Message, context: Context):
    """Train the model on local data."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)

    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    batch_size = context.run_config["batch-size"]
    trainloader, _ = load_data(partition_id, num_partitions, batch_size)

    train_loss = train_fn(
        model,
        trainloader,
        context.run_config["local-epochs"],
        msg.content["config"]["lr"],
        device,
    )

    model_record = ArrayRecord(model.state_dict())
    metrics = {
        "train_loss": train_loss,
        "num-examples": len(trainloader.dataset),
    }
    metric_record = MetricRecord(metrics)
    content = RecordDict({"arrays": model_record, "metrics": metric_record})
    return Message(content=content, reply_to=msg)


def evaluate(msg: Message, context: Context):
    """Evaluate the model on local data."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)

    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    batch_size = context.run_config["batch-size"]
    _, valloader = load_data(partition_id, num_partitions, batch_size)

    eval_loss, eval_acc = test_fn(model, valloader, device)

    metrics = {
        "eval_loss": eval_loss,
        "eval_acc": eval_acc,
        "num-examples": len(valloader.dataset),
    }
    content = RecordDict({"metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


app_plain = ClientApp()
app = ClientApp(mods=[gradient_coding_mod])
for _app in (app_plain, app):
    _app.train()(train)
    _app.evaluate()(evaluate)


# ------------------------------------------------------------------------- server_app.py
def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """Evaluate the model on the held-out digits."""
    model = Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    test_loss, test_acc = test_fn(model, load_centralized_dataset(), torch.device("cpu"))
    return MetricRecord({"accuracy": test_acc, "loss": test_loss})
