"""The sweep's figure, two panels as the paper's Figure 12: inference images/s against input
size (left) and the largest batch that fits against input size (right), one line per
variant."""

from __future__ import annotations

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
    sweep had run)."""
    path = Path(path)
    if path.suffix[1:].lower() in FigureCanvasBase.get_supported_filetypes():
        return path
    return path.with_name(path.name.rstrip(".") + ".png")


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
