"""Shared test settings: deterministic seeds, and where the real CIFAR-10 copy lives."""

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def real_cifar10_dir() -> Path:
    """`VITKIT_CIFAR10_DIR`, else ../shared/data/cifar10/cifar-10-batches-bin beside the repo."""
    env = os.environ.get("VITKIT_CIFAR10_DIR")
    if env:
        return Path(env)
    return REPO.parent / "shared" / "data" / "cifar10" / "cifar-10-batches-bin"


@pytest.fixture(scope="session")
def cifar10_dir() -> Path:
    """The real CIFAR-10 binary folder; CI must have it, elsewhere its absence skips."""
    path = real_cifar10_dir()
    if not path.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"CI needs the real CIFAR-10 copy at {path}")
        pytest.skip(f"real CIFAR-10 not found at {path} (set VITKIT_CIFAR10_DIR to run)")
    return path
