"""The CPU training kernel for attention and the class-token shortcut compute the model's
function: values and gradients equal to SDPA and to the full forward.

Tolerances: 1e-12 in float64 (the same sums in another order), 1e-5 against timm in float32.
"""

import pytest
import timm.models.vision_transformer as timm_vit
import torch
import torch.nn.functional as F

from reference_models import randomise
from vitkit import VisionTransformer, apply_token_merging, create_model
from vitkit.model import attention
from vitkit.model.attention import BatchedAttention, attend, uses_batched_kernel
from vitkit.weights import load_state_dict_checked
from vitkit.weights.timm import config_from_timm_model


def sdpa(qkv: torch.Tensor, heads: int) -> torch.Tensor:
    batch, tokens, three_width = qkv.shape
    q, k, v = qkv.view(batch, tokens, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(
        batch, tokens, three_width // 3)


@pytest.mark.parametrize("shape", [(4, 4, 65, 12), (3, 3, 17, 64), (2, 1, 1, 8), (5, 2, 128, 32)])
def test_batched_attention_values_and_gradients_equal_sdpa(shape):
    batch, heads, tokens, head_dim = shape
    qkv = torch.randn(batch, tokens, 3 * heads * head_dim, dtype=torch.float64,
                      requires_grad=True)
    grad_out = torch.randn(batch, tokens, heads * head_dim, dtype=torch.float64)
    out = BatchedAttention.apply(qkv, heads)
    (grad,) = torch.autograd.grad(out, qkv, grad_out)
    expected = sdpa(qkv, heads)
    (expected_grad,) = torch.autograd.grad(expected, qkv, grad_out)
    assert out.shape == expected.shape and grad.shape == qkv.shape
    assert (out - expected).abs().max() < 1e-12
    assert (grad - expected_grad).abs().max() < 1e-12


def test_batched_attention_passes_torch_gradcheck():
    qkv = torch.randn(2, 5, 3 * 2 * 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: BatchedAttention.apply(x, 2), (qkv,))


def test_attend_runs_the_batched_kernel_only_for_cpu_training_passes(monkeypatch):
    calls = []
    real = BatchedAttention.apply
    monkeypatch.setattr(BatchedAttention, "apply",
                        lambda *args: calls.append(args[0].shape) or real(*args))
    qkv = torch.randn(2, 9, 24, requires_grad=True)
    attend(qkv, 2)
    assert len(calls) == 1
    with torch.no_grad():  # inference: SDPA (as fast, keeps no attention matrix)
        attend(qkv, 2)
    attend(qkv, 2, dropout=0.1)  # attention dropout: SDPA's
    long = torch.randn(1, attention.BATCHED_MAX_TOKENS + 1, 24, requires_grad=True)
    attend(long, 2)
    assert len(calls) == 1
    assert not uses_batched_kernel(qkv.detach()) and uses_batched_kernel(qkv)
    # every path gives the same values
    with torch.no_grad():
        assert torch.allclose(attend(qkv, 2), real(qkv, 2), atol=1e-6)


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


def test_merged_models_keep_their_own_forward():
    model = apply_token_merging(tiny(), 2)
    assert not model.pools_class_token_only()
    apply_token_merging(model, 0)
    assert model.pools_class_token_only()


def test_a_training_step_equals_timms_in_loss_and_gradients():
    """The whole CPU training path (batched attention + shortcut) against timm's SDPA model."""
    reference = randomise(timm_vit.VisionTransformer(
        img_size=32, patch_size=4, embed_dim=48, depth=3, num_heads=4, num_classes=10), std=0.1)
    config, state_dict = config_from_timm_model(reference)
    model = VisionTransformer(config)
    load_state_dict_checked(model, state_dict)
    model.train(), reference.train()
    images, labels = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    loss = F.cross_entropy(model(images), labels)
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
