"""The tiny random model and prompts shared by the model tests."""

from __future__ import annotations

import random

import pytest
import torch

from daemons.model import ModelConfig, random_model

BLOCK = 16


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """The tiny model's matmuls are too small to share: on a busy machine a second OpenMP thread
    only spins, making these tests several times slower. Restored for whatever runs next."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def model():
    return random_model(ModelConfig.tiny(), seed=0)


def prompt(length: int, seed: int) -> list[int]:
    """BOS and ``length - 1`` random bytes, reproducible from ``seed``."""
    rng = random.Random(seed)
    return [256] + [rng.randrange(256) for _ in range(length - 1)]
