"""matplotlib figures: learning curves and confusion matrices (Agg backend, no display)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from vitkit.analysis.figures import fit_inside, tight_layout


def plot_learning_curve(history: Sequence[dict[str, float]], path: str | Path,
                        title: str = "", metric: str = "top1") -> Path:
    """Two panels side by side: train and test loss against epochs (left), test top-1 (and EMA
    top-1) against training minutes (right); `metric` "r2" or "map" plots that score of a
    regression or multi-label run instead."""
    epochs = [row["epoch"] for row in history]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot(epochs, [row["train_loss"] for row in history], label="train")
    ax_loss.plot(epochs, [row["test_loss"] for row in history], label="test")
    ax_loss.set(xlabel="epoch", ylabel="loss", title="loss")
    ax_loss.legend()
    minutes = [row["minutes"] for row in history]
    percent, name = (100, "top-1") if metric == "top1" else (1, {"r2": "R^2", "map": "mAP"}.get(
        metric, metric))
    ax_acc.plot(minutes, [percent * row.get(metric, float("nan")) for row in history],
                marker=".", label=name)
    if any(f"ema_{metric}" in row for row in history):
        ax_acc.plot(minutes, [percent * row.get(f"ema_{metric}", float("nan"))
                              for row in history], label=f"{name} (EMA weights)")
    if metric == "top1":
        ax_acc.set(xlabel="training minutes", ylabel="test accuracy (%)", title="test accuracy")
    else:
        ax_acc.set(xlabel="training minutes", ylabel=f"test {name}", title=f"test {name}")
    ax_acc.grid(alpha=0.3)
    ax_acc.legend()
    if title:
        fit_inside(fig.suptitle(title))
    tight_layout(fig)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


LABELLED_CLASSES = 60  # more classes than this: a confusion figure of fixed size, no labels


def plot_confusion(confusion: torch.Tensor, classes: Sequence[str], path: str | Path,
                   title: str = "") -> Path:
    """Row-normalised confusion matrix (rows: true class, columns: prediction) of the classes
    the data holds or the model predicted (an ImageNet model scored on three classes shows
    those and its other predictions, not 1,000 rows); beyond `LABELLED_CLASSES` of them, a
    figure of fixed size without class labels."""
    counts = confusion.double()
    seen = ((counts.sum(1) > 0) | (counts.sum(0) > 0)).nonzero().flatten()
    if 0 < len(seen) < len(classes):
        counts = counts[seen][:, seen]
        classes = [classes[i] for i in seen.tolist()]
    rates = counts / counts.sum(1, keepdim=True).clamp(min=1)
    labelled = len(classes) <= LABELLED_CLASSES
    size = max(4.0, 0.45 * len(classes) + 2) if labelled else 12.0
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow(rates.numpy(), cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
    ticks = range(len(classes))
    if labelled:
        ax.set_xticks(ticks, classes, rotation=90)
        ax.set_yticks(ticks, classes)
    ax.set(xlabel="predicted", ylabel="true")
    fit_inside(ax.set_title(title or "confusion matrix"))
    if len(classes) <= 20:
        for i in ticks:
            for j in ticks:
                value = rates[i, j].item()
                ax.text(j, i, f"{100 * value:.0f}", ha="center", va="center", fontsize=7,
                        color="white" if value > 0.5 else "black")
    tight_layout(fig)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def plot_fewshot(shots: Sequence[int], curves: Mapping[str, tuple[Sequence[float],
                 Sequence[float]]], path: str | Path, title: str = "") -> Path:
    """Few-shot accuracy (%) against shots per class (log x axis): one line per model
    (label -> (mean, std) per shot count), error bars = std over seeds."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for label, (mean, std) in curves.items():
        ax.errorbar(shots, [100 * m for m in mean], yerr=[100 * s for s in std], marker="o",
                    capsize=3, label=label)
    ax.set_xscale("log")
    ax.set_xticks(list(shots), [str(n) for n in shots])
    ax.minorticks_off()
    ax.set(xlabel="images per class (shots)", ylabel="test accuracy (%)")
    fit_inside(ax.set_title(title or "few-shot linear evaluation"))
    ax.grid(alpha=0.3)
    if len(curves) > 1:
        ax.legend(fontsize=8)
    tight_layout(fig)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
