"""`ModelInfo`: what a model knows about itself beyond its config and tensors, in one record.

`VisionTransformer.info` holds it; the model's `preprocess`, `class_names`, `task`, `origin`,
`weights_kind`, `eval_tta` and `pos_interpolation` attributes read and write its fields.
`vitkit.weights.build_model` fills it from a weights record, `save_pretrained` writes it
back, `reset_classifier` clears what described the old head, and timm's `pretrained_cfg` is
a view of it. A fresh model's record is empty: no preprocessing of its own (the official one
then serves, `vitkit.preprocess.preprocess_for`), no names, classification.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from vitkit.preprocess import Preprocess
from vitkit.tasks.spec import TaskSpec

__all__ = ["INFO_FIELDS", "InfoField", "ModelInfo", "ModelInfoAttributes"]

T = TypeVar("T")


@dataclass
class ModelInfo:
    """A model's metadata.

    `preprocess`: what its inputs must look like (None: the official squash to [-1, 1]).
    `class_names`: the names of a classifier's outputs, as its weights store them.
    `task`: the `TaskSpec` its head was trained for (None: classification by `class_names`).
    `origin`: the format the weights came from ("official", "timm", "hf", "vitkit", ...).
    `weights_kind`: "raw" or "ema", the weights a training run kept.
    `eval_tta`: the test-time augmentation its training run evaluated with.
    `pos_interpolation`: how its learned position embeddings resample to another size (the
    convention of the weights' format), which `save_pretrained` records.
    """

    preprocess: Preprocess | None = None
    class_names: list[str] | None = None
    task: TaskSpec | None = None
    origin: str | None = None
    weights_kind: str = "raw"
    eval_tta: str = "none"
    pos_interpolation: str | None = None

    def replace(self, **changes: Any) -> ModelInfo:
        """A copy with `changes` applied."""
        return dataclasses.replace(self, **changes)

    def for_new_head(self) -> ModelInfo:
        """The record once the head is replaced: no class names, task or test-time
        augmentation (they described the old head's outputs); the rest kept."""
        return self.replace(class_names=None, task=None, eval_tta="none")


INFO_FIELDS = tuple(field.name for field in dataclasses.fields(ModelInfo))


class InfoField(Generic[T]):
    """A model attribute that reads and writes the field of `model.info` it is named after."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, model: Any, owner: type | None = None) -> T:
        if model is None:
            return self  # type: ignore[return-value]  # the class's own attribute
        return getattr(model.info, self.name)

    def __set__(self, model: Any, value: T) -> None:
        setattr(model.info, self.name, value)


class ModelInfoAttributes:
    """The record's fields as the model's own attributes (`model.class_names` is
    `model.info.class_names`); mixed into `VisionTransformer`, which sets `info`."""

    info: ModelInfo
    preprocess: InfoField[Preprocess | None] = InfoField()
    class_names: InfoField[list[str] | None] = InfoField()
    task: InfoField[TaskSpec | None] = InfoField()
    origin: InfoField[str | None] = InfoField()
    weights_kind: InfoField[str] = InfoField()
    eval_tta: InfoField[str] = InfoField()
    pos_interpolation: InfoField[str | None] = InfoField()

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickle; a model pickled with the fields as loose attributes gets its record."""
        if "info" not in state:
            state = dict(state)
            state["info"] = ModelInfo(**{name: state.pop(name) for name in INFO_FIELDS
                                         if name in state})
        super().__setstate__(state)  # type: ignore[misc]  # nn.Module's
