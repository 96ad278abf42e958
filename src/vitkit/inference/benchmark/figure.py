"""The sweep's figure, two panels as the paper's Figure 12: inference images/s against input
size (left) and the largest batch that fits against input size (right), one line per
variant."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.backend_bases import FigureCanvasBase

from vitkit.inference.benchmark.sweep import SweepRow


def figure_path(path: str | Path) -> Path:
    """The file the figure is written to: `path`, with ".png" added when its suffix is not a
    format matplotlib writes ("sweep" -> "sweep.png", "sweep.v2" -> "sweep.v2.png"). Added
    here, not left to savefig: savefig adds ".png" to a name without a suffix itself (so the
    report named a file that was not written) and refuses an unknown suffix (after the whole
    sweep had run). `~` is expanded."""
    path = Path(path).expanduser()
    if path.suffix[1:].lower() in FigureCanvasBase.get_supported_filetypes():
        return path
    return path.with_name(path.name.rstrip(".") + ".png")


def figure_problem(path: str | Path) -> str | None:
    """Why the figure could not be written at `path` (None: it can), found before a sweep
    runs rather than after it: the file `figure_path` names is a folder, or its format needs
    a program that is not installed (.pgf: LaTeX)."""
    written = figure_path(path)
    if written.is_dir():
        return (f"{path}: the figure would be written to {written}, which is a folder: give "
                f"another file name, e.g. {written / 'sweep.png'}")
    texsystem = matplotlib.rcParams["pgf.texsystem"]
    if written.suffix.lower() == ".pgf" and not installed(texsystem):
        return (f"{path}: matplotlib writes .pgf through LaTeX ({texsystem}), which is not "
                f"installed: give a .png, .pdf or .svg file, e.g. {written.with_suffix('.pdf')}")
    return None


def installed(program: str) -> bool:
    """Whether `program` is on the PATH."""
    return shutil.which(program) is not None


def plot_sweep(rows: Sequence[SweepRow], path: str | Path, title: str = "") -> Path:
    """Write the two-panel PNG to `figure_path(path)` (log-scaled y axes) and return that
    path."""
    fig, (ax_speed, ax_batch) = plt.subplots(1, 2, figsize=(10, 4))
    variants = list(dict.fromkeys(row.variant for row in rows))
    for variant in variants:
        mine = sorted((row for row in rows if row.variant == variant), key=lambda r: r.img_size)
        sizes = [row.img_size for row in mine]
        ax_speed.plot(sizes, [row.images_per_s for row in mine], marker="o", label=variant)
        ax_batch.plot(sizes, [max(row.largest_batch, 1) for row in mine], marker="o",
                      label=variant)
    batch = rows[0].batch_size if rows else 0
    ax_speed.set(xlabel="input size (px)", ylabel=f"images/s (batch {batch})",
                 title="inference speed", yscale="log")
    ax_batch.set(xlabel="input size (px)", ylabel="largest batch", yscale="log",
                 title="largest batch within the memory cap")
    for ax in (ax_speed, ax_batch):
        ax.grid(alpha=0.3, which="both")
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = figure_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
