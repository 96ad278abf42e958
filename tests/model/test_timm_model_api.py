"""The timm model API on vitkit's VisionTransformer, checked against timm itself.

Widths (`embed_dim`, `num_features`, `head_hidden_size`), `get_classifier`,
`reset_classifier(num_classes, global_pool)`, `set_grad_checkpointing`,
`forward_intermediates` / `prune_intermediate_layers`, `pretrained_cfg`, and `set_image_size`
keeping `preprocess` in step. Parity tolerance: 1e-5 max abs difference at fp32 (observed:
bit-identical); gradients with and without checkpointing: 1e-6 (observed: bit-identical).
"""

import pytest
import timm
import timm.models.vision_transformer as timm_vit
import torch
from PIL import Image
from timm.data import create_transform, resolve_data_config
from timm.models._hub import save_for_hf
from torch import nn

import vitkit
import vitkit.model.timm_api as timm_api_module
from reference_models import randomise
from vitkit import VisionTransformer
from vitkit.config import ViTConfig
from vitkit.errors import ConfigError
from vitkit.inference.merging import apply_token_merging
from vitkit.preprocess import Preprocess, official_preprocess, preprocess_for
from vitkit.weights import load_state_dict_checked
from vitkit.weights.formats.timm import config_from_timm_model

TOL = 1e-5
GRAD_TOL = 1e-6


def _timm(**kwargs) -> nn.Module:
    defaults = dict(img_size=32, patch_size=8, embed_dim=64, depth=4, num_heads=4,
                    num_classes=7)
    return randomise(timm_vit.VisionTransformer(**{**defaults, **kwargs}), std=0.2)


def _vitkit_from(reference: nn.Module) -> VisionTransformer:
    config, state_dict = config_from_timm_model(reference)
    model = VisionTransformer(config).eval()
    load_state_dict_checked(model, state_dict)
    return model


def _small(**overrides) -> VisionTransformer:
    fields = dict(img_size=32, patch_size=8, width=64, depth=3, num_heads=4, mlp_dim=128,
                  num_classes=5, init="trunc_normal")
    return VisionTransformer(ViTConfig(**{**fields, **overrides}))


def _max_diff(ours, theirs) -> float:
    if isinstance(ours, torch.Tensor):
        return (ours - theirs).abs().max().item()
    if isinstance(ours, dict):
        assert ours.keys() == theirs.keys()
        return max(_max_diff(ours[key], theirs[key]) for key in ours)
    assert len(ours) == len(theirs)
    return max(_max_diff(a, b) for a, b in zip(ours, theirs, strict=True))


@pytest.fixture(scope="module")
def vit_tiny() -> tuple[nn.Module, VisionTransformer]:
    """timm's vit_tiny_patch16_224 with random weights, and vitkit's copy of it."""
    reference = randomise(timm.create_model("vit_tiny_patch16_224", pretrained=False), 0.05)
    return reference, _vitkit_from(reference)


# -- 1-2: widths and the classifier -------------------------------------------------------------
def test_widths_are_timms(vit_tiny):
    reference, model = vit_tiny
    for name in ("embed_dim", "num_features", "head_hidden_size"):
        assert getattr(model, name) == getattr(reference, name) == 192


def test_head_hidden_size_is_the_pre_logits_width_as_in_timm():
    # timm: num_features is the backbone's width, head_hidden_size what the classifier sees
    convnext = timm.create_model("convnext_atto", head_hidden_size=100, pretrained=False)
    features = convnext.forward_features(torch.randn(1, 3, 64, 64))
    assert features.shape[1] == convnext.num_features == 320
    assert convnext.forward_head(features, pre_logits=True).shape[-1] == 100
    assert convnext.get_classifier().in_features == convnext.head_hidden_size == 100
    model = _small(pre_logits_dim=100).eval()
    tokens = model.forward_features(torch.randn(1, 3, 32, 32))
    assert tokens.shape[-1] == model.num_features == model.embed_dim == 64
    assert model.forward_head(tokens, pre_logits=True).shape[-1] == 100
    assert model.get_classifier().in_features == model.head_hidden_size == 100
    model.reset_classifier(3)  # drops the pre-logits layer
    assert model.head_hidden_size == model.get_classifier().in_features == 64


