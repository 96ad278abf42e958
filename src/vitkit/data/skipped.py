"""Files a loader skipped: counts by reason, the summary line, and `skipped_files.txt`.

Each skipped file is a (path, reason) pair whose reason reads "kind: detail", the kind being
one of `vitkit.data.image_decoder.FIXES` (e.g. "truncated: image file is truncated"). The text file
holds one "path<TAB>reason" line per file after "#" comment lines (counts and fixes), so a
run's folder names every file it did not train or evaluate on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from vitkit.data.dataset import ImageDataset
from vitkit.data.image_decoder import FIXES
from vitkit.weights.formats.run_folder import SKIPPED_FILES

__all__ = ["SKIPPED_FILES_NAME", "count_by_kind", "read_skipped_files", "summarize_skips",
           "write_skipped_files"]

SKIPPED_FILES_NAME = SKIPPED_FILES  # a run file: vitkit.weights.formats.run_folder


def count_by_kind(skipped: Iterable[tuple[str, str]]) -> dict[str, int]:
    """{kind: number of files}, most frequent first (ties alphabetical)."""
    counts = Counter(reason.partition(":")[0] for _, reason in skipped)
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def summarize_skips(skipped: Sequence[tuple[str, str]], total: int) -> str:
    """One line: "skipped 3 of 120 files (2 truncated, 1 not an image)"."""
    by_kind = ", ".join(f"{n} {kind}" for kind, n in count_by_kind(skipped).items())
    return f"skipped {len(skipped)} of {total} files ({by_kind})"


def write_skipped_files(out_dir: str | Path, *datasets: ImageDataset) -> Path | None:
    """Write every skipped file of `datasets` to `out_dir/skipped_files.txt`; its path, or
    None (and no file) when nothing was skipped."""
    skipped = [entry for dataset in datasets for entry in dataset.skipped_files]
    if not skipped:
        return None
    path = Path(out_dir) / SKIPPED_FILES_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"# {len(skipped)} unreadable files skipped (path<TAB>reason); by kind:"]
    lines += [f"#   {n} {kind}: {FIXES.get(kind, '')}"
              for kind, n in count_by_kind(skipped).items()]
    lines += [f"{file}\t{reason}" for file, reason in skipped]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def read_skipped_files(path: str | Path) -> list[tuple[str, str]]:
    """The (path, reason) pairs of a `skipped_files.txt`."""
    rows = Path(path).read_text(encoding="utf-8").split("\n")
    return [(file, reason) for file, _, reason in
            (row.partition("\t") for row in rows if row and not row.startswith("#"))]
