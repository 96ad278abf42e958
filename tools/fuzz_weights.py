"""Fuzz vitkit's weights readers with seeded mutations: every input must load or be refused clearly.

    python tools/fuzz_weights.py [--per-reader 10000] [--seed 0] [--reader NAME|all]
                                 [--seconds S]

Readers (each fuzzes one tiny model written in that format, read back with
`vitkit.load_pretrained`): `npz` (official .npz, original vit_jax layout),
`npz_big_vision` (the AugReg / big_vision layout), `npz_hybrid` (a ResNet-stem hybrid),
`timm_pth`, `timm_safetensors`, `hf_folder` (Hugging Face model folder), `vitkit_folder`
(`save_pretrained`) and `train_checkpoint` (last.pt). Mutations are structural (a tensor
dropped, renamed, added, reshaped, retyped, given NaN/inf; a config.json key dropped or
given a wrong type) or on the bytes (flips, cuts, inserts, garbage, a header claiming huge
sizes). Prints per reader how many inputs gave a clear error (a `VitkitError` naming the
file), loaded, or did something else ("other": a raw exception, an escaped warning, or an
error that does not name the file; it must be 0, and its first cases are listed). The test
suite runs the same fuzzers on a fixed number of seeded cases each, never bounded by the clock
(tests/weights/test_fuzz_weights.py). `--seconds` is for long runs by hand.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import struct
import sys
import tempfile
import time
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzz_data import FuzzCounts, mutate, run_and_report

from vitkit.catalog import load_pretrained
from vitkit.config import ViTConfig
from vitkit.errors import VitkitError
from vitkit.model.vit import VisionTransformer
from vitkit.preprocess import official_preprocess
from vitkit.train.checkpoint import Position, TrainCheckpoint
from vitkit.weights import save_pretrained, to_official_arrays
from vitkit.weights.formats.train_checkpoint import TrainedWeights

TINY = dict(img_size=32, patch_size=16, width=16, depth=1, num_heads=2, mlp_dim=32,
            num_classes=3)
HYBRID = dict(TINY, stem="resnet", resnet_layers=(1,), resnet_width=32)
HUGE = 1 << 40

Tensors = dict[str, Any]  # numpy arrays (npz) or torch tensors (the others)


@dataclass
class Seed:
    """One reader's valid input: its tensors by the format's own names, how to write them
    (and, for folders, config.json) to `target`, and the file the byte mutations hit."""

    reader: str
    tensors: Tensors
    write: Callable[[Tensors, dict[str, Any] | None, Path], None]
    config: dict[str, Any] | None = None  # config.json (folders) or the checkpoint's settings
    filename: str = "weights"  # file or folder written under the case's directory
    byte_target: str = ""  # the file inside a folder that byte mutations hit
    numpy: bool = False
    options: dict[str, Any] = field(default_factory=dict)  # for load_pretrained


def tiny_model(hybrid: bool = False, seed: int = 0) -> VisionTransformer:
    torch.manual_seed(seed)
    return VisionTransformer(ViTConfig(**(HYBRID if hybrid else TINY))).eval()


# -- writers ------------------------------------------------------------------------------------
def _write_npz(tensors: Tensors, config: dict | None, target: Path) -> None:
    with target.open("wb") as stream:
        np.savez(stream, **tensors)


def _write_pth(tensors: Tensors, config: dict | None, target: Path) -> None:
    torch.save(dict(tensors), target)


def _write_safetensors(tensors: Tensors, config: dict | None, target: Path) -> None:
    save_file({k: v.contiguous() for k, v in tensors.items()}, target)


def _write_folder(tensors: Tensors, config: dict | None, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, target / "model.safetensors")
    text = config if isinstance(config, str) else json.dumps(config)
    (target / "config.json").write_text(text)


def _write_train(tensors: Tensors, config: dict | None, target: Path) -> None:
    state = dict(config or {})
    state["model"] = dict(tensors)
    torch.save(state, target)


# -- seeds --------------------------------------------------------------------------------------
def _hf_seed() -> Seed:
    from transformers import ViTConfig as HFConfig
    from transformers import ViTForImageClassification

    torch.manual_seed(0)
    hf = ViTForImageClassification(HFConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        image_size=32, patch_size=16, num_labels=3))
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        config = json.loads((Path(tmp) / "config.json").read_text())
    tensors = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    return Seed("hf_folder", tensors, _write_folder, config, "hf", "model.safetensors")


def _vitkit_seed() -> Seed:
    with tempfile.TemporaryDirectory() as tmp:
        save_pretrained(tiny_model(), tmp)
        config = json.loads((Path(tmp) / "config.json").read_text())
    tensors = {k: v.detach().clone() for k, v in tiny_model().state_dict().items()}
    return Seed("vitkit_folder", tensors, _write_folder, config, "vitkit", "model.safetensors")


def _train_seed() -> Seed:
    model = tiny_model()
    trained = TrainedWeights(
        model.config, official_preprocess(model.config.img_size, 3), ["a", "b", "c"],
        {k: v.detach().clone() for k, v in model.state_dict().items()}, None)
    checkpoint = TrainCheckpoint(
        trained, {"state": {}, "param_groups": []}, Position(total_steps=10),
        torch.get_rng_state(), torch.zeros(4, dtype=torch.int64), {"epochs": 1})
    state = checkpoint.to_state()
    tensors = state.pop("model")
    return Seed("train_checkpoint", tensors, _write_train, state, "last.pt")


def make_seed(reader: str) -> Seed:
    """The valid input a reader's mutations start from."""
    if reader in ("npz", "npz_big_vision", "npz_hybrid"):
        layout = "big_vision" if reader == "npz_big_vision" else "original"
        arrays = to_official_arrays(tiny_model(reader == "npz_hybrid"), layout)
        return Seed(reader, arrays, _write_npz, None, "weights.npz", numpy=True)
    if reader in ("timm_pth", "timm_safetensors"):
        tensors = {k: v.detach().clone() for k, v in tiny_model().state_dict().items()}
        pth = reader == "timm_pth"
        return Seed(reader, tensors, _write_pth if pth else _write_safetensors, None,
                    "weights.pth" if pth else "weights.safetensors",
                    options={"num_heads": TINY["num_heads"]})  # width 16 is not standard
    return {"hf_folder": _hf_seed, "vitkit_folder": _vitkit_seed,
            "train_checkpoint": _train_seed}[reader]()


