"""`vitkit explain` and the analyses behind it: attention rollout, mean attention distance,
position-embedding similarity, filter components, figures and the command line."""

from __future__ import annotations

import itertools
import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.text import Text
from PIL import Image

from vitkit import create_model, save_pretrained
from vitkit.analysis import figures
from vitkit.analysis.attention import (
    attention_rollout,
    attention_weights,
    discard_weakest,
    fuse_heads,
    map_source,
    output_token_map,
)
from vitkit.analysis.distance import (
    PAPER_IMAGES,
    mean_attention_distance,
    uniform_attention_distance,
)
from vitkit.analysis.explain import FILES, explain
from vitkit.analysis.filters import filter_components, fix_signs, pixel_filters, to_display
from vitkit.analysis.inputs import stratified_indices
from vitkit.analysis.position_similarity import cosine_similarity_grid, position_similarity
from vitkit.cli import main
from vitkit.errors import ConfigError
from vitkit.model.posembed import sincos_2d


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


def _true_class(name: str) -> str:
    """The class in a sampled image's name, "data test #i: class -> prediction (p%)"."""
    return name.split(": ", 1)[1].split(" -> ")[0]


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
    """An unknown head fusion is refused, naming it and the fusions there are."""
    with pytest.raises(ConfigError) as info:
        fuse_heads(torch.rand(1, 2, 3, 3), "median")
    says(str(info.value), "median", "mean", "max", "min")


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


def _vit_explain_mask(layers: list[np.ndarray], head_fusion: str, discard_ratio: float,
                      rows_by_their_own_sums: bool = False) -> np.ndarray:
    """jacobgil/vit-explain's `rollout` (vit_rollout.py) restated in numpy for one image:
    fuse the heads, zero the weakest `discard_ratio` of all T x T entries except entry
    (0, 0), a = (A + I) / 2, then `a / a.sum(-1)`, which divides column j by the sum of
    row j; layers multiplied first layer first; the class token's row over the patches
    divided by its max. `rows_by_their_own_sums` swaps in vitkit's normalisation."""
    tokens = layers[0].shape[-1]
    result = np.eye(tokens)
    for heads in layers:
        fused = {"mean": heads.mean(0), "max": heads.max(0), "min": heads.min(0)}[head_fusion]
        flat = fused.copy().reshape(-1)
        weakest = np.argsort(flat, kind="stable")[:int(flat.size * discard_ratio)]
        flat[weakest[weakest != 0]] = 0
        a = (flat.reshape(tokens, tokens) + np.eye(tokens)) / 2
        a = a / a.sum(-1, keepdims=True) if rows_by_their_own_sums else a / a.sum(-1)
        result = a @ result
    mask = result[0, 1:]
    return mask / mask.max()


def test_rollout_equals_vit_explain_for_mean_fusion_and_differs_only_by_its_normalisation():
    # Sharp attention, as trained models have: max/min-fused rows sum far from 1.
    generator = torch.Generator().manual_seed(1)
    attentions = [torch.softmax(3 * torch.randn(1, 4, 16, 16, generator=generator), -1)
                  for _ in range(3)]
    layers = [a[0].double().numpy() for a in attentions]

    def ours(fusion: str) -> np.ndarray:
        row = attention_rollout(attentions, fusion, 0.0, num_prefix_tokens=1)[0, 0, 1:]
        return (row / row.max()).double().numpy()

    np.testing.assert_allclose(ours("mean"), _vit_explain_mask(layers, "mean", 0.0), atol=1e-6)
    for fusion in ("max", "min"):  # measured: 0.16 and 0.016 apart at most
        assert np.abs(ours(fusion) - _vit_explain_mask(layers, fusion, 0.0)).max() > 5e-3
        np.testing.assert_allclose(ours(fusion), _vit_explain_mask(layers, fusion, 0.0, True),
                                   atol=1e-6)
    # And on a model's own attention weights (mean fusion).
    _, attentions = attention_weights(_tiny_model(), torch.randn(1, 3, 24, 40))
    row = attention_rollout(attentions, "mean", 0.0, num_prefix_tokens=1)[0, 0, 1:]
    expected = _vit_explain_mask([a[0].double().numpy() for a in attentions], "mean", 0.0)
    np.testing.assert_allclose((row / row.max()).numpy(), expected, atol=1e-6)