def test_get_classifier_is_the_head_before_and_after_a_reset():
    reference, model = _timm(), _small()
    assert reference.get_classifier() is reference.head and model.get_classifier() is model.head
    reference.reset_classifier(0)
    model.reset_classifier(0)
    assert isinstance(model.get_classifier(), nn.Identity)
    assert isinstance(reference.get_classifier(), nn.Identity)


# -- 3: reset_classifier(num_classes, global_pool) ----------------------------------------------
@pytest.mark.parametrize(("built", "reset"), [("token", "avg"), ("avg", "token"),
                                              ("token", None), ("token", "token")])
def test_reset_classifier_global_pool_gives_timms_logits(built, reset):
    reference = _timm(global_pool=built)
    model = _vitkit_from(reference)
    reference.reset_classifier(3, reset)
    model.reset_classifier(3, reset)
    with torch.no_grad():
        model.head.weight.copy_(reference.head.weight.normal_())
        model.head.bias.copy_(reference.head.bias.normal_())
        images = torch.randn(2, 3, 32, 32)
        assert _max_diff(model(images), reference(images)) <= TOL
    assert model.config.pool == {"token": "class_token", "avg": "mean_patches"}[reset or built]


def test_reset_classifier_takes_vitkit_pool_names_too():
    model = _small()
    model.reset_classifier(3, "mean_all_tokens")
    assert model.config.pool == "mean_all_tokens" and model.config.num_classes == 3


@pytest.mark.parametrize("name", ["", "max", "avgmax", "map", "mean"])
def test_reset_classifier_refuses_an_unknown_pool_naming_the_accepted(name):
    model = _small()
    with pytest.raises(ConfigError, match="'token', 'avg', 'class_token', 'mean_patches'"):
        model.reset_classifier(3, name)
    assert model.config.num_classes == 5 and model.head.out_features == 5  # left as it was


def test_reset_classifier_old_positional_drop_pre_logits_is_refused_with_a_hint():
    model = _small(pre_logits_dim=16)
    with pytest.raises(ConfigError, match="keyword arguments"):
        model.reset_classifier(3, False)
    with pytest.raises(TypeError):
        model.reset_classifier(3, None, False)
    model.reset_classifier(3, drop_pre_logits=False, zero_init=True)
    assert model.config.pre_logits_dim == 16 and model.head.in_features == 16
    assert not model.head.weight.any()


def test_reset_classifier_token_pool_needs_a_class_token():
    model = _small(class_token=False, pool="mean_patches")
    with pytest.raises(ConfigError, match="class_token"):
        model.reset_classifier(3, "token")


def test_reset_classifier_head_follows_the_model_dtype_and_mode():
    model = _small().to(torch.bfloat16).eval()
    model.reset_classifier(3, "avg")
    assert model.head.weight.dtype == torch.bfloat16 and not model.head.training
    assert model(torch.randn(1, 3, 32, 32, dtype=torch.bfloat16)).shape == (1, 3)


# -- 4: gradient checkpointing ------------------------------------------------------------------
def _loss_and_grads(model, images, checkpointing):
    model.set_grad_checkpointing(checkpointing)
    model.zero_grad()
    torch.manual_seed(0)  # the same dropout and drop-path draws in both runs
    logits = model(images)
    logits.square().sum().backward()
    return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("pool", ["class_token", "mean_patches"])
def test_grad_checkpointing_gives_the_same_outputs_and_gradients(pool):
    model = _small(pool=pool, dropout=0.1, drop_path=0.2).train()
    images = torch.randn(4, 3, 32, 32)
    plain_logits, plain = _loss_and_grads(model, images, False)
    logits, grads = _loss_and_grads(model, images, True)
    assert torch.equal(logits, plain_logits)
    assert max((grads[name] - plain[name]).abs().max().item() for name in plain) <= GRAD_TOL


