"""Per-epoch metrics to CSV and JSONL (and TensorBoard when installed), plus the curve PNG."""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from vitkit.analysis.plots import plot_learning_curve
from vitkit.files import write_atomic
from vitkit.weights.formats.run_folder import (
    LEARNING_CURVE,
    METRICS_CSV,
    METRICS_JSONL,
    TENSORBOARD,
)

log = logging.getLogger("vitkit.train")


class MetricsRecorder:
    """Appends one row per evaluation; redraws `learning_curve.png` each time.

    A run starts from the rows its checkpoint holds (`history`, empty for a new run):
    metrics.jsonl and metrics.csv are rewritten from them first, so rows logged after the
    checkpoint by a run that was then killed are not kept twice when it resumes. Whole-file
    rewrites are atomic: a crash mid-write leaves the previous file, never half of one.
    """

    def __init__(self, out_dir: Path, formats: Sequence[str],
                 history: Sequence[dict[str, float]] = (), metric: str = "top1") -> None:
        self.out_dir = Path(out_dir)
        self.metric = metric  # the score the curve plots: top1, r2 or map
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.formats = set(formats)
        self._restart_from(list(history))
        self._writer = None
        if "tensorboard" in self.formats:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(str(self.out_dir / TENSORBOARD))
            except ImportError:
                log.warning("TensorBoard is not installed (pip install tensorboard): skipped")

    def write(self, row: dict[str, float], history: list[dict[str, float]]) -> None:
        if "jsonl" in self.formats:
            with open(self.out_dir / METRICS_JSONL, "a") as stream:
                stream.write(json.dumps(row) + "\n")
        if "csv" in self.formats:
            self._write_csv(history)
        if self._writer is not None:
            for key, value in row.items():
                if key not in ("epoch", "step"):
                    self._writer.add_scalar(key, value, int(row["step"]))
        self.plot(history)

    def plot(self, history: Sequence[dict[str, float]]) -> None:
        """learning_curve.png of `history` (nothing before the first evaluation)."""
        if history:
            plot_learning_curve(history, self.out_dir / LEARNING_CURVE,
                                metric=self.metric)

    def _restart_from(self, history: list[dict[str, float]]) -> None:
        """metrics.jsonl (and .csv) hold exactly `history`, what the checkpoint knows."""
        if "jsonl" in self.formats:
            text = "".join(json.dumps(row) + "\n" for row in history).encode()
            write_atomic(self.out_dir / METRICS_JSONL, lambda stream: stream.write(text))
        if "csv" in self.formats and history:
            self._write_csv(history)

    def _write_csv(self, history: list[dict[str, float]]) -> None:
        """Rewritten whole, so a resumed run has one consistent file."""
        keys = list(dict.fromkeys(key for row in history for key in row))
        table = io.StringIO(newline="")
        writer = csv.DictWriter(table, fieldnames=keys)
        writer.writeheader()
        writer.writerows(history)
        data = table.getvalue().encode()
        write_atomic(self.out_dir / METRICS_CSV, lambda stream: stream.write(data))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