def test_explain_json_states_the_conventions_and_when_they_match_vit_explain(tmp_path):
    model = _tiny_model()
    images = torch.randint(0, 256, (1, 3, 24, 40), dtype=torch.uint8)
    mean = explain(model, images, tmp_path / "mean")["conventions"]
    other = explain(model, images, tmp_path / "max", head_fusion="max", discard_ratio=0.5)
    assert mean["vit_explain"].startswith("equal to jacobgil/vit-explain")
    assert other["conventions"]["vit_explain"].startswith("differs")
    assert "divides column j by the sum of row j" in other["conventions"]["vit_explain"]
    assert "50% of the entries zeroed" in other["conventions"]["rollout"]
    assert "class token's column is never discarded" in mean["discard"]
    assert "T x (T - 1)" in mean["discard"]
    assert "renormalised to sum 1 over the patch keys" in mean["mean_attention_distance"]
    assert "largest-magnitude entry is positive" in mean["filter_sign"]
    assert "scaled per map" in mean["figures"]
    saved = json.loads((tmp_path / "max" / "explain.json").read_text())
    assert saved["conventions"] == other["conventions"]
    gap = _tiny_model(class_token=False, pool="mean_patches")
    gap_conventions = explain(gap, images, tmp_path / "gap")["conventions"]
    assert "all T x T entries" in gap_conventions["discard"]
    assert "mean of the patch tokens' rows" in gap_conventions["vit_explain"]


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


def _probing_vits_distance(attention: np.ndarray, side: int, patch: int) -> np.ndarray:
    """sayakpaul/probing-vits' compute_mean_attention_dist restated: drop the class token's
    row and column (no renormalisation), weight by the patch-centre distances of a square
    grid, sum over keys, mean over queries -> (batch, heads)."""
    count = side * side
    distance = np.zeros((count, count))
    for i, j in itertools.product(range(count), repeat=2):
        distance[i, j] = patch * math.hypot(i // side - j // side, i % side - j % side)
    return (attention[..., 1:, 1:] * distance).sum(-1).mean(-1)


def test_mean_distance_is_probing_vits_formula_on_rows_renormalised_over_the_patches():
    _, attentions = attention_weights(_tiny_model(img_size=(32, 32)), torch.randn(4, 3, 32, 32))
    ours = mean_attention_distance(attentions, (4, 4), 8, num_prefix_tokens=1).double().numpy()
    raw = [a.double().numpy() for a in attentions]
    theirs = np.stack([_probing_vits_distance(a, 4, 8).mean(0) for a in raw])
    assert (theirs < ours).all()  # the class token's share of each row counts as distance 0
    renormalised = []
    for a in raw:
        a = a.copy()
        a[..., 1:, 1:] /= a[..., 1:, 1:].sum(-1, keepdims=True)
        renormalised.append(_probing_vits_distance(a, 4, 8).mean(0))
    np.testing.assert_allclose(ours, np.stack(renormalised), rtol=1e-5)


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
    with pytest.raises(ConfigError) as info:
        position_similarity(create_model("Ti/8", img_size=16, pos_embed="none"))
    says(str(info.value), "no position embeddings", "pos_embed", "learned")


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


def test_filter_component_signs_do_not_depend_on_the_sign_the_svd_returns():
    generator = torch.Generator().manual_seed(5)
    components = torch.randn(6, 3, 4, 4, generator=generator)
    fixed = fix_signs(components)
    assert torch.equal(fixed, fix_signs(-components))
    flipped = components.clone()
    flipped[[1, 4]] *= -1  # any subset of components negated
    assert torch.equal(fix_signs(flipped), fixed)
    flat = fixed.reshape(6, -1)
    assert (flat.gather(1, flat.abs().argmax(1, keepdim=True)) > 0).all()
    filters = torch.randn(64, 3, 4, 4, generator=generator)
    assert torch.allclose(filter_components(filters).components,
                          filter_components(-filters).components, atol=1e-6)


def test_filter_components_equal_scikit_learns_pca_with_its_sign_convention():
    from sklearn.decomposition import PCA  # >= 1.5: largest-magnitude entry positive

    generator = torch.Generator().manual_seed(7)
    decay = torch.logspace(0, -2, 48, dtype=torch.float64)  # distinct variances
    basis, _ = torch.linalg.qr(torch.randn(48, 48, generator=generator, dtype=torch.float64))
    flat = (torch.randn(96, 48, generator=generator, dtype=torch.float64) * decay) @ basis.T
    result = filter_components(flat.reshape(96, 3, 4, 4), count=28)
    pca = PCA(n_components=28, svd_solver="full").fit(flat.numpy())
    np.testing.assert_allclose(result.components.reshape(28, 48).numpy(), pca.components_,
                               atol=1e-6)
    np.testing.assert_allclose(result.explained_variance_ratio.numpy(),
                               pca.explained_variance_ratio_, rtol=1e-5)


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
    sizes = {"rollout": (3 * 160 + 90, 70 + 2 * 180), "heads": (30 + 4 * 120 + 90, 70 + 2 * 120),
             "distance": (500, 400), "positions": (650, 600), "filters": (630, 4 * 105 + 50)}
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


@pytest.fixture
def drawn(monkeypatch) -> dict[str, dict[str, list]]:
    """Each figure saved, by file name: all its texts, and every title or label that
    overlaps a panel it does not belong to (colour bars count as panels)."""
    seen: dict[str, dict[str, list]] = {}
    save = figures._save

    def inspect_then_save(fig, path):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        labels = [(text, None) for text in fig.texts]
        labels += [(ax.title, ax) for ax in fig.axes if ax.get_title()]
        overlaps = [(text.get_text(), index) for text, owner in labels
                    for index, ax in enumerate(fig.axes) if ax is not owner and
                    text.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))]
        seen[Path(path).name] = {"texts": [t.get_text() for t in fig.findobj(Text)],
                                 "overlaps": overlaps}
        return save(fig, path)

    monkeypatch.setattr(figures, "_save", inspect_then_save)
    return seen


