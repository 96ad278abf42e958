"""Token Merging (ToMe): r=0 is the plain model bit for bit, a known merge is the size-weighted
average, proportional attention makes a merged pair attend like the duplicates it replaced,
and the token count falls by r per layer."""

import pytest
import torch

from vitkit import ConfigError, apply_token_merging, create_model
from vitkit.inference.merging import (
    MergingBlock,
    MergingVisionTransformer,
    attend_with_sizes,
    merge_tokens,
)
from vitkit.model.layers import Block
from vitkit.model.vit import VisionTransformer

SMALL = dict(img_size=32, patch_size=8, width=32, depth=4, num_heads=4, mlp_dim=64,
             num_classes=5)  # 16 patches


def small_model(**overrides) -> VisionTransformer:
    torch.manual_seed(0)
    model = create_model("Ti/16", **{**SMALL, **overrides}).eval()
    with torch.no_grad():  # a non-zero head and class token, so outputs depend on everything
        for param in model.parameters():
            param.add_(0.02 * torch.randn_like(param))
    return model


@pytest.mark.parametrize("pool", ["class_token", "mean_patches", "mean_all_tokens"])
def test_r0_restores_the_plain_model_bit_for_bit(pool):
    model = small_model(pool=pool)
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        plain = model(images)
        merged = apply_token_merging(model, 2)(images)
        assert isinstance(model, MergingVisionTransformer) and model.merge_r == 2
        assert not torch.equal(merged, plain)  # merging changed something
        restored = apply_token_merging(model, 0)(images)
    assert type(model) is VisionTransformer and all(type(b) is Block for b in model.blocks)
    assert getattr(model, "merge_r", 0) == 0  # what the ONNX export and auto read
    assert torch.equal(restored, plain)


