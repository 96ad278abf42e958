"""Fuzz vitkit's data readers with seeded mutations: every input must load or be refused clearly.

    python tools/fuzz_data.py [--cases 10000] [--seed 0] [--reader cifar|images|all]
                              [--seconds S]

Readers: `cifar` (`vitkit.data.sources.cifar.load_cifar` on a small CIFAR-10 or CIFAR-100
folder whose batch file or class-name file was mutated) and `images`
(`vitkit.data.image_decoder.decode_image` on mutated PNG, JPEG, GIF, BMP, TIFF, WebP and PPM files).
Prints, per reader, how many inputs gave a clear error, loaded, or did something else
("other": a raw exception, a warning that escaped, an error that does not name the file, or a
result that breaks the reader's contract; it must be 0). The test suite runs the same fuzzers
on a fixed number of seeded cases, never bounded by the clock, so a busy machine only makes it
slower (tests/data/test_images.py, tests/data/test_cifar.py). `--seconds` is for long runs by hand.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from vitkit.data.image_decoder import FIXES, decode_image
from vitkit.data.sources.cifar import CIFAR_SPECS, load_cifar
from vitkit.errors import VitkitError

# The fuzzer keeps Pillow's decompression-bomb limit small, so that a mutated header claiming
# a large image is decoded in milliseconds; the limit's own check is what is tested.
FUZZ_MAX_PIXELS = 1 << 20


@dataclass
class FuzzCounts:
    """Outcomes of one reader's fuzz run."""

    reader: str
    clear_error: int = 0
    loaded: int = 0
    other: int = 0
    slowest_s: float = 0.0
    examples: list[str] = field(default_factory=list)  # the first few "other" cases

    @property
    def cases(self) -> int:
        return self.clear_error + self.loaded + self.other

    def add(self, outcome: str, note: str = "") -> None:
        if outcome == "clear":
            self.clear_error += 1
        elif outcome == "loaded":
            self.loaded += 1
        else:
            self.other += 1
            if len(self.examples) < 5:
                self.examples.append(note)

    def line(self) -> str:
        return (f"{self.reader}: {self.cases} inputs: clear error {self.clear_error}, loaded "
                f"{self.loaded}, other {self.other} (slowest input {self.slowest_s:.3f} s)")


# -- mutations ------------------------------------------------------------------------------

def _flip(data: bytearray, rng: np.random.Generator) -> None:
    for pos in rng.integers(0, len(data), size=int(rng.integers(1, 9))):
        data[pos] ^= int(rng.integers(1, 256))


def _flip_header(data: bytearray, rng: np.random.Generator) -> None:
    head = min(len(data), 96)  # where sizes, modes and markers live
    for pos in rng.integers(0, head, size=int(rng.integers(1, 4))):
        data[pos] = int(rng.choice([0, 1, 0x7F, 0x80, 0xFF, int(rng.integers(0, 256))]))


def _truncate(data: bytearray, rng: np.random.Generator) -> None:
    del data[int(rng.integers(0, len(data))):]


def _delete(data: bytearray, rng: np.random.Generator) -> None:
    start = int(rng.integers(0, len(data)))
    del data[start:start + int(rng.integers(1, 64))]


def _insert(data: bytearray, rng: np.random.Generator) -> None:
    pos = int(rng.integers(0, len(data) + 1))
    data[pos:pos] = rng.bytes(int(rng.integers(1, 64)))


def _duplicate(data: bytearray, rng: np.random.Generator) -> None:
    start = int(rng.integers(0, len(data)))
    chunk = data[start:start + int(rng.integers(1, 256))]
    pos = int(rng.integers(0, len(data) + 1))
    data[pos:pos] = chunk


def _append(data: bytearray, rng: np.random.Generator) -> None:
    data.extend(rng.bytes(int(rng.integers(1, 4096))))


def _random(data: bytearray, rng: np.random.Generator) -> None:
    data[:] = rng.bytes(int(rng.integers(0, 2 * len(data) + 2)))


MUTATIONS: tuple[Callable[[bytearray, np.random.Generator], None], ...] = (
    _flip, _flip, _flip_header, _flip_header, _truncate, _truncate, _delete, _insert,
    _duplicate, _append, _random,
)


