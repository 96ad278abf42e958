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