@pytest.mark.parametrize("size", [(24, 40), (32, 32)])  # wide and square tiles
def test_figures_state_fusion_discard_scale_and_image_count_with_no_label_over_a_panel(
        tmp_path, drawn, size):
    model = _tiny_model(img_size=size)  # 2 layers, 3 heads
    images = torch.randint(0, 256, (3, 3, *size), dtype=torch.uint8)
    explain(model, images, tmp_path, head_fusion="max", discard_ratio=0.25,
            names=["a", "b", "c"], show=2)
    rollout = drawn[FILES["rollout"]]["texts"]
    assert any("head fusion max, discard ratio 0.25" in text for text in rollout)
    assert {"image", "rollout map", "overlay", "rollout, scaled per map"} <= set(rollout)
    assert sum(text.startswith(("a -> ", "b -> ", "c -> ")) for text in rollout) == 2  # show=2
    heads = drawn[FILES["heads"]]["texts"]
    assert {"image", "head 1", "head 3", "layer 1", "layer 2",
            "attention, scaled per map"} <= set(heads)
    assert any("averaged over 3 images" in text for text in drawn[FILES["distance"]]["texts"])
    assert any("largest entry positive" in text for text in drawn[FILES["filters"]]["texts"])
    assert set(drawn) == set(FILES.values())
    for name, figure in drawn.items():
        assert figure["overlaps"] == [], name


def test_flat_kind_tells_all_zero_and_constant_maps_from_drawable_ones():
    assert figures.flat_kind(torch.zeros(3, 5)) == "all zero"
    assert figures.flat_kind(torch.full((3, 5), 0.2)) == "constant"
    assert figures.flat_kind(torch.rand(3, 5) + 0.1) is None
    assert figures.flat_kind(torch.tensor([[0.0, 1e-9]])) is None


