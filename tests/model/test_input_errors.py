"""Bad tensors get errors that name the problem and the fix, before torch sees them."""

import pytest
import torch

from vitkit import InputError, create_model


def says(text, *parts):
    """Assert that the message names each part (case-insensitive), showing it otherwise."""
    text = str(text)
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"message lacks {missing}: {text}"


@pytest.fixture(scope="module")
def model():
    return create_model("Ti/16", depth=1, num_classes=10).eval()


def test_missing_batch_dimension(model):
    image = torch.randn(3, 224, 224)
    with pytest.raises(InputError) as refused:
        model(image)
    says(refused.value, "rank 3", "unsqueeze(0)")
    assert model(image.unsqueeze(0)).shape == (1, 10)


def test_wrong_rank(model):
    with pytest.raises(InputError) as refused:
        model(torch.randn(3, 224))
    says(refused.value, "(batch, channels, height, width)", "rank 2")


def test_wrong_channel_count(model):
    grey = torch.randn(2, 1, 224, 224)
    with pytest.raises(InputError) as refused:
        model(grey)
    says(refused.value, "3 input channel", "got 1", "in_chans=1")
    one_channel = create_model("Ti/16", depth=1, num_classes=10, in_chans=1).eval()
    assert one_channel(grey).shape == (2, 10)


def test_channels_last_input_is_explained(model):
    with pytest.raises(InputError, match="NCHW"):
        model(torch.randn(2, 224, 224, 3))


@pytest.mark.parametrize("in_chans, size", [(3, 224), (1, 8)])
def test_channels_last_input_is_told_to_permute_and_that_works(in_chans, size):
    """An NHWC batch whose last dimension is the model's channel count is told the permute
    that makes it NCHW (not to build the model with in_chans=its height)."""
    model = create_model("Ti/16", depth=1, num_classes=10, in_chans=in_chans, img_size=size,
                         patch_size=min(16, size)).eval()
    x = torch.randn(2, size, size, in_chans)
    with pytest.raises(InputError) as refused:
        model(x)
    says(refused.value, "channels-last", "x.permute(0, 3, 1, 2)")
    assert f"in_chans={size}" not in str(refused.value)
    assert model(x.permute(0, 3, 1, 2)).shape == (2, 10)


def test_size_not_divisible_by_patch(model):
    with pytest.raises(InputError) as refused:
        model(torch.randn(1, 3, 230, 230))
    says(refused.value, "230x230", "patch size 16", "224x224")


def test_size_other_than_the_configured_one(model):
    images = torch.randn(1, 3, 384, 384)
    with pytest.raises(InputError) as refused:
        model(images)
    says(refused.value, "384x384", "224x224", "img_size=(384, 384)", "set_dynamic_img_size()")
    larger = create_model("Ti/16", depth=1, num_classes=10, img_size=(384, 384)).eval()
    assert larger(images).shape == (1, 10)


def test_pixels_other_dtypes_and_lists_are_explained_and_the_advice_works(model):
    """uint8 pixels, float64 images and a list of PIL images are each refused naming the
    type and the call that converts them, and that call, followed, runs."""
    from PIL import Image

    from vitkit.preprocess import preprocess_for

    pixels = torch.randint(0, 256, (2, 3, 224, 224), dtype=torch.uint8)
    with pytest.raises(InputError) as refused:
        model(pixels)
    says(refused.value, "torch.uint8", "preprocess_for(model).normalize(images)")
    assert model(preprocess_for(model).normalize(pixels)).shape == (2, 10)
    doubles = torch.randn(2, 3, 224, 224, dtype=torch.float64)
    with pytest.raises(InputError) as refused:
        model(doubles)
    says(refused.value, "float64", "torch.float32", "images.to(torch.float32)")
    assert model(doubles.to(torch.float32)).shape == (2, 10)
    images = [Image.new("RGB", (300, 200)), Image.new("RGB", (64, 64))]
    with pytest.raises(InputError) as refused:
        model(images)
    says(refused.value, "list", "vitkit.preprocess.preprocess_for(model)(images)")

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

