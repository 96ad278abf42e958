"""What a path holds, decided once from its bytes, and its contents read once, safely.

This is the only module that looks at a file's bytes to tell formats apart (npz, PyTorch zip,
pickle, safetensors, an HTML page saved by a failed download) and the only one that opens
them: pickles with `torch.load(weights_only=True)`, .npz without pickle, safetensors as is.
The adapters in `vitkit.weights.formats` decide from a `Found` whether a source is theirs.
"""

from __future__ import annotations

import logging
import pickle
import re
import struct
import warnings
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from vitkit.errors import CheckpointError
from vitkit.files import read_json
from vitkit.weights.formats.base import damaged
from vitkit.weights.formats.npz_archive import read_npz_arrays

log = logging.getLogger("vitkit.weights")
CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # a folder's, in order of preference
INDEX_SUFFIX = ".index.json"  # beside the shards of a split one: model.safetensors.index.json
KINDS = ("folder", "npz", "torch", "safetensors", "html", "unknown")
_HTML_STARTS = (b"<!doctype", b"<html", b"<?xml", b"<head", b"<body")


def file_kind(path: Path) -> str:
    """One of KINDS, from the first bytes (and a zip's member names)."""
    if path.is_dir():
        return "folder"
    with path.open("rb") as stream:
        head = stream.read(16)
    if not head:
        raise CheckpointError(f"{path} is empty (0 bytes), so it holds no weights: save, "
                              "copy or download it again")
    if head.lstrip().lower().startswith(_HTML_STARTS):
        return "html"
    if head.startswith(b"PK"):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, EOFError, OSError, ValueError, NotImplementedError,
                struct.error) as exc:
            raise damaged(path, f"a broken zip archive: {exc}") from None
        if names and all(name.endswith(".npy") for name in names):
            return "npz"
        return "torch" if any(name.endswith("data.pkl") for name in names) else "unknown"
    if len(head) >= 9:
        (header_len,) = struct.unpack("<Q", head[:8])
        if head[8:9] == b"{":
            if header_len + 8 > path.stat().st_size:
                raise damaged(path, f"its safetensors header claims {header_len} bytes, more "
                                    f"than the file's {path.stat().st_size}")
            return "safetensors"
    return "torch" if head[:1] == b"\x80" else "unknown"


# What torch.load raises on bytes that are not a whole PyTorch file.
_TORCH_READ_ERRORS = (RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError, TypeError,
                      KeyError, IndexError, AttributeError, struct.error, UnicodeDecodeError,
                      OverflowError, MemoryError, AssertionError, NotImplementedError,
                      SafetensorError)  # torch.load hands files it takes for safetensors on


def html_error(path: Path) -> CheckpointError:
    return CheckpointError(
        f"{path} is an HTML page, not a checkpoint: the download returned a web page (a login, "
        "quota or error page). Download the file again from its direct URL.")


def load_npz(path: Path) -> dict[str, np.ndarray]:
    """All arrays of an .npz file, without pickle, each header checked before its data is
    read (`npz_archive`)."""
    return read_npz_arrays(path)