def test_grad_checkpointing_runs_each_block_through_checkpoint(monkeypatch):
    calls = []

    def counting(function, *args, **kwargs):
        calls.append(kwargs.get("use_reentrant"))
        return torch.utils.checkpoint.checkpoint(function, *args, **kwargs)

    monkeypatch.setattr(timm_api_module, "checkpoint", counting)
    model = _small().train()
    assert model.pools_class_token_only()  # the shortcut: 2 blocks, then the last for one token
    model.set_grad_checkpointing()
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert calls == [False] * 3
    with torch.no_grad():  # nothing to save: no checkpoint
        model(torch.randn(2, 3, 32, 32))
    model.set_grad_checkpointing(False)
    model(torch.randn(2, 3, 32, 32))
    assert len(calls) == 3


def test_grad_checkpointing_keeps_fewer_activations():
    model = _small(pool="mean_patches").train()
    images = torch.randn(2, 3, 32, 32)

    def saved_elements() -> int:
        count = [0]

        def pack(tensor):
            count[0] += tensor.numel()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            model(images).sum().backward()
        return count[0]

    plain = saved_elements()
    model.set_grad_checkpointing()
    assert saved_elements() < plain / 3


def test_grad_checkpointing_with_token_merging_gives_the_same_gradients():
    model = apply_token_merging(_small(depth=3), 2).train()
    images = torch.randn(2, 3, 32, 32)
    plain_logits, plain = _loss_and_grads(model, images, False)
    logits, grads = _loss_and_grads(model, images, True)
    assert torch.equal(logits, plain_logits)
    assert max((grads[name] - plain[name]).abs().max().item() for name in plain) <= GRAD_TOL


# -- 5: forward_intermediates and prune_intermediate_layers -------------------------------------
INTERMEDIATE_CASES = {
    "all": dict(),
    "last_3_normed": dict(indices=3, norm=True),
    "listed_nlc_prefix": dict(indices=[0, -1], output_fmt="NLC", return_prefix_tokens=True),
    "stop_early": dict(indices=[1, 5], stop_early=True),
    "only": dict(indices=2, intermediates_only=True, return_prefix_tokens=True),
    "dict": dict(indices=[3], output_dict=True, return_prefix_tokens=True),
    "dict_only": dict(output_dict=True, intermediates_only=True),
}


@pytest.mark.parametrize("case", INTERMEDIATE_CASES)
def test_forward_intermediates_match_timm_vit_tiny(case, vit_tiny):
    reference, model = vit_tiny
    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        theirs = reference.forward_intermediates(images, **INTERMEDIATE_CASES[case])
        ours = model.forward_intermediates(images, **INTERMEDIATE_CASES[case])
    assert _max_diff(ours, theirs) <= TOL


@pytest.mark.parametrize("kwargs", [dict(global_pool="avg"),
                                    dict(global_pool="avg", class_token=False),
                                    dict(global_pool="token", img_size=(32, 48))])
def test_forward_intermediates_match_timm_other_layouts(kwargs):
    reference = _timm(**kwargs)
    model = _vitkit_from(reference)
    images = torch.randn(2, 3, *reference.patch_embed.img_size)
    for options in (dict(norm=True), dict(return_prefix_tokens=True, output_fmt="NLC")):
        with torch.no_grad():
            theirs = reference.forward_intermediates(images, **options)
            ours = model.forward_intermediates(images, **options)
        assert _max_diff(ours, theirs) <= TOL


def test_forward_intermediates_maps_follow_a_dynamic_image_size():
    model = _small(dynamic_img_size=True).eval()
    _, maps = model.forward_intermediates(torch.randn(1, 3, 48, 64), indices=1)
    assert maps[0].shape == (1, 64, 6, 8)


@pytest.mark.parametrize(("indices", "fmt"), [(0, "NCHW"), (4, "NCHW"), ([3], "NCHW"),
                                              ([], "NCHW"), (None, "NHWC")])
