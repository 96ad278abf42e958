"""Titles built from long paths stay inside their figures: paths are cut to their ends behind
"…" ("…/parent/name.png"), lines are wrapped, and no first letters fall off the left edge.
Each figure is caught as it is saved and each title's rendered box is measured (Agg)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.figure
import pytest
import torch

from vitkit.analysis import figures, plots

LONG = "/data/" + "/".join(f"experiment_{i:02d}_run" for i in range(12)) + "/best.pt"
assert len(LONG) >= 200


Box = tuple[str, float, float, float, float]  # text, x0, x1, y0, y1 in pixels


def boxes(fig: matplotlib.figure.Figure) -> list[Box]:
    """Each title's text and rendered box (fig.texts and the axes titles)."""
    renderer = fig.canvas.get_renderer()
    shown = [text for text in [*fig.texts, *(ax.title for ax in fig.axes)] if text.get_text()]
    return [(text.get_text(), *(lambda b: (b.x0, b.x1, b.y0, b.y1))(
        text.get_window_extent(renderer))) for text in shown]


@pytest.fixture
def saved(monkeypatch) -> list[tuple[matplotlib.figure.Figure, list[Box]]]:
    """The figures saved while the test runs, each with its titles' boxes measured as it was
    saved (closing it takes its renderer)."""
    caught = []
    savefig = matplotlib.figure.Figure.savefig

    def keep(fig, *args, **kwargs):
        result = savefig(fig, *args, **kwargs)
        caught.append((fig, boxes(fig)))
        return result

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    return caught


def assert_inside(fig: matplotlib.figure.Figure, measured: list[Box], wanted: str) -> None:
    assert any(wanted in text.replace("\n", " ") for text, *_ in measured), \
        f"no title holds {wanted!r}: {[text for text, *_ in measured]}"
    width, height = fig.bbox.width, fig.bbox.height
    for text, x0, x1, y0, y1 in measured:
        assert x0 >= 0 and x1 <= width and y0 >= 0 and y1 <= height, (text, x0, x1, width)


def draw_each(path, tmp_path):
    """Every figure of figures.py and plots.py titled with `path`."""
    title = f"{path}: attention rollout from the class token"
    images, maps = torch.randint(0, 255, (2, 3, 16, 16), dtype=torch.uint8), torch.rand(2, 4, 4)
    figures.plot_rollout(images, maps, tmp_path / "r.png", [f"{path} -> cat (90%)"] * 2, title)
    figures.plot_head_maps(images[0], torch.rand(2, 3, 4, 4), tmp_path / "h.png", title)
    figures.plot_mean_distance(torch.rand(2, 3) * 10, tmp_path / "d.png", 5.0, title, images=2)
    figures.plot_position_similarity(torch.rand(4, 4, 4, 4), tmp_path / "p.png", title)
    figures.plot_filter_components(torch.rand(7, 3, 4, 4), tmp_path / "f.png", [0.1] * 7, title)
    history = [{"epoch": e, "train_loss": 1.0, "test_loss": 1.0, "minutes": e, "top1": 0.5}
               for e in (1, 2)]
    plots.plot_learning_curve(history, tmp_path / "l.png", title)
    plots.plot_confusion(torch.eye(3, dtype=torch.long), ["a", "b", "c"], tmp_path / "c.png",
                         f"{path} test: top-1 90%")
    plots.plot_fewshot([1, 5], {"m": ([0.5, 0.6], [0.0, 0.0])}, tmp_path / "s.png",
                       f"{path}: few-shot linear")


def test_a_200_character_path_in_a_title_stays_inside_every_figure(saved, tmp_path):
    draw_each(LONG, tmp_path)
    assert len(saved) == 8
    for fig, measured in saved:
        assert_inside(fig, measured, "/best.pt")  # the path's end, which names the file
        assert any("\u2026/" in text for text, *_ in measured)


def test_a_title_that_fits_is_left_as_it_is(saved, tmp_path):
    figures.plot_mean_distance(torch.rand(2, 3), tmp_path / "d.png", title="runs/a/best.pt")
    assert saved[0][0].axes[0].get_title() == "runs/a/best.pt"


def test_a_long_word_without_separators_keeps_its_end(saved, tmp_path):
    word = "x" * 150 + "_END"
    figures.plot_position_similarity(torch.rand(3, 3, 3, 3), tmp_path / "p.png", word)
    fig, measured = saved[0]
    title = fig.axes[0].get_title()
    assert title.startswith("\u2026") and title.endswith("_END")
    assert_inside(fig, measured, "_END")