def load_torch(path: Path) -> Any:
    """A PyTorch file read with `torch.load(weights_only=True)`: tensors and containers only.

    torch does not check the CRCs of its zip archive, so they are checked here first: a
    flipped byte in a tensor is reported as damage, not loaded as a wrong weight. torch.load
    is handed the open file, not its name, as it takes a name ending in .safetensors for a
    safetensors file: a PyTorch file so named is read by its bytes, with a warning.
    """
    check_zip_crcs(path)
    if path.suffix == ".safetensors":
        log.warning("%s is a PyTorch file (torch.save), not safetensors, though it is named "
                    ".safetensors: read by its content with torch.load(weights_only=True). "
                    "Rename it to .pt or .bin (or convert it: safetensors.torch.save_file) "
                    "so that other tools read it too", path)
    try:
        with warnings.catch_warnings(), path.open("rb") as stream:
            # e.g. "pickle protocol 252" on damaged bytes: the error below says it better
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(stream, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's own text advises weights_only=False, which would run the file's code: keep
        # only the line that names what the file holds
        what = re.search(r"Unsupported[^\n.]*", str(exc))
        raise CheckpointError(
            f"refused to load {path}: it is a pickle that needs to run code or build objects "
            f"beyond tensors and plain containers, and vitkit only loads with "
            f"torch.load(weights_only=True). If you trust the file, re-save its state dict "
            f"(torch.save(model.state_dict(), ...)) or convert it to safetensors."
            + (f" ({what.group(0).strip()})" if what else "")
        ) from None
    except _TORCH_READ_ERRORS as exc:
        # the file's bytes drive torch's zip reader and unpickler: any failure there means
        # the bytes are not a whole PyTorch file
        raise damaged(path, f"not a readable PyTorch file: {type(exc).__name__}: "
                            f"{_first_line(exc)}") from None


def check_zip_crcs(path: Path) -> None:
    """Raise the damaged-file error when `path` is a zip archive whose members fail their
    CRC-32 (one pass over the data); other files pass unchecked."""
    if not zipfile.is_zipfile(path):
        return
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError,
            RuntimeError, struct.error) as exc:
        raise damaged(path, f"a broken zip archive: {_first_line(exc)}") from None
    if bad is not None:
        raise damaged(path, f"member {bad!r} fails its CRC-32 check")


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; a PyTorch file named as one (a vitkit folder's
    model.safetensors written with torch.save) is read as what it is (`load_torch`)."""
    if file_kind(path) == "torch":
        tensors = state_dict_of(load_torch(path))
        if tensors is None:
            raise CheckpointError(f"{path} is a PyTorch file named .safetensors that holds no "
                                  "state dict of tensors: save the weights again")
        return tensors
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError, RuntimeError, OverflowError, MemoryError,
            TypeError) as exc:
        raise damaged(path, f"its safetensors header or data fail their checks: "
                            f"{_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]


def state_dict_of(obj: Any) -> dict[str, torch.Tensor] | None:
    """The tensors of a state dict, unwrapped from {"state_dict"|"model"|"module": ...} and
    wrappers' key prefixes ("module.", "_orig_mod."); None when `obj` holds none."""
    if not isinstance(obj, dict):
        return None
    for key in ("state_dict", "model", "module", "model_state"):
        if isinstance(obj.get(key), dict):
            return state_dict_of(obj[key])
    tensors = {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
    return {_bare_key(k): v for k, v in tensors.items()} or None


def _bare_key(key: str) -> str:
    """A parameter name without the prefixes wrappers add: DDP's and DataParallel's
    "module.", torch.compile's "_orig_mod." (in any order, as wrappers nest)."""
    while key.startswith(("module.", "_orig_mod.")):
        key = key.partition(".")[2]
    return key


@dataclass
class Found:
    """A path on disk, its kind, and what it holds, each read at most once."""

    path: Path
    kind: str
    _contents: Any = field(default=None, repr=False)
    _loaded: bool = field(default=False, repr=False)
    _weights: Found | None = field(default=None, repr=False)  # a folder's weights file
    _shards: dict[str, torch.Tensor] | None = field(default=None, repr=False)  # or its shards

    @classmethod
    def at(cls, path: str | Path) -> Found:
        path = Path(path)
        kind = file_kind(path)
        if kind == "html":
            raise html_error(path)
        return cls(path, kind)

    def contents(self) -> Any:
        """npz: the arrays; safetensors: the tensors; torch: the loaded object; else None."""
        if not self._loaded:
            readers = {"npz": load_npz, "safetensors": load_safetensors, "torch": load_torch}
            reader = readers.get(self.kind)
            self._contents = reader(self.path) if reader else None
            self._loaded = True
        return self._contents

    def tensors(self) -> dict[str, torch.Tensor] | None:
        """The state dict a safetensors or PyTorch file, or a folder's weights file, holds."""
        if self.kind == "folder":
            if self._weights is None:
                weights = self.weights_file()
                if weights is None:
                    return None
                if weights.name.endswith(INDEX_SUFFIX):
                    if self._shards is None:
                        self._shards = read_shards(weights)
                    return self._shards
                self._weights = Found.at(weights)
            return self._weights.tensors()
        if self.kind not in ("safetensors", "torch"):
            return None
        return state_dict_of(self.contents())

    def config(self) -> dict[str, Any] | None:
        """config.json inside a folder, or beside a file; None when there is none."""
        folder = self.path if self.kind == "folder" else self.path.parent
        path = folder / CONFIG_FILE
        if not path.is_file():
            return None
        data = read_json(path, CheckpointError, "restore or re-download it")
        return data if isinstance(data, dict) else None

    def weights_file(self) -> Path | None:
        """A folder's weights: model.safetensors, else pytorch_model.bin, else the index of
        either split into shards (`save_pretrained(..., max_shard_size=...)`)."""
        names = WEIGHT_FILES + tuple(name + INDEX_SUFFIX for name in WEIGHT_FILES)
        return next((self.path / n for n in names if (self.path / n).is_file()), None)


def missing_weights(folder: Path) -> CheckpointError:
    """The error for a model folder that holds none of `Found.weights_file`'s files."""
    return CheckpointError(f"{folder} has no {' or '.join(WEIGHT_FILES)} (nor an index of "
                           "their shards)")


def shard_map(index: Path) -> dict[str, str]:
    """A sharded folder's index's `weight_map`: tensor name -> shard file in the same folder."""
    data = read_json(index, CheckpointError, "restore or re-download it")
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or \
            not all(isinstance(v, str) for v in weight_map.values()):
        raise damaged(index, "its weight_map is not an object of tensor name: shard file")
    return weight_map


def read_shards(index: Path) -> dict[str, torch.Tensor]:
    """The state dict of a sharded Hugging Face folder: its index's `weight_map` (tensor
    name -> shard file in the same folder), each shard read as a file of its own."""
    weight_map = shard_map(index)
    tensors: dict[str, torch.Tensor] = {}
    for name in sorted(set(weight_map.values())):
        shard = index.parent / name
        if Path(name).name != name or not shard.is_file():
            raise CheckpointError(f"{index} names the shard {name!r}, which is not a file in "
                                  f"{index.parent}: download or copy the whole folder again")
        tensors.update(Found.at(shard).tensors() or {})
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
        raise damaged(index, f"its shards lack {len(missing)} tensor(s) it lists, such as "
                             f"{missing[0]!r}")
    return tensors
