"""Model behaviour: pooling heads, features-only and regression heads, pre-logits, init."""

import pytest
import torch

from vitkit import ConfigError, create_model


def test_pooling_by_name_reads_the_right_tokens():
    for pool, expected in [("class_token", lambda t: t[:, 0]),
                           ("mean_patches", lambda t: t[:, 1:].mean(1)),
                           ("mean_all_tokens", lambda t: t.mean(1))]:
        model = create_model("Ti/8", img_size=32, depth=1, pool=pool, num_classes=0).eval()
        x = torch.randn(2, 3, 32, 32)
        torch.testing.assert_close(model(x), expected(model.forward_features(x)))


def test_einops_head_is_mean_then_layernorm_then_linear():
    model = create_model("einops-tutorial", img_size=32, patch_size=16, depth=1).eval()
    x = torch.randn(2, 3, 32, 32)
    tokens = model.forward_features(x)
    expected = model.head(model.fc_norm(tokens.mean(dim=1)))
    torch.testing.assert_close(model(x), expected)


def test_features_only_model_and_regression_head():
    features = create_model("Ti/8", img_size=32, depth=1, num_classes=0)
    assert features(torch.randn(2, 3, 32, 32)).shape == (2, 192)
    regression = create_model("Ti/20", img_size=(60, 100), in_chans=1, num_classes=1, depth=1,
                              pos_embed="sincos1d", init="trunc_normal")
    assert regression.patch_embed.proj.in_channels == 1
    assert regression(torch.randn(3, 1, 60, 100)).shape == (3, 1)


def test_pre_logits_layer_is_linear_tanh_and_reset_drops_it():
    model = create_model("Ti/8", img_size=32, depth=1, pre_logits_dim=64, num_classes=21)
    x = torch.randn(2, 3, 32, 32)
    features = model.forward_head(model.forward_features(x), pre_logits=True)
    assert features.shape == (2, 64) and features.abs().max() <= 1
    model.reset_classifier(10)
    assert model.config.pre_logits_dim == 0 and model.config.num_classes == 10
    assert isinstance(model.pre_logits, torch.nn.Identity)
    assert torch.all(model.head.weight == 0)  # official scheme: new head starts at zero
    assert model(x).shape == (2, 10)


def test_jax_init_matches_the_official_scheme():
    model = create_model("S/16", num_classes=10)
    assert torch.all(model.head.weight == 0) and torch.all(model.head.bias == 0)
    assert torch.all(model.cls_token == 0)
    assert model.pos_embed.std().item() == pytest.approx(0.02, rel=0.05)
    fc1_bias = model.blocks[0].mlp.fc1.bias
    assert 0 < fc1_bias.abs().max() < 1e-5
    assert torch.all(model.blocks[0].attn.qkv.bias == 0)
    qkv = model.blocks[0].attn.qkv.weight
    bound = (6 / (384 + 384)) ** 0.5  # xavier-uniform of each (D, D) q/k/v kernel
    assert qkv.abs().max() <= bound and qkv.abs().max() > 0.9 * bound


def test_trunc_normal_init_is_bounded_with_std_near_002():
    model = create_model("S/16", num_classes=10, init="trunc_normal")
    weight = model.blocks[0].mlp.fc1.weight
    assert weight.abs().max() <= 0.04
    assert weight.std().item() == pytest.approx(0.02 * 0.88, rel=0.05)  # truncation at 2 std
    assert torch.all(model.blocks[0].mlp.fc1.bias == 0)


def test_training_step_reduces_loss_on_a_fixed_batch():
    model = create_model("cifar10-tutorial")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    images, labels = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    losses = []
    for _ in range(20):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert losses[-1] < 0.5 * losses[0]


def test_conv_stem_gives_the_patch_grid_and_checks_its_config():
    model = create_model("Ti/4", img_size=(32, 48), depth=1, num_classes=10, stem="conv",
                         stem_channels=[16, 32, 64])
    tokens = model.forward_features(torch.randn(2, 3, 32, 48))
    assert tokens.shape == (2, 1 + 8 * 12, 192)
    strides = [m.stride[0] for m in model.patch_embed.convs if isinstance(m, torch.nn.Conv2d)]
    assert strides == [1, 2, 2]  # the last log2(P) convolutions halve the resolution
    with pytest.raises(ConfigError, match="power of 2"):
        create_model("Ti/6", img_size=36, stem="conv", stem_channels=[16, 32, 64])
    with pytest.raises(ConfigError, match="at least log2"):
        create_model("Ti/8", img_size=32, stem="conv", stem_channels=[16, 32])
