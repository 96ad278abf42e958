"""ImageNet class names for 1,000- and 21,843-way heads, read from package data.

ImageNet-1k uses the standard order (sorted WordNet ids; index 0 = "tench"). ImageNet-21k
uses the order of the official Google ViT heads: the sorted WordNet ids of the fall11
release (timm's `imagenet21k_goog_synsets.txt`; index 0 = "organism"). Each class is named
by its first WordNet lemma, so a few names repeat (two "crane"s, two "maillot"s in 1k).
Files: `classnames/imagenet{1k,21k}.tsv.gz`, one "wnid<TAB>name" line per class.
"""

from __future__ import annotations

import gzip
from functools import cache
from importlib import resources

__all__ = ["imagenet_class_names", "imagenet_synsets"]

_FILES = {1000: "imagenet1k.tsv.gz", 21843: "imagenet21k.tsv.gz"}


@cache
def _read(num_classes: int) -> tuple[tuple[str, str], ...]:
    path = resources.files("vitkit.data").joinpath("classnames", _FILES[num_classes])
    with path.open("rb") as handle:
        lines = gzip.decompress(handle.read()).decode("utf-8").splitlines()
    rows = tuple(tuple(line.split("\t", 1)) for line in lines)
    if len(rows) != num_classes:  # a damaged install, not bad user input
        raise RuntimeError(f"{_FILES[num_classes]} holds {len(rows)} classes, expected "
                           f"{num_classes}; reinstall vitkit")
    return rows  # type: ignore[return-value]


def imagenet_class_names(num_classes: int) -> list[str] | None:
    """Names for a 1,000 (ImageNet-1k) or 21,843 (ImageNet-21k) class head; else None."""
    if num_classes not in _FILES:
        return None
    return [name for _, name in _read(num_classes)]


def imagenet_synsets(num_classes: int) -> list[str] | None:
    """WordNet ids ("n01440764") in head order, for the same head sizes; else None."""
    if num_classes not in _FILES:
        return None
    return [wnid for wnid, _ in _read(num_classes)]