def test_merging_keeps_the_state_dict():
    model = small_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    apply_token_merging(model, 3)
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_known_merge_is_the_size_weighted_average():
    # one prefix token, four patches: A = patches 0, 2; B = patches 1, 3.
    # Patch 0's key equals patch 1's (cosine 1); patch 2's key is orthogonal to both B keys.
    keys = torch.tensor([[[9.0, 9.0, 9.0],  # prefix: never merged, whatever its key
                          [1.0, 0.0, 0.0], [2.0, 0.0, 0.0],  # patch 0 (A), patch 1 (B)
                          [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]])  # patch 2 (A), patch 3 (B)
    x = torch.randn(1, 5, 6)
    size = torch.tensor([[[1.0], [2.0], [3.0], [1.0], [1.0]]])
    new_x, new_size = merge_tokens(x, size, keys, r=1, num_prefix=1)
    # prefix, the unmerged A token (patch 2), then B (patch 1 + patch 0, patch 3)
    expected = torch.stack([x[0, 0], x[0, 3], (2 * x[0, 1] + 3 * x[0, 2]) / 5, x[0, 4]])
    torch.testing.assert_close(new_x[0], expected, rtol=0, atol=1e-6)
    assert new_size.flatten().tolist() == [1.0, 1.0, 5.0, 1.0]


def reference_merge(x: torch.Tensor, size: torch.Tensor, keys: torch.Tensor, r: int,
                    num_prefix: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ToMe's bipartite merge written out token by token (float64): A = even patches, B = odd;
    each A token's most cosine-similar B; the r best-scored A tokens merge into theirs."""
    tokens_out, sizes_out = [], []
    for b in range(x.shape[0]):
        patches = list(range(num_prefix, x.shape[1]))
        set_a, set_b = patches[0::2], patches[1::2]
        r_here = min(r, len(patches) // 2)
        if r_here == 0:  # nothing to merge: the tokens as they are
            tokens_out.append(x[b])
            sizes_out.append(size[b])
            continue
        unit = torch.nn.functional.normalize(keys[b], dim=-1)
        best = {a: max(set_b, key=lambda j, a=a: float(unit[a] @ unit[j])) for a in set_a}
        merged = sorted(set_a, key=lambda a: -float(unit[a] @ unit[best[a]]))[:r_here]
        total = {j: x[b, j] * size[b, j] for j in set_b}
        weight = {j: size[b, j].clone() for j in set_b}
        for a in merged:
            total[best[a]] = total[best[a]] + x[b, a] * size[b, a]
            weight[best[a]] = weight[best[a]] + size[b, a]
        order = [*range(num_prefix), *[a for a in set_a if a not in merged], *set_b]
        tokens_out.append(torch.stack([total[i] / weight[i] if i in total else x[b, i]
                                       for i in order]))
        sizes_out.append(torch.stack([weight[i] if i in weight else size[b, i] for i in order]))
    return torch.stack(tokens_out), torch.stack(sizes_out)


def keys_with_shared_targets(batch: int, tokens: int, num_prefix: int) -> torch.Tensor:
    """Random keys where every fourth patch (all A tokens) nearly repeats the first B patch's
    key, so several A tokens merge into one B token (distinct scores: no ties to break)."""
    keys = torch.randn(batch, tokens, 4, dtype=torch.float64)
    if tokens > num_prefix + 1:
        shared = keys[:, num_prefix + 1:num_prefix + 2]
        rows = keys[:, num_prefix::4]
        keys[:, num_prefix::4] = shared + 1e-3 * torch.randn_like(rows)
    return keys


@pytest.mark.parametrize("batch,tokens,num_prefix,r", [(1, 5, 1, 1), (3, 17, 1, 4),
                                                         (2, 18, 0, 3), (2, 65, 2, 8),
                                                         (2, 9, 1, 100), (1, 2, 1, 1)])
def test_merge_tokens_equals_the_token_by_token_merge(batch, tokens, num_prefix, r):
    torch.manual_seed(tokens)
    x = torch.randn(batch, tokens, 6, dtype=torch.float64)
    size = torch.randint(1, 5, (batch, tokens, 1)).double()
    keys = keys_with_shared_targets(batch, tokens, num_prefix)
    new_x, new_size = merge_tokens(x, size, keys, r, num_prefix)
    expected_x, expected_size = reference_merge(x, size, keys, r, num_prefix)
    assert torch.equal(new_size, expected_size)
    torch.testing.assert_close(new_x, expected_x, rtol=0, atol=1e-12)


def test_bf16_merges_round_once():
    """In bf16 a merged token is its float64 average rounded once: within half a bf16 step
    (2^-9 relative, 2^-8 with the average's own float32 rounding) of the exact value."""
    torch.manual_seed(4)
    x = torch.randn(4, 65, 64).bfloat16()
    size = torch.randint(1, 9, (4, 65, 1)).bfloat16()
    keys = keys_with_shared_targets(4, 65, 1)
    new_x, new_size = merge_tokens(x, size, keys, 16, 1)
    expected_x, expected_size = merge_tokens(x.double(), size.double(), keys, 16, 1)
    assert torch.equal(new_size.double(), expected_size)
    torch.testing.assert_close(new_x.double(), expected_x, rtol=2**-8, atol=0)


def test_identical_tokens_are_merged_by_a_block_into_one_of_size_two():
    torch.manual_seed(1)
    block = Block(32, 4, 64).eval()
    x = torch.randn(2, 9, 32)
    x[:, 2] = x[:, 1]  # patches 0 and 1 (A and B) are identical, so are their keys
    with torch.no_grad():
        plain, _ = block(x)
        block.__class__ = MergingBlock
        block.merge_r, block.num_prefix = 1, 1
        merged, size, _ = block.forward_merging(x, None)
    assert merged.shape == (2, 8, 32)
    # the merged pair sits in B (after prefix + 3 unmerged A tokens) with size 2
    assert size[:, :, 0].tolist() == [[1, 1, 1, 1, 2, 1, 1, 1]] * 2
    torch.testing.assert_close(merged[:, 4], plain[:, 1], rtol=0, atol=1e-5)
    # every other token is the plain block's output (the merge happens after the attention)
    torch.testing.assert_close(merged[:, 0], plain[:, 0], rtol=0, atol=1e-5)
    torch.testing.assert_close(merged[:, 1:4], plain[:, [3, 5, 7]], rtol=0, atol=1e-5)
    torch.testing.assert_close(merged[:, 5:], plain[:, [4, 6, 8]], rtol=0, atol=1e-5)


@pytest.mark.parametrize("explicit", [False, True], ids=["sdpa", "explicit"])
def test_proportional_attention_on_a_merged_pair_equals_the_duplicate_pair(explicit):
    """ToMe's exactness property: a token of size 2 draws the attention of two copies."""
    torch.manual_seed(2)
    attn = Block(32, 4, 64).attn.eval()
    tokens = torch.randn(2, 5, 32)
    duplicated = torch.cat([tokens[:, :2], tokens[:, 1:2], tokens[:, 2:]], dim=1)  # a, a
    size = torch.tensor([1.0, 2.0, 1.0, 1.0, 1.0]).view(1, 5, 1).expand(2, -1, -1)
    with torch.no_grad():
        out_dup, _, _ = attend_with_sizes(attn, duplicated, None, explicit)
        out_merged, _, weights = attend_with_sizes(attn, tokens, size, explicit)
        out_unweighted, _, _ = attend_with_sizes(attn, tokens, None, explicit)
    torch.testing.assert_close(out_merged, out_dup[:, [0, 1, 3, 4, 5]], rtol=0, atol=1e-6)
    assert (out_unweighted - out_merged).abs().max() > 1e-3  # the log(size) term matters
    if explicit:
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 5))


def test_the_explicit_and_sdpa_paths_agree_with_sizes():
    model = apply_token_merging(small_model(), 2)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        fused = model(images)
        explicit, _ = model(images, return_attention=True)
    torch.testing.assert_close(explicit, fused, rtol=0, atol=1e-5)


def test_the_token_count_falls_by_r_per_layer_and_sizes_add_up():
    model = apply_token_merging(small_model(depth=4), 2)  # 17 tokens
    with torch.no_grad():
        tokens, attentions = model.forward_features(torch.randn(2, 3, 32, 32),
                                                    return_attention=True)
    assert [a.shape[-1] for a in attentions] == [17, 15, 13, 11]  # before each layer's merge
    assert tokens.shape == (2, 17 - 4 * 2, 32)
    sizes = model.token_sizes[:, :, 0]
    assert sizes[:, 0].tolist() == [1.0, 1.0]  # the class token is never merged
    assert sizes[:, 1:].sum(dim=1).tolist() == [16.0, 16.0]  # every patch counted once


def test_a_large_r_is_clipped_so_the_prefix_and_one_token_remain():
    model = apply_token_merging(small_model(depth=6), 1000)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        logits = model(images)
        model.forward_features(images)
    assert model.token_sizes.shape[1] == 2  # class token + one token of size 16
    assert model.token_sizes[:, 1, 0].tolist() == [16.0, 16.0]
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("pool", ["mean_patches", "mean_all_tokens"])
def test_mean_pooled_models_pool_with_a_size_weighted_mean(pool):
    model = apply_token_merging(small_model(pool=pool, final_norm="pooled"), 3)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        logits = model(images)
        tokens = model.forward_features(images)
        start = 1 if pool == "mean_patches" else 0
        size = model.token_sizes[:, start:]
        pooled = (tokens[:, start:] * size).sum(1) / size.sum(1)
        expected = model.head(model.fc_norm(pooled))
        unweighted = model.head(model.fc_norm(tokens[:, start:].mean(1)))
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-6)
    assert (logits - unweighted).abs().max() > 1e-6


