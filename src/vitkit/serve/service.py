"""`ModelService`: one model loaded for serving, with `vitkit predict`'s answers and `vitkit
explain`'s maps on decoded inputs.

The weights are read as `vitkit predict` reads them and run through the same
`vitkit.inference.predictor.Predictor`: `model`, the float model as loaded (explain's
attention maps come from it: merged tokens have no grid, int8 has no attention weights to
show), and the served `runner`: token merging on a copy, then the precision chosen once at
start (`--precision auto` measures then, not per request), then test-time augmentation. Each
answer is the predictor's `Prediction` row, so it equals what `vitkit predict --json` prints.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vitkit.analysis.attention import (
    HEAD_FUSIONS,
    attention_rollout,
    attention_weights,
    map_source,
    output_token_map,
)
from vitkit.analysis.figures import unit_scaled
from vitkit.errors import InputError
from vitkit.inference.precision import Precision
from vitkit.inference.predictor import InferenceOptions, Predictor, Provenance
from vitkit.model.vit import VisionTransformer
from vitkit.preprocess import Preprocess
from vitkit.serve.overlay import data_url, image_png, overlay_png
from vitkit.tasks import Task

__all__ = ["ModelService", "display_name"]

log = logging.getLogger(__name__)


def display_name(source: str | Path) -> str:
    """How the weights are named on the page: "parent/name" for a local path (as `vitkit
    explain` titles its figures), else the name or Hub repository as given."""
    path = Path(source)
    return f"{path.resolve().parent.name}/{path.name}" if path.exists() else str(source)


@dataclass
class ModelService:
    """The `predictor` that serves (its float `model`, the merged `runner` in its `precision`,
    task, names, preprocessing), under `name`; `train_config`: the run's recipe (its data and
    folder), if any. Build with `load` or `from_model`."""

    predictor: Predictor
    name: str = "model"
    train_config: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.model.eval()
        self.runner.eval()
        self.predictor.names  # noqa: B018  # a model without a head is refused at start

    # -- building --------------------------------------------------------------------------
    @classmethod
    def load(cls, weights: str | Path, *, weights_dir: str | Path | None = None,
             precision: str | None = None, int8: str | None = None, merge_tokens: int = 0,
             batch_size: int = 8, tta: str | None = None,
             options: InferenceOptions | None = None) -> ModelService:
        """The weights any source `vitkit predict` reads, served as `vitkit predict
        WEIGHTS --precision P --merge-tokens R --tta T` runs them (`options`, or as loose
        arguments; `int8`: an engine, as --int8-engine; `tta` None: the weights' training
        run's); `batch_size` is the batch `--precision auto` measures at."""
        from vitkit.catalog import read_weights
        from vitkit.weights.formats.train_checkpoint import data_dir_from_here

        options = InferenceOptions.given(options, precision=precision, int8=int8,
                                         merge_tokens=merge_tokens, tta=tta,
                                         measure_batch=batch_size)  # before the model loads
        record = read_weights(weights, weights_dir)
        train_config = data_dir_from_here(record.train_config, record.path, data_option=None,
                                          trained_in=record.trained_in)
        predictor = Predictor.from_record(record, options, source=weights, announce=True)
        return cls(predictor, display_name(weights), train_config)

    @classmethod
    def from_model(cls, model: VisionTransformer, *, name: str = "model",
                   precision: str | None = None, int8: str | None = None,
                   merge_tokens: int = 0, train_config: dict[str, Any] | None = None,
                   batch_size: int = 8, tta: str | None = None,
                   options: InferenceOptions | None = None) -> ModelService:
        """Serve `model` (kept as the float model); the served copy is merged, put in its
        precision and given its test-time augmentation (`tta`; None: `model.eval_tta`) here,
        once."""
        options = InferenceOptions.given(options, precision=precision, int8=int8,
                                         merge_tokens=merge_tokens, tta=tta,
                                         measure_batch=batch_size)
        model.eval()
        provenance = Provenance(origin=model.origin, weights_kind=model.weights_kind,
                                train_config=train_config)
        predictor = Predictor.from_model(model, options, provenance=provenance, announce=True)
        return cls(predictor, name, train_config)

    # -- the predictor's parts -------------------------------------------------------------
    @property
    def model(self) -> VisionTransformer:
        return self.predictor.model

    @property
    def runner(self) -> torch.nn.Module:
        return self.predictor.runner

    @property
    def context(self) -> Callable[[], AbstractContextManager]:
        return self.predictor.context

    @property
    def precision(self) -> Precision:
        return self.predictor.precision

    @property
    def merge_tokens(self) -> int:
        return self.predictor.options.merge_tokens

    @property
    def tta(self) -> str:
        """The test-time augmentation the runner applies (`vitkit.inference.tta`)."""
        return self.predictor.tta

    @property
    def task(self) -> Task:
        return self.predictor.task

    @property
    def names(self) -> list[str] | None:
        return self.predictor.names

    @property
    def preprocess(self) -> Preprocess:
        return self.predictor.preprocess

    # -- what it is ------------------------------------------------------------------------
    @property
    def trained_on(self) -> str | None:
        """The data the weights were trained on (`data=` of their run), when they say."""
        data = (self.train_config or {}).get("data")
        return data if isinstance(data, str) else None

    @property
    def inputs(self) -> str:
        """"images" for a model of 8-bit pictures, "arrays" for one trained on arrays
        (data=arrays: values in the data's units, `Preprocess.scale` 1)."""
        return "images" if self.preprocess.pictures else "arrays"

    @property
    def precision_name(self) -> str:
        """"fp32", "bf16" or "int8 (engine)"."""
        chosen = self.precision
        return f"{chosen.name} ({chosen.engine})" if chosen.engine else chosen.name

    def describe(self) -> dict[str, Any]:
        """The model's half of `GET /api/model`."""
        config = self.model.config
        return {"name": self.name, "task": self.task.kind, "inputs": self.inputs,
                "config": config.to_dict(), "img_size": list(config.img_size),
                "in_chans": config.in_chans, "depth": config.depth,
                "num_heads": config.num_heads, "grid": list(config.grid_size),
                "names": self.names, "preprocess": self.preprocess.to_dict(),
                "precision": self.precision_name, "precision_reason": self.precision.reason,
                "merge_tokens": self.merge_tokens, "tta": self.tta, "trained_on": self.trained_on}

    # -- predictions -----------------------------------------------------------------------
    def forward(self, images: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The served model's output row for each (C, H, W) image at the model's size (uint8
        pictures or float arrays), in one batch. The batcher's work function."""
        return list(self.predictor(images).float().cpu())

    def answers(self, names: Sequence[str], outputs: Sequence[torch.Tensor],
                topk: int = 5) -> list[dict[str, Any]]:
        """The `vitkit predict --json` object of each named input from its output row."""
        return [row.to_dict() for row in self.predictor.predictions(names, outputs, topk)]

    def predict(self, items: Sequence[tuple[str, torch.Tensor]],
                topk: int = 5) -> list[dict[str, Any]]:
        """`vitkit predict --json`'s objects for decoded inputs (name, (C, H, W) image at the
        model's size), one batch, no batcher."""
        if not items:
            return []
        return self.answers([name for name, _ in items],
                            self.forward([image for _, image in items]), topk)

    # -- explain ---------------------------------------------------------------------------
    def check_explain(self, layer: int | None, head: str | int, discard_ratio: float,
                      fusion: str) -> tuple[int, str | int]:
        """(layer, head) checked against the model, `layer` None meaning the last; refuses
        bad values with the allowed range."""
        depth, heads = self.model.config.depth, self.model.config.num_heads
        layer = depth if layer is None else layer
        if not 1 <= layer <= depth:
            raise InputError(f"layer must be 1..{depth} (this model's depth), got {layer}")
        if head != "all":
            try:
                head = int(head)
            except (TypeError, ValueError):
                raise InputError(f"head must be 'all' or a head number 0..{heads - 1}, got "
                                 f"{head!r}") from None
            if not 0 <= head < heads:
                raise InputError(f"head must be 'all' or 0..{heads - 1} (this model has "
                                 f"{heads} heads), got {head}")
        if not 0.0 <= discard_ratio < 1.0:
            raise InputError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
        if fusion not in HEAD_FUSIONS:
            raise InputError(f"fusion must be one of {', '.join(HEAD_FUSIONS)}, got "
                             f"{fusion!r}")
        return layer, head

    def attention_map(self, image: torch.Tensor, layer: int, head: str | int,
                      discard_ratio: float, fusion: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(the output's map over the patch grid (gh, gw), the float model's output row):
        head "all" is the rollout of the first `layer` layers (heads fused by `fusion`, the
        weakest `discard_ratio` discarded); a head number is that head's raw attention at
        `layer`. The map is read from the row that stands for the output (`map_source`)."""
        config = self.model.config
        logits, attentions = attention_weights(self.model, self.predictor.inputs([image]))
        attentions = [a.float().cpu() for a in attentions]
        prefix, grid, source = config.num_prefix_tokens, config.grid_size, map_source(config)
        if head == "all":
            rows = attention_rollout(attentions[:layer], fusion, discard_ratio, prefix)
        else:
            rows = attentions[layer - 1][:, int(head)]
        return output_token_map(rows, prefix, grid, source)[0], logits[0].float().cpu()

    def explain(self, image: torch.Tensor, name: str = "image", layer: int | None = None,
                head: str | int = "all", discard_ratio: float = 0.0,
                fusion: str = "mean") -> dict[str, Any]:
        """`POST /api/explain`'s answer for one decoded input: the map (scaled to 0..1: its
        weakest patch 0, its strongest 1; a flat map is all 0), the map over the image and
        the image as PNG data URLs, and the float model's prediction."""
        layer, head = self.check_explain(layer, head, discard_ratio, fusion)
        heat, output = self.attention_map(image, layer, head, discard_ratio, fusion)
        scaled = unit_scaled(heat)
        return {"name": name, "layer": layer, "head": head, "discard_ratio": discard_ratio,
                "fusion": fusion, "grid": list(heat.shape),
                "map": [[round(float(v), 6) for v in row] for row in scaled],
                "overlay_png": data_url(overlay_png(image, scaled)),
                "image_png": data_url(image_png(image)),
                "prediction": self.answers([name], [output])[0]}
