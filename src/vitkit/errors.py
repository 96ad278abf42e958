"""Every exception vitkit raises on purpose, in one hierarchy.

Each message names the problem and the fix. Catch `VitkitError` for all of them; the CLI
prints their message without a traceback. A file that is damaged, not a checkpoint, or does
not fit is a `CheckpointError` whatever its format.

    VitkitError
      ConfigError          a model or training setting that cannot be used
      InputError           a tensor or image a model cannot take
      CheckpointError      a weights or training file: missing, damaged, foreign or unfitting
        WeightsNotFoundError   a named checkpoint neither on disk nor downloadable
      DataError            a dataset that is missing, malformed or does not fit the model
      TrainingError        a run that cannot go on (a diverging loss)
      ExportError          a model that cannot be exported, or an export that does not match
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any


def first_few(items: Iterable[Any], count: int = 5) -> str:
    """The first `count` of `items` for a message, " ..." after them when there are more:
    "3, 17, 40 ..." (indices of bad rows, class names)."""
    items = list(items)
    return ", ".join(str(item) for item in items[:count]) + (" ..." if len(items) > count else "")


def unclear_names(names: Iterable[str]) -> str | None:
    """What keeps `names` (of outputs: targets, labels, classes) from naming one each: an
    empty or repeated name, in words; None when each names one. Reports key their figures
    by name, so a repeat would fold two outputs into one."""
    names, seen = [str(n).strip() for n in names], set()
    too_long = long_name(names)
    if too_long:
        return too_long
    repeated = [n for n in names if n in seen or seen.add(n)]
    if "" in names:
        return f"name {names.index('') + 1} of {len(names)} is empty"
    if repeated:
        return f"{first_few(dict.fromkeys(repeated))} appear(s) more than once"
    return None


# The longest class or target name vitkit takes: a name is a label in reports, and a longer
# one is a damaged file (or an attempt to fill memory and the screen), not a name.
NAME_MAX_CHARS = 1000


def long_name(names: Iterable[object], limit: int = NAME_MAX_CHARS) -> str | None:
    """The first of `names` longer than `limit` characters, in words (its position and
    length, never its text); None when none is."""
    names = list(names)
    for index, name in enumerate(names):
        if len(str(name)) > limit:
            return (f"name {index + 1} of {len(names)} (index {index}) is {len(str(name)):,} "
                    f"characters long, over the limit of {limit:,}")
    return None


class VitkitError(Exception):
    """Base class of every error vitkit raises on purpose."""


class ConfigError(VitkitError, ValueError):
    """A model configuration, variant name, training setting or config file that cannot be used."""


class InputError(VitkitError, ValueError):
    """A tensor given to a model whose rank, channels or size do not fit its config."""


class CheckpointError(VitkitError, ValueError):
    """A weights or checkpoint file that is missing, damaged, of an unknown format, or made
    for another model."""



class WeightsNotFoundError(CheckpointError, FileNotFoundError):
    """A named checkpoint that is neither on disk nor downloadable."""


class DataError(VitkitError, ValueError):
    """A dataset that is missing, malformed, or does not fit the model."""


class MissingSplit(DataError):
    """A Hugging Face dataset has no split of the name asked for."""


class TrainingError(VitkitError, RuntimeError):
    """A training run that cannot go on, such as a loss that stopped being finite."""


class ExportError(VitkitError):
    """A model that cannot be exported, a missing exporter, or an export that does not match."""


__all__ = ["CheckpointError", "ConfigError", "DataError", "ExportError",
           "InputError", "TrainingError", "VitkitError", "WeightsNotFoundError"]


# what torch's allocators raise when a tensor cannot be had (CPU, CUDA, or a size too large
# to count): the input asked for more than the machine holds, not a bug
OUT_OF_MEMORY_WORDS = ("can't allocate memory", "out of memory",
                       "Storage size calculation overflowed")


def out_of_memory_message(exc: BaseException) -> str | None:
    """One line for an allocation that failed (naming the fix); None for other errors."""
    if not isinstance(exc, MemoryError) and not any(w in str(exc) for w in OUT_OF_MEMORY_WORDS):
        return None
    lines = str(exc).strip().splitlines()
    cause = (lines[0] if lines else type(exc).__name__)[:200]
    return (f"out of memory ({cause}): this machine cannot hold it; lower the batch size or "
            "the image size (--batch-size, --img-size, or batch_size= / model.img_size= for "
            "training)")


# What gloo and NCCL say when another process of the job has gone.
LOST_PEER_WORDS = ("Connection closed by peer", "Connection reset by peer",
                   "NCCL communicator was aborted")


def lost_peer_message(exc: BaseException) -> str | None:
    """One line for a collective that failed because another torchrun process ended (its
    own error says why); None for other errors."""
    under_torchrun = int(os.environ.get("WORLD_SIZE", "1") or 1) > 1  # torchrun sets it
    if not under_torchrun or not any(w in str(exc) for w in LOST_PEER_WORDS):
        return None
    return ("another process of this torchrun job ended (its own message above says why), "
            "so this one stops too")

