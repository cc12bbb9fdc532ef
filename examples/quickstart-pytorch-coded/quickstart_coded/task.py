"""quickstart_coded: the model, the data and the training loop (offline 8x8 digits)."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from datasets import Dataset
from flwr_datasets.partitioner import IidPartitioner
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader

CENTRAL_TEST_SIZE = 300  # digits held out for the server's global evaluation


class Net(nn.Module):
    """Small CNN for 1x8x8 images (the quickstart's conv-pool-conv-pool-fc shape, scaled down)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 2 * 2, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))  # 16 x 4 x 4
        x = self.pool(F.relu(self.conv2(x)))  # 32 x 2 x 2
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


_splits = None  # Cache: {"train": federated pool, "test": central test set}
partitioner = None  # Cache IidPartitioner (one per num_partitions)


def _digits_splits():
    """scikit-learn's embedded digits (1797 images, no download) as a Hugging Face Dataset."""
    global _splits
    if _splits is None:
        digits = load_digits()
        images = (digits.images.astype("float32") / 16.0 - 0.5) / 0.5  # Normalize to [-1, 1]
        dataset = Dataset.from_dict(
            {"img": images[:, None].tolist(), "label": digits.target.tolist()}
        )
        _splits = dataset.train_test_split(test_size=CENTRAL_TEST_SIZE, seed=42)
    return _splits


def load_data(partition_id: int, num_partitions: int, batch_size: int):
    """Load IID partition `partition_id` of the digits: 80% train, 20% test."""
    global partitioner
    if partitioner is None or partitioner.num_partitions != num_partitions:
        partitioner = IidPartitioner(num_partitions=num_partitions)
        partitioner.dataset = _digits_splits()["train"]
    partition = partitioner.load_partition(partition_id)
    # Divide data on each node: 80% train, 20% test
    partition_train_test = partition.train_test_split(test_size=0.2, seed=42)
    partition_train_test = partition_train_test.with_format("torch")
    trainloader = DataLoader(partition_train_test["train"], batch_size=batch_size, shuffle=True)
    testloader = DataLoader(partition_train_test["test"], batch_size=batch_size)
    return trainloader, testloader


def load_centralized_dataset():
    """Load the held-out test set and return a dataloader."""
    return DataLoader(_digits_splits()["test"].with_format("torch"), batch_size=128)


def train(net, trainloader, epochs, lr, device):
    """Train the model on the training set."""
    net.to(device)  # move model to GPU if available
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
    avg_trainloss = running_loss / (epochs * len(trainloader))
    return avg_trainloss


def test(net, testloader, device):
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
    accuracy = correct / len(testloader.dataset)
    loss = loss / len(testloader)
    return loss, accuracy
