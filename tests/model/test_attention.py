"""The explicit attention path returns every layer's weights and equals the fused path."""

import math

import pytest
import torch

from vitkit import create_model
from vitkit.model.layers import Attention


@pytest.mark.parametrize("pool", ["class_token", "mean_patches"])
def test_attention_path_equals_fused_path(pool):
    model = create_model("Ti/8", img_size=(32, 48), depth=3, num_classes=5, pool=pool,
                         init="trunc_normal").eval()
    images = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        fused = model(images)
        logits, attentions = model(images, return_attention=True)
    assert (fused - logits).abs().max().item() <= 1e-5
    assert len(attentions) == 3
    tokens = 1 + 4 * 6
    for weights in attentions:
        assert weights.shape == (2, 3, tokens, tokens)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, tokens))


def test_attention_weights_follow_the_paper_formula():
    torch.manual_seed(1)
    attn = Attention(width=8, num_heads=2).eval()
    x = torch.randn(1, 5, 8)
    _, weights = attn(x, return_attention=True)
    q, k, _ = attn.qkv(x).split(8, dim=-1)
    q0, k0 = q[0, :, :4], k[0, :, :4]  # head 0
    expected = torch.softmax(q0 @ k0.T / math.sqrt(4), dim=-1)
    torch.testing.assert_close(weights[0, 0], expected)


def test_features_with_attention_returns_tokens_and_maps():
    model = create_model("cifar10-tutorial").eval()
    tokens, attentions = model.forward_features(torch.randn(1, 3, 32, 32), return_attention=True)
    assert tokens.shape == (1, 65, 48)
    assert [a.shape for a in attentions] == [(1, 4, 65, 65)] * 4
