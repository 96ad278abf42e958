"""Multi-label classification: any number of labels per image. Targets are 0/1 float (N, K);
one logit per label; binary cross-entropy with logits; metrics `map` (macro average precision,
as scikit-learn's `average_precision_score(average="macro")`: a label without positives
scores 0), `f1` (macro F1 of sigmoid >= 0.5) and per-label AP; outputs reported as sigmoid
probabilities and the labels at or above 0.5."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vitkit.errors import ConfigError, DataError, first_few
from vitkit.tasks.base import value_names
from vitkit.tasks.infer import infer_task
from vitkit.tasks.per_output import PerOutputTask

log = logging.getLogger("vitkit.tasks")

MULTILABEL_THRESHOLD = 0.5


class Multilabel(PerOutputTask):
    kind = "multilabel"
    primary_metric = "map"
    outputs_word = "label(s)"
    outputs_plural = "labels"
    onnx_meaning = ("logits: sigmoid gives each label's probability (a label is predicted at "
                    "0.5 or more)")
    model_words = "multi-label"
    target_words = "0/1 label(s)"
    integer_words = "0/1 labels"
    sources_words = ("arrays whose targets are (N, K) 0/1, a folder whose splits hold a "
                     "targets.csv of 0/1 columns, or a Hugging Face dataset with a label-list "
                     "column")
    linear_probe = "one-vs-rest logistic regression"  # the frozen-feature probe of its labels
    probe_regularisation = "weight_decay"
    knn_words = "label sets"

    # -- training ---------------------------------------------------------------------------
    def training_targets(self, labels: torch.Tensor, num_outputs: int,
                         label_smoothing: float = 0.0) -> torch.Tensor:
        if label_smoothing:
            raise ConfigError("label_smoothing is for single-label classification; drop it "
                              "for task=multilabel (or set it to 0)")
        return labels.float().reshape(len(labels), -1)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(outputs.float(), targets)

    def warn_of_training_targets(self, train: Any, where: str) -> None:
        """Warn of labels no training image has (their outputs only learn "absent"), as a
        classification run warns of a class the training split lacks."""
        labels = train.labels
        if labels is None or np.ndim(labels) != 2 or not len(labels):
            return
        never = np.flatnonzero(np.asarray(labels).max(axis=0) <= 0)
        if len(never):
            names = self.names or list(train.classes) or []
            shown = [names[i] if i < len(names) else str(i) for i in never.tolist()]
            log.warning("warning: %s: label(s) %s are never positive in the training split, so "
                        "their outputs only learn that they are absent (an average precision "
                        "of 0 where they occur held out): add training images that have them, "
                        "or drop those labels", where, first_few(shown))

    def check_held_out(self, labels: Any, where: str) -> None:
        """Targets other than 0 and 1 are refused (scikit-learn refuses to score those)."""
        infer_task(np.asarray(labels), self.kind, where=f"the held-out targets of {where}")

    # -- evaluation -------------------------------------------------------------------------
    def metrics(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        scores = self.decode(outputs).double()
        truth = targets.reshape(len(targets), -1) > 0.5
        ap = average_precision(scores, truth)
        predicted = scores >= MULTILABEL_THRESHOLD
        tp = (predicted & truth).sum(0).double()
        fp = (predicted & ~truth).sum(0).double()
        fn = (~predicted & truth).sum(0).double()
        denominator = 2 * tp + fp + fn
        f1 = torch.where(denominator > 0, 2 * tp / denominator.clamp(min=1), 0.0)
        loss = self.loss(outputs, truth.float())
        return {"test_loss": float(loss), "map": float(ap.mean()), "f1": float(f1.mean()),
                "per_label": {self.output_name(j): {"ap": float(ap[j]), "f1": float(f1[j])}
                              for j in range(len(ap))}}

    def check_eval_values(self, labels: torch.Tensor, data: str) -> None:
        if not bool(((labels == 0) | (labels == 1)).all()):
            raise DataError(f"{data} has targets other than 0 and 1, but the model is "
                            "multi-label: evaluate on 0/1 label targets")

    def eval_lines(self, report: dict[str, Any], title: str, num_outputs: int) -> list[str]:
        lines = [f"{title}: mAP {report['map']:.4f}, F1 {report['f1']:.4f} (at 0.5), loss "
                 f"{report['loss']:.4f}", "per label:"]
        return lines + [f"  {name:<12} AP {m['ap']:.4f}  F1 {m['f1']:.4f}"
                        for name, m in report["per_label"].items()]

    def primary_words(self, score: float) -> str:
        return f"mAP {score:.4f}"

    def epoch_words(self, row: dict[str, float], num_outputs: int) -> str:
        return f"test mAP {row['map']:.4f}, F1 {row['f1']:.4f}"

    def probe_lines(self, metrics: dict[str, Any], regularisation: float,
                    grid: str) -> list[str]:
        """The frozen-feature probe's lines: the grid searched, the test scores."""
        return [f"linear probe ({self.linear_probe}): weight decay by held-out 10% of train "
                f"(mAP): {grid}",
                f"  chosen weight decay {regularisation:g}; test mAP {metrics['map']:.4f}, "
                f"F1 at 0.5 {metrics['f1']:.4f}"]

    # -- outputs ----------------------------------------------------------------------------
    def decode(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs.float().sigmoid()

    def describe(self, outputs: torch.Tensor, top_k: int = 5,
                 names: Sequence[str] | None = None) -> list[dict[str, Any]]:
        probs = self.decode(outputs.detach().float().cpu())
        return [{"probs": {self.output_name(j): float(p) for j, p in enumerate(row)},
                 "labels": [self.output_name(j) for j, p in enumerate(row)
                            if p >= MULTILABEL_THRESHOLD]}
                for row in probs]

    def row_json(self, row: Any) -> dict[str, Any]:
        return {"probs": row.report["probs"], "labels": row.report["labels"]}

    def row_text(self, row: Any) -> str:
        probs = row.report["probs"]
        if not row.report["labels"]:
            top = max(probs, key=probs.__getitem__)
            return f"no label at 50% or more (highest: {top} {100 * probs[top]:.2f}%)"
        return ", ".join(f"{label} ({100 * probs[label]:.2f}%)" for label in row.report["labels"])

    def title_words(self, outputs: torch.Tensor, class_names: Sequence[str] | None,
                    num_classes: int) -> str | None:
        if not num_classes:
            return None
        report = self.describe(outputs[None])[0]
        probs = report["probs"]
        if not report["labels"]:
            top = max(probs, key=probs.__getitem__)
            return f"no label (highest {top} {100 * probs[top]:.0f}%)"
        return ", ".join(f"{label} ({100 * probs[label]:.0f}%)" for label in report["labels"])

    def target_text(self, row: torch.Tensor, classes: list[str]) -> str:
        """The labels a test image has: "labels cat, dog" (or "labels none")."""
        values = row.reshape(-1).tolist()
        names = self.names or classes or None
        shown = value_names(names, len(values)) if names else [str(j) for j in
                                                              range(len(values))]
        present = [n for n, v in zip(shown, values, strict=True) if v >= MULTILABEL_THRESHOLD]
        return "labels " + (", ".join(present) if present else "none")


def average_precision(scores: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Per-column average precision, as scikit-learn's `average_precision_score`:
    sum over distinct score thresholds (descending) of (R_n - R_{n-1}) * P_n; a column without
    positives scores 0."""
    result = torch.zeros(scores.shape[1], dtype=torch.float64)
    for j in range(scores.shape[1]):
        order = torch.argsort(scores[:, j], descending=True, stable=True)
        s, t = scores[order, j], truth[order, j].double()
        positives = t.sum()
        if positives == 0:
            continue
        last_of_group = torch.ones(len(s), dtype=torch.bool)
        last_of_group[:-1] = s[1:] != s[:-1]
        tp = t.cumsum(0)[last_of_group]
        seen = torch.arange(1, len(s) + 1, dtype=torch.float64)[last_of_group]
        precision, recall = tp / seen, tp / positives
        steps = torch.diff(recall, prepend=torch.zeros(1, dtype=torch.float64))
        result[j] = (steps * precision).sum()
    return result