READERS = ("npz", "npz_big_vision", "npz_hybrid", "timm_pth", "timm_safetensors", "hf_folder",
           "vitkit_folder", "train_checkpoint")


# -- structural mutations -------------------------------------------------------------------------
def _pick(tensors: Tensors, rng: np.random.Generator) -> str:
    names = sorted(tensors)
    return names[int(rng.integers(0, len(names)))]


def _reshaped(value: Any, rng: np.random.Generator) -> Any:
    shape = tuple(value.shape)
    choice = int(rng.integers(0, 6))
    if choice == 0 and shape:  # one row or column fewer
        axis = int(rng.integers(0, len(shape)))
        return value[(slice(None),) * axis + (slice(0, max(shape[axis] - 1, 0)),)]
    if choice == 1:  # an extra leading axis
        return value.reshape((1, *shape))
    if choice == 2:  # flattened
        return value.reshape(-1)
    if choice == 3 and len(shape) >= 2:  # transposed
        return value.T if isinstance(value, np.ndarray) else value.transpose(0, -1)
    if choice == 4:  # doubled along the first axis
        return np.concatenate([value, value]) if isinstance(value, np.ndarray) else \
            torch.cat([value.reshape(-1), value.reshape(-1)]).reshape((2, *shape))
    return value.reshape(-1)[:0] if choice == 5 else value.reshape((*shape, 1))


_NUMPY_DTYPES = ("float16", "float64", "int32", "uint8", "bool", ">f4", ">f8", "complex64",
                 "datetime64[s]", "U3", "S2", "object", "V4")
_TORCH_DTYPES = (torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64,
                 torch.uint8, torch.bool, torch.complex64)


def _retyped(value: Any, rng: np.random.Generator) -> Any:
    if isinstance(value, np.ndarray):
        dtype = _NUMPY_DTYPES[int(rng.integers(0, len(_NUMPY_DTYPES)))]
        if dtype == "object":
            return value.astype(object)
        if dtype.startswith(("datetime", "U", "S", "V")):
            return np.zeros(value.shape, dtype=dtype)
        return value.astype(dtype)
    return value.to(_TORCH_DTYPES[int(rng.integers(0, len(_TORCH_DTYPES)))])


def _nonfinite(value: Any, rng: np.random.Generator) -> Any:
    out = value.copy() if isinstance(value, np.ndarray) else value.clone()
    flat = out.reshape(-1)
    if len(flat):
        flat[int(rng.integers(0, len(flat)))] = float(rng.choice([np.nan, np.inf, -np.inf]))
    return out


