"""Bad tensors get errors that name the problem and the fix, before torch sees them."""

import pytest
import torch

from vitkit import InputError, create_model


@pytest.fixture(scope="module")
def model():
    return create_model("Ti/16", depth=1, num_classes=10).eval()


def test_missing_batch_dimension(model):
    with pytest.raises(InputError, match=r"rank 3.*unsqueeze\(0\)"):
        model(torch.randn(3, 224, 224))


def test_wrong_rank(model):
    with pytest.raises(InputError, match=r"\(batch, channels, height, width\).*rank 2"):
        model(torch.randn(3, 224))


def test_wrong_channel_count(model):
    with pytest.raises(InputError, match=r"expects 3 input channel\(s\) but got 1.*in_chans=1"):
        model(torch.randn(2, 1, 224, 224))


def test_channels_last_input_is_explained(model):
    with pytest.raises(InputError, match="NCHW"):
        model(torch.randn(2, 224, 224, 3))


def test_size_not_divisible_by_patch(model):
    with pytest.raises(InputError, match=r"230x230 is not divisible by patch size 16.*224x224"):
        model(torch.randn(1, 3, 230, 230))


def test_size_other_than_the_configured_one(model):
    with pytest.raises(InputError, match=r"384x384 differs.*img_size=\(384, 384\)"):
        model(torch.randn(1, 3, 384, 384))


def test_pixels_other_dtypes_and_lists_are_explained_and_the_advice_works(model):
    """uint8 pixels, float64 images and a list of PIL images reached torch's "Input type ...
    and bias type ... should be the same" or an AttributeError; each is named now, and the
    advice, followed, runs."""
    from PIL import Image

    from vitkit.preprocess import preprocess_for

    pixels = torch.randint(0, 256, (2, 3, 224, 224), dtype=torch.uint8)
    with pytest.raises(InputError, match=r"torch.uint8, not normalised floats.*"
                                         r"preprocess_for\(model\)\.normalize\(images\)"):
        model(pixels)
    assert model(preprocess_for(model).normalize(pixels)).shape == (2, 10)
    doubles = torch.randn(2, 3, 224, 224, dtype=torch.float64)
    with pytest.raises(InputError, match=r"float64 but the model's weights are torch.float32: "
                                         r"call images.to\(torch.float32\)"):
        model(doubles)
    assert model(doubles.to(torch.float32)).shape == (2, 10)
    images = [Image.new("RGB", (300, 200)), Image.new("RGB", (64, 64))]
    with pytest.raises(InputError, match=r"got a list: make one from PIL images with "
                                         r"vitkit.preprocess.preprocess_for\(model\)\(images\)"):
        model(images)
    assert model(preprocess_for(model)(images)).shape == (2, 10)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts: not refused
        assert model(torch.randn(1, 3, 224, 224)).shape == (1, 10)


def test_int64_pixels_get_advice_that_works_and_rank_comes_first(model):
    """torch.randint gives int64: the advice must convert them to uint8 first (normalize takes
    uint8 or floats), and a 3-D uint8 tensor is told to add the batch dimension."""
    from vitkit.preprocess import preprocess_for

    pixels = torch.randint(0, 256, (1, 3, 224, 224))
    with pytest.raises(InputError, match=r"normalize\(images\.to\(torch\.uint8\)\)"):
        model(pixels)
    assert model(preprocess_for(model).normalize(pixels.to(torch.uint8))).shape == (1, 10)
    with pytest.raises(InputError, match=r"images\.unsqueeze\(0\)"):
        model(torch.zeros(3, 224, 224, dtype=torch.uint8))

