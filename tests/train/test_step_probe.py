"""The probe that foresees a step's time before the first step: it leaves the run untouched
(random state, weights, gradients) and foresees a step within a small factor of its time."""

from __future__ import annotations

import time

import torch

from vitkit.config import ViTConfig
from vitkit.model.vit import VisionTransformer
from vitkit.train.step_probe import PROBE_TOKENS, probe_images, probe_step_rate

CONFIG = ViTConfig(img_size=32, patch_size=4, width=64, depth=2, num_heads=4, mlp_dim=128,
                   num_classes=10, dropout=0.1, drop_path=0.1)


def test_the_probe_leaves_random_state_weights_and_gradients_as_they_were():
    torch.manual_seed(0)
    model = VisionTransformer(CONFIG).train()
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    model.head.weight.grad = torch.ones_like(model.head.weight)
    before = torch.get_rng_state()
    rate = probe_step_rate(model, 32, 65, torch.device("cpu"), None)
    assert rate > 0
    assert torch.equal(torch.get_rng_state(), before)  # dropout and drop-path drew in a fork
    for name, p in model.named_parameters():
        assert torch.equal(p, weights[name]), name
        if name == "head.weight":
            assert torch.equal(p.grad, torch.ones_like(p))
        else:
            assert p.grad is None, name


def test_the_probe_leaves_a_conv_stems_batchnorm_statistics_as_they_were():
    config = CONFIG.replace(stem="conv", stem_channels=(8, 16))
    model = VisionTransformer(config).train()
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    assert any(name.endswith("num_batches_tracked") for name in buffers)
    probe_step_rate(model, 16, config.num_patches + 1, torch.device("cpu"), None)
    for name, buffer in model.named_buffers():
        assert torch.equal(buffer, buffers[name]), name


def test_the_probe_runs_enough_images_to_keep_its_products_efficient_and_no_more_than_a_batch():
    assert probe_images(512, 577) == 8  # ViT-B/16 at 384 px: 8 of 512 images
    assert probe_images(128, 65) * 65 >= PROBE_TOKENS
    assert probe_images(64, 17) == 64  # a small model: the whole batch
    assert probe_images(3, 10_000) == 1


def test_the_foreseen_step_time_is_within_a_small_factor_of_a_measured_step():
    torch.manual_seed(0)
    model = VisionTransformer(CONFIG).train()
    batch, tokens = 64, 65
    foreseen = probe_step_rate(model, batch, tokens, torch.device("cpu"), None) * tokens
    optimizer = torch.optim.AdamW(model.parameters())
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    seconds = []
    for _ in range(4):
        start = time.perf_counter()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - start)
    measured = min(seconds[1:])
    assert measured / 4 < foreseen < measured * 4, (foreseen, measured)


def test_the_probe_runs_under_the_runs_autocast():
    model = VisionTransformer(CONFIG).train()
    assert probe_step_rate(model, 8, 65, torch.device("cpu"), torch.bfloat16) > 0
