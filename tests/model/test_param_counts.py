"""Exact parameter counts of every variant (224 px, 1000 classes), counted on the meta device."""

import numpy as np
import pytest
import torch

from vitkit import count_parameters, create_model
from vitkit.cli import main

PAPER_COUNTS = {
    "Ti/16": 5_717_416,
    "S/16": 22_050_664,
    "S/32": 22_878_952,
    "B/16": 86_567_656,
    "B/32": 88_224_232,
    "B/8": 86_576_872,
    "L/16": 304_326_632,
    "L/32": 306_535_400,
    "H/14": 632_045_800,
}


@pytest.mark.parametrize(("name", "expected"), PAPER_COUNTS.items())
def test_variant_parameter_count_is_exact(name, expected):
    assert count_parameters(name) == expected


def test_b16_average_pooling_without_class_token_has_86_566_120():
    assert count_parameters("B/16", class_token=False, pool="mean_patches") == 86_566_120


def test_einops_tutorial_model_counts_86_567_656_with_152_064_held_directly():
    model = create_model("einops-tutorial", device="meta")
    total = sum(p.numel() for p in model.parameters())
    direct = sum(p.numel() for p in model.parameters(recurse=False))
    assert total == 86_567_656
    assert direct == 152_064  # class token 768 + position embeddings 151,296
    assert total - direct == 86_415_592  # what torchsummary reports for the tutorial


def test_cifar10_tutorial_model_has_119_098_parameters_and_no_final_norm():
    model = create_model("cifar10-tutorial")
    assert sum(p.numel() for p in model.parameters()) == 119_098
    assert model.config.final_norm == "none"
    assert model.config.pool == "class_token"


def test_the_tutorial_model_trained_on_cifar100_has_a_100_way_head(tmp_path):
    """docs/models.md: `vitkit train model=cifar10-tutorial data=cifar100` sizes the head to
    the data's 100 classes: 123,508 parameters (a small synthetic CIFAR-100 folder)."""
    folder = tmp_path / "cifar-100-binary"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name, count in (("train.bin", 16), ("test.bin", 8)):
        records = rng.integers(0, 256, size=(count, 2 + 3072), dtype=np.uint8)
        records[:, 1] = np.arange(count) % 100  # the fine label
        records.tofile(folder / name)
    assert main(["train", "model=cifar10-tutorial", "data=cifar100", f"data_dir={tmp_path}",
                 "epochs=1", "warmup_epochs=0", "batch_size=8", "progress=false",
                 "--out", str(tmp_path / "run")]) == 0
    state = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert sum(tensor.numel() for tensor in state["model"].values()) == 123_508
    assert state["model_config"]["num_classes"] == 100


def test_real_allocation_matches_meta_count():
    assert sum(p.numel() for p in create_model("Ti/16").parameters()) == PAPER_COUNTS["Ti/16"]
