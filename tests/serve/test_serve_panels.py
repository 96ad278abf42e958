"""`vitkit.serve.panels`: the Figure 7 panels as PNG bytes, drawn by explain's code, cached per
service, for every stem and position-embedding kind."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from vitkit.analysis import figures as plots
from vitkit.analysis.attention import attention_weights
from vitkit.analysis.distance import mean_attention_distance
from vitkit.config import ViTConfig
from vitkit.model.vit import VisionTransformer
from vitkit.preprocess import Preprocess, preprocess_for
from vitkit.serve import panels
from vitkit.serve.panels import FIGURES, figure_png

TINY = {"img_size": (16, 16), "patch_size": 4, "width": 32, "depth": 2, "num_heads": 2,
        "mlp_dim": 64, "num_classes": 3}
KINDS = {"patch, learned": {}, "sincos2d": {"pos_embed": "sincos2d"},
         "no positions": {"pos_embed": "none"},
         "conv stem": {"stem": "conv", "stem_channels": (8, 16)},
         "resnet stem": {"stem": "resnet", "resnet_layers": (1,)}}


def service(**changes) -> SimpleNamespace:
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(**{**TINY, **changes})).eval()
    return SimpleNamespace(model=model, name="tiny")


def decoded(png: bytes) -> Image.Image:
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    image = Image.open(io.BytesIO(png))
    image.load()
    return image


@pytest.mark.parametrize("kind", KINDS)
def test_every_panel_is_a_png_for_each_stem_and_position_kind(kind):
    served = service(**KINDS[kind])
    sizes = {name: decoded(figure_png(served, name)).size for name in FIGURES}
    assert sizes["attention_distance"] == (500, 400)  # plot_mean_distance's documented size
    if kind == "no positions":  # explain skips the figure; the page gets the reason instead
        assert sizes["position_similarity"] == (500, 200)
    else:
        assert sizes["position_similarity"] == (650, 600)
    width, height = sizes["filters"]
    assert width == 630 and (height - 50) % 105 == 0 and height >= 155


def test_panels_are_cached_on_the_service(monkeypatch):
    served = service()
    calls = []
    draw = panels._DRAW["filters"]
    monkeypatch.setitem(panels._DRAW, "filters",
                        lambda s: calls.append(1) or draw(s))
    first = figure_png(served, "filters")
    assert figure_png(served, "filters") is first and len(calls) == 1
    assert figure_png(service(), "filters") == first  # another service draws its own
    assert len(calls) == 2


def test_an_unknown_figure_is_a_value_error():
    with pytest.raises(ValueError) as info:
        figure_png(service(), "rollout")
    for part in ("unknown figure", "'rollout'", *FIGURES):  # the figures there are
        assert part in str(info.value), str(info.value)


def test_distances_are_mean_attention_distance_over_the_generated_images():
    served = service()
    distances, source = panels.attention_distances(served)
    model = served.model
    images = panels.generated_images(preprocess_for(model))
    _, attentions = attention_weights(model, preprocess_for(model).normalize(images))
    expected = mean_attention_distance(attentions, (4, 4), 4, 1)
    assert distances.shape == (2, 2)
    torch.testing.assert_close(distances, expected, rtol=1e-5, atol=1e-5)
    assert source == f"{panels.DISTANCE_IMAGES} generated images (smooth noise, seed 0)"
    assert panels.attention_distances(served)[0] is distances  # cached


def test_generated_images_are_seeded_and_in_the_models_units():
    pictures = Preprocess(img_size=(16, 16))
    first = panels.generated_images(pictures, 4)
    assert first.dtype == torch.uint8 and first.shape == (4, 3, 16, 16)
    assert torch.equal(first, panels.generated_images(pictures, 4))
    assert not torch.equal(first, panels.generated_images(pictures, 4, seed=1))
    arrays = Preprocess(img_size=(16, 16), mean=(100.0,), std=(5.0,), scale=1.0)
    fields = panels.generated_images(arrays, 8)
    assert fields.is_floating_point() and fields.shape == (8, 1, 16, 16)
    normalised = arrays.normalize(fields)
    assert abs(normalised.mean().item()) < 0.5 and 0.3 < normalised.std().item() < 2


def test_the_models_own_data_is_used_when_it_is_local():
    served = service(num_classes=10)
    served.train_config = {"data": "digits"}
    images, source = panels.distance_images(served, count=8)
    assert images.shape == (8, 3, 16, 16) and source == "8 test images of digits (seed 0)"
    served.train_config = {"data": "cifar10", "data_dir": "/nonexistent/cifar"}
    assert "generated images" in panels.distance_images(served, count=8)[1]
    served.train_config = {"data": "hf:someone/dataset"}  # never fetched from the hub
    assert "generated images" in panels.distance_images(served, count=8)[1]
    served.train_config = None  # weights that name no data
    assert "generated images" in panels.distance_images(served, count=8)[1]


def test_drawing_to_memory_writes_what_explain_writes_to_a_file(tmp_path):
    distances = torch.tensor([[10.0, 12.0], [14.0, 13.0]])
    path = plots.plot_mean_distance(distances, tmp_path / "d.png", 16.5, "t", images=3)
    buffer = io.BytesIO()
    assert plots.plot_mean_distance(distances, buffer, 16.5, "t", images=3) is buffer
    assert path == tmp_path / "d.png" and path.read_bytes() == buffer.getvalue()


def test_a_served_run_folder_averages_the_distances_over_its_own_test_images(digits_run):
    from vitkit.serve.service import ModelService

    served = ModelService.load(digits_run)
    assert served.trained_on == "digits" and served.train_config["data"] == "digits"
    images, source = panels.distance_images(served, count=8)
    assert len(images) == 8 and source == "8 test images of digits (seed 0)"