def mutate(data: bytes, rng: np.random.Generator) -> bytes:
    """`data` after one to three random mutations (flips, cuts, inserts, garbage, ...)."""
    out = bytearray(data)
    for _ in range(int(rng.integers(1, 4))):
        if not out:
            break
        MUTATIONS[int(rng.integers(0, len(MUTATIONS)))](out, rng)
    return bytes(out)


# -- image files ----------------------------------------------------------------------------

def _encode(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def image_seeds() -> dict[str, bytes]:
    """Small valid files of every kind the decoder converts: the fuzzer's starting points."""
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8))
    gray = rgb.convert("L")
    rgba = Image.fromarray(rng.integers(0, 256, (12, 10, 4), dtype=np.uint8))
    palette = rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=8)
    sixteen = Image.fromarray(rng.integers(0, 65536, (12, 10), dtype=np.uint16))
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise
    seeds = {
        "rgb.png": _encode(rgb, "PNG"),
        "gray.png": _encode(gray, "PNG"),
        "rgba.png": _encode(rgba, "PNG"),
        "palette.png": _encode(palette, "PNG", transparency=0),
        "sixteen.png": _encode(sixteen, "PNG"),
        "rgb.jpg": _encode(rgb, "JPEG", quality=90),
        "gray.jpg": _encode(gray, "JPEG"),
        "cmyk.jpg": _encode(rgb.convert("CMYK"), "JPEG"),
        "exif.jpg": _encode(rgb, "JPEG", exif=exif),
        "anim.gif": _encode(palette, "GIF", save_all=True, append_images=[palette]),
        "rgb.bmp": _encode(rgb, "BMP"),
        "rgb.tif": _encode(rgb, "TIFF"),
        "rgb.ppm": _encode(rgb, "PPM"),
    }
    with contextlib.suppress(KeyError, OSError):  # Pillow built without WebP: no such seed
        seeds["rgb.webp"] = _encode(rgb, "WEBP")
    return seeds


def check_image(path: Path, channels: int) -> tuple[str, str]:
    """("clear" | "loaded" | "other", note) for one decode of `path`."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            decoded = decode_image(path, channels)
        except Exception as err:
            return "other", f"raised {type(err).__name__}: {err}"
    if caught:
        return "other", f"warning escaped: {caught[0].message}"
    if decoded.image is not None:
        image = decoded.image
        good = image.mode == ("L" if channels == 1 else "RGB") and image.width * image.height
        return ("loaded", "") if good else ("other", f"bad result {image.mode} {image.size}")
    if decoded.kind in FIXES and decoded.detail:
        return "clear", ""
    return "other", f"unclear refusal {decoded.kind!r}: {decoded.detail!r}"


def fuzz_images(cases: int, seed: int = 0, seconds: float | None = None) -> FuzzCounts:
    """Decode `cases` mutated image files (stopping early after `seconds`)."""
    counts = FuzzCounts("images")
    seeds = list(image_seeds().items())
    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, FUZZ_MAX_PIXELS
    try:
        with tempfile.TemporaryDirectory(prefix="vitkit-fuzz-") as tmp:
            for case in range(cases):
                if seconds is not None and time.perf_counter() - started > seconds:
                    break
                name, data = seeds[int(rng.integers(0, len(seeds)))]
                path = Path(tmp) / f"case{Path(name).suffix}"
                path.write_bytes(mutate(data, rng))
                tick = time.perf_counter()
                outcome, note = check_image(path, int(rng.choice([1, 3])))
                counts.slowest_s = max(counts.slowest_s, time.perf_counter() - tick)
                counts.add(outcome, f"case {case} ({name}): {note}")
    finally:
        Image.MAX_IMAGE_PIXELS = limit
    return counts


# -- CIFAR folders --------------------------------------------------------------------------

def _meta_variants(names: list[str], rng: np.random.Generator) -> bytes:
    """A class-name file gone wrong in a structured way: encoding, line count, separators."""
    text = "\n".join(names) + "\n"
    choice = int(rng.integers(0, 6))
    if choice == 0:
        return text.encode(str(rng.choice(["utf-16", "utf-32", "cp1252", "latin-1"])))
    if choice == 1:
        return "\n".join(names[: int(rng.integers(0, len(names)))]).encode()
    if choice == 2:
        return (text + "\n".join(f"extra{i}" for i in range(int(rng.integers(1, 5))))).encode()
    if choice == 3:
        return text.replace("\n", str(rng.choice(["\r\n", "\r", "\t", " "]))).encode()
    if choice == 4:
        return ("é" + text).encode("latin-1", errors="replace")
    return "\ufeff".encode() + text.encode()


def _write_cifar(folder: Path, dataset: str, rng: np.random.Generator) -> dict[str, bytes]:
    """A valid 3-record test split of `dataset` in `folder`; {file name: bytes}."""
    spec = CIFAR_SPECS[dataset]
    records = rng.integers(0, 256, (3, spec.record_bytes), dtype=np.uint8)
    records[:, spec.label_index] = rng.integers(0, spec.num_classes, 3)
    names = [f"class{i}" for i in range(spec.num_classes)]
    files = {spec.test_files[0]: records.tobytes(), spec.meta_file: "\n".join(names).encode()}
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def check_cifar(folder: Path, dataset: str, mutated: str) -> tuple[str, str]:
    """("clear" | "loaded" | "other", note) for one `load_cifar` of `folder`'s test split."""
    spec = CIFAR_SPECS[dataset]
    try:
        ds = load_cifar(folder, "test", dataset)  # type: ignore[arg-type]
    except VitkitError as err:
        named = mutated in str(err)
        return ("clear", "") if named else ("other", f"error does not name {mutated}: {err}")
    except Exception as err:
        return "other", f"raised {type(err).__name__}: {err}"
    good = (tuple(ds.images.shape[1:]) == (3, 32, 32) and len(ds.classes) == spec.num_classes
            and int(ds.labels.max()) < spec.num_classes and len(ds.images) == len(ds.labels)
            and all(name.isprintable() for name in ds.classes))
    return ("loaded", "") if good else ("other", f"bad dataset {tuple(ds.images.shape)}")


