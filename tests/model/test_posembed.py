"""Fixed position embeddings equal independent formulas; the table sizes follow the grid."""

import math

import numpy as np
import pytest
import torch

from vitkit import create_model
from vitkit.model.posembed import sincos_1d, sincos_2d


def _sincos_2d_reference(grid_h: int, grid_w: int, width: int) -> np.ndarray:
    """big_vision's posemb_sincos_2d written out with loops."""
    quarter = width // 4
    table = np.zeros((grid_h * grid_w, width))
    for row in range(grid_h):
        for col in range(grid_w):
            index = row * grid_w + col
            for i in range(quarter):
                omega = 1.0 / 10000 ** (i / (quarter - 1))
                table[index, i] = math.sin(col * omega)
                table[index, quarter + i] = math.cos(col * omega)
                table[index, 2 * quarter + i] = math.sin(row * omega)
                table[index, 3 * quarter + i] = math.cos(row * omega)
    return table


@pytest.mark.parametrize(("grid", "width"), [((4, 4), 16), ((3, 5), 32), ((2, 7), 8)])
def test_sincos_2d_matches_reference_formula(grid, width):
    expected = _sincos_2d_reference(*grid, width)
    np.testing.assert_allclose(sincos_2d(grid, width).numpy(), expected, atol=1e-6)


def test_sincos_1d_matches_transformer_formula():
    table = sincos_1d(10, 6).numpy()
    for pos in range(10):
        for i in range(3):
            angle = pos / 10000 ** (2 * i / 6)
            assert table[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-6)


def test_sincos_2d_similarity_falls_with_distance():
    table = torch.nn.functional.normalize(sincos_2d((8, 8), 64), dim=-1)
    similarity = (table @ table.T).reshape(8, 8, 8, 8)
    centre = similarity[3, 3]
    assert centre[3, 3] > centre[3, 4] > centre[3, 6]
    assert centre[3, 4] > centre[5, 5]


@pytest.mark.parametrize("kind", ["sincos1d", "sincos2d"])
def test_fixed_embeddings_are_buffers_not_parameters(kind):
    model = create_model("Ti/8", img_size=(32, 48), pos_embed=kind, depth=1)
    assert "pos_embed" not in dict(model.named_parameters())
    assert "pos_embed" not in model.state_dict()  # rebuilt from the config, never stored
    assert model.pos_embed.shape == (1, 1 + 4 * 6, 192)
    if kind == "sincos2d":
        assert torch.all(model.pos_embed[0, 0] == 0)  # the class token has no position


def test_no_position_embedding():
    model = create_model("Ti/8", img_size=32, pos_embed="none", depth=1)
    assert model.pos_embed is None
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 1000)


def test_set_image_size_resamples_learned_and_rebuilds_fixed_embeddings():
    from vitkit.model.posembed import resample_grid_embed

    learned = create_model("Ti/4", img_size=32, depth=1, num_classes=3)
    before = learned.pos_embed.detach().clone()
    parameter = learned.pos_embed
    learned.set_image_size(16)
    assert learned.pos_embed is parameter  # optimizers keep tracking the same tensor
    torch.testing.assert_close(learned.pos_embed.data,
                               resample_grid_embed(before, (8, 8), (4, 4), 1, "bicubic"))
    assert torch.equal(learned.pos_embed[0, 0], before[0, 0])  # class token row kept
    assert learned(torch.randn(2, 3, 16, 16)).shape == (2, 3)

    fixed = create_model("Ti/4", img_size=32, depth=1, pos_embed="sincos2d")
    fixed.set_image_size((16, 24))
    fresh = create_model("Ti/4", img_size=(16, 24), depth=1, pos_embed="sincos2d")
    assert torch.equal(fixed.pos_embed, fresh.pos_embed)