def _class_token_keeps_to_itself(batch: int, heads: int, tokens: int) -> torch.Tensor:
    """The class token keeps 0.9 of its attention and spreads 0.1 unevenly over the patches;
    each patch gives 0.5 to the class token and 0.5 evenly to the patches."""
    attention = torch.zeros(batch, heads, tokens, tokens)
    attention[..., 1:, 0] = 0.5
    attention[..., 1:, 1:] = 0.5 / (tokens - 1)
    spread = torch.rand(batch, heads, tokens - 1, generator=torch.Generator().manual_seed(0))
    attention[..., 0, 1:] = 0.1 * (spread + 0.5) / (spread + 0.5).sum(-1, keepdim=True)
    attention[..., 0, 0] = 0.9
    return attention


def test_an_all_zero_rollout_map_is_logged_kept_in_the_json_and_marked_on_the_figure(
        tmp_path, drawn, monkeypatch, caplog):
    model = _tiny_model()  # 1 class token + 3x5 patches, 2 layers, 3 heads

    def crafted_attention(model, images):
        return model(images), [_class_token_keeps_to_itself(len(images), 3, 16)] * 2

    monkeypatch.setattr("vitkit.analysis.explain.attention_weights", crafted_attention)
    images = torch.randint(0, 256, (2, 3, 24, 40), dtype=torch.uint8)
    # Discarding 90% of the 240 non-class entries removes all 15 class-to-patch entries.
    with caplog.at_level(logging.WARNING, logger="vitkit.analysis.explain"):
        report = explain(model, images, tmp_path / "max", head_fusion="max", discard_ratio=0.9,
                         names=["first", "second"])
    assert len(report["warnings"]) == 1
    warning = report["warnings"][0]
    says(warning, "rollout map", "2 image(s)", "all zero", "first", "head fusion max",
         "discard ratio 0.9")
    assert warning in caplog.text
    assert json.loads((tmp_path / "max" / "explain.json").read_text())["warnings"] == [warning]
    assert drawn[FILES["rollout"]]["texts"].count("all zero") == 2
    # The warning advises mean head fusion with discard ratio 0; following it clears it.
    says(warning, "mean head fusion", "discard ratio 0")
    report = explain(model, images, tmp_path / "mean", names=["first", "second"])
    assert report["warnings"] == []
    assert "all zero" not in drawn[FILES["rollout"]]["texts"]
    assert np.array(report["rollout"]["maps"]).min() > 0


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
    """With no images and weights that name no data, explain exits 2 advising image files or
    --data; passing an image file, as advised, works."""
    weights = save_pretrained(_tiny_model(), tmp_path / "weights")
    assert main(["explain", str(weights), "--out", str(tmp_path / "out")]) == 2
    says(capsys.readouterr().err, "no images", "image files", "--data")
    image = _png(tmp_path / "a.png", (40, 24), 1)
    assert main(["explain", str(weights), str(image), "--out", str(tmp_path / "out")]) == 0


def test_cli_explains_a_training_checkpoint_on_its_own_test_data(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "digits", "total_steps=3", "train_limit=128", "test_limit=32",
                 "progress=false", "model.class_token=false", "model.pool=mean_patches",
                 "--out", str(run)]) == 0
    out = tmp_path / "out"
    assert main(["explain", str(run / "last.pt"), "--out", str(out), "--num-images", "3"]) == 0
    report = json.loads((out / "explain.json").read_text())
    assert report["rollout"]["map_source"] == "mean_of_tokens"
    assert len(report["images"]) == 3 and report["images"][0].startswith("digits test #")
    assert len({_true_class(name) for name in report["images"]}) == 3  # sampled across classes
    assert report["model"]["grid"] == [4, 4]
    assert len(report["mean_attention_distance_px"]["per_layer"]) == 4
    # Without --num-images the distance averages over the paper's 128 (digits has 359).
    assert main(["explain", str(run / "last.pt"), "--out", str(out)]) == 0
    report = json.loads((out / "explain.json").read_text())
    assert report["mean_attention_distance_px"]["images"] == PAPER_IMAGES == 128
    assert len(report["images"]) == 128 and report["rollout"]["images_shown"] == 8
    assert "128 image(s)" in capsys.readouterr().out


