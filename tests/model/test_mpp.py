"""Masked patch prediction (paper Section 4.6, Appendix B.1.2): colour targets, the 50% /
80-10-10 corruption, the loss over corrupted patches only, and a tiny model that learns.
Each check compares with a computation of its own (numpy), not with the module's functions."""

import math

import numpy as np
import pytest
import torch

from messages import says
from vitkit import ConfigError, create_model
from vitkit.objectives.mpp import (
    MaskedPatchPrediction,
    MPPConfig,
    color_targets,
    corrupt,
    mpp_loss,
)
from vitkit.preprocess import IMAGENET_MEAN, IMAGENET_STD, Preprocess


# -- an independent reference ---------------------------------------------------------------------
def reference_colors(pixels, patch, bits=3, cells=1):
    """[0, 1] pixels (B, 3, H, W) -> colour classes (B, N, cells * cells), by loops in float64:
    each cell's mean colour, each channel to floor(mean * 2**bits) (1.0 to the top level),
    class = R * 4**bits + G * 2**bits + B."""
    pixels = np.asarray(pixels, dtype=np.float64)
    batch, _, height, width = pixels.shape
    levels, step = 2 ** bits, patch // cells
    out = np.zeros((batch, (height // patch) * (width // patch), cells * cells), dtype=np.int64)
    for b in range(batch):
        for i in range(height // patch):
            for j in range(width // patch):
                for ci in range(cells):
                    for cj in range(cells):
                        top, left = i * patch + ci * step, j * patch + cj * step
                        mean = pixels[b, :, top:top + step, left:left + step].mean(axis=(1, 2))
                        r, g, bl = (min(int(np.floor(m * levels)), levels - 1) for m in mean)
                        out[b, i * (width // patch) + j, ci * cells + cj] = \
                            r * levels * levels + g * levels + bl
    return out


def normalise(pixels, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)):
    m = torch.tensor(mean).view(1, -1, 1, 1)
    s = torch.tensor(std).view(1, -1, 1, 1)
    return (torch.as_tensor(pixels, dtype=torch.float32) - m) / s


def solid(colors, patch):
    """One image of solid patches in a row: colors [(r, g, b), ...] in [0, 1]."""
    image = np.zeros((1, 3, patch, patch * len(colors)))
    for k, color in enumerate(colors):
        image[0, :, :, k * patch:(k + 1) * patch] = np.array(color)[:, None, None]
    return image


def tiny_model(**overrides):
    fields = dict(img_size=16, patch_size=4, width=32, depth=2, num_heads=2, mlp_dim=64,
                  num_classes=0)
    return create_model("Ti/4", **{**fields, **overrides})


# -- targets --------------------------------------------------------------------------------------
def test_solid_colours_give_their_3_bit_classes():
    colors = [(1, 0, 0), (0, 1, 0), (0, 0, 1), (0, 0, 0), (1, 1, 1), (0.5, 0.25, 0.75)]
    targets = color_targets(normalise(solid(colors, 4)), patch_size=4, bits=3)
    # R*64 + G*8 + B: red 7*64, green 7*8, blue 7, black 0, white 511, levels (4, 2, 6)
    assert targets.tolist() == [[448, 56, 7, 0, 511, 4 * 64 + 2 * 8 + 6]]
    assert targets.dtype == torch.long


def test_half_black_half_white_patch_is_its_quantised_mean():
    image = np.zeros((1, 3, 8, 8))
    image[:, :, :, 4:] = 1.0  # left half black, right half white: mean 0.5 -> level 4 of 8
    assert color_targets(normalise(image), 8).tolist() == [[4 * 64 + 4 * 8 + 4]]
    image = np.zeros((1, 3, 8, 8))
    image[:, :, :2, :] = 1.0  # a quarter white: mean 0.25 -> level 2
    assert color_targets(normalise(image), 8).tolist() == [[2 * 64 + 2 * 8 + 2]]


def test_other_bit_depths_quantise_per_channel():
    colors = [(1, 0, 0), (0.5, 0.5, 0.5), (0.3, 0.6, 0.9)]
    for bits in (1, 2, 4):
        got = color_targets(normalise(solid(colors, 4)), 4, bits=bits)
        assert got[0].tolist() == reference_colors(solid(colors, 4), 4, bits)[0, :, 0].tolist()
    assert color_targets(normalise(solid([(1, 0, 0)], 4)), 4, bits=1).item() == 4  # 1*4 + 0 + 0


def test_random_images_match_the_reference_with_the_models_normalisation():
    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, (3, 3, 16, 24)) / 255.0
    for mean, std in [((0.5,) * 3, (0.5,) * 3), (IMAGENET_MEAN, IMAGENET_STD)]:
        got = color_targets(normalise(pixels, mean, std), 8, mean=mean, std=std)
        np.testing.assert_array_equal(got.numpy(), reference_colors(pixels, 8)[..., 0])


def test_downsized_targets_are_4x4_cells_of_each_patch():
    image = np.zeros((1, 3, 8, 8))  # one 8x8 patch in four 4x4 quadrants
    image[0, 0, :4, :4] = 1.0  # top left red
    image[0, 1, :4, 4:] = 1.0  # top right green
    image[0, 2, 4:, :4] = 1.0  # bottom left blue
    image[0, :, 4:, 4:] = 1.0  # bottom right white
    assert color_targets(normalise(image), 8, downsized=2).tolist() == [[[448, 56, 7, 511]]]
    rng = np.random.default_rng(5)
    pixels = rng.integers(0, 256, (2, 3, 32, 16)) / 255.0
    got = color_targets(normalise(pixels), 16, downsized=4)
    assert got.shape == (2, 2, 16)
    np.testing.assert_array_equal(got.numpy(), reference_colors(pixels, 16, cells=4))


# -- corruption -----------------------------------------------------------------------------------
def distinct_tokens(batch, count, width=3):
    return torch.arange(batch * count * width, dtype=torch.float32).view(batch, count, width)


def test_exactly_round_n_times_mask_prob_patches_per_image():
    for count, prob, expected in [(16, 0.5, 8), (7, 0.5, 4), (196, 0.5, 98), (10, 0.15, 2),
                                  (3, 0.1, 1)]:  # half up, at least one
        _, corrupted, _, _ = corrupt(distinct_tokens(40, count), torch.zeros(3),
                                     MPPConfig(mask_prob=prob))
        assert corrupted.sum(dim=1).tolist() == [expected] * 40, (count, prob)


def test_replaced_tokens_are_the_mask_random_ones_another_patch_of_the_image_rest_as_they_are():
    tokens, mask_token = distinct_tokens(64, 16), torch.tensor([-1.0, -2.0, -3.0])
    out, corrupted, replaced, random = corrupt(tokens, mask_token, MPPConfig())
    assert not (replaced & random).any()
    assert not (replaced & ~corrupted).any() and not (random & ~corrupted).any()
    assert random.any() and replaced.any()
    kept = ~replaced & ~random
    torch.testing.assert_close(out[kept], tokens[kept], rtol=0, atol=0)
    assert (out[replaced] == mask_token).all()
    for b, i in random.nonzero().tolist():
        same = (tokens[b] == out[b, i]).all(dim=1).nonzero().flatten().tolist()
        assert len(same) == 1 and same[0] != i  # exactly one other patch of the same image


def test_the_80_10_10_split_and_the_choice_are_fair_over_100k_corrupted_patches():
    batch, count = 1000, 200  # 100 corrupted per image: 100,000 in all
    tokens = distinct_tokens(batch, count, width=1)
    generator = torch.Generator().manual_seed(11)
    out, corrupted, replaced, random = corrupt(tokens, torch.tensor([-1.0]), MPPConfig(),
                                               generator)
    total = int(corrupted.sum())
    assert total == 100_000
    for share, mask in [(0.8, replaced), (0.1, random)]:
        sigma = math.sqrt(share * (1 - share) / total)
        assert abs(int(mask.sum()) / total - share) < 5 * sigma, (share, int(mask.sum()))
    per_position = corrupted.float().mean(dim=0)  # each position chosen half the time
    assert (per_position - 0.5).abs().max() < 5 * math.sqrt(0.25 / batch)
    # the random donor is uniform over the other positions of the image
    donors = (out[random, 0] - tokens[:, :1, 0].expand(-1, count)[random]).long()
    own = random.nonzero()[:, 1]
    assert (donors != own).all() and donors.min() >= 0 and donors.max() < count
    counts = np.bincount(donors.numpy(), minlength=count)
    expected = len(donors) / count
    assert abs(counts - expected).max() < 6 * math.sqrt(expected)


def test_the_same_generator_gives_the_same_corruption():
    tokens = distinct_tokens(4, 16)
    first = corrupt(tokens, torch.zeros(3), MPPConfig(), torch.Generator().manual_seed(1))
    second = corrupt(tokens, torch.zeros(3), MPPConfig(), torch.Generator().manual_seed(1))
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


# -- the model ------------------------------------------------------------------------------------
def test_positions_are_added_after_corruption():
    model = tiny_model()
    with torch.no_grad():
        model.pos_embed.normal_()
    mpp = MaskedPatchPrediction(model, MPPConfig(replace_prob=1.0, random_prob=0.0))
    seen = []
    model.blocks[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    out = mpp(torch.randn(2, 3, 16, 16))
    first = seen[0][:, 1:]  # the patch tokens entering block 1
    expected = mpp.mask_token + model.pos_embed[0, 1:]
    for b, i in out.corrupted.nonzero().tolist():
        torch.testing.assert_close(first[b, i], expected[i])
    torch.testing.assert_close(seen[0][:, 0], (model.cls_token + model.pos_embed[:, 0])[0]
                               .expand(2, -1))


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def test_loss_is_cross_entropy_over_the_corrupted_patches_only():
    mpp = MaskedPatchPrediction(tiny_model())
    images = torch.randn(3, 3, 16, 16)
    out = mpp(images, generator=torch.Generator().manual_seed(0))
    assert out.logits.shape == (3, 16, 512) and out.targets.shape == (3, 16)
    assert out.corrupted.sum(dim=1).tolist() == [8, 8, 8]
    logits, targets = out.logits.detach().double().numpy(), out.targets.numpy()
    mask = out.corrupted.numpy()
    picked = log_softmax(logits[mask])[np.arange(mask.sum()), targets[mask]]
    assert out.loss.item() == pytest.approx(-picked.mean(), rel=1e-5)
    changed = out.logits.detach().clone()
    changed[~out.corrupted] = torch.randn_like(changed[~out.corrupted]) * 10
    assert mpp_loss(changed, out.targets, out.corrupted).item() == pytest.approx(
        out.loss.item(), rel=1e-6)
    changed[out.corrupted] += torch.randn_like(changed[out.corrupted])
    assert mpp_loss(changed, out.targets, out.corrupted).item() != pytest.approx(
        out.loss.item(), rel=1e-6)


def test_targets_are_the_mean_colours_of_the_input_patches():
    preprocess = Preprocess(img_size=16, mean=IMAGENET_MEAN, std=IMAGENET_STD)
    mpp = MaskedPatchPrediction(tiny_model(), preprocess=preprocess)
    pixels = np.random.default_rng(2).integers(0, 256, (2, 3, 16, 16)) / 255.0
    out = mpp(normalise(pixels, IMAGENET_MEAN, IMAGENET_STD))
    np.testing.assert_array_equal(out.targets.numpy(), reference_colors(pixels, 4)[..., 0])


def test_downsized_and_pixel_targets():
    pixels = np.random.default_rng(4).integers(0, 256, (2, 3, 16, 16)) / 255.0
    images = normalise(pixels)
    mpp = MaskedPatchPrediction(tiny_model(), MPPConfig(target="downsized", downsized=2))
    out = mpp(images)
    assert out.logits.shape == (2, 16, 4, 512) and out.targets.shape == (2, 16, 4)
    np.testing.assert_array_equal(out.targets.numpy(), reference_colors(pixels, 4, cells=2))
    mask = out.corrupted.numpy()
    logits = out.logits.detach().double().numpy()[mask].reshape(-1, 512)
    picked = log_softmax(logits)[np.arange(len(logits)), out.targets.numpy()[mask].reshape(-1)]
    assert out.loss.item() == pytest.approx(-picked.mean(), rel=1e-5)

    mpp = MaskedPatchPrediction(tiny_model(), MPPConfig(target="pixels"))
    out = mpp(images)
    assert out.logits.shape == (2, 16, 3 * 4 * 4)
    # patch (i, j) of image b, channel-major: pixels[b, :, 4i:4i+4, 4j:4j+4].flatten()
    expected = np.stack([np.stack([pixels[b, :, 4 * i:4 * i + 4, 4 * j:4 * j + 4].reshape(-1)
                                   for i in range(4) for j in range(4)]) for b in range(2)])
    np.testing.assert_allclose(out.targets.numpy(), expected, atol=1e-6)
    mask = out.corrupted.numpy()
    error = (out.logits.detach().double().numpy()[mask] - expected[mask]) ** 2
    assert out.loss.item() == pytest.approx(error.mean(), rel=1e-5)


def test_a_dynamic_size_model_predicts_every_patch_of_another_size():
    pixels = np.random.default_rng(6).integers(0, 256, (2, 3, 16, 24)) / 255.0
    out = MaskedPatchPrediction(tiny_model(dynamic_img_size=True))(normalise(pixels))
    assert out.logits.shape == (2, 24, 512) and out.corrupted.sum(dim=1).tolist() == [12, 12]
    np.testing.assert_array_equal(out.targets.numpy(), reference_colors(pixels, 4)[..., 0])


def test_gradients_reach_the_encoder_and_the_mask_token():
    model = tiny_model()
    mpp = MaskedPatchPrediction(model)
    mpp(torch.randn(2, 3, 16, 16)).loss.backward()
    for name, parameter in [("mask_token", mpp.mask_token),
                            ("patch embedding", model.patch_embed.proj.weight),
                            ("positions", model.pos_embed), ("class token", model.cls_token),
                            ("first block", model.blocks[0].attn.qkv.weight),
                            ("head", mpp.head.weight)]:
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
    assert any(p is model.patch_embed.proj.weight for p in mpp.parameters())  # held, not copied


def test_a_tiny_model_learns_on_a_fixed_batch():
    """Over 40 Adam steps the loss falls from ln 512 to below the entropy of the batch's colours,
    the best a predictor that ignores the other patches can do: the model reads the context
    (each image's patch rows share a colour)."""
    torch.manual_seed(0)
    palette = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [1.0, 1.0, 1.0]])
    rows = torch.randint(0, 4, (8, 4))  # a palette colour per row of 4 patches
    pixels = palette[rows].permute(0, 2, 1)[..., None].repeat_interleave(4, 2) \
        .repeat_interleave(16, 3)  # (8, 3, 16, 16)
    classes = np.array([448, 56, 7, 511])[rows.numpy()]
    shares = np.bincount(classes.ravel()) / classes.size
    entropy = -sum(p * math.log(p) for p in shares if p > 0)
    mpp = MaskedPatchPrediction(tiny_model())
    optimizer = torch.optim.Adam(mpp.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)  # a fresh corruption each step
    losses = []
    for _ in range(40):
        loss = mpp((pixels - 0.5) / 0.5, generator=generator).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(512), abs=0.5)
    assert np.mean(losses[-5:]) < entropy - 0.2, (entropy, losses)


# -- refusals -------------------------------------------------------------------------------------
@pytest.mark.parametrize("fields, parts", [
    (dict(mask_prob=0.0), ["mask_prob", "0.0", "(0, 1)"]),
    (dict(mask_prob=1.0), ["mask_prob", "1.0", "(0, 1)"]),
    (dict(mask_prob=1.5), ["mask_prob", "1.5", "(0, 1)"]),
    (dict(mask_prob=float("nan")), ["mask_prob", "(0, 1)"]),
    (dict(replace_prob=1.2), ["replace_prob", "1.2", "[0, 1]"]),
    (dict(random_prob=-0.1), ["random_prob", "-0.1", "[0, 1]"]),
    (dict(replace_prob=0.8, random_prob=0.3), ["replace_prob + random_prob", "at most 1"]),
    (dict(target="colour"), ["colour", "mean_color", "downsized", "pixels"]),
    (dict(bits=0), ["bits", "[1, 8]"]),
    (dict(downsized=0), ["downsized", "positive"]),
])
def test_bad_settings_are_refused_naming_the_value_and_the_range(fields, parts):
    with pytest.raises(ConfigError) as error:
        MPPConfig(**fields)
    says(error.value, *parts)


def test_a_downsized_grid_that_does_not_divide_the_patch_is_refused():
    with pytest.raises(ConfigError) as error:
        MaskedPatchPrediction(tiny_model(), MPPConfig(target="downsized", downsized=3))
    says(error.value, "downsized=3", "divide", "patch size 4")


def test_one_channel_data_is_refused_naming_mae_and_the_advice_works():
    with pytest.raises(ConfigError) as error:
        color_targets(torch.zeros(2, 1, 8, 8), 4, mean=(0.5,), std=(0.5,))
    says(error.value, "RGB", "1 channel", "MAE", "target='pixels'")
    model = tiny_model(in_chans=1)
    with pytest.raises(ConfigError) as error:
        MaskedPatchPrediction(model)
    says(error.value, "RGB", "MAE")
    out = MaskedPatchPrediction(model, MPPConfig(target="pixels"))(torch.randn(2, 1, 16, 16))
    assert out.logits.shape == (2, 16, 16) and torch.isfinite(out.loss)
