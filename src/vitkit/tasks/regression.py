"""Regression: one or more real quantities per image. Targets are float (N, K); the head has K
outputs, trained on targets standardised with the training set's mean and std (stored in the
`TaskSpec`, undone by `decode`); loss "mse" (default), "huber" or "l1"; metrics `mae`, `rmse`,
`r2` (each the mean over outputs, as scikit-learn's "uniform_average", and per output under
the target names); outputs reported as values in the targets' units."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F

from vitkit.errors import ConfigError
from vitkit.tasks.base import value_names
from vitkit.tasks.per_output import PerOutputTask

log = logging.getLogger("vitkit.tasks")

GEOMETRIC = ("flip", "crop_padding")  # what a regression run takes only when set


class Regression(PerOutputTask):
    kind = "regression"
    primary_metric = "r2"
    outputs_word = "target(s)"
    outputs_plural = "target(s)"
    onnx_output = "values"
    onnx_meaning = ("values in the targets' units: de-standardised in the graph "
                    "(output * target_std + target_mean)")
    onnx_note = ("output 'values': the regression targets' units (de-standardised in the "
                 "graph; the task and its target mean/std are in the file's metadata)")
    model_words = "a regression model"
    target_words = "float target(s)"
    integer_words = "values"
    sources_words = ("arrays whose targets are floats, a folder whose splits hold a "
                     "targets.csv, or a Hugging Face dataset with a float column")
    linear_probe = "ridge regression"  # the frozen-feature probe of its targets
    probe_regularisation = "alpha"
    knn_words = "values"

    def _stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        spec = self.spec
        k = like.shape[-1]
        mean = spec.target_mean or [0.0] * k
        std = spec.target_std or [1.0] * k
        return (torch.tensor(mean, dtype=torch.float32, device=like.device),
                torch.tensor(std, dtype=torch.float32, device=like.device))

    def standardise(self, targets: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(targets)
        return (targets.float() - mean) / std

    # -- training ---------------------------------------------------------------------------
    def training_targets(self, labels: torch.Tensor, num_outputs: int,
                         label_smoothing: float = 0.0) -> torch.Tensor:
        if label_smoothing:
            raise ConfigError("label_smoothing is for classification: a regression target is "
                              "a value, not a class; drop label_smoothing (or set it to 0)")
        return self.standardise(labels.reshape(len(labels), -1))

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        outputs = outputs.float()
        if self.spec.loss == "huber":
            return F.huber_loss(outputs, targets)
        if self.spec.loss == "l1":
            return F.l1_loss(outputs, targets)
        return F.mse_loss(outputs, targets)

    def adjust_augment(self, augment: Any, cfg: Any, streamed: bool,
                       float_images: bool) -> Any:
        """The flip and crop padding off unless they are set (targets may be positions); a
        warning, on pictures and arrays alike, where a recipe or the user turns a flip, crop
        padding or a zoomed crop (resize_crop, the Inception crop of streamed data) on."""
        # float arrays take no crop padding (refused before), so only the flip is theirs to set
        geometric = ("flip",) if float_images else GEOMETRIC
        unset = [key for key in geometric if key not in cfg.augment]
        augment = replace(augment, flip=bool(cfg.augment.get("flip", False)),
                          crop_padding=int(cfg.augment.get("crop_padding", 0)))
        if unset:
            log.info("task=regression: %s off (a mirror image or a shifted crop changes what a "
                     "target may measure, such as a position); set %s where the targets do "
                     "not change with them", " and ".join(f"augment.{key}" for key in unset),
                     "augment.flip=true" if float_images else
                     "augment.flip=true or augment.crop_padding=4")
        moving = [(name, fix) for name, fix, on in (
            ("augment.flip=true", "augment.flip=false", augment.flip),
            (f"augment.crop_padding={augment.crop_padding}", "augment.crop_padding=0",
             augment.crop_padding),
            (f"resize_crop={cfg.resize_crop:.3g}", "resize_crop=1", cfg.resize_crop > 1)) if on]
        if moving:
            fixes = [fix for _, fix in moving]
            log.warning("warning: task=regression with %s (set by the recipe or by you): a "
                        "mirror image or a shifted crop changes targets such as a position "
                        "while the target stays; where they do, set %s",
                        ", ".join(name for name, _ in moving),
                        " and ".join([", ".join(fixes[:-1]), fixes[-1]] if len(fixes) > 1
                                     else fixes))
        if streamed and cfg.crop_scale[0] < 1:
            log.warning("warning: task=regression on streamed data: the Inception crop (crop_"
                        "scale=%s) zooms and shifts each training image, which changes targets "
                        "such as a position or a size; crop_scale=[1.0, 1.0] keeps each image "
                        "whole", list(cfg.crop_scale))
        return augment

    # -- evaluation -------------------------------------------------------------------------
    def metrics(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        pred = self.decode(outputs).double()
        true = targets.reshape(len(targets), -1).double()
        err = pred - true
        mae = err.abs().mean(0)
        rmse = err.pow(2).mean(0).sqrt()
        total = (true - true.mean(0)).pow(2).sum(0)
        residual = err.pow(2).sum(0)
        # scikit-learn's r2_score: 1 for a perfect fit of a constant target, else 0 there
        r2 = torch.where(total > 0, 1 - residual / total.clamp(min=1e-300),
                         torch.where(residual == 0, 1.0, 0.0).double())
        per = {self.output_name(j): {"mae": float(mae[j]), "rmse": float(rmse[j]),
                                     "r2": float(r2[j])} for j in range(len(mae))}
        loss = self.loss(outputs, self.standardise(true.float()))
        return {"test_loss": float(loss), "mae": float(mae.mean()), "rmse": float(rmse.mean()),
                "r2": float(r2.mean()), "per_output": per}

    def eval_lines(self, report: dict[str, Any], title: str, num_outputs: int) -> list[str]:
        lines = [f"{title}: R^2 {report['r2']:.4f}, MAE {report['mae']:.4g}, RMSE "
                 f"{report['rmse']:.4g}, loss {report['loss']:.4f}", "per output:"]
        return lines + [f"  {name:<12} R^2 {m['r2']:.4f}  MAE {m['mae']:.4g}  RMSE "
                        f"{m['rmse']:.4g}" for name, m in report["per_output"].items()]

    def primary_words(self, score: float) -> str:
        return f"R^2 {score:.4f}"

    def epoch_words(self, row: dict[str, float], num_outputs: int) -> str:
        return f"test R^2 {row['r2']:.4f}, MAE {row['mae']:.4g}, RMSE {row['rmse']:.4g}"

    def probe_lines(self, metrics: dict[str, Any], regularisation: float,
                    grid: str) -> list[str]:
        """The frozen-feature probe's lines: the grid searched, the test scores."""
        lines = [f"linear probe ({self.linear_probe}): alpha by held-out 10% of train (R^2): "
                 f"{grid}",
                 f"  chosen alpha {regularisation:g}; test R^2 {metrics['r2']:.4f}, MAE "
                 f"{metrics['mae']:.4g}, RMSE {metrics['rmse']:.4g}"]
        if len(metrics["per_output"]) > 1:
            lines += [f"  {name}: R^2 {v['r2']:.4f}, MAE {v['mae']:.4g}, RMSE {v['rmse']:.4g}"
                      for name, v in metrics["per_output"].items()]
        return lines

    # -- outputs ----------------------------------------------------------------------------
    def decode(self, outputs: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(outputs)
        return outputs.float() * std + mean

    def describe(self, outputs: torch.Tensor, top_k: int = 5,
                 names: Sequence[str] | None = None) -> list[dict[str, Any]]:
        values = self.decode(outputs.detach().float().cpu())
        return [{"values": [float(v) for v in row],
                 "named": {self.output_name(j): float(v) for j, v in enumerate(row)}}
                for row in values]

    def row_json(self, row: Any) -> dict[str, Any]:
        return {"values": row.report["values"], "names": row.names}

    def row_text(self, row: Any) -> str:
        values = row.report["values"]
        return ", ".join(f"{name}={value:.4g}" for name, value in
                         zip(value_names(row.names, len(values)), values, strict=True))

    def title_words(self, outputs: torch.Tensor, class_names: Sequence[str] | None,
                    num_classes: int) -> str | None:
        if not num_classes:
            return None
        values = self.describe(outputs[None])[0]["values"]
        return ", ".join(f"{label}={value:.4g}" for label, value in
                         zip(value_names(self.names, len(values)), values, strict=True))

    def output_scaling(self, num_outputs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(target_std, target_mean): the graph's outputs in the targets' units."""
        std = torch.tensor(self.spec.target_std or [1.0] * num_outputs, dtype=torch.float32)
        mean = torch.tensor(self.spec.target_mean or [0.0] * num_outputs, dtype=torch.float32)
        return std, mean
