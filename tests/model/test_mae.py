"""MAE pre-training (`vitkit.objectives`): the same loss, logits, mask and ids_restore as
Hugging Face's `ViTMAEForPreTraining` for the same weights and noise, state dicts converted
both ways, HF's masking counts and patch order, and config errors that name the problem."""

from __future__ import annotations

import re

import pytest
import torch

from vitkit.config import ViTConfig
from vitkit.errors import CheckpointError, ConfigError, InputError
from vitkit.model import VisionTransformer
from vitkit.objectives import (
    MAEDecoderConfig,
    MaskedAutoencoder,
    fix_mae_positions_,
    patchify,
    random_masking,
    unpatchify,
)
from vitkit.objectives.mae import mae_positions
from vitkit.weights.formats.hf_mae import mae_from_hf_state_dict, mae_to_hf_state_dict

transformers = pytest.importorskip("transformers")
from transformers import ViTMAEConfig, ViTMAEForPreTraining  # noqa: E402

TOLERANCE = 1e-5
SMALL = dict(image_size=32, patch_size=8, hidden_size=48, num_hidden_layers=2,
             num_attention_heads=3, intermediate_size=96, decoder_hidden_size=32,
             decoder_num_hidden_layers=1, decoder_num_attention_heads=4,
             decoder_intermediate_size=64)
CASES = {
    "ratio0.75": dict(mask_ratio=0.75, norm_pix_loss=False),
    "ratio0.5-norm_pix": dict(mask_ratio=0.5, norm_pix_loss=True),
    "ratio0.6-deeper-decoder-tanh-no-qkv-bias": dict(
        mask_ratio=0.6, norm_pix_loss=True, decoder_num_hidden_layers=2,
        hidden_act="gelu_pytorch_tanh", qkv_bias=False, layer_norm_eps=1e-6),
}


