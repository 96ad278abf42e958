"""Shared test settings: deterministic seeds and a small thread count."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
