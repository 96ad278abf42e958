"""Shared test settings: deterministic seeds, where the real CIFAR-10 copy lives, and the
data fuzzer of tools/fuzz_data.py."""

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
# Both hubs offline before any test imports huggingface_hub or datasets (they read it once).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _offline_caches(tmp_path_factory: pytest.TempPathFactory,
                    monkeypatch: pytest.MonkeyPatch) -> None:
    """No test touches the network or the user's caches: vitkit's cache (file indexes, named
    checkpoints) and Hugging Face's live in a temporary folder, and both hubs are offline."""
    caches = tmp_path_factory.getbasetemp() / "caches"
    monkeypatch.setenv("VITKIT_CACHE", str(caches / "vitkit"))
    monkeypatch.setenv("HF_HOME", str(caches / "huggingface"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


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


@pytest.fixture(scope="session")
def fuzzer() -> ModuleType:
    """tools/fuzz_data.py, the fuzzer of the long runs, for bounded runs in the suite."""
    spec = importlib.util.spec_from_file_location("fuzz_data", REPO / "tools" / "fuzz_data.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_data"] = module  # its dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def weights_fuzzer(fuzzer: ModuleType) -> ModuleType:
    """tools/fuzz_weights.py (which reuses tools/fuzz_data.py's byte mutations)."""
    spec = importlib.util.spec_from_file_location("fuzz_weights",
                                                  REPO / "tools" / "fuzz_weights.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_weights"] = module
    spec.loader.exec_module(module)
    return module
