"""Streamed image folders at scale: flat memory, loader speed against torchvision and the model.

1. Generates (once, cached under --root, never inside the repository) ROOT/train/<class>/*.jpg
   and ROOT/val/<class>/*.jpg: CIFAR-10 images upsampled to about 400x300 (random sizes and
   aspect ratios), JPEG quality 90, in parallel processes.
2. Peak memory: a short `vitkit train data=folder data_mode=stream` on a subset folder (symlinks
   to the first files of each class) and on the whole set; the summed RSS of the process tree
   (training process + DataLoader workers, sampled every 0.2 s) and the training process's own
   max RSS (getrusage of the reaped child). Target: the two differ by < 200 MB.
3. Loader images/s with the same worker count and batch size: vitkit's StreamFeed (Inception
   crop) and StreamEval (shorter side to size / 0.875, centre crop) against torchvision's
   ImageFolder + DataLoader with RandomResizedCrop / Resize + CenterCrop, both ending in uint8
   tensors. No flip in either (vitkit flips later, on whole batches). Repetitions alternate the
   loaders; medians of images/s and of the loader processes' CPU time per image (what a busy,
   shared machine distorts least) are reported. Target: vitkit >= torchvision.
4. The model's training step rate (forward + backward + AdamW, fp32) against the loader's rate.
   Target: the loader keeps up.

    python benchmarks/data_loading.py                 # 50,000 files: ~2 min to generate, ~10 min
    python benchmarks/data_loading.py --quick         # 2,000 files, Ti/16: a ~2 min smoke check
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parent))  # readme_tables, for importers
import readme_tables

TARGET_RSS_GROWTH = 200 * 1024**2
MEAN_AREA = 400 * 300  # generated images: about 400x300 pixels
JPEG_QUALITY = 90


# -- 1. the image folder ------------------------------------------------------------------------
def _write_jpeg(task: tuple[str, bytes, int]) -> None:
    """Upsample one 32x32 CIFAR image to a random size around 400x300 and save it as JPEG."""
    from PIL import Image

    path, pixels, seed = task
    rng = np.random.default_rng(seed)
    area = MEAN_AREA * rng.uniform(0.75, 1.25)
    aspect = math.exp(rng.uniform(math.log(0.6), math.log(1.8)))  # width / height
    width = round(math.sqrt(area * aspect))
    height = round(area / width)
    image = Image.frombytes("RGB", (32, 32), pixels).resize((width, height), Image.BICUBIC)
    image.save(path, quality=JPEG_QUALITY)


def _jpeg_tasks(folder: Path, split: str, count: int, cifar_dir: str, seed: int
                ) -> list[tuple[str, bytes, int]]:
    """One task per file: the first count / 10 images of each class in the CIFAR-10 split."""
    from vitkit.data.sources.cifar import load_cifar

    data = load_cifar(cifar_dir, split)
    labels = data.labels.numpy()
    per_class = -(-count // len(data.classes))
    chosen = np.sort(np.concatenate([np.flatnonzero(labels == c)[:per_class]
                                     for c in range(len(data.classes))]))[:count]
    if len(chosen) < count:
        raise SystemExit(f"{cifar_dir} holds too few CIFAR-10 {split} images for {count} files")
    for name in data.classes:
        (folder / name).mkdir(parents=True, exist_ok=True)
    pixels = data.images[chosen.tolist()].permute(0, 2, 3, 1).contiguous().numpy()
    return [(str(folder / data.classes[int(labels[i])] / f"{i:05d}.jpg"), pixels[k].tobytes(),
             seed + int(i)) for k, i in enumerate(chosen)]


def generate(root: Path, train_count: int, val_count: int, cifar_dir: str,
             processes: int) -> float:
    """Write the folder unless ROOT/manifest.json says it holds these counts; seconds taken."""
    manifest = root / "manifest.json"
    wanted = {"train": train_count, "val": val_count, "quality": JPEG_QUALITY, "layout": 2}
    if manifest.exists() and json.loads(manifest.read_text()) == wanted:
        return 0.0
    start = time.perf_counter()
    if root.exists():
        shutil.rmtree(root)
    tasks = (_jpeg_tasks(root / "train", "train", train_count, cifar_dir, 0)
             + _jpeg_tasks(root / "val", "test", val_count, cifar_dir, 10**6))
    with mp.get_context("fork").Pool(processes) as pool:
        for _ in pool.imap_unordered(_write_jpeg, tasks, chunksize=64):
            pass
    manifest.write_text(json.dumps(wanted))
    return time.perf_counter() - start


def subset_folder(root: Path, count: int) -> Path:
    """ROOT/subset-COUNT: train/ holds symlinks to the first count/classes files of each class
    (by name), val/ links to ROOT/val."""
    target = root / f"subset-{count}"
    classes = sorted(p.name for p in (root / "train").iterdir() if p.is_dir())
    per_class = count // len(classes)
    if (target / "train").exists():
        shutil.rmtree(target)
    for name in classes:
        (target / "train" / name).mkdir(parents=True)
        for file in sorted((root / "train" / name).iterdir())[:per_class]:
            (target / "train" / name / file.name).symlink_to(file)
    (target / "val").symlink_to(root / "val", target_is_directory=True)
    return target


def count_files(folder: Path) -> int:
    return sum(1 for _ in folder.glob("*/*.jpg"))


# -- 2. peak memory of a streamed training run --------------------------------------------------
def _tree_rss(pid: int) -> int:
    """Summed RSS of process `pid` and all its descendants (0 once it is gone)."""
    import psutil

    try:
        parent = psutil.Process(pid)
        procs = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += proc.memory_info().rss
    return total


def train_peak_rss(data_dir: Path, recipe: dict, out: Path) -> tuple[int, int, float]:
    """Run `vitkit train` on `data_dir`; (peak summed RSS of its process tree, its own max RSS,
    seconds), both in bytes."""
    out.mkdir(parents=True, exist_ok=True)
    recipe_file = out / "recipe.json"
    recipe_file.write_text(json.dumps({**recipe, "data_dir": str(data_dir),
                                       "out_dir": str(out / "run")}))
    command = [sys.executable, "-m", "vitkit.cli", "train", str(recipe_file), "--overwrite"]
    log = (out / "train.log").open("w")
    start = time.perf_counter()
    import vitkit

    source = str(Path(vitkit.__file__).resolve().parents[1])  # the vitkit this script imports
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (source, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    peak = 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        peak = max(peak, _tree_rss(proc.pid))
        time.sleep(0.2)
    proc.returncode = os.waitstatus_to_exitcode(status)
    log.close()
    if proc.returncode:
        tail = (out / "train.log").read_text()[-2000:]
        raise SystemExit(f"vitkit train failed ({proc.returncode}):\n{tail}")
    return peak, usage.ru_maxrss * 1024, time.perf_counter() - start


# -- 3. loaders ---------------------------------------------------------------------------------
def vitkit_train_batches(folder: Path, size: int, batch: int, workers: int, epoch: int
                         ) -> tuple[Iterator, Callable[[], None]]:
    from vitkit.data.feeds import StreamFeed
    from vitkit.data.loader import BatchOrder
    from vitkit.data.sources.folder import FolderRecords
    from vitkit.data.transforms import InceptionCrop

    records = FolderRecords.scan(folder)
    feed = StreamFeed(records, BatchOrder(len(records), batch, seed=0),
                      InceptionCrop((size, size)), 3, (size, size), seed=0, workers=workers)
    return (images for _, images, _ in feed.epoch(epoch)), feed.close


def vitkit_eval_batches(folder: Path, size: int, batch: int, workers: int, epoch: int
                        ) -> tuple[Iterator, Callable[[], None]]:
    from vitkit.data.feeds import StreamEval
    from vitkit.data.sources.folder import FolderRecords
    from vitkit.data.transforms import EvalResize
    from vitkit.preprocess import Preprocess

    preprocess = Preprocess(img_size=(size, size), resize_mode="shorter_side", crop_pct=0.875)
    feed = StreamEval(FolderRecords.scan(folder), EvalResize(preprocess), 3, (size, size),
                      workers)
    batches = feed.eval_batches(batch)
    return (images for images, _ in batches), batches.close


def _torchvision_batches(folder: Path, transform, batch: int, workers: int, shuffle: bool,
                         epoch: int) -> tuple[Iterator, Callable[[], None]]:
    import torch
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    loader = DataLoader(ImageFolder(str(folder), transform=transform), batch_size=batch,
                        shuffle=shuffle, num_workers=workers, drop_last=True,
                        generator=torch.Generator().manual_seed(epoch),
                        prefetch_factor=4 if workers else None)  # vitkit's prefetch too
    iterator = iter(loader)
    return (images for images, _ in iterator), getattr(iterator, "_shutdown_workers", _nothing)


def _nothing() -> None:
    pass


def torchvision_train_batches(folder: Path, size: int, batch: int, workers: int, epoch: int
                              ) -> tuple[Iterator, Callable[[], None]]:
    from torchvision import transforms as T

    crop = T.Compose([T.RandomResizedCrop(size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)),
                      T.PILToTensor()])
    return _torchvision_batches(folder, crop, batch, workers, True, epoch)


def torchvision_eval_batches(folder: Path, size: int, batch: int, workers: int, epoch: int
                             ) -> tuple[Iterator, Callable[[], None]]:
    from torchvision import transforms as T

    resize = T.Compose([T.Resize(round(size / 0.875)), T.CenterCrop(size), T.PILToTensor()])
    return _torchvision_batches(folder, resize, batch, workers, False, epoch)


LOADERS = {
    "train": {"vitkit StreamFeed": vitkit_train_batches,
              "torchvision ImageFolder": torchvision_train_batches},
    "eval": {"vitkit StreamEval": vitkit_eval_batches,
             "torchvision ImageFolder": torchvision_eval_batches},
}


def _cpu_seconds() -> float:
    """CPU time (user + system) of this process and its live children (the loader workers)."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += sum(child.cpu_times()[:2])
    return total


