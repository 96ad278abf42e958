"""benchmarks/finetune_streamed.py end to end on a tiny set: full-size JPEGs made from real
CIFAR-10, the same files as a Hugging Face dataset, a checkpoint pre-trained at 32 px, then
`vitkit finetune` streamed from the folder and from `hf:`, and `vitkit train` from scratch,
each through the real CLI; a corrupt JPEG among the files is named and skipped."""

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import datasets
import pytest
from PIL import Image

from vitkit.catalog import read_weights
from vitkit.cli import main
from vitkit.data.skipped import read_skipped_files

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    path = REPO / "benchmarks" / "finetune_streamed.py"
    spec = importlib.util.spec_from_file_location("finetune_streamed", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["finetune_streamed"] = module  # its dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def quick_runs(bench, cifar10_dir, tmp_path_factory) -> dict:
    """The benchmark's quick path on 60 + 20 JPEGs (plus a corrupt one in train/cat), checking
    the data it makes on the way: sizes in range, JPEG files, the dataset's bytes and labels."""
    root = tmp_path_factory.mktemp("e2e")
    settings = bench.QUICK
    jpegs = bench.make_jpeg_folder(cifar10_dir, root, settings)
    files = {split: sorted((jpegs / split).glob("*/*.jpg")) for split in ("train", "val")}
    assert [len(files["train"]), len(files["val"])] == [60, 20]
    sides = {side for path in files["train"] for side in Image.open(path).size}
    assert min(sides) >= settings.sides[0] and max(sides) <= settings.sides[1]
    assert Image.open(files["val"][0]).format == "JPEG"
    broken = jpegs / "train" / "cat" / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 not a JPEG after all")

    hf = bench.make_hf_dataset(jpegs, root / "hf")
    stored = datasets.load_from_disk(str(hf))
    assert sorted(stored) == ["train", "validation"]
    names = stored["validation"].features["label"].names
    assert names == sorted(p.name for p in (jpegs / "train").iterdir() if p.is_dir())
    raw = stored["validation"].cast_column("image", datasets.Image(decode=False))[0]["image"]
    label = stored["validation"][0]["label"]
    assert raw["bytes"] == (jpegs / "val" / names[label] / raw["path"]).read_bytes()

    init = bench.pretrain(cifar10_dir, root / "runs" / "pretrain", settings)
    rows = bench.run_all(cifar10_dir, root, settings, init=init)
    return {"root": root, "rows": rows, "init": init, "broken": broken, "bench": bench}


def test_quick_finetune_from_folder_and_hf_dataset_skips_a_corrupt_jpeg(quick_runs):
    rows, init, broken = quick_runs["rows"], quick_runs["init"], quick_runs["broken"]
    assert [row["run"] for row in rows] == ["folder", "hf", "scratch"]
    init_preprocess = read_weights(init).preprocess
    for row in rows:
        run = quick_runs["root"] / "runs" / row["run"]
        metrics = _metrics(run)
        assert metrics[-1]["epoch"] == 1.0 and metrics[-1]["step"] == 61 // 16  # ran through
        assert 0.0 <= metrics[-1]["top1"] <= 1.0 and metrics[-1]["images_per_s"] > 0
        assert (run / "last.pt").is_file()
        preprocess = read_weights(run / "best.pt").preprocess
        if row["run"] == "scratch":  # a fresh run evaluates streamed images by shorter side
            assert (preprocess.resize_mode, preprocess.crop_pct) == ("shorter_side", 0.875)
        else:  # fine-tuning keeps the checkpoint's own preprocessing, at the new size
            assert preprocess == init_preprocess.replace(img_size=[16, 16])
        skipped = read_skipped_files(run / "skipped_files.txt")
        assert len(skipped) == 1, skipped
        if row["run"] != "hf":
            assert Path(skipped[0][0]) == broken
    assert "squash 16" in quick_runs["bench"].table(rows)


@pytest.mark.parametrize("name", ["scratch", "folder"])
def test_vitkit_eval_of_a_streamed_run_reproduces_its_own_score(quick_runs, name, capsys):
    """`vitkit eval RUN` finds the folder and evaluates as the run did: shorter side and centre
    crop for the run from scratch, squash for the fine-tuned one."""
    run = quick_runs["root"] / "runs" / name
    own = _metrics(run)[-1]  # one evaluation: best.pt holds these weights
    assert main(["eval", str(run), "--out", str(run / "eval")]) == 0
    report = json.loads((run / "eval" / "eval.json").read_text())
    assert report["images"] == 20
    assert report["top1"] == pytest.approx(own["top1"])
    assert report["loss"] == pytest.approx(own["test_loss"], abs=1e-4)