def test_cli_explains_an_official_npz_hybrid_with_its_root_filters(tmp_path):
    from vitkit.weights.formats.npz import save_npz

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


def test_stratified_sample_of_a_class_sorted_split_covers_min_of_count_and_classes():
    sizes = [7, 3, 12, 1, 9, 5, 5, 8, 2, 10]
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate(sizes)])  # sorted by class
    assert set(labels[:7].tolist()) == {0}  # the first N alone would cover one class
    for count in (1, 4, 10, 13, 40, 62, 100):
        chosen = stratified_indices(labels, count, seed=0)
        assert len(chosen) == min(count, len(labels)) == len(set(chosen.tolist()))
        classes = labels[chosen].tolist()
        assert len(set(classes[:10])) == len(set(classes)) == min(count, 10)
        for label, size in enumerate(sizes):
            assert classes.count(label) >= min(size, count // 10)
    assert torch.equal(stratified_indices(labels, 20, 1), stratified_indices(labels, 20, 1))
    assert not torch.equal(stratified_indices(labels, 20, 0), stratified_indices(labels, 20, 1))


def test_cli_samples_a_class_sorted_folder_across_classes_and_says_how_many(
        tmp_path, capsys, drawn):
    weights = save_pretrained(_tiny_model(), tmp_path / "weights", class_names=list("abcde"))
    data = tmp_path / "data"
    for split, count in (("train", 1), ("val", 4)):
        for label in "abcde":
            (data / split / label).mkdir(parents=True)
            for i in range(count):
                _png(data / split / label / f"{i}.png", (40, 24), ord(label) * 10 + i)
    out = tmp_path / "out"
    assert main(["explain", str(weights), "--data", "folder", "--data-dir", str(data),
                 "--num-images", "5", "--show", "3", "--out", str(out)]) == 0
    report = json.loads((out / "explain.json").read_text())
    assert {_true_class(name) for name in report["images"]} == set("abcde")
    assert report["rollout"]["images_shown"] == 3
    assert np.array(report["rollout"]["maps"]).shape == (3, 3, 5)
    # By default the paper's 128, here capped at the 20 test images there are.
    assert main(["explain", str(weights), "--data", "folder", "--data-dir", str(data),
                 "--out", str(out)]) == 0
    report = json.loads((out / "explain.json").read_text())
    assert report["mean_attention_distance_px"]["images"] == 20
    assert report["images_source"].startswith("20 test images sampled across classes")
    assert "128 asked" in report["images_source"]
    assert any("averaged over 20 images" in text for text in drawn[FILES["distance"]]["texts"])
    assert "over 20 image(s)" in capsys.readouterr().out


def test_sampled_test_images_of_a_streamed_folder_run_are_read_as_predict_reads_them(
        tmp_path, capsys):
    """A folder run with data_mode=stream records shorter side + centre crop: the test images
    `vitkit explain RUN` samples are fed exactly as `vitkit predict` feeds the same files (not
    squashed), and the labels explain reports equal predict's."""
    from vitkit import load_pretrained
    from vitkit.analysis.inputs import images_from_data
    from vitkit.catalog import read_weights
    from vitkit.data.image_decoder import open_image
    from vitkit.data.sources import open_source

    data = tmp_path / "data"
    for split, count in (("train", 2), ("val", 3)):
        for label in "abc":
            (data / split / label).mkdir(parents=True)
            for i in range(count):  # wide: the centre crop cuts off what a squash keeps
                _png(data / split / label / f"{i}.png", (48, 16), ord(label) * 10 + i)
    run = tmp_path / "run"
    assert main(["train", "digits", "data=folder", f"data_dir={data}", "data_mode=stream",
                 "model.num_classes=3", "batch_size=6", "warmup_epochs=0", "total_steps=3",
                 "progress=false", "--out", str(run)]) == 0
    preprocess = load_pretrained(run).preprocess
    assert preprocess.resize_mode == "shorter_side"

    images, names = images_from_data(None, None, 9, preprocess, read_weights(run).train_config)
    test = open_source("folder", str(data), mode="stream")[1]
    files = [Path(name.split("folder test ", 1)[1].split(": ")[0]) for name in names]
    assert len(set(files)) == 9 and all(f.is_file() for f in files)  # named by their paths
    assert {str(f) for f in files} <= {test.where(i) for i in range(len(test))}
    fed_by_predict = torch.stack([preprocess.to_uint8(open_image(f, 1)) for f in files])
    assert torch.equal(images, fed_by_predict)
    squash = preprocess.replace(resize_mode="squash", crop_pct=1.0)
    assert not torch.equal(images, torch.stack([squash.to_uint8(open_image(f, 1))
                                                for f in files]))

    out = tmp_path / "explain"
    assert main(["explain", str(run), "--out", str(out), "--num-images", "9"]) == 0
    capsys.readouterr()
    titles = json.loads((out / "explain.json").read_text())["images"]
    assert [title.split(" -> ")[0] for title in titles] == names
    assert main(["predict", str(run), *map(str, files), "--json", "--topk", "1"]) == 0
    predicted = [json.loads(line)["topk"][0] for line in capsys.readouterr().out.splitlines()]
    assert [title.split(" -> ")[1] for title in titles] == [
        f"{top['label']} ({100 * top['prob']:.0f}%)" for top in predicted]


# -- numerical edges of the analyses ----------------------------------------------------------

@pytest.mark.parametrize("share", [1e-6, 1e-13, 1e-20])
def test_mean_distance_renormalises_however_small_the_share_on_patches(share):
    """Every query puts all but `share` of its attention on the class token and `share` on
    the diagonally opposite patch of a 2x2 grid (patch 10 px): renormalised over the patch
    keys, as documented, each query looks 14.142 px away."""
    attention = torch.zeros(1, 1, 5, 5)
    attention[0, 0, :, 0] = 1.0
    attention[0, 0, 1:, 0] = 1 - share
    for query in range(4):
        attention[0, 0, 1 + query, 1 + (3 - query)] = share
    distance = mean_attention_distance([attention], (2, 2), 10, num_prefix_tokens=1)
    assert distance.item() == pytest.approx(200**0.5, rel=1e-6)


def test_a_query_with_no_attention_on_patches_is_left_out_of_the_mean():
    attention = torch.zeros(1, 1, 5, 5)
    attention[0, 0, :, 0] = 1.0  # every query on the class token only ...
    attention[0, 0, 1, 0], attention[0, 0, 1, 2] = 0.5, 0.5  # ... but patch 0: patch 1, 10 px
    distance = mean_attention_distance([attention], (2, 2), 10, num_prefix_tokens=1)
    assert distance.item() == pytest.approx(10.0)  # not 2.5 (three queries counted as 0 px)


def test_similarity_by_grid_distance_keys_each_exact_distance():
    """One entry per exact distance between two cells of the grid, keyed by it: 2 and
    sqrt(5) get separate keys, as do 2.83, 3 and 3.16."""
    from vitkit.analysis.position_similarity import similarity_by_distance

    rows, cols = 3, 4
    similarity = torch.rand(rows, cols, rows, cols, generator=torch.Generator().manual_seed(0))
    expected: dict[float, list[float]] = {}
    for (r1, c1), (r2, c2) in itertools.product(itertools.product(range(rows), range(cols)),
                                                repeat=2):
        expected.setdefault(math.hypot(r1 - r2, c1 - c2), []).append(
            similarity[r1, c1, r2, c2].item())
    table = similarity_by_distance(similarity)
    assert len(table) == len(expected)
    assert {"2", "2.23607", "2.82843", "3", "3.16228"} <= set(table)
    for d, values in expected.items():
        assert table[f"{d:.6g}"] == pytest.approx(np.mean(values), abs=5e-5)


def test_similarity_by_grid_distance_keeps_one_key_per_distance_on_large_grids():
    """On a 48x48 grid every distinct distance (e.g. sqrt(2740) and sqrt(2741)) has a key of
    its own: one key per distinct sum of squares."""
    from vitkit.analysis.position_similarity import similarity_by_distance

    side = 48
    squares = {a * a + b * b for a in range(side) for b in range(side)}
    table = similarity_by_distance(torch.zeros(side, side, side, side))
    assert len(table) == len(squares)


def test_explain_refuses_a_token_merging_model_naming_the_fix(tmp_path):
    from vitkit import apply_token_merging

    model = apply_token_merging(_tiny_model(), 2)
    images = torch.randint(0, 256, (1, 3, 24, 40), dtype=torch.uint8)
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as info:
        explain(model, images, out)
    says(str(info.value), "token merging", "apply_token_merging(model, 0)")
    assert not out.exists()
    report = explain(apply_token_merging(model, 0), images, out)  # as advised
    assert set(report["files"]) == set(FILES)


def test_explain_into_an_earlier_output_folder_leaves_no_stale_figure(tmp_path):
    images = torch.randint(0, 256, (1, 3, 24, 40), dtype=torch.uint8)
    explain(_tiny_model(), images, tmp_path)
    assert (tmp_path / FILES["positions"]).is_file()
    no_positions = _tiny_model(pos_embed="none", class_token=False, pool="mean_patches")
    report = explain(no_positions, images, tmp_path)
    assert "positions" not in report["files"]
    assert not (tmp_path / FILES["positions"]).exists()  # the other model's figure is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*report["files"].values(), "explain.json"])


@pytest.mark.parametrize("ratio", ["1.0", "-0.1", "nan"])
def test_cli_discard_ratio_outside_0_1_is_refused_at_the_flag(tmp_path, capsys, ratio):
    weights = save_pretrained(_tiny_model(), tmp_path / "weights")
    out = tmp_path / "out"
    image = _png(tmp_path / "a.png", (40, 24), 1)
    with pytest.raises(SystemExit) as exit_info:
        main(["explain", str(weights), str(image), "--out", str(out), "--discard-ratio", ratio])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    says(err, "--discard-ratio", ratio, *(["finite"] if ratio == "nan" else ["[0, 1)"]))
    assert not out.exists()
    assert main(["explain", str(weights), str(image), "--out", str(out),
                 "--discard-ratio", "0.5"]) == 0  # in [0, 1), as the message says


SMALL = ["data=arrays", "model.depth=1", "model.width=16", "model.num_heads=2",
         "model.mlp_dim=32", "model.patch_size=4", "model.img_size=8", "epochs=1",
         "batch_size=16", "warmup_epochs=0", "progress=false"]


def _arrays(root: Path, train_targets: np.ndarray, test_targets: np.ndarray | None = None,
            **extra) -> Path:
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    test_targets = train_targets if test_targets is None else test_targets
    for split, targets in (("train", train_targets), ("test", test_targets)):
        images = rng.random((len(targets), 8, 8), dtype=np.float32)
        np.savez(root / f"{split}.npz", images=images, targets=targets,
                 **(extra if split == "train" else {}))
    return root


def test_explain_names_classes_the_data_does_not_name(tmp_path: Path) -> None:
    data = _arrays(tmp_path / "d", (np.arange(32) % 3).astype(np.uint8))
    assert main(["train", *SMALL, f"data_dir={data}", "--out", str(tmp_path / "run")]) == 0
    assert main(["explain", str(tmp_path / "run"), "--num-images", "3",
                 "--out", str(tmp_path / "explained")]) == 0
    explained = json.loads((tmp_path / "explained" / "explain.json").read_text())
    shown = explained["images"]
    # "arrays test #11: class 2 -> class 1 (34%)": the true class, then the prediction
    assert {line.split(": ")[1].split(" -> ")[0] for line in shown} == \
        {"class 0", "class 1", "class 2"}
    for line, predicted in zip(shown, explained["predictions"], strict=True):
        top = predicted["top"][0]  # the JSON names the prediction as the title does
        assert top["label"] == f"class {top['index']}"
        assert line.split(" -> ")[1].startswith(f"{top['label']} (")