def test_forward_intermediates_refuses_what_does_not_fit(indices, fmt):
    with pytest.raises(ConfigError, match=r"blocks|output_fmt"):
        _small().forward_intermediates(torch.randn(1, 3, 32, 32), indices, output_fmt=fmt)


def test_forward_intermediates_refused_under_token_merging():
    model = apply_token_merging(_small(), 2)
    with pytest.raises(ConfigError, match="apply_token_merging"):
        model.forward_intermediates(torch.randn(1, 3, 32, 32))


@pytest.mark.parametrize("prune_norm", [False, True])
def test_prune_intermediate_layers_matches_timm_and_keeps_the_config_true(prune_norm):
    reference = _timm(depth=6)
    model = _vitkit_from(reference)
    kept = reference.prune_intermediate_layers([1, -3], prune_norm=prune_norm)
    assert model.prune_intermediate_layers([1, -3], prune_norm=prune_norm) == kept == [1, 3]
    assert len(model.blocks) == len(reference.blocks) == model.config.depth == 4
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ours = model.forward_intermediates(images, [1, 3], norm=True, intermediates_only=True)
        theirs = reference.forward_intermediates(images, [1, 3], norm=True,
                                                 intermediates_only=True)
    assert _max_diff(ours, theirs) <= TOL
    assert model.config.num_classes == 0
    assert model.config.final_norm == ("none" if prune_norm else "tokens")
    VisionTransformer(model.config).load_state_dict(model.state_dict())  # config fits weights


# -- 6: pretrained_cfg --------------------------------------------------------------------------
def test_pretrained_cfg_of_a_timm_hub_folder_resolves_as_timms(tmp_path):
    reference = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    save_for_hf(reference, tmp_path)
    model = vitkit.load_pretrained(tmp_path)
    assert resolve_data_config(model=model) == resolve_data_config(model=reference)
    theirs = reference.pretrained_cfg
    ours = model.pretrained_cfg
    assert {key: theirs[key] for key in ours} == ours
    assert model.default_cfg == ours


