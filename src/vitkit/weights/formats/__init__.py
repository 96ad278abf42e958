"""One adapter per weights format, and the registry that tries them in order.

An adapter is a module with `detect(found) -> bool` and `read(found, options) -> WeightsRecord`
(and `write` where vitkit writes the format). `read_record` sniffs the path once
(`sniff.Found`) and hands it to the first adapter that detects it. Adding a format = one
module here, listed in ADAPTERS.

Two modules here are sources, not formats: they turn a name into a local path for
`vitkit.catalog` (`hf_hub`: "hf-hub:ORG/NAME" through huggingface_hub; `hub`: the named
official checkpoints). Names are resolved only there; this registry reads local paths.
"""

from __future__ import annotations

from pathlib import Path

from vitkit.errors import CheckpointError, WeightsNotFoundError
from vitkit.weights.formats import hf, npz, run_folder, timm, train_checkpoint, vitkit
from vitkit.weights.formats.base import ReadOptions
from vitkit.weights.formats.sniff import CONFIG_FILE, Found
from vitkit.weights.record import WeightsRecord

# Order matters where formats overlap: a training checkpoint holds a timm-named "model" dict,
# and vitkit's model.safetensors holds timm-named tensors.
ADAPTERS = (train_checkpoint, run_folder, vitkit, npz, hf, timm)


def read_record(path: str | Path, options: ReadOptions | None = None) -> WeightsRecord:
    """Read a local file or folder of any format vitkit knows into a `WeightsRecord`."""
    if not Path(path).exists():
        raise WeightsNotFoundError(f"{path} does not exist")
    try:
        found = Found.at(Path(path))
        for adapter in ADAPTERS:
            if adapter.detect(found):
                return adapter.read(found, options or ReadOptions())
    except CheckpointError as exc:  # a run's damaged last.pt: its best.pt is the way out
        raise run_folder.way_out(exc, path) from None
    raise _not_recognised(found)


def _not_recognised(found: Found) -> CheckpointError:
    path = found.path
    if found.kind == "folder":
        if found.config() is None:
            return CheckpointError(
                f"{path} has no {CONFIG_FILE}, best.pt or last.pt: it is not a vitkit or "
                "Hugging Face model folder, nor a training run's folder")
        return CheckpointError(f"{path / CONFIG_FILE} is neither a vitkit, timm nor Hugging "
                               "Face ViT config")
    tensors = found.tensors()
    if tensors:
        return CheckpointError(
            f"{path} holds tensors but not a ViT state dict vitkit knows (timm's "
            f"'patch_embed.proj.weight', Hugging Face's 'embeddings.…'); first keys: "
            f"{', '.join(list(tensors)[:5])}")
    if found.kind in ("torch", "safetensors"):
        return CheckpointError(f"{path} holds no tensors that look like model weights")
    return CheckpointError(
        f"{path} is not a checkpoint format vitkit reads: expected an official .npz, "
        ".safetensors, a PyTorch .bin/.pth/.pt, a model folder or a training run's folder")


__all__ = ["ADAPTERS", "ReadOptions", "hf", "npz", "read_record", "run_folder", "timm",
           "train_checkpoint", "vitkit"]