def _ratio(numerator: float, denominator: float) -> str:
    """"  1.23x", or "     -" where the denominator measured 0 (CPU times come in clock ticks
    of 10 ms, so a tiny run can measure none)."""
    return f"{numerator / denominator:>6.2f}x" if denominator > 0 else f"{'-':>7}"


def loader_rate(make, folder: Path, size: int, batch: int, workers: int, epoch: int,
                images: int) -> tuple[float, float]:
    """(images/s, CPU ms per image of the whole loader) over `images` images, after
    2 x workers warm-up batches (worker start-up and the first fills of the prefetch queue are
    not counted). CPU time is what a busy shared machine distorts least."""
    batches, close = make(folder, size, batch, workers, epoch)
    try:
        for _ in range(2 * max(workers, 1)):
            next(batches)
        seen, cpu, start = 0, _cpu_seconds(), time.perf_counter()
        while seen < images:
            seen += len(next(batches))
        wall, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
        return seen / wall, 1e3 * cpu / seen
    finally:
        close()


def time_loaders(folder: Path, size: int, batch: int, workers: int, images: int, reps: int
                 ) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """(images/s, CPU ms/image) of every loader, `reps` rounds, the order alternating."""
    rates: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for path, makers in LOADERS.items():
        rates[path] = {name: [] for name in makers}
        names = list(makers)
        for rep in range(reps):
            for name in names if rep % 2 == 0 else names[::-1]:
                rates[path][name].append(loader_rate(makers[name], folder, size, batch,
                                                     workers, rep, images))
    return rates