def randomise_(module: torch.nn.Module, seed: int) -> None:
    """Every parameter random (HF starts positions and the mask token at zero, which would
    hide a mix-up of them)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1 + 0.1 * noise if re.search(r"(norm|layernorm\w*)\.weight$", name)
                        else 0.2 * noise)


def hf_model(seed: int = 0, **overrides) -> ViTMAEForPreTraining:
    model = ViTMAEForPreTraining(ViTMAEConfig(**{**SMALL, **overrides})).eval()
    randomise_(model, seed)
    return model


def inputs(model_config, batch: int = 3, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    size, patch = model_config.image_size, model_config.patch_size
    images = torch.randn(batch, model_config.num_channels, size, size, generator=generator)
    noise = torch.rand(batch, (size // patch) ** 2, generator=generator)
    return images, noise


def differences(ours, theirs) -> dict[str, float]:
    return {"loss": (ours.loss - theirs.loss).abs().item(),
            "logits": (ours.logits - theirs.logits).abs().max().item(),
            "mask": (ours.mask - theirs.mask).abs().max().item(),
            "ids_restore": (ours.ids_restore - theirs.ids_restore).abs().max().item()}


def assert_same(ours, theirs) -> None:
    found = differences(ours, theirs)
    assert ours.logits.shape == theirs.logits.shape and ours.mask.shape == theirs.mask.shape
    assert max(found.values()) < TOLERANCE, found
    assert torch.equal(ours.ids_restore, theirs.ids_restore)


@pytest.mark.parametrize("case", list(CASES))
def test_outputs_equal_hf_vitmae_for_pretraining(case):
    hf = hf_model(**CASES[case])
    ours = mae_from_hf_state_dict(hf.state_dict(), hf.config).eval()
    images, noise = inputs(hf.config)
    with torch.no_grad():
        theirs, mine = hf(images, noise=noise), ours(images, noise)
    assert_same(mine, theirs)
    assert ours.mask_ratio == hf.config.mask_ratio
    assert ours.norm_pix_loss == hf.config.norm_pix_loss


def test_round_trip_through_hf_gives_the_same_outputs():
    encoder = VisionTransformer(ViTConfig(img_size=32, patch_size=8, width=48, depth=2,
                                          num_heads=3, mlp_dim=96, num_classes=0))
    ours = MaskedAutoencoder(fix_mae_positions_(encoder), MAEDecoderConfig(32, 2, 4, 64),
                             mask_ratio=0.75, norm_pix_loss=True).eval()
    randomise_(ours, seed=3)
    state_dict, config = mae_to_hf_state_dict(ours)
    hf = ViTMAEForPreTraining(ViTMAEConfig(**config)).eval()
    hf.load_state_dict(state_dict, strict=True)
    images, noise = inputs(hf.config, seed=4)
    with torch.no_grad():
        assert_same(ours(images, noise), hf(images, noise=noise))
    back = mae_from_hf_state_dict(state_dict, config).eval()
    with torch.no_grad():
        assert_same(back(images, noise), ours(images, noise))


def test_transformers_4_key_names_are_read_too():
    hf = hf_model(seed=5)
    old = {}
    for key, tensor in hf.state_dict().items():
        key = re.sub(r"^vit\.layers\.", "vit.encoder.layer.", key)
        key = re.sub(r"attention\.([qkv])_proj", lambda m: "attention.attention." + {
            "q": "query", "k": "key", "v": "value"}[m.group(1)], key)
        key = key.replace("attention.o_proj", "attention.output.dense")
        key = key.replace("mlp.fc1", "intermediate.dense").replace("mlp.fc2", "output.dense")
        old[key] = tensor
    assert "decoder.decoder_layers.0.attention.attention.query.weight" in old
    ours = mae_from_hf_state_dict(old, hf.config.to_dict()).eval()
    images, noise = inputs(hf.config)
    with torch.no_grad():
        assert_same(ours(images, noise), hf(images, noise=noise))


def test_a_foreign_key_is_refused_by_name():
    state_dict = {**hf_model().state_dict(), "decoder.extra.weight": torch.zeros(1)}
    with pytest.raises(CheckpointError, match=re.escape("decoder.extra.weight")):
        mae_from_hf_state_dict(state_dict, SMALL)


def test_decoder_positions_are_mae_sincos_table():
    from transformers.models.vit_mae.modeling_vit_mae import (
        build_2d_sinusoidal_position_embedding,
    )
    table = build_2d_sinusoidal_position_embedding(4, 4, 32, cls_token=True)
    half = table.shape[-1] // 2
    hf_layout = torch.cat([table[..., half:], table[..., :half]], dim=-1)[None]
    assert (mae_positions((4, 4), 32, 1) - hf_layout).abs().max() < 1e-6


@pytest.mark.parametrize("ratio", [0.75, 0.5, 0.6, 0.9, 0.3, 0.7])
def test_random_masking_keeps_int_n_times_one_minus_ratio_per_image(ratio):
    tokens = torch.randn(4, 16, 5)
    noise = torch.rand(4, 16)
    visible, mask, ids_restore = random_masking(tokens, ratio, noise)
    keep = int(16 * (1 - ratio))  # HF's count: truncated
    assert visible.shape == (4, keep, 5)
    assert mask.sum(dim=1).tolist() == [16 - keep] * 4
    order = noise.argsort(dim=1)
    assert torch.equal(ids_restore, order.argsort(dim=1))
    for row in range(4):  # the kept ones: the least noise, in the order of their noise
        assert torch.equal(visible[row], tokens[row, order[row, :keep]])
        assert torch.equal(mask[row] == 0, torch.isin(torch.arange(16), order[row, :keep]))


def test_random_masking_refuses_noise_of_another_shape():
    with pytest.raises(InputError, match=r"\(2, 16\)"):
        random_masking(torch.zeros(2, 16, 4), 0.75, torch.rand(2, 15))


def test_patchify_is_hfs_order_and_unpatchify_inverts_it():
    hf = hf_model()
    images = torch.randn(2, 3, 32, 32)
    assert torch.equal(patchify(images, 8), hf.patchify(images))
    assert torch.equal(unpatchify(patchify(images, 8), 8, (32, 32)), images)
    wide = torch.randn(2, 3, 16, 40)
    assert torch.equal(unpatchify(patchify(wide, 8), 8, (16, 40)), wide)


def test_non_square_images_train_but_have_no_hf_form():
    encoder = VisionTransformer(ViTConfig(img_size=(32, 48), patch_size=8, width=48, depth=1,
                                          num_heads=3, mlp_dim=96, num_classes=0))
    model = MaskedAutoencoder(encoder, MAEDecoderConfig(32, 1, 4, 64), mask_ratio=0.5)
    output = model(torch.randn(2, 3, 32, 48))
    assert output.logits.shape == (2, 24, 192) and output.mask.sum().item() == 2 * 12
    output.loss.backward()
    assert encoder.blocks[0].attn.qkv.weight.grad is not None
    assert model.decoder.pred.weight.grad is not None
    with pytest.raises(ConfigError, match="square"):
        mae_to_hf_state_dict(model)


def test_the_encoder_is_the_vit_given_not_a_copy():
    encoder = VisionTransformer(ViTConfig(img_size=32, patch_size=8, width=48, depth=1,
                                          num_heads=3, mlp_dim=96, num_classes=0))
    model = MaskedAutoencoder(encoder)
    assert model.encoder is encoder
    encoder_params = {id(p) for p in encoder.parameters()}
    assert encoder_params <= {id(p) for p in model.parameters()}


@pytest.mark.parametrize("ratio", [0, 0.0, 1, 1.0, 1.5, -0.1])
def test_mask_ratio_outside_zero_one_is_refused(ratio):
    encoder = VisionTransformer(ViTConfig(img_size=32, patch_size=8, width=48, depth=1,
                                          num_heads=3, mlp_dim=96, num_classes=0))
    with pytest.raises(ConfigError, match=r"mask_ratio.*\(0, 1\).*" + re.escape(repr(ratio))):
        MaskedAutoencoder(encoder, mask_ratio=ratio)


def test_decoder_width_not_divisible_by_heads_is_refused_with_a_fix():
    with pytest.raises(ConfigError, match="divisible by its 5 heads") as info:
        MAEDecoderConfig(width=64, num_heads=5)
    fits = [int(n) for n in re.search(r"among \[([\d, ]+)\]", str(info.value)).group(1)
            .split(",")]
    assert MAEDecoderConfig(width=64, num_heads=fits[-1]).num_heads == fits[-1]


def test_decoder_sizes_must_be_positive():
    with pytest.raises(ConfigError, match="depth"):
        MAEDecoderConfig(depth=0)


def test_an_encoder_without_class_token_and_of_dynamic_size_runs():
    encoder = VisionTransformer(ViTConfig(img_size=32, patch_size=8, width=48, depth=1,
                                          num_heads=3, mlp_dim=96, num_classes=0,
                                          class_token=False, pool="mean_patches",
                                          dynamic_img_size=True))
    model = MaskedAutoencoder(encoder, MAEDecoderConfig(32, 1, 4, 64), mask_ratio=0.75).eval()
    images = torch.randn(2, 3, 48, 32)
    output = model(images)
    assert output.logits.shape == (2, 24, 192)
    assert output.mask.sum(dim=1).tolist() == [24 - int(24 * 0.25)] * 2
    assert model.unpatchify(output.logits, (48, 32)).shape == images.shape
