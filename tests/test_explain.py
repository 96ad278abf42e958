"""`vitkit explain` and the analyses behind it: attention rollout, mean attention distance,
position-embedding similarity, filter components, figures and the command line."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit import create_model, save_pretrained
from vitkit.analysis.attention import (
    attention_rollout,
    attention_weights,
    discard_weakest,
    fuse_heads,
    map_source,
    output_token_map,
)
from vitkit.analysis.distance import mean_attention_distance, uniform_attention_distance
from vitkit.analysis.explain import FILES, explain
from vitkit.analysis.filters import filter_components, pixel_filters, to_display
from vitkit.analysis.posembed import cosine_similarity_grid, position_similarity
from vitkit.cli import main
from vitkit.errors import ConfigError
from vitkit.model.posembed import sincos_2d


def _layers(*matrices: list[list[float]]) -> list[torch.Tensor]:
    """One (B=1, heads=1, T, T) attention per matrix."""
    return [torch.tensor(m, dtype=torch.float64)[None, None] for m in matrices]


# -- rollout ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
def test_rollout_of_identity_attention_is_the_identity(fusion):
    eye = torch.eye(5).expand(2, 3, 5, 5)
    rollout = attention_rollout([eye] * 4, fusion, num_prefix_tokens=1)
    assert torch.allclose(rollout, torch.eye(5).expand(2, 5, 5))


def test_rollout_of_two_layers_equals_the_hand_computed_product():
    # Layer 1: both tokens attend to token 0 -> (A + I) renormalised = [[1, 0], [.5, .5]].
    # Layer 2: both attend to token 1        -> [[.5, .5], [0, 1]].
    # Rollout = layer 2 @ layer 1 (first layer first); the other order gives [[.5,.5],[.25,.75]].
    rollout = attention_rollout(_layers([[1, 0], [1, 0]], [[0, 1], [0, 1]]))
    assert torch.allclose(rollout[0], torch.tensor([[0.75, 0.25], [0.5, 0.5]]))


@pytest.mark.parametrize("fusion, expected", [
    ("mean", [[1.6 / 2, 0.4 / 2], [0.4 / 2, 1.6 / 2]]),
    ("max", [[1.9 / 2.6, 0.7 / 2.6], [0.6 / 2.4, 1.8 / 2.4]]),
    ("min", [[1.3 / 1.4, 0.1 / 1.4], [0.2 / 1.6, 1.4 / 1.6]]),
])
def test_head_fusion_picks_the_right_head_per_entry(fusion, expected):
    heads = torch.tensor([[[0.9, 0.1], [0.2, 0.8]], [[0.3, 0.7], [0.6, 0.4]]])[None]
    rollout = attention_rollout([heads], fusion)
    assert torch.allclose(rollout[0], torch.tensor(expected), atol=1e-6)


def test_head_fusion_refuses_unknown_names():
    with pytest.raises(ConfigError, match="mean, max, min"):
        fuse_heads(torch.rand(1, 2, 3, 3), "median")


FUSED = torch.tensor([[[0.05, 0.50, 0.45], [0.01, 0.60, 0.39], [0.02, 0.08, 0.90]]])


def test_discard_ratio_zeroes_the_weakest_entries_but_never_the_class_column():
    # 6 entries outside the class token's column; half of them (.08, .39, .45) go, although
    # the class column holds the three smallest values.
    kept = discard_weakest(FUSED, 0.5, num_prefix_tokens=1)
    assert torch.equal(kept, torch.tensor([[[0.05, 0.50, 0.0], [0.01, 0.60, 0.0],
                                            [0.02, 0.0, 0.90]]]))
    # Without a class token all 9 entries compete: int(4.5) = 4 smallest go.
    kept = discard_weakest(FUSED, 0.5, num_prefix_tokens=0)
    assert torch.equal(kept, torch.tensor([[[0.0, 0.50, 0.45], [0.0, 0.60, 0.39],
                                            [0.0, 0.0, 0.90]]]))


def test_rollout_with_discarding_renormalises_the_kept_entries():
    rollout = attention_rollout([FUSED[:, None]], discard_ratio=0.5, num_prefix_tokens=1)
    kept = torch.tensor([[1.05, 0.50, 0.0], [0.01, 1.60, 0.0], [0.02, 0.0, 1.90]])
    assert torch.allclose(rollout[0], kept / kept.sum(1, keepdim=True))


def test_output_map_is_the_class_row_or_the_mean_of_the_patch_rows_on_a_non_square_grid():
    rollout = torch.arange(49, dtype=torch.float32).reshape(1, 7, 7)  # 1 class + 2x3 patches
    cls_map = output_token_map(rollout, 1, (2, 3))
    assert torch.equal(cls_map[0], torch.tensor([[1.0, 2, 3], [4, 5, 6]]))
    mean_map = output_token_map(rollout, 1, (2, 3), "mean_of_tokens")
    assert torch.equal(mean_map[0], rollout[0, 1:, 1:].mean(0).reshape(2, 3))
    assert output_token_map(rollout[:, 1:, 1:], 0, (2, 3)).shape == (1, 2, 3)  # no class token


def test_map_source_follows_the_pooling():
    assert map_source(create_model("Ti/16", img_size=32).config) == "class_token"
    gap = create_model("Ti/16", img_size=32, class_token=False, pool="mean_patches")
    assert map_source(gap.config) == "mean_of_tokens"


# -- mean attention distance --------------------------------------------------------------------
def _analytic_uniform_distance(rows: int, cols: int, patch: int) -> float:
    """Mean distance between all pairs of patch centres, by an explicit double loop."""
    cells = list(itertools.product(range(rows), range(cols)))
    total = sum(math.dist(a, b) for a in cells for b in cells)
    return patch * total / len(cells) ** 2


@pytest.mark.parametrize("prefix", [0, 1])
def test_mean_distance_of_identity_attention_is_zero(prefix):
    eye = torch.eye(prefix + 12).expand(2, 3, -1, -1)
    distances = mean_attention_distance([eye, eye], (3, 4), 16, prefix)
    assert distances.shape == (2, 3)
    assert torch.equal(distances, torch.zeros(2, 3))


def test_mean_distance_of_uniform_attention_is_the_mean_pairwise_distance():
    grid, patch = (3, 5), 16
    uniform = torch.full((2, 4, 15, 15), 1 / 15)
    expected = _analytic_uniform_distance(*grid, patch)
    distances = mean_attention_distance([uniform] * 3, grid, patch)
    assert torch.allclose(distances, torch.full((3, 4), expected))
    assert uniform_attention_distance(grid, patch) == pytest.approx(expected)


def test_the_class_token_row_and_column_are_left_out_of_the_distance():
    # Half of each patch's attention goes to the class token, the rest uniformly to patches;
    # the class token's own row is arbitrary. Only the patch-to-patch part counts.
    grid, patch, n = (4, 2), 8, 8
    attention = torch.zeros(1, 2, n + 1, n + 1)
    attention[..., 1:, 0] = 0.5
    attention[..., 1:, 1:] = 0.5 / n
    attention[..., 0, :] = torch.rand(n + 1)
    distances = mean_attention_distance([attention], grid, patch, num_prefix_tokens=1)
    assert torch.allclose(distances, torch.full((1, 2), _analytic_uniform_distance(4, 2, 8)))


def test_attending_to_the_next_patch_is_one_patch_size_away():
    attention = torch.zeros(1, 1, 5, 5)
    for query in range(5):
        attention[0, 0, query, query + 1 if query < 4 else 3] = 1.0
    assert mean_attention_distance([attention], (1, 5), 14).item() == pytest.approx(14.0)


# -- position embeddings -------------------------------------------------------------------------
def test_sincos_similarity_falls_with_distance_along_a_row_from_the_corner():
    similarity = cosine_similarity_grid(sincos_2d((14, 14), 768), (14, 14))  # ViT-B/16
    assert similarity.shape == (14, 14, 14, 14)
    assert torch.allclose(similarity[3, 5, 3, 5], torch.tensor(1.0))
    assert (similarity[0, 0, 0].diff() < 0).all()  # along the first row
    assert (similarity[0, 0, :, 0].diff() < 0).all()  # down the first column


@pytest.mark.parametrize("grid, width", [((8, 8), 128), ((6, 10), 32), ((14, 14), 768)])
def test_sincos_neighbours_are_more_similar_than_far_patches(grid, width):
    similarity = cosine_similarity_grid(sincos_2d(grid, width), grid)
    for i, j in [(0, 0), (grid[0] // 2, grid[1] // 2), (grid[0] - 1, 1)]:
        tile = similarity[i, j]
        rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]),
                                    indexing="ij")
        far = ((rows - i) ** 2 + (cols - j) ** 2) >= 9
        neighbours = [tile[a, b] for a, b in [(i - 1, j), (i + 1, j), (i, j - 1), (i, j + 1)]
                      if 0 <= a < grid[0] and 0 <= b < grid[1]]
        assert min(neighbours) > tile[far].max()


def test_position_similarity_reads_learned_embeddings_and_refuses_models_without():
    model = create_model("Ti/8", img_size=(16, 24), class_token=True)
    with torch.no_grad():
        model.pos_embed.normal_()
    similarity = position_similarity(model)
    patches = model.pos_embed[0, 1:]
    expected = torch.nn.functional.cosine_similarity(patches[4], patches[1], dim=0)
    assert similarity.shape == (2, 3, 2, 3)
    assert similarity[1, 1, 0, 1].item() == pytest.approx(expected.item(), abs=1e-5)
    with pytest.raises(ConfigError, match="no position embeddings"):
        position_similarity(create_model("Ti/8", img_size=16, pos_embed="none"))


# -- filters -------------------------------------------------------------------------------------
def test_pca_of_filters_recovers_known_components_up_to_sign():
    generator = torch.Generator().manual_seed(3)
    axes, _ = torch.linalg.qr(torch.randn(48, 3, generator=generator, dtype=torch.float64))
    coefficients = torch.randn(64, 3, generator=generator, dtype=torch.float64)
    coefficients, _ = torch.linalg.qr(coefficients - coefficients.mean(0))  # centred, orthogonal
    scales = torch.tensor([10.0, 5.0, 2.0], dtype=torch.float64)
    filters = (coefficients * scales) @ axes.T + torch.randn(48, generator=generator,
                                                             dtype=torch.float64)
    result = filter_components(filters.reshape(64, 3, 4, 4).float(), count=28)
    assert result.components.shape == (3, 3, 4, 4)  # rank 3 < 28
    found = result.components.reshape(3, 48).double()
    cosines = (found * axes.T).sum(1).abs()
    assert torch.allclose(cosines, torch.ones(3, dtype=torch.float64), atol=1e-4)
    assert torch.allclose(result.explained_variance_ratio.double(),
                          scales**2 / (scales**2).sum(), atol=1e-5)
    shown = to_display(result.components)
    assert shown.amin() == 0 and shown.amax() == 1


def test_pixel_filters_name_the_layer_they_come_from():
    filters, source = pixel_filters(create_model("Ti/4", img_size=16, width=32, num_heads=4))
    assert filters.shape == (32, 3, 4, 4) and "patch_embed.proj" in source
    stem = create_model("Ti/4", img_size=16, width=32, num_heads=4, stem="conv",
                        stem_channels=(8, 16, 32))
    filters, source = pixel_filters(stem)
    assert filters.shape == (8, 3, 3, 3) and "3x3 conv" in source


# -- figures and explain() ----------------------------------------------------------------------
def _png_pixels(path: str | Path) -> np.ndarray:
    with Image.open(path) as image:
        assert image.format == "PNG"
        return np.asarray(image.convert("RGB"))


def _tiny_model(**overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    options = {"img_size": (24, 40), "width": 48, "depth": 2, "num_heads": 3, "mlp_dim": 96,
               "num_classes": 5, "init": "trunc_normal", **overrides}
    model = create_model("Ti/8", **options).eval()
    if isinstance(model.pos_embed, torch.nn.Parameter):  # learned positions start at zero
        with torch.no_grad():
            model.pos_embed.normal_(0, 0.5)
    return model


def test_explain_writes_every_figure_at_its_size_and_not_blank(tmp_path):
    model = _tiny_model()  # 24x40 images, 3x5 patch grid, 2 layers, 3 heads
    images = torch.randint(0, 256, (2, 3, 24, 40), dtype=torch.uint8)
    report = explain(model, images, tmp_path, names=["a", "b"])
    sizes = {"rollout": (480, 2 * 160 + 40), "heads": (4 * 120, 2 * 120 + 40),
             "distance": (500, 400), "positions": (650, 600), "filters": (630, 4 * 105 + 40)}
    assert set(report["files"]) == set(FILES)
    for key, (width, height) in sizes.items():
        pixels = _png_pixels(tmp_path / report["files"][key])
        assert pixels.shape[:2] == (height, width), key
        assert pixels.std() > 20, f"{key} looks blank"
        assert (tmp_path / report["files"][key]).stat().st_size < 300_000
    saved = json.loads((tmp_path / "explain.json").read_text())
    assert saved["rollout"]["map_source"] == "class_token"
    assert np.array(saved["rollout"]["maps"]).shape == (2, 3, 5)
    assert np.array(saved["mean_attention_distance_px"]["per_head"]).shape == (2, 3)
    assert saved["filters"]["components"] == 28 and "patch_embed.proj" in saved["filters"]["source"]


def test_explain_does_not_change_the_fused_forward_and_matches_its_logits():
    model = _tiny_model()
    images = torch.randn(2, 3, 24, 40)
    logits, attentions = attention_weights(model, images)
    assert len(attentions) == 2 and attentions[0].shape == (2, 3, 16, 16)
    assert torch.allclose(logits, model(images), atol=1e-5)


def test_explain_without_position_embeddings_skips_that_figure(tmp_path):
    model = _tiny_model(pos_embed="none", class_token=False, pool="mean_patches")
    report = explain(model, torch.randint(0, 256, (1, 3, 24, 40), dtype=torch.uint8), tmp_path)
    assert "positions" not in report["files"]
    assert "no position embeddings" in report["position_embedding"]["skipped"]
    assert report["rollout"]["map_source"] == "mean_of_tokens"


# -- command line ---------------------------------------------------------------------------------
def _png(path: Path, size: tuple[int, int], seed: int) -> Path:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def test_cli_explains_a_saved_model_on_non_square_image_files(tmp_path, capsys):
    weights = save_pretrained(_tiny_model(), tmp_path / "weights",
                              class_names=["a", "b", "c", "d", "e"])
    files = [_png(tmp_path / "wide.png", (70, 30), 1), _png(tmp_path / "tall.png", (20, 50), 2)]
    out = tmp_path / "out"
    assert main(["explain", str(weights), *map(str, files), "--out", str(out),
                 "--head-fusion", "max", "--discard-ratio", "0.5"]) == 0
    assert "mean attention distance per layer" in capsys.readouterr().out
    report = json.loads((out / "explain.json").read_text())
    assert len(report["images"]) == 2 and report["images"][0].startswith(str(files[0]))
    assert report["rollout"]["head_fusion"] == "max"
    assert report["rollout"]["discard_ratio"] == 0.5
    assert report["model"]["img_size"] == [24, 40]
    for name in FILES.values():
        assert (out / name).stat().st_size > 0


def test_cli_without_images_or_data_says_to_pass_images(tmp_path, capsys):
    weights = save_pretrained(_tiny_model(), tmp_path / "weights")
    assert main(["explain", str(weights), "--out", str(tmp_path / "out")]) == 2
    assert "pass image files" in capsys.readouterr().err


def test_cli_explains_a_training_checkpoint_on_its_own_test_data(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "digits", "total_steps=3", "train_limit=128", "test_limit=32",
                 "progress=false", "model.class_token=false", "model.pool=mean_patches",
                 "--out", str(run)]) == 0
    out = tmp_path / "out"
    assert main(["explain", str(run / "last.pt"), "--out", str(out), "--num-images", "3"]) == 0
    report = json.loads((out / "explain.json").read_text())
    assert report["rollout"]["map_source"] == "mean_of_tokens"
    assert len(report["images"]) == 3 and report["images"][0].startswith("digits test #0")
    assert report["model"]["grid"] == [4, 4]
    assert len(report["mean_attention_distance_px"]["per_layer"]) == 4


def test_cli_explains_an_official_npz_hybrid_with_its_root_filters(tmp_path):
    from vitkit.weights.npz import save_npz

    torch.manual_seed(0)
    model = create_model("Ti/16", img_size=32, stem="resnet", resnet_layers=(1,),
                         resnet_width=32, width=48, depth=1, num_heads=3, mlp_dim=96,
                         num_classes=4)
    path = save_npz(model, tmp_path / "R-Ti_16.npz")
    out = tmp_path / "out"
    assert main(["explain", str(path), str(_png(tmp_path / "x.png", (48, 40), 3)),
                 "--out", str(out)]) == 0
    report = json.loads((out / "explain.json").read_text())
    assert "7x7 root conv" in report["filters"]["source"]
    assert report["model"]["stem"] == "resnet" and report["model"]["grid"] == [2, 2]
    assert _png_pixels(out / FILES["filters"]).std() > 20