# -- 4. the model's step rate -------------------------------------------------------------------
def train_step_rate(model_name: str, size: int, batch: int, steps: int) -> float:
    """Images/s of fp32 forward + backward + AdamW steps of `model_name` at `size`, as
    `vitkit train` sets up the CPU (one warm-up step first)."""
    import torch

    from vitkit import create_model
    from vitkit.runtime import configure_cpu
    from vitkit.train.optim import build_adamw

    configure_cpu()
    torch.manual_seed(0)
    model = create_model(model_name, img_size=size, num_classes=10).train()
    optimizer = build_adamw(model, lr=1e-3)
    images = torch.randn(batch, 3, size, size)
    labels = torch.randint(0, 10, (batch,))

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return batch * steps / (time.perf_counter() - start)


# -- the report ---------------------------------------------------------------------------------
def _mb(value: int) -> str:
    return f"{value / 1024**2:,.0f} MB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="2,000 files, Ti/16, fewer images and steps: a smoke check")
    parser.add_argument("--root", type=Path, help="where the generated folder is kept "
                        "(default /tmp/vitkit-bench-jpegs, or ...-quick with --quick)")
    parser.add_argument("--cifar-dir", default=os.environ.get("VITKIT_CIFAR10_DIR"),
                        help="CIFAR-10 binary folder (default $VITKIT_CIFAR10_DIR)")
    parser.add_argument("--count", type=int, help="training files (default 50,000; quick 2,000)")
    parser.add_argument("--val-count", type=int, help="held-out files (default 1,000; quick 200)")
    parser.add_argument("--subset", type=int, help="files in the small set of the memory "
                        "comparison (default count / 5)")
    parser.add_argument("--model", help="model whose step rate the loader must keep up with "
                        "(default S/16; quick Ti/16)")
    parser.add_argument("--train-model", default="Ti/16", help="model of the short training "
                        "runs whose memory is measured (default Ti/16: the data path, not the "
                        "model, is under test, and S/16 steps take ~10 s on 2 busy cores)")
    parser.add_argument("--size", type=int, default=224, help="model and loader image size")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--train-steps", type=int, help="steps of each training run "
                        "(default 12; quick 2)")
    parser.add_argument("--images", type=int, help="timed images per loader repetition "
                        "(default 2,000; quick 400)")
    parser.add_argument("--reps", type=int, help="repetitions per loader (default 5; quick 2)")
    parser.add_argument("--step-reps", type=int, help="timed model steps (default 3; quick 1)")
    readme_tables.add_flag(parser)
    args = parser.parse_args(argv)
    name = "data_loading.py" + (" --quick" if args.quick else "")
    with readme_tables.recording(name, args.write_readme, argv=argv):
        quick = args.quick
        default_root = Path("/tmp/vitkit-bench-jpegs" + ("-quick" if quick else ""))
        root = (args.root or default_root).resolve()
        count = args.count or (2_000 if quick else 50_000)
        val_count = args.val_count or (200 if quick else 1_000)
        subset = args.subset or count // 5
        model = args.model or ("Ti/16" if quick else "S/16")
        train_steps = args.train_steps or (2 if quick else 12)
        images = args.images or (400 if quick else 2_000)
        reps = args.reps or (2 if quick else 5)
        step_reps = args.step_reps or (1 if quick else 3)
        if not args.cifar_dir:
            parser.error("pass --cifar-dir or set VITKIT_CIFAR10_DIR (the CIFAR-10 binary folder)")
        if Path(__file__).resolve().parent.parent in [root, *root.parents]:
            parser.error(f"--root {root} is inside the repository: pick a folder outside it")

        from vitkit.runtime import cpu_description

        print(cpu_description(), flush=True)
        cores = len(os.sched_getaffinity(0))
        print(f"{count:,} training + {val_count:,} held-out JPEGs in {root}, {cores} CPU cores, "
              f"batch {args.batch}, {args.workers} loader workers, {args.size}px; load average "
              f"{os.getloadavg()[0]:.1f} at the start", flush=True)
        seconds = generate(root, count, val_count, args.cifar_dir, max(cores, 1))
        print(f"generation: {f'{seconds:.0f} s' if seconds else 'cached'}", flush=True)
        small = subset_folder(root, subset)

        recipe = {"model": {"variant": args.train_model, "img_size": args.size, "num_classes": 10},
                  "data": "folder", "data_mode": "stream", "workers": args.workers,
                  "batch_size": args.batch, "total_steps": train_steps, "warmup_steps": 1,
                  "test_limit": 2 * args.batch, "progress": False, "augment": {"crop_padding": 0}}
        runs = {}
        for label, folder in ((f"{count_files(small / 'train'):,} files", small),
                              (f"{count_files(root / 'train'):,} files", root)):
            runs[label] = train_peak_rss(folder, recipe, root / "runs" / folder.name)
            print(f"  trained {train_steps} steps on {label} in {runs[label][2]:.0f} s", flush=True)

        rates = time_loaders(root / "train", args.size, args.batch, args.workers, images, reps)
        step_rate = train_step_rate(model, args.size, args.batch, step_reps)

        (small_tree, small_own, _), (large_tree, large_own, _) = runs.values()
        growth = large_tree - small_tree
        print(f"\nPeak memory of `vitkit train data=folder data_mode=stream "
              f"model={args.train_model}` ({train_steps} steps, batch {args.batch}, "
              f"workers={args.workers})")
        print(f"{'training set':<16}{'process tree (summed RSS)':>28}{'training process':>20}")
        for label, (tree, own, _) in runs.items():
            print(f"{label:<16}{_mb(tree):>28}{_mb(own):>20}")
        verdict = "PASS" if abs(growth) < TARGET_RSS_GROWTH else "FAIL"
        print(f"{'difference':<16}{_mb(growth):>28}{_mb(large_own - small_own):>20}   "
              f"target < {_mb(TARGET_RSS_GROWTH)}: {verdict}")

        print(f"\nLoaders at {args.size}px, batch {args.batch}, {args.workers} workers, uint8 out, "
              f"no flip; medians of {reps} alternating repetitions of {images:,} images "
              "(min-max of images/s in brackets; CPU = loader processes' CPU time per image)")
        print(f"{'path':<7}{'loader':<25}{'images/s':>9}{'(min-max)':>12}{'vs tv':>7}"
              f"{'CPU ms/img':>12}{'vs tv':>7}")
        best_train = 0.0
        for path, by_name in rates.items():
            speed = {name: statistics.median(r for r, _ in runs) for name, runs in by_name.items()}
            cpu = {name: statistics.median(c for _, c in runs) for name, runs in by_name.items()}
            tv = "torchvision ImageFolder"
            for name, runs in by_name.items():
                spread = f"({min(r for r, _ in runs):.0f}-{max(r for r, _ in runs):.0f})"
                print(f"{path:<7}{name:<25}{speed[name]:>9.0f}{spread:>12}"
                      f"{speed[name] / speed[tv]:>6.2f}x{cpu[name]:>12.2f}"
                      f"{_ratio(cpu[tv], cpu[name])}")
            if path == "train":
                best_train = speed["vitkit StreamFeed"]
        print("(vs tv: vitkit's speed / torchvision's, and torchvision's CPU time / vitkit's: "
              "above 1 is better for vitkit)")

        keeps_up = "PASS" if best_train >= step_rate else "FAIL"
        print(f"\n{model} training step (fp32, forward + backward + AdamW, batch {args.batch}): "
              f"{step_rate:.1f} images/s; vitkit's training loader: {best_train:.0f} images/s "
              f"({best_train / step_rate:.1f}x the model): {keeps_up}")
        own_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        print(f"(largest child process of this script, getrusage: {_mb(own_children)}; load "
              f"average {os.getloadavg()[0]:.1f} at the end)")
        return 0


if __name__ == "__main__":
    sys.exit(main())