def fuzz_cifar(cases: int, seed: int = 0, seconds: float | None = None) -> FuzzCounts:
    """Load `cases` CIFAR folders with one mutated file (stopping early after `seconds`)."""
    counts = FuzzCounts("cifar")
    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vitkit-fuzz-") as tmp:
        valid = {name: _write_cifar(Path(tmp) / name, name, rng) for name in CIFAR_SPECS}
        for case in range(cases):
            if seconds is not None and time.perf_counter() - started > seconds:
                break
            dataset = str(rng.choice(sorted(CIFAR_SPECS)))
            folder, files = Path(tmp) / dataset, valid[dataset]
            target = str(rng.choice(sorted(files)))
            spec = CIFAR_SPECS[dataset]
            if target == spec.meta_file and rng.random() < 0.3:
                names = [f"class{i}" for i in range(spec.num_classes)]
                data = _meta_variants(names, rng)
            else:
                data = mutate(files[target], rng)
            (folder / target).write_bytes(data)
            tick = time.perf_counter()
            outcome, note = check_cifar(folder, dataset, target)
            counts.slowest_s = max(counts.slowest_s, time.perf_counter() - tick)
            counts.add(outcome, f"case {case} ({dataset}/{target}): {note}")
            (folder / target).write_bytes(files[target])  # restore for the next case
    return counts


FUZZERS = {"cifar": fuzz_cifar, "images": fuzz_images}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000, help="inputs per reader")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reader", choices=[*FUZZERS, "all"], default="all")
    parser.add_argument("--seconds", type=float, help="stop each reader after this long")
    args = parser.parse_args(argv)
    readers = list(FUZZERS) if args.reader == "all" else [args.reader]
    return run_and_report(readers, lambda reader: FUZZERS[reader](args.cases, args.seed,
                                                                  args.seconds))


def run_and_report(readers: list[str], fuzz: Callable[[str], FuzzCounts]) -> int:
    """Fuzz each reader in turn, print its counts and first "other" cases; 1 if any other."""
    failed = False
    for reader in readers:
        started = time.perf_counter()
        counts = fuzz(reader)
        print(f"{counts.line()} in {time.perf_counter() - started:.1f} s", flush=True)
        for example in counts.examples:
            print(f"  other: {example}")
        failed |= counts.other > 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
