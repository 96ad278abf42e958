"""`model.info` (`vitkit.model.info.ModelInfo`): the model's metadata in one record. The older
attribute names read and write it; copies, pickles and a new head keep it right."""

from __future__ import annotations

import copy
import pickle

from vitkit import create_model
from vitkit.model.info import INFO_FIELDS, ModelInfo
from vitkit.preprocess import Preprocess
from vitkit.tasks import TaskSpec

TINY = {"width": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64, "patch_size": 4,
        "img_size": [16, 16], "num_classes": 3}


def described():
    model = create_model(TINY)
    model.preprocess = Preprocess(img_size=(16, 16))
    model.class_names = ["a", "b", "c"]
    model.task = TaskSpec("classification", names=["a", "b", "c"])
    model.origin, model.eval_tta = "vitkit", "flip"
    return model


def test_the_attributes_are_the_records_fields():
    model = described()
    assert model.info == ModelInfo(Preprocess(img_size=(16, 16)), ["a", "b", "c"],
                                   TaskSpec("classification", names=["a", "b", "c"]),
                                   "vitkit", "raw", "flip", None)
    assert all(getattr(model, name) == getattr(model.info, name) for name in INFO_FIELDS)
    assert "info" in vars(model) and not set(INFO_FIELDS) & set(vars(model))
    assert create_model(TINY).info == ModelInfo()


def test_copies_and_pickles_keep_their_own_record():
    model = described()
    copied = copy.deepcopy(model)
    copied.class_names = ["x", "y", "z"]
    assert model.class_names == ["a", "b", "c"]
    assert pickle.loads(pickle.dumps(model)).info == model.info


def test_a_model_pickled_with_loose_attributes_gets_its_record():
    model = described()
    state = dict(vars(model))
    old = state.pop("info")
    state.update({name: getattr(old, name) for name in INFO_FIELDS})
    restored = object.__new__(type(model))
    restored.__setstate__(state)
    assert restored.info == old and restored.class_names == ["a", "b", "c"]


def test_a_new_head_forgets_what_described_the_old_one():
    model = described()
    model.reset_classifier(5)
    assert (model.class_names, model.task, model.eval_tta) == (None, None, "none")
    assert model.preprocess == Preprocess(img_size=(16, 16)) and model.origin == "vitkit"
    assert "label_names" not in model.pretrained_cfg
