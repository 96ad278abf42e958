"""A run's output folder: never writing over a run by accident.

A training run writes the files `vitkit.weights.formats.run_folder` lists (`RUN_FILES`,
`RUN_FOLDERS`: checkpoints, metrics, the learning curve, the skipped files, tensorboard/).
Starting a new run in a folder that holds them would mix the two runs' metrics and overwrite
the checkpoints, so it is refused unless the run is being continued (`resume` inside the
folder) or `overwrite` clears it first (with the reports `vitkit eval` wrote there of the
earlier run's weights).

Checkpoints are written to `.{name}.XXXX.tmp` and renamed; a process killed mid-write
(kill -9, power loss) leaves that file behind. Starting in the folder removes them.

A start that fails before its first checkpoint (a refused setting, data that does not fill a
batch, a first step out of memory) leaves the folder as it was (`undone_unless_saved`), so the
corrected command starts in the same folder instead of being refused as a run's.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vitkit.errors import ConfigError
from vitkit.weights.formats.run_folder import CHECKPOINTS, LAST, RUN_FILES, RUN_FOLDERS
from vitkit.weights.formats.sniff import Found

log = logging.getLogger("vitkit.train")


def run_files(out_dir: str | Path) -> list[Path]:
    """The files and folders of an earlier run in `out_dir` (empty when there is none)."""
    out = Path(out_dir)
    return [out / name for name in (*RUN_FILES, *RUN_FOLDERS) if (out / name).exists()]


def prepare_run_dir(out_dir: str | Path, resume: str | Path | None = None,
                    overwrite: bool = False) -> None:
    """Refuse to start a run over an earlier one in `out_dir`, unless it is continued from a
    checkpoint in that folder (`resume`) or `overwrite` deletes the earlier run's files."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder: pass a folder for the run")
    found = run_files(out)
    resuming_here = resume is not None and _inside(Path(resume), out)
    if not found and not resuming_here:  # a run's folder may keep a save_pretrained copy
        check_not_a_model_folder(out)
    if overwrite and resuming_here:
        raise ConfigError(f"--overwrite would delete {out}'s run, which --resume {resume} "
                          "continues: use --resume to continue it, or --overwrite (without "
                          "--resume) to start over")
    if not found or resuming_here:
        remove_stale_temporary_files(out)
        return
    if not overwrite:
        names = ", ".join(path.name for path in found)
        resumable = (out / LAST).is_file()
        continue_it = f"To continue it: --resume {out / LAST}; to" if resumable else \
            f"It has no {LAST} to continue from. To"
        raise ConfigError(
            f"{out} already holds a run ({names}); a new run there would overwrite it. "
            f"{continue_it} start over (deletes those files and the eval reports there): "
            "--overwrite; to keep it: "
            "another --out folder.")
    for path in [*found, *report_files(out)]:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)  # another rank (torchrun) may have removed it
    remove_stale_temporary_files(out)


@contextmanager
def undone_unless_saved(out_dir: str | Path) -> Iterator[None]:
    """Run a start in `out_dir`; when it raises before writing a checkpoint there, remove the
    run files and folders it created (`RUN_FILES`, `RUN_FOLDERS`: skipped_files.txt, an empty
    metrics.jsonl) and then the folders it created, where empty. What the folder held before
    stays, whatever its name; a start that wrote a checkpoint (diverged.pt, last.pt) keeps
    its files, since they are the run's."""
    out = Path(out_dir)
    created = [folder for folder in (out, *out.parents) if not folder.exists()]
    before = set(out.iterdir()) if out.is_dir() else set()
    try:
        yield
    except BaseException:
        _remove_new_run_files(out, before)
        for folder in created:  # deepest first; one that holds something stops it
            try:
                folder.rmdir()
            except OSError:
                break
        raise


def _remove_new_run_files(out: Path, before: set[Path]) -> None:
    """Remove the run files in `out` that are not in `before`, unless one is a checkpoint."""
    new = [path for path in run_files(out) if path not in before]
    if any(path.name in CHECKPOINTS for path in new):
        return
    for path in new:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if new:
        log.info("the run did not start: removed what it wrote in %s (%s)", out,
                 ", ".join(path.name for path in new))


def check_not_a_model_folder(out: Path) -> None:
    """Refuse a folder of saved weights (config.json and model.safetensors or
    pytorch_model.bin: `save_pretrained`, Hugging Face, timm): the run's checkpoints beside
    them would not be the folder's model, which every verb reads from config.json."""
    if not (out / "config.json").is_file():
        return
    weights = Found.at(out).weights_file()
    if weights is not None:
        raise ConfigError(f"--out {out} holds saved weights ({weights.name} and config.json), "
                          "which `vitkit predict/eval` of the folder would read instead of "
                          "this run's: pass another --out folder for the run")


def report_files(out_dir: str | Path) -> list[Path]:
    """The reports `vitkit eval` wrote beside a run's weights (eval.json, eval-*.json,
    confusion_matrix.png): the earlier run's, so --overwrite deletes them with it (they do
    not make a folder a run's)."""
    out = Path(out_dir)
    return [path for path in (out / "eval.json", out / "confusion_matrix.png",
                              *sorted(out.glob("eval-*.json"))) if path.is_file()]


def stale_temporary_files(out_dir: str | Path) -> list[Path]:
    """Half-written checkpoints (`.last.pt.XXXX.tmp`) an interrupted save left in `out_dir`."""
    out = Path(out_dir)
    return sorted(path for name in CHECKPOINTS for path in out.glob(f".{name}.*.tmp")
                  if path.is_file())


def remove_stale_temporary_files(out_dir: str | Path) -> int:
    """Delete the files `stale_temporary_files` finds; how many there were (logged)."""
    stale = stale_temporary_files(out_dir)
    for path in stale:
        path.unlink(missing_ok=True)  # another rank (torchrun) may have removed it
    if stale:
        log.info("removed %d stale temporary checkpoint file(s) an interrupted save left in %s "
                 "(%s)", len(stale), out_dir, ", ".join(path.name for path in stale))
    return len(stale)


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().parent == folder.resolve()