def _renamed(name: str, rng: np.random.Generator) -> str:
    digits = [i for i, c in enumerate(name) if c.isdigit()]
    if digits and rng.random() < 0.7:
        i = digits[int(rng.integers(0, len(digits)))]
        return name[:i] + str(int(rng.choice([1, 2, 7, 99999]))) + name[i + 1:]
    return name + str(rng.choice(["_x", ".extra", "/kernel"]))


def mutate_tensors(tensors: Tensors, rng: np.random.Generator) -> tuple[Tensors, str]:
    """`tensors` after one structural mutation, and its name."""
    out = dict(tensors)
    name = _pick(out, rng)
    kind = str(rng.choice(["drop", "shape", "dtype", "nonfinite", "rename", "add"]))
    if kind == "drop":
        del out[name]
    elif kind == "shape":
        out[name] = _reshaped(out[name], rng)
    elif kind == "dtype":
        out[name] = _retyped(out[name], rng)
    elif kind == "nonfinite":
        out[name] = _nonfinite(out[name], rng)
    elif kind == "rename":
        out[_renamed(name, rng)] = out.pop(name)
    else:
        out[name + "_copy" if rng.random() < 0.5 else _renamed(name, rng)] = out[name]
    return out, f"{kind} {name}"


_WRONG_VALUES = ("text", -3, 0, 1 << 40, 2.5, True, None, [], [1, 2, 3], {"a": 1}, "224")


def mutate_config(config: dict[str, Any], rng: np.random.Generator) -> tuple[Any, str]:
    """config.json (or a checkpoint's settings) with a key dropped or given a wrong value,
    one level down when the value is an object."""
    out = json.loads(json.dumps(config, default=str)) if not _has_tensors(config) else \
        dict(config)
    keys = sorted(out)
    key = keys[int(rng.integers(0, len(keys)))]
    where = out
    if isinstance(out[key], dict) and out[key] and rng.random() < 0.6:
        where = out[key] = dict(out[key])
        key = sorted(where)[int(rng.integers(0, len(where)))]
    if rng.random() < 0.3:
        del where[key]
        return out, f"config: drop {key}"
    where[key] = _WRONG_VALUES[int(rng.integers(0, len(_WRONG_VALUES)))]
    return out, f"config: {key}={where[key]!r}"


def _has_tensors(config: dict[str, Any]) -> bool:
    return any(isinstance(v, torch.Tensor) for v in config.values()) or "rng" in config


# -- byte mutations ------------------------------------------------------------------------------
def huge_npy_header(data: bytes, rng: np.random.Generator) -> bytes:
    """An .npz whose one member's .npy header claims a huge shape (the zip itself valid)."""
    source = zipfile.ZipFile(io.BytesIO(data))
    names = source.namelist()
    victim = names[int(rng.integers(0, len(names)))]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name in names:
            payload = source.read(name)
            if name == victim:
                member = io.BytesIO(payload)
                np.lib.format.read_magic(member)
                _, _, dtype = np.lib.format.read_array_header_1_0(member)
                header = io.BytesIO()
                shape = (HUGE,) if rng.random() < 0.5 else (1 << 20, 1 << 20, 4)
                np.lib.format.write_array_header_1_0(
                    header, {"descr": np.lib.format.dtype_to_descr(dtype),
                             "fortran_order": False, "shape": shape})
                payload = header.getvalue() + payload[member.tell():]
            archive.writestr(name, payload)
    return out.getvalue()


def huge_zip_sizes(data: bytes, rng: np.random.Generator) -> bytes:
    """A zip whose central directory claims huge sizes for one member."""
    out = bytearray(data)
    starts = [i for i in range(len(out) - 4) if out[i:i + 4] == b"PK\x01\x02"]
    if starts:
        start = starts[int(rng.integers(0, len(starts)))]
        field_at = start + int(rng.choice([20, 24]))  # compressed / uncompressed size
        out[field_at:field_at + 4] = struct.pack("<I", int(rng.choice([0xFFFFFFFE, 1 << 31])))
    return bytes(out)


def huge_safetensors_header(data: bytes, rng: np.random.Generator) -> bytes:
    """A safetensors file whose header claims a huge tensor, or a huge header."""
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    if rng.random() < 0.3:
        return struct.pack("<Q", HUGE) + data[8:]
    name = sorted(k for k in header if k != "__metadata__")[0]
    if rng.random() < 0.5:
        header[name]["shape"] = [1 << 20, 1 << 20]
    else:
        header[name]["data_offsets"] = [0, HUGE]
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data[8 + length:]


