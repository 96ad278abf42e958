"""examples/beyond_classification.py runs as documented, in small: both sets are written, both
tasks train and evaluate through the CLI, and the tables hold every row, with baselines that
behave as their definitions say (the training mean scores R^2 ~ 0; label frequency scores mAP =
the positives' share)."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "beyond_classification.py"


def test_the_example_prints_both_tables_against_its_baselines(tmp_path: Path) -> None:
    out = tmp_path / "beyond"
    result = subprocess.run([sys.executable, str(EXAMPLE), "--epochs", "1", "--train", "256",
                             "--test", "128", "--out", str(out)], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout
    assert "avx" in text.splitlines()[0] or "instruction sets" in text.splitlines()[0]
    for row in ("ViT (vitkit)", "predict the training mean", "ridge on pixels",
                "label frequency"):
        assert row in text
    mean_r2 = float(re.search(r"predict the training mean\s+(-?[\d.]+)", text).group(1))
    assert abs(mean_r2) < 0.05
    with np.load(out / "shapes" / "test.npz") as data:
        share = data["targets"].mean()
    frequency_map = float(re.search(r"label frequency\s+([\d.]+)", text).group(1))
    assert abs(frequency_map - share) < 0.02
    for run in ("fields_vit", "shapes_vit"):
        assert (out / run / "best.pt").is_file() and (out / run / "eval" / "eval.json").is_file()
