"""Layer contracts: stochastic depth, GELU forms, dropout only in training."""

import pytest
import torch

from vitkit import create_model
from vitkit.model.layers import DropPath


def test_drop_path_is_identity_in_eval_mode():
    layer = DropPath(0.5).eval()
    x = torch.randn(16, 5, 8)
    assert torch.equal(layer(x), x)


def test_drop_path_drops_whole_samples_and_rescales_in_training():
    layer = DropPath(0.5).train()
    x = torch.ones(1000, 3, 4)
    out = layer(x)
    per_sample = out.flatten(1)
    assert set(per_sample.unique().tolist()) <= {0.0, 2.0}
    assert torch.all(per_sample.min(1).values == per_sample.max(1).values)  # all or nothing
    assert 0.4 < (per_sample[:, 0] == 0).float().mean() < 0.6


def test_drop_path_rates_grow_linearly_over_depth():
    model = create_model("Ti/16", drop_path=0.1, depth=5)
    rates = [block.drop_path1.prob for block in model.blocks]
    assert rates == pytest.approx([0.0, 0.025, 0.05, 0.075, 0.1])


def test_model_with_dropout_is_deterministic_in_eval():
    model = create_model("Ti/8", img_size=32, depth=2, dropout=0.1, attn_dropout=0.1,
                         drop_path=0.2).eval()
    x = torch.randn(2, 3, 32, 32)
    features = model.forward_features
    assert torch.equal(features(x), features(x))
    model.train()
    assert not torch.equal(features(x), features(x))


def test_gelu_tanh_and_exact_differ_but_slightly():
    exact = create_model("Ti/8", img_size=32, depth=2, init="trunc_normal")
    tanh = create_model("Ti/8", img_size=32, depth=2, act="gelu_tanh", init="trunc_normal")
    tanh.load_state_dict(exact.state_dict())
    x = torch.randn(2, 3, 32, 32)
    diff = (exact.forward_features(x) - tanh.forward_features(x)).abs().max().item()
    assert 0 < diff < 1e-2