def mutate_bytes(data: bytes, kind: str, rng: np.random.Generator) -> tuple[bytes, str]:
    """`data` after a random byte mutation, or a header claiming huge sizes."""
    roll = rng.random()
    try:
        if roll < 0.12 and kind == "npz":
            return huge_npy_header(data, rng), "bytes: huge .npy header"
        if roll < 0.2 and kind in ("npz", "torch"):
            return huge_zip_sizes(data, rng), "bytes: huge zip sizes"
        if roll < 0.2 and kind == "safetensors":
            return huge_safetensors_header(data, rng), "bytes: huge safetensors header"
    except (zipfile.BadZipFile, ValueError, KeyError, IndexError):
        pass
    return mutate(data, rng), "bytes: flip/cut/insert"


# -- one case --------------------------------------------------------------------------------------
def write_case(seed: Seed, rng: np.random.Generator, root: Path) -> tuple[Path, str]:
    """Write one mutated input under `root`; returns its path and what was mutated."""
    target = root / seed.filename
    if target.is_dir():
        shutil.rmtree(target)
    tensors, config = seed.tensors, seed.config
    roll = rng.random()
    if roll < 0.45 or (roll < 0.6 and config is None):
        tensors, what = mutate_tensors(tensors, rng)
        if config is not None and "tensors_sha256" in config and rng.random() < 0.5:
            config = {k: v for k, v in config.items() if k != "tensors_sha256"}
        if config is not None and "checksum" in config and rng.random() < 0.5:
            config = {k: v for k, v in config.items() if k != "checksum"}
    elif roll < 0.6:
        config, what = mutate_config(config, rng)
    else:
        what = ""
    try:
        seed.write(tensors, config, target)
    except (TypeError, ValueError, RuntimeError, AttributeError) as exc:
        # the format cannot hold this mutation (e.g. safetensors and complex): write the seed
        seed.write(seed.tensors, seed.config, target)
        what = f"unwritable ({type(exc).__name__}), seed"
    if roll >= 0.6:
        file = target / seed.byte_target if seed.byte_target else target
        if seed.byte_target and rng.random() < 0.25:
            file = target / "config.json"
        kind = "npz" if seed.numpy else "safetensors" if file.suffix == ".safetensors" else \
            "json" if file.suffix == ".json" else "torch"
        data, what = mutate_bytes(file.read_bytes(), kind, rng)
        file.write_bytes(data)
        what = f"{what} of {file.name}"
    return target, what


def check(path: Path, **options: Any) -> tuple[str, str, BaseException | None]:
    """("clear" | "loaded" | "other", a note, the error raised)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            model = load_pretrained(path, **options)
        except VitkitError as exc:
            if path.name not in str(exc):
                return "other", f"error without the file's name: {exc}", exc
            return "clear", "", exc
        except Exception as exc:
            return "other", f"{type(exc).__name__}: {str(exc)[:160]}", exc
    if not all(bool(torch.isfinite(p).all()) for p in model.state_dict().values()):
        return "other", "loaded non-finite weights", None
    return "loaded", "", None


def fuzz_reader(reader: str, cases: int, seed: int = 0, seconds: float | None = None
                ) -> FuzzCounts:
    """Run `cases` mutated inputs (or stop after `seconds`) through one reader."""
    counts = FuzzCounts(reader)
    base = make_seed(reader)
    rng = np.random.default_rng([seed, READERS.index(reader)])
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(cases):
            if seconds is not None and time.perf_counter() - started > seconds:
                break
            path, what = write_case(base, rng, Path(tmp))
            begun = time.perf_counter()
            outcome, note, _ = check(path, **base.options)
            counts.slowest_s = max(counts.slowest_s, time.perf_counter() - begun)
            counts.add(outcome, f"{what}: {note}")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-reader", type=int, default=10_000, help="inputs per reader")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reader", choices=[*READERS, "all"], default="all")
    parser.add_argument("--seconds", type=float, help="stop each reader after this long")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    readers = list(READERS) if args.reader == "all" else [args.reader]
    return run_and_report(readers, lambda reader: fuzz_reader(reader, args.per_reader,
                                                              args.seed, args.seconds))


if __name__ == "__main__":
    sys.exit(main())
