"""vitkit's own format: a folder with model.safetensors (the state dict) and config.json
(format, version, model config, preprocessing, class names, which weights, the task they were
trained for (`task`: kind, output names, loss, target standardisation; absent or null in
older folders: classification), the test-time augmentation its training run evaluated with
(`eval_tta`, "none" or "flip"; absent: none), which `vitkit eval` and `predict` then default
to, how its position embeddings are resampled to another size by default
(`pos_interpolation`: the convention of the weights it was converted from, "official" for an
.npz, "timm", "bicubic" for Hugging Face's; absent: "bilinear"),
and the sha256 of the tensors, `tensors_sha256`, checked on reading when present)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from vitkit.config import ViTConfig
from vitkit.errors import CheckpointError, ConfigError, first_few
from vitkit.fieldtypes import check_known_keys, check_value, did_you_mean
from vitkit.preprocess import Preprocess, check_tta, official_preprocess
from vitkit.tasks import TaskSpec
from vitkit.weights.checksum import tensors_checksum, verify_checksum
from vitkit.weights.formats.base import ReadOptions
from vitkit.weights.formats.sniff import CONFIG_FILE, Found, load_safetensors
from vitkit.weights.record import WEIGHT_KINDS, WeightsRecord, check_config_fits
from vitkit.weights.resampling import CONVENTIONS

FORMAT_NAME = "vitkit"
FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
CHECKSUM_KEY = "tensors_sha256"  # config.json: sha256 of the tensors (vitkit.weights.checksum)
# Every key `write` puts in config.json; others are warned of when the folder is read.
CONFIG_KEYS = ("format", "version", "model", "preprocess", "class_names", "weights", "task",
               "eval_tta", "pos_interpolation", CHECKSUM_KEY)

log = logging.getLogger(__name__)


def _is_vitkit_config(meta: dict | None) -> bool:
    return bool(meta) and meta.get("format") == FORMAT_NAME


def detect(found: Found) -> bool:
    """The folder, or its model.safetensors (found through the config.json beside it)."""
    return found.kind in ("folder", "safetensors") and _is_vitkit_config(found.config())


def read(found: Found, options: ReadOptions) -> WeightsRecord:
    folder = found.path if found.kind == "folder" else found.path.parent
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"{folder} has a vitkit {CONFIG_FILE} but no {WEIGHTS_FILE}: "
                              "copy the weights file beside it")
    config_path = folder / CONFIG_FILE
    meta = found.config() or {}
    _warn_of_unknown_keys(meta, config_path)
    tensors = load_safetensors(weights)
    if CHECKSUM_KEY in meta:
        verify_checksum(tensors, meta[CHECKSUM_KEY], weights)
    try:
        config, preprocess, class_names = _settings(meta, tensors, config_path)
        task = _task(meta.get("task"))
        eval_tta = check_tta(meta.get("eval_tta", "none"))
        pos_interpolation = _pos_interpolation(meta.get("pos_interpolation"))
    except ConfigError as exc:
        raise CheckpointError(f"{config_path} is not a valid vitkit config: {exc}. Fix the "
                              "file, or write the folder again with save_pretrained") from None
    return WeightsRecord(config, tensors, preprocess, "vitkit", class_names,
                         extra={"eval_tta": eval_tta, "pos_interpolation": pos_interpolation},
                         weights=meta.get("weights", "raw"),
                         path=weights, task=task)


def _warn_of_unknown_keys(meta: dict[str, Any], path: Path) -> None:
    """Warn, once for the file, of config.json keys that vitkit neither writes nor reads (a
    typo, or another tool's addition): named (long ones cut short), the closest known key
    suggested for each near miss."""
    unknown = [key for key in meta if key not in CONFIG_KEYS]
    if not unknown:
        return
    shown = [repr(key) if len(key) <= 40 else f"{key[:40]!r}... ({len(key):,} characters)"
             for key in unknown]
    hints = "".join(did_you_mean(key, CONFIG_KEYS) for key in unknown[:5] if len(key) <= 40)
    log.warning("warning: %s: unknown key(s) %s are ignored.%s Known keys: %s", path,
                first_few(shown), hints, ", ".join(CONFIG_KEYS))


def _pos_interpolation(saved: Any) -> str | None:
    """config.json's "pos_interpolation" (null or absent: the folder's default), checked."""
    if saved is None or (isinstance(saved, str) and saved in CONVENTIONS):
        return saved
    raise ConfigError(f"'pos_interpolation' is {_short(saved)}, expected one of "
                      f"{', '.join(CONVENTIONS)}")


def _task(saved: Any) -> TaskSpec | None:
    """config.json's "task" (null or absent: classification), type-checked."""
    if saved is None:
        return None
    if not isinstance(saved, dict):
        raise ConfigError(f"'task' is {_short(saved)}, expected an object")
    try:
        return TaskSpec.from_dict(saved)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"'task' is not a task ({exc})") from None