def test_merging_works_with_a_dynamic_image_size():
    model = small_model()
    model.set_dynamic_img_size()
    apply_token_merging(model, 2)
    images = torch.randn(1, 3, 48, 40)  # 6x5 = 30 patches
    with torch.no_grad():
        assert model(images).shape == (1, 5)
        assert model.forward_features(images).shape[1] == 31 - 4 * 2
    assert model.token_sizes.shape[1] == 31 - 4 * 2 and model.token_sizes.sum() == 31


@pytest.mark.parametrize("r", [-1, 1.5, "2"])
def test_a_bad_r_is_refused_with_the_fix(r):
    model = small_model()
    with pytest.raises(ConfigError) as info:
        apply_token_merging(model, r)
    message = str(info.value)
    for part in ("tokens to merge", repr(r), "integer >= 0", "use 0"):
        assert part in message, message
    assert apply_token_merging(model, 0) is model  # the advice works
    assert type(model) is VisionTransformer


def test_a_non_vitkit_model_is_refused():
    with pytest.raises(ConfigError) as info:
        apply_token_merging(torch.nn.Linear(2, 2), 1)
    message = str(info.value)
    for part in ("VisionTransformer", "Linear", "vitkit.create_model"):
        assert part in message, message


def test_the_merge_schedule_is_the_token_count_each_layer_keeps():
    """`merge_schedule` gives `forward_flops` the tokens a merging model keeps per layer: the
    same counts the model itself ends with, and r=0 counts as the plain model."""
    from vitkit.inference.merging import merge_schedule
    from vitkit.summary import forward_flops, token_count

    model = apply_token_merging(small_model(), 3)
    tokens = token_count(model.config)
    assert tokens == 17
    assert merge_schedule(model.config, 3, tokens) == [14, 11, 8, 5]
    assert merge_schedule(model.config, 8, tokens) == [9, 5, 3, 2]  # clipped to half the patches
    assert merge_schedule(model.config, 0, tokens) == [17] * 4
    with torch.no_grad():
        assert model.forward_features(torch.zeros(1, 3, 32, 32)).shape[1] == 5
    assert forward_flops(model.config, tokens_per_layer=[17] * 4) == forward_flops(model.config)
    merged = forward_flops(model.config, tokens_per_layer=merge_schedule(model.config, 3, 17))
    assert merged < forward_flops(model.config)
    with pytest.raises(ConfigError) as info:
        forward_flops(model.config, tokens_per_layer=[17, 17, 17])
    for part in ("token schedule", "3 layers", "4"):
        assert part in str(info.value), str(info.value)


