"""The class-token shortcut computes the model's function: `model(x)` (the last block run for
the class token alone) equals the full forward in values and gradients, and a training step
equals timm's.

Tolerances: 1e-12 in float64 (the same sums in another order), 1e-5 against timm in float32.
"""

import pytest
import timm.models.vision_transformer as timm_vit
import torch
import torch.nn.functional as F

from reference_models import randomise
from vitkit import VisionTransformer, apply_token_merging, create_model
from vitkit.weights import load_state_dict_checked
from vitkit.weights.formats.timm import config_from_timm_model


def tiny(**overrides) -> VisionTransformer:
    settings = dict(img_size=16, patch_size=4, width=32, depth=3, num_heads=4, mlp_dim=64,
                    num_classes=5, init="trunc_normal")
    return create_model("Ti/4", **{**settings, **overrides}).double()


def test_class_token_shortcut_equals_the_full_forward_in_values_and_gradients():
    model = tiny()
    for p in model.parameters():  # trunc-normal init leaves biases at 0: make them count
        torch.nn.init.normal_(p, std=0.2)
    assert model.pools_class_token_only()
    images = torch.randn(3, 3, 16, 16, dtype=torch.float64)
    fast = model(images)
    full = model.forward_head(model.forward_features(images))
    assert (fast - full).abs().max() < 1e-12
    grads_fast = torch.autograd.grad(fast.square().sum(), list(model.parameters()))
    grads_full = torch.autograd.grad(full.square().sum(), list(model.parameters()))
    for fast_grad, full_grad in zip(grads_fast, grads_full, strict=True):
        assert (fast_grad - full_grad).abs().max() < 1e-10


def test_class_token_shortcut_draws_the_same_drop_path_masks():
    model = tiny(drop_path=0.5).train()
    images = torch.randn(8, 3, 16, 16, dtype=torch.float64)
    torch.manual_seed(3)
    fast = model(images)
    torch.manual_seed(3)
    full = model.forward_head(model.forward_features(images))
    assert (fast - full).abs().max() < 1e-12


@pytest.mark.parametrize("overrides", [dict(class_token=False, pool="mean_all_tokens"),
                                       dict(pool="mean_patches")])
def test_pooled_models_run_every_token_through_every_block(overrides):
    assert not tiny(**overrides).pools_class_token_only()


def test_merged_models_take_the_shortcut_through_their_merging_blocks():
    """A merging model's shortcut merges as its full path does (not the plain path's
    logits), and r=0 gives the plain shortcut back."""
    model, images = tiny(), torch.randn(2, 3, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        plain = model(images)
        apply_token_merging(model, 2)
        assert model.pools_class_token_only()
        merged, full = model(images), model.forward_head(model.forward_features(images))
        assert (merged - full).abs().max() < 1e-5 and (merged - plain).abs().max() > 1e-4
        apply_token_merging(model, 0)
        assert model.pools_class_token_only() and torch.equal(model(images), plain)


def backward_nodes(tensor: torch.Tensor) -> set[str]:
    """The names of the autograd nodes behind `tensor`."""
    seen, stack = set(), [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(next_node for next_node, _ in node.next_functions)
    return {type(node).__name__ for node in seen}


def test_a_training_step_equals_timms_in_loss_and_gradients():
    """The whole training path against timm's model: the shortcut and the chunked attention
    (in its transposed layout, head dim 12) included."""
    reference = randomise(timm_vit.VisionTransformer(
        img_size=32, patch_size=4, embed_dim=48, depth=3, num_heads=4, num_classes=10), std=0.1)
    config, state_dict = config_from_timm_model(reference)
    model = VisionTransformer(config)
    load_state_dict_checked(model, state_dict)
    model.train(), reference.train()
    images, labels = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    loss = F.cross_entropy(model(images), labels)
    assert any("vitkit_chunked_attention" in name for name in backward_nodes(loss))
    expected = F.cross_entropy(reference(images), labels)
    grads = dict(zip([n for n, _ in model.named_parameters()],
                     torch.autograd.grad(loss, list(model.parameters())), strict=True))
    reference_grads = dict(zip([n for n, _ in reference.named_parameters()],
                               torch.autograd.grad(expected, list(reference.parameters())),
                               strict=True))
    assert abs(loss.item() - expected.item()) < 1e-5
    # the layouts differ (timm and vitkit name a few tensors differently): compare by name
    # where they agree, which covers every block tensor, the head and the class token
    shared = [name for name in grads if name in reference_grads]
    assert len(shared) >= 12 * 3
    for name in shared:
        assert (grads[name] - reference_grads[name]).abs().max() < 1e-5, name


def test_a_hook_on_the_last_block_sees_every_token():
    model = tiny()
    seen = []
    handle = model.blocks[-1].register_forward_hook(lambda _m, _i, out: seen.append(out[0].shape))
    assert not model.pools_class_token_only()
    model(torch.randn(2, 3, 16, 16, dtype=torch.float64))
    assert seen == [torch.Size([2, 17, 32])]
    handle.remove()
    assert model.pools_class_token_only()