def _settings(meta: dict[str, Any], tensors: dict[str, torch.Tensor], path: Path
              ) -> tuple[ViTConfig, Preprocess, list[str] | None]:
    """The model config, preprocessing and class names of config.json, each type-checked."""
    checks = (("model", dict, "an object"), ("preprocess", dict, "an object"),
              ("class_names", list, "a list of strings"),
              ("weights", str, f"one of {', '.join(WEIGHT_KINDS)}"))
    for key, kind, expected in checks:
        value = meta.get(key)
        nullable = key in ("preprocess", "class_names")
        if (key not in meta and key != "model") or (nullable and value is None):
            continue
        wrong = not isinstance(value, kind) \
            or (key == "class_names" and not all(isinstance(name, str) for name in value)) \
            or (key == "weights" and value not in WEIGHT_KINDS)
        if wrong:
            raise ConfigError(f"{key!r} is {_short(value)}, expected {expected}")
    config = ViTConfig.from_dict(meta["model"])
    check_config_fits(config, tensors, path)
    check_class_names(meta.get("class_names"), config)
    saved = meta.get("preprocess")
    if saved:
        check_known_keys(Preprocess, saved, "preprocess")
        for key, value in saved.items():
            check_value(Preprocess, key, value, f"preprocess.{key}", what="preprocess")
        preprocess = Preprocess.from_dict(saved)
    else:
        preprocess = official_preprocess(config.img_size, config.in_chans)
    return config, preprocess, meta.get("class_names")


def check_class_names(class_names: list[str] | None, config: ViTConfig) -> None:
    """Refuse more class names than the head has outputs (fewer are allowed: a head with
    spare outputs, `model.num_classes` above the data's classes, leaves the rest unnamed)."""
    if class_names is None or config.num_classes <= 0 \
            or len(class_names) <= config.num_classes:
        return
    raise ConfigError(f"{len(class_names)} class names for a head of {config.num_classes} "
                      f"outputs: give one name per output (in output order), or class_names="
                      f"None to leave them unnamed")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) < 60 else f"a {type(value).__name__}"


def write(state_dict: dict[str, torch.Tensor], config: ViTConfig, preprocess: Preprocess,
          directory: str | Path, class_names: list[str] | None = None,
          weights: str = "raw", task: TaskSpec | None = None, eval_tta: str = "none",
          pos_interpolation: str | None = None) -> Path:
    """Write the folder; returns it. `pos_interpolation`: the resampling convention of the
    weights' origin, recorded as the folder's default (None: not recorded)."""
    directory = Path(directory)
    check_class_names(class_names, config)
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"{directory} is a file: save_pretrained writes a folder "
                          f"({WEIGHTS_FILE} and {CONFIG_FILE}); pass a folder path")
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in state_dict.items()}
    save_file(tensors, directory / WEIGHTS_FILE, metadata={"format": FORMAT_NAME})
    meta = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "model": config.to_dict(),
            "preprocess": preprocess.to_dict(), "class_names": class_names, "weights": weights,
            "task": task.to_dict() if task is not None else None,
            "eval_tta": check_tta(eval_tta),
            "pos_interpolation": _pos_interpolation(pos_interpolation),
            CHECKSUM_KEY: tensors_checksum(tensors)}
    (directory / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return directory