@pytest.mark.parametrize("preprocess", [
    official_preprocess((32, 32)),
    Preprocess(img_size=(32, 32), resize_mode="shorter_side", crop_pct=0.875,
               interpolation="bicubic", mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
], ids=["squash", "shorter_side"])
def test_timms_transform_from_pretrained_cfg_gives_the_preprocess_pixels(preprocess):
    model = _small()
    model.preprocess = preprocess
    image = Image.fromarray(torch.randint(0, 256, (45, 70, 3), dtype=torch.uint8).numpy())
    theirs = create_transform(**resolve_data_config(model=model))(image)
    assert _max_diff(preprocess([image])[0], theirs) <= TOL


def test_pretrained_cfg_tells_only_what_it_knows():
    """A model without `preprocess` tells timm the official preprocessing, which vitkit's
    predict, eval and save_pretrained use for it (it told none, so timm's resolve_data_config
    fell back to ImageNet's mean and std, bicubic, crop_pct 0.875: other pixels)."""
    model = _small()
    cfg = model.pretrained_cfg
    assert cfg == {"input_size": (3, 32, 32), "fixed_input_size": True, "num_classes": 5,
                   "pool_size": None, "first_conv": "patch_embed.proj", "classifier": "head",
                   "interpolation": "bilinear", "crop_pct": 1.0, "crop_mode": "squash",
                   "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}
    image = Image.fromarray(torch.randint(0, 256, (45, 70, 3), dtype=torch.uint8).numpy())
    theirs = create_transform(**resolve_data_config(model=model))(image)
    assert _max_diff(official_preprocess((32, 32))([image])[0], theirs) <= TOL
    model.preprocess = Preprocess(img_size=(32, 32), scale=1.0)  # arrays in their own units
    assert "mean" not in model.pretrained_cfg and "std" not in model.pretrained_cfg
    model.class_names = ["a", "b", "c", "d", "e"]
    assert model.pretrained_cfg["label_names"] == ("a", "b", "c", "d", "e")


def test_pretrained_cfg_is_read_only():
    model = _small()
    model.pretrained_cfg["num_classes"] = 99
    assert model.pretrained_cfg["num_classes"] == 5
    with pytest.raises(AttributeError):
        model.pretrained_cfg = {}


@pytest.mark.parametrize(("stem", "first_conv"), [
    (dict(), "patch_embed.proj"),
    (dict(stem="conv", stem_channels=(16, 32, 64)), "patch_embed.convs.0"),
    (dict(stem="resnet", patch_size=32, img_size=64), "patch_embed.backbone.stem.conv"),
])
def test_pretrained_cfg_first_conv_reads_the_pixels(stem, first_conv):
    # timm's names: "patch_embed.proj" (ViTs), "patch_embed.backbone.stem.conv" (hybrids)
    model = _small(in_chans=2, **stem)
    assert model.pretrained_cfg["first_conv"] == first_conv
    conv = dict(model.named_modules())[first_conv]
    assert isinstance(conv, nn.Conv2d) and conv.in_channels == 2


# -- 7: set_image_size keeps preprocess in step -------------------------------------------------
def test_set_image_size_updates_preprocess_as_saved():
    model = _small()
    model.preprocess = Preprocess(img_size=(32, 32), resize_mode="shorter_side", crop_pct=0.9)
    model.set_image_size((48, 64))
    assert model.preprocess.img_size == (48, 64)
    assert model.preprocess == preprocess_for(model)  # what save_pretrained writes
    assert model.preprocess.crop_pct == 0.9
    assert model.pretrained_cfg["input_size"] == (3, 48, 64)


# -- the attributes code written for timm reads, and get_intermediate_layers ---------------------

TIMM_ATTRIBUTES = ("num_classes", "global_pool", "num_prefix_tokens", "has_class_token",
                   "no_embed_class", "dynamic_img_size", "feature_info", "embed_dim",
                   "num_features")


@pytest.mark.parametrize("kwargs", [dict(), dict(global_pool="avg"),
                                    dict(global_pool="avg", class_token=False),
                                    dict(num_classes=0),
                                    dict(img_size=(32, 48), patch_size=16)])
def test_timm_attributes_equal_timms(kwargs):
    reference = _timm(**kwargs)
    model = _vitkit_from(reference)
    for name in TIMM_ATTRIBUTES:
        assert getattr(model, name) == getattr(reference, name), name


def test_dynamic_img_size_attribute_is_the_configs():
    assert _small(dynamic_img_size=True).dynamic_img_size is True
    assert _small().dynamic_img_size is False


def test_timm_attributes_follow_reset_classifier():
    reference, model = _timm(), _vitkit_from(_timm())
    reference.reset_classifier(3, "avg")
    model.reset_classifier(3, "avg")
    assert (model.num_classes, model.global_pool) == (reference.num_classes,
                                                      reference.global_pool) == (3, "avg")


GET_INTERMEDIATE_CASES = [dict(), dict(n=2, reshape=True), dict(n=[0, 2], norm=True),
                          dict(n=3, return_prefix_tokens=True),
                          dict(n=[-1], reshape=True, return_prefix_tokens=True, norm=True)]


@pytest.mark.parametrize("options", GET_INTERMEDIATE_CASES)
def test_get_intermediate_layers_match_timm(options, vit_tiny):
    reference, model = vit_tiny
    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        theirs = reference.get_intermediate_layers(images, **options)
        ours = model.get_intermediate_layers(images, **options)
    assert len(ours) == len(theirs)
    assert _max_diff(ours, theirs) <= TOL


def test_get_intermediate_layers_refuses_an_attention_mask(vit_tiny):
    _, model = vit_tiny
    images = torch.randn(1, 3, 224, 224)
    with pytest.raises(ConfigError) as refused:
        model.get_intermediate_layers(images, attn_mask=torch.zeros(197, 197))
    for part in ("attn_mask", "no attention mask", "None"):
        assert part in str(refused.value), str(refused.value)

    assert len(model.get_intermediate_layers(images, attn_mask=None)) == 1  # as advised
