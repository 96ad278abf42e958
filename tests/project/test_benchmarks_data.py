"""benchmarks/data_loading.py runs end to end on a tiny generated folder (no timing asserted)."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("data_loading",
                                                  REPO / "benchmarks" / "data_loading.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["data_loading"] = module
    spec.loader.exec_module(module)
    return module


def test_data_loading_benchmark_runs_on_a_tiny_folder(bench: ModuleType, cifar10_dir: Path,
                                                       tmp_path: Path, capsys) -> None:
    pytest.importorskip("psutil")
    pytest.importorskip("torchvision")
    root = tmp_path / "jpegs"
    code = bench.main(["--quick", "--root", str(root), "--cifar-dir", str(cifar10_dir),
                       "--count", "60", "--val-count", "20", "--size", "32", "--batch", "8",
                       "--workers", "0", "--train-steps", "1", "--images", "16", "--reps", "1",
                       "--step-reps", "1"])
    out = capsys.readouterr().out
    assert code == 0

    # the folder: 10 class folders, 6 training and 2 held-out files each, ~400x300 JPEGs
    train = sorted((root / "train").glob("*/*.jpg"))
    assert len(train) == 60 and len(list((root / "val").glob("*/*.jpg"))) == 20
    assert len({p.parent.name for p in train}) == 10
    for path in train[:5]:
        with Image.open(path) as image:
            assert image.format == "JPEG" and image.mode == "RGB"
            assert 0.7 * 400 * 300 <= image.width * image.height <= 1.3 * 400 * 300
    subset = sorted((root / "subset-12" / "train").glob("*/*.jpg"))
    assert len(subset) == 10 and all(p.is_symlink() for p in subset)
    assert bench.generate(root, 60, 20, str(cifar10_dir), 1) == 0.0  # cached: not rewritten

    # the report: both training runs measured, every loader timed, the model compared
    assert "10 files" in out and "60 files" in out
    assert "difference" in out and ("PASS" in out or "FAIL" in out)
    for row in ("train  vitkit StreamFeed", "train  torchvision ImageFolder",
                "eval   vitkit StreamEval", "eval   torchvision ImageFolder"):
        assert row in out
    assert "training step" in out and "x the model" in out
    assert (root / "runs" / "jpegs" / "run" / "metrics.jsonl").is_file()
