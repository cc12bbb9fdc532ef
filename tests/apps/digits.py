"""Offline data for the fixture apps: a few hundred of scikit-learn's embedded 8x8 digits.

Images are normalized to [-1, 1] like the quickstart's CIFAR-10 transform, and served as
``{"img": float32 (1, 8, 8), "label": int64}`` samples so that the apps' batch handling reads
exactly like Flower's examples (``batch["img"]``, ``batch["label"]``).
"""

from functools import lru_cache

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch.utils.data import Dataset

POOL_SIZE = 480  # shared by all clients: 40 to 120 per partition at 6 partitions
CENTRAL_SIZE = 300  # held out for the server's global evaluation


class DigitsDataset(Dataset):
    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images = torch.from_numpy(images)
        self.labels = torch.from_numpy(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        return {"img": self.images[idx], "label": self.labels[idx]}


@lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    images = ((digits.images[order].astype(np.float32) / 16.0 - 0.5) / 0.5)[:, None]
    return images, digits.target[order].astype(np.int64)


def partition(partition_id: int, num_partitions: int) -> tuple[DigitsDataset, DigitsDataset]:
    """Partition ``partition_id`` of the (shuffled) pool, split 80% train / 20% test.

    IID, but of unequal sizes (in proportion 1 : 2 : 3 : 1 : 2 : 3 ...), so that an example-
    weighted average differs from a plain mean of the partition models.
    """
    images, labels = _digits()
    weights = 1 + np.arange(num_partitions) % 3
    bounds = np.round(np.cumsum(np.r_[0, weights]) / weights.sum() * POOL_SIZE).astype(int)
    idx = np.arange(bounds[partition_id], bounds[partition_id + 1])
    cut = round(0.8 * len(idx))
    train, test = idx[:cut], idx[cut:]
    return DigitsDataset(images[train], labels[train]), DigitsDataset(images[test], labels[test])


def central() -> DigitsDataset:
    images, labels = _digits()
    return DigitsDataset(images[-CENTRAL_SIZE:], labels[-CENTRAL_SIZE:])