@pytest.mark.parametrize("r", [2, 3])
def test_the_class_token_shortcut_with_merging_equals_the_full_forward(r):
    """forward runs the last merging block for the class token alone (proportional attention
    over the merged tokens): the logits of the full path (every token through every block),
    in float64; it takes the shortcut, and a hook on the last block turns it off."""
    model = apply_token_merging(small_model().double(), r)
    images = torch.randn(3, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        full = model.forward_head(model.forward_features(images))
        assert model.pools_class_token_only()
        assert (model(images) - full).abs().max().item() < 1e-12
        calls = []
        model.blocks[-1].mlp.register_forward_hook(lambda m, i, o: calls.append(o.shape[1]))
        assert not model.pools_class_token_only()
        assert (model(images) - full).abs().max().item() < 1e-12
    assert calls == [17 - 4 * r]  # the hooked MLP saw every token left, not one


def test_the_shortcut_with_merging_skips_the_last_blocks_other_tokens():
    """Which tokens the last block's MLP runs: the class token alone with the class-token
    pool; every merged token with a mean pool (no shortcut)."""
    seen = []
    for pool in ("class_token", "mean_patches"):
        model = apply_token_merging(small_model(pool=pool), 2)
        mlp = model.blocks[-1].mlp
        original = mlp.forward
        mlp.forward = lambda x, original=original: seen.append(x.shape[1]) or original(x)
        with torch.no_grad():
            model(torch.randn(2, 3, 32, 32))
    assert seen == [1, 17 - 4 * 2]


def test_a_one_block_merging_model_takes_the_shortcut_with_no_sizes_yet():
    model = apply_token_merging(small_model(depth=1).double(), 2)
    images = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        full = model.forward_head(model.forward_features(images))
        assert (model(images) - full).abs().max().item() < 1e-12
    assert model.token_sizes is None  # no block merged before the last one


def test_merge_tokens_exports_to_onnx_with_several_merges_into_one_token(tmp_path):
    """The merge as ONNX: onnxruntime gives the same tokens and sizes when several A tokens
    merge into one B token (every one of them is added in, not only one)."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")

    class Merge(torch.nn.Module):
        def forward(self, x, size, keys):
            return merge_tokens(x, size, keys, 8, 1)

    torch.manual_seed(5)
    x, size = torch.randn(3, 33, 6), torch.randint(1, 5, (3, 33, 1)).float()
    keys = keys_with_shared_targets(3, 33, 1).float()
    path = tmp_path / "merge.onnx"
    torch.onnx.export(Merge(), (x, size, keys), str(path), dynamo=False,
                      input_names=["x", "size", "keys"])
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got_x, got_size = session.run(None, {"x": x.numpy(), "size": size.numpy(),
                                         "keys": keys.numpy()})
    expected_x, expected_size = merge_tokens(x, size, keys, 8, 1)
    assert (expected_size > 2).any()  # some B token took more than one A token
    assert torch.equal(torch.from_numpy(got_size), expected_size)
    torch.testing.assert_close(torch.from_numpy(got_x), expected_x, rtol=0, atol=1e-5)


def test_merging_under_bf16_autocast_keeps_the_sums_in_float32():
    """Autocast (CUDA's bf16 path) must not round the merged sums: the sizes stay whole and
    add up, and the size-weighted sum of the tokens is kept to float32's rounding."""
    torch.manual_seed(6)
    x = torch.randn(2, 65, 32)
    size = torch.randint(100, 200, (2, 65, 1)).float()  # sizes above 256 once merged
    keys = keys_with_shared_targets(2, 65, 1).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        new_x, new_size = merge_tokens(x, size, keys, 16, 1)
    assert new_x.dtype == torch.float32 and (new_size > 256).any()
    assert torch.equal(new_size.sum(dim=1), size.sum(dim=1))
    torch.testing.assert_close((new_x * new_size).sum(dim=1), (x * size).sum(dim=1),
                               rtol=0, atol=0.05)
