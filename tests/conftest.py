"""Shared test settings: deterministic seeds, each test in its own working directory with its
own caches, one trained digits run for the tests that need one, where the real CIFAR-10 copy
lives, and the fuzzers of tools/."""

import importlib.util
import os
import shutil
import sys
from collections.abc import Iterator
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
def _own_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test runs in its own empty folder, never in the clone: what a command writes to
    ./runs or ./eval stays there, and a run the README's `vitkit train` left in the clone
    cannot change a test's outcome."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _own_caches(tmp_path_factory: pytest.TempPathFactory,
                monkeypatch: pytest.MonkeyPatch) -> None:
    """No test touches the network, the user's caches or another test's: vitkit's cache (file
    indexes, named checkpoints, extracted features), its weights folder and Hugging Face's
    caches live in a folder of this test's own, and both hubs are offline. A test that needs
    something cached puts it there itself (or a fixture of its scope hands it over)."""
    use_caches_in(tmp_path_factory.mktemp("caches"), monkeypatch)


def use_caches_in(caches: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vitkit's and Hugging Face's caches under `caches`, both hubs offline."""
    for name, folder in {"VITKIT_CACHE": "vitkit", "VITKIT_WEIGHTS_DIR": "weights",
                         "HF_HOME": "huggingface", "HF_DATASETS_CACHE": "huggingface/datasets",
                         "XDG_CACHE_HOME": "xdg"}.items():
        monkeypatch.setenv(name, str(caches / folder))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    if "datasets" in sys.modules:  # `datasets` reads its cache folder once, at import
        monkeypatch.setattr(sys.modules["datasets"].config, "HF_DATASETS_CACHE",
                            caches / "huggingface" / "datasets")


# The shared run: the digits recipe's model (a 4x4 grid of 2x2 patches: 16 tokens and the
# class token) for 8 epochs at lr 0.003, about 88% held-out top-1; the shipped sample digit
# (a held-out 3) is predicted a 3.
DIGITS_RUN = ["train", "digits", "epochs=8", "lr=0.003", "warmup_epochs=1", "progress=false"]


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {path.relative_to(folder).as_posix(): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in sorted(folder.rglob("*"))}


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One short `vitkit train` on the embedded digits (`DIGITS_RUN`), trained once for the
    session in a folder of its own, with caches of its own: `runs/digits` of a working folder,
    as the README's set-up command leaves it. Tests only read it; a test that writes into the
    run folder (`vitkit eval` and `fewshot` put their reports there) takes `digits_run_copy`;
    a write into this one is reported as an error when the session ends."""
    from vitkit.cli import main

    root = tmp_path_factory.mktemp("digits-run")
    run = root / "runs" / "digits"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        use_caches_in(root / "caches", patch)
        torch.manual_seed(0)
        assert main([*DIGITS_RUN, "--out", str(run)]) == 0
    trained = _listing(run)
    yield run
    changed = sorted(set(trained.items()) ^ set(_listing(run).items()))
    assert not changed, (f"a test wrote into the shared digits run ({', '.join(dict(changed))}): "
                         "give it digits_run_copy")


@pytest.fixture
def digits_run_copy(digits_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the shared digits run for this test to write into (outside its working
    folder, which stays empty)."""
    return Path(shutil.copytree(digits_run, tmp_path_factory.mktemp("digits-copy") / "digits"))


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


@pytest.fixture
def unfaithful_exporter(monkeypatch: pytest.MonkeyPatch) -> float:
    """vitkit's ONNX exports (float, and the float graph of an int8 export) write a graph whose
    logits are all 0.05 above the model's: inside int8's tolerance (0.1 x the logits' range;
    the top-1 is kept), far outside the float check's 1e-4: a token-merging scatter that drops
    its reduction (0.05-0.2 off) is of this kind. Returns the shift."""
    import copy

    import vitkit.export
    import vitkit.export.checked_export
    import vitkit.export.int8

    shift = 0.05
    export_faithfully = vitkit.export.export_onnx

    def export_shifted(model, path, **kwargs):
        shifted = copy.deepcopy(model)
        with torch.no_grad():
            shifted.head.bias.add_(shift)
        return export_faithfully(shifted, path, **kwargs)

    monkeypatch.setattr(vitkit.export, "export_onnx", export_shifted)
    monkeypatch.setattr(vitkit.export.int8, "export_onnx", export_shifted)
    monkeypatch.setattr(vitkit.export.checked_export, "export_onnx", export_shifted)
    return shift
