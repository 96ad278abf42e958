"""End to end: fine-tune a vitkit checkpoint on full-size JPEGs, streamed from a folder and
from a Hugging Face dataset, against the same run from scratch.

1. Real CIFAR-10 images, each upsampled to a random size (sides 256-500 px, so a random aspect
   ratio) and saved as JPEG (quality 90) in ROOT/jpeg/{train,val}/<class>/; the same files as a
   Hugging Face dataset (`load_dataset("imagefolder")`, JPEG bytes embedded, ClassLabel labels)
   saved with `save_to_disk` in ROOT/hf. Both are cached under --root (never in the repo).
2. A checkpoint to start from: `vitkit train cifar10` on the in-memory CIFAR-10 training set at
   32 px for 800 steps of 128 (~2 epochs; cached too; or pass --init WEIGHTS).
3. `vitkit finetune` from it at 64 px on `data=folder` and on `data=hf:ROOT/hf`, both
   `data_mode=stream` (DataLoader workers decode each JPEG and take an Inception crop), and
   `vitkit train cifar10` on the folder with no init as the baseline; then a table of top-1 on
   the val images, training images/s (metrics.jsonl) and wall time.

Each run is a subprocess (the command a user types), one after the other.

    python benchmarks/finetune_streamed.py --data-dir ../shared/data/cifar10/cifar-10-batches-bin
    python benchmarks/finetune_streamed.py --quick          # a smoke run of every step
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.append(str(Path(__file__).resolve().parent))  # readme_tables, for importers
import readme_tables

JPEG_QUALITY = 90
RUNS = ("folder", "hf", "scratch")


@dataclass(frozen=True)
class Settings:
    """Sizes and budgets of one benchmark run (`FULL`, or `QUICK` for a smoke run)."""

    train_images: int = 5000
    val_images: int = 1000
    sides: tuple[int, int] = (256, 500)  # each side of a JPEG drawn from this range
    # CIFAR-10 pre-training (the cifar10 recipe, 16 -> 24 -> 32 px): a fixed number of steps
    # (~4 min on 2 idle cores), not a time budget, so that other jobs on the same cores change
    # its wall time but not the checkpoint.
    pretrain_budget: float = 0.0  # seconds; 0 = none
    pretrain_args: tuple[str, ...] = ("total_steps=800", "warmup_steps=50")
    model_args: tuple[str, ...] = ()  # model overrides of the cifar10 recipe (both runs)
    img_size: int = 64
    epochs: float = 4
    budget: float = 180.0  # seconds of training per fine-tuning run; 0 = none
    batch_size: int = 64
    lr: float = 0.01  # SGD, as the paper fine-tunes
    warmup_steps: int = 30
    crop_scale: tuple[float, float] = (0.25, 1.0)
    workers: int | None = None  # loader processes; None = one per core


FULL = Settings()
# Every step on a few images with a tiny model: for the test and a first look.
QUICK = Settings(
    train_images=60, val_images=20, sides=(40, 72), pretrain_budget=0.0,
    pretrain_args=("train_limit=256", "test_limit=64", "total_steps=4", "warmup_epochs=0",
                   "batch_size=64", "resolution_schedule=[]"),
    model_args=("model.width=32", "model.depth=1", "model.num_heads=2", "model.mlp_dim=64",
                "model.stem_channels=[8,16,32]"),
    img_size=16, epochs=1, budget=0.0, batch_size=16, warmup_steps=1, workers=0)


# -- 1. the data -------------------------------------------------------------------------------
def _save_jpegs(images: np.ndarray, labels: np.ndarray, classes: list[str], folder: Path,
                sides: tuple[int, int], rng: np.random.Generator) -> None:
    for index, (image, label) in enumerate(zip(images, labels, strict=True)):
        width, height = (int(side) for side in rng.integers(sides[0], sides[1] + 1, size=2))
        picture = Image.fromarray(image.transpose(1, 2, 0)).resize((width, height),
                                                                   Image.Resampling.BICUBIC)
        path = folder / classes[int(label)] / f"{index:05d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        picture.save(path, quality=JPEG_QUALITY)


def _balanced(labels: np.ndarray, count: int) -> np.ndarray:
    """Indices of the first `count` images taking the classes in turn (each class present)."""
    per_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    rounds = -(-count // len(per_class))
    turns = np.stack([indices[:rounds] for indices in per_class], axis=1).reshape(-1)
    return np.sort(turns[:count])


def make_jpeg_folder(cifar_dir: str | Path, root: Path, settings: Settings, seed: int = 0
                     ) -> Path:
    """ROOT/jpeg/{train,val}/<class>/*.jpg: CIFAR-10 training images (train) and test images
    (val), the first of each class in turn, upsampled to random sizes; reused when already
    made with these settings."""
    from vitkit.data.sources.cifar import load_cifar

    folder = root / "jpeg"
    stamp = {"train": settings.train_images, "val": settings.val_images,
             "sides": list(settings.sides), "quality": JPEG_QUALITY, "seed": seed}
    done = folder / "made.json"
    if done.is_file() and json.loads(done.read_text()) == stamp:
        return folder
    rng = np.random.default_rng(seed)
    for split, cifar_split, count in (("train", "train", settings.train_images),
                                      ("val", "test", settings.val_images)):
        data = load_cifar(cifar_dir, cifar_split)
        labels = data.labels.numpy()
        keep = _balanced(labels, count)
        _save_jpegs(data.images.numpy()[keep], labels[keep], list(data.classes),
                    folder / split, settings.sides, rng)
    done.write_text(json.dumps(stamp))
    return folder


def make_hf_dataset(jpeg_folder: Path, out: Path) -> Path:
    """The JPEG folder as a Hugging Face DatasetDict (train, validation) in `out`
    (`save_to_disk`): the JPEG files' own bytes inside, labels a ClassLabel of the folder
    names. Files the folder holds beside the images (made.json) are not images and are left
    out by `imagefolder`."""
    import datasets

    stamp = out / "made_from.json"
    source = (jpeg_folder / "made.json").read_text()
    if stamp.is_file() and stamp.read_text() == source:
        return out
    loaded = datasets.load_dataset("imagefolder", data_dir=str(jpeg_folder),
                                   cache_dir=str(out.parent / "hf-cache"))
    embedded = datasets.DatasetDict({
        split: part.cast_column("image", datasets.Image(decode=False))
        .map(_embed_bytes, desc=f"embedding {split} JPEG bytes")
        .cast_column("image", datasets.Image())
        for split, part in loaded.items()})
    embedded.save_to_disk(str(out))
    stamp.write_text(source)
    return out


def _embed_bytes(row: dict) -> dict:
    """An undecoded image value with the file's bytes in place of its path."""
    image = row["image"]
    if image.get("bytes") is None:
        image = {"bytes": Path(image["path"]).read_bytes(), "path": Path(image["path"]).name}
    return {"image": image}


# -- 2. and 3. the runs ------------------------------------------------------------------------
def vitkit(*args: str) -> float:
    """Run `vitkit ARGS` in a subprocess; return its wall time in seconds."""
    command = [sys.executable, "-m", "vitkit.cli", *args]
    print("$", " ".join(command), flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - start


def pretrain(cifar_dir: str | Path, out: Path, settings: Settings) -> Path:
    """best.pt of `vitkit train cifar10` (32 px, in memory) within the pre-training budget;
    reused when `out` already holds one."""
    best = out / "best.pt"
    if not best.is_file():
        vitkit("train", "cifar10", "progress=false", *settings.model_args,
               *settings.pretrain_args,
               "--data-dir", str(cifar_dir), "--time-budget", str(settings.pretrain_budget),
               "--out", str(out), "--overwrite")
    return best


def _common(settings: Settings) -> list[str]:
    workers = [] if settings.workers is None else [f"workers={settings.workers}"]
    return ["progress=false", "data_mode=stream", f"epochs={settings.epochs}",
            f"batch_size={settings.batch_size}",
            f"crop_scale={json.dumps(list(settings.crop_scale))}", *workers]


def _budget(settings: Settings) -> list[str]:
    """Always given: the cifar10 recipe's own 3600 s budget would stretch a run to fill it."""
    return ["--time-budget", str(settings.budget)]


def finetune(init: Path, data: str, data_dir: Path | None, out: Path, settings: Settings
             ) -> float:
    """`vitkit finetune INIT` on streamed `data` at `settings.img_size`; its wall time."""
    folder = ["--data-dir", str(data_dir)] if data_dir else []
    return vitkit("finetune", str(init), *_common(settings), "total_steps=0", "accum_steps=1",
                  f"lr={settings.lr}", f"warmup_steps={settings.warmup_steps}",
                  "--data", data, "--img-size", str(settings.img_size), *folder,
                  *_budget(settings), "--out", str(out), "--overwrite")


def from_scratch(jpeg_folder: Path, out: Path, settings: Settings) -> float:
    """The cifar10 recipe's model and optimizer, no init, on the streamed folder."""
    return vitkit("train", "cifar10", *_common(settings), *settings.model_args,
                  "data=folder", f"model.img_size={settings.img_size}",
                  "resolution_schedule=[]", "warmup_epochs=0.5", "eval_every=1",
                  "--data-dir", str(jpeg_folder), *_budget(settings), "--out", str(out),
                  "--overwrite")


# -- 4. the table ------------------------------------------------------------------------------
def summarize(run_dir: Path, wall_seconds: float | None = None) -> dict[str, object]:
    """A finished run: its last and best top-1, training images/s (median over evaluated
    epochs), training minutes, and how its checkpoint resizes images for evaluation."""
    from vitkit.catalog import read_weights

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if line.strip()]
    pre = read_weights(run_dir / "best.pt").preprocess
    resize = (f"squash {pre.img_size[0]}" if pre.resize_mode == "squash"
              else f"short side/{pre.crop_pct:g}, crop {pre.img_size[0]}")
    skipped = run_dir / "skipped_files.txt"
    return {"run": run_dir.name, "epochs": rows[-1]["epoch"], "top1": rows[-1]["top1"],
            "best_top1": max(row["top1"] for row in rows),
            "images_per_s": float(np.median([row["images_per_s"] for row in rows])),
            "train_minutes": rows[-1]["minutes"], "wall_s": wall_seconds, "eval_resize": resize,
            "skipped": len(skipped.read_text().splitlines()) if skipped.is_file() else 0}


def table(rows: list[dict[str, object]]) -> str:
    lines = [f"{'run':<10}{'epochs':>7}{'top-1':>8}{'best':>8}{'img/s':>8}{'train min':>10}"
             f"{'wall min':>9}  eval resize"]
    for row in rows:
        wall = f"{row['wall_s'] / 60:.1f}" if row["wall_s"] is not None else "-"
        lines.append(f"{row['run']:<10}{row['epochs']:>7.2f}{100 * row['top1']:>7.2f}%"
                     f"{100 * row['best_top1']:>7.2f}%{row['images_per_s']:>8.1f}"
                     f"{row['train_minutes']:>10.1f}{wall:>9}  {row['eval_resize']}")
    return "\n".join(lines)


def run_all(cifar_dir: str | Path, root: Path, settings: Settings, init: Path | None = None,
            runs: tuple[str, ...] = RUNS) -> list[dict[str, object]]:
    """Every step (data, pre-training, the runs named in `runs`); one summary per run."""
    started = time.perf_counter()
    jpegs = make_jpeg_folder(cifar_dir, root, settings)
    hf = make_hf_dataset(jpegs, root / "hf")
    print(f"data ready in {time.perf_counter() - started:.0f} s: {jpegs}, {hf}", flush=True)
    init = init or pretrain(cifar_dir, root / "runs" / "pretrain", settings)
    results = []
    for name in runs:
        out = root / "runs" / name
        if name == "scratch":
            wall = from_scratch(jpegs, out, settings)
        else:
            data, folder = ("folder", jpegs) if name == "folder" else (f"hf:{hf}", None)
            wall = finetune(init, data, folder, out, settings)
        results.append(summarize(out, wall))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("VITKIT_CIFAR10_DIR"),
                        help="cifar-10-batches-bin folder (default: $VITKIT_CIFAR10_DIR)")
    parser.add_argument("--root", type=Path, default=Path("/tmp/vitkit-e2e"),
                        help="where the JPEGs, the dataset and the runs are kept")
    parser.add_argument("--init", type=Path, help="start from these weights (no pre-training)")
    parser.add_argument("--runs", default=",".join(RUNS), help="of folder, hf, scratch")
    parser.add_argument("--budget", type=float, help="seconds per fine-tuning run")
    parser.add_argument("--pretrain-steps", type=int, help="CIFAR-10 pre-training steps")
    parser.add_argument("--quick", action="store_true", help="a few images, a tiny model")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    readme_tables.add_flag(parser)
    args = parser.parse_args()
    with readme_tables.recording("finetune_streamed.py", args.write_readme):
        if not args.data_dir:
            parser.error("--data-dir (or VITKIT_CIFAR10_DIR) must name cifar-10-batches-bin")
        settings = QUICK if args.quick else FULL
        if args.budget is not None:
            settings = replace(settings, budget=args.budget)
        if args.pretrain_steps is not None:
            warmup = max(args.pretrain_steps // 16, 1)
            settings = replace(settings, pretrain_args=(f"total_steps={args.pretrain_steps}",
                                                        f"warmup_steps={warmup}"))
        root = args.root / "quick" if args.quick else args.root
        from vitkit.runtime import cpu_description

        print(cpu_description(), flush=True)
        print("settings:", json.dumps(asdict(settings)), flush=True)
        rows = run_all(args.data_dir, root, settings, args.init, tuple(args.runs.split(",")))
        print(table(rows))
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
