"""`t2t-tutorial`: the regression ViT of the walkthrough built on the Tokens-to-Token ViT code,
pinned against its parameter count and its sinusoid table."""

import numpy as np
import torch

from vitkit import count_parameters, create_model
from vitkit.catalog import model_rows
from vitkit.cli import main
from vitkit.tasks import task_of


def _walkthrough_parameter_count() -> int:
    """The walkthrough's ViT_Model, layer by layer (the sinusoid table is a fixed buffer)."""
    width, mlp, depth, patch, chans = 768, 3072, 12, 50, 1
    patch_embed = chans * patch * patch * width + width  # Conv2d(1, 768, 50, stride 50)
    class_token = width
    layer_norm = 2 * width
    block = (2 * layer_norm
             + width * 3 * width  # qkv, no bias
             + width * width + width  # proj
             + width * mlp + mlp + mlp * width + width)  # MLP fc1, fc2
    head = width * 1 + 1  # one regression output
    return patch_embed + class_token + depth * block + layer_norm + head


def _get_sinusoid_encoding(n_position: int, d_hid: int) -> np.ndarray:
    """T2T-ViT's table: angle = pos / 10000^(2 * (j // 2) / d_hid); sin on even columns,
    cos on odd ones; float32 as torch.FloatTensor makes it."""
    table = np.array([[pos / np.power(10000, 2 * (j // 2) / d_hid) for j in range(d_hid)]
                      for pos in range(n_position)])
    table[:, 0::2] = np.sin(table[:, 0::2])
    table[:, 1::2] = np.cos(table[:, 1::2])
    return table.astype(np.float32)


def test_t2t_tutorial_has_the_walkthroughs_86_950_657_parameters():
    assert _walkthrough_parameter_count() == 86_950_657
    assert count_parameters("t2t-tutorial") == 86_950_657
    model = create_model("t2t-tutorial", device="meta")
    config = model.config
    assert (config.img_size, config.in_chans, config.patch_size) == ((400, 100), 1, 50)
    assert (config.width, config.depth, config.num_heads, config.mlp_dim) == (768, 12, 1, 3072)
    assert not config.qkv_bias and config.class_token and config.final_norm == "tokens"
    assert config.num_classes == 1 and config.init == "trunc_normal"
    # the table is a buffer, not a parameter
    assert not any("pos_embed" in name for name, _ in model.named_parameters())


def test_t2t_tutorial_sinusoid_table_is_the_walkthroughs():
    model = create_model("t2t-tutorial")
    table = model.pos_embed[0].numpy()
    assert table.shape == (8 * 2 + 1, 768)  # 400/50 x 100/50 patches and the class token
    expected = _get_sinusoid_encoding(8 * 2 + 1, 768)
    assert np.abs(table - expected).max() == 0.0


def test_t2t_tutorial_is_a_regression_model_of_one_channel():
    model = create_model("t2t-tutorial").eval()
    task = task_of(model)
    assert task.kind == "regression"
    with torch.no_grad():
        out = model(torch.rand(2, 1, 400, 100))  # the walkthrough's input: floats in [0, 1]
    assert out.shape == (2, 1)
    assert task.describe(out)[0]["values"] == [float(out[0, 0])]
    # other names stay classification models
    assert task_of(create_model("cifar10-tutorial")).kind == "classification"


def test_t2t_tutorial_is_listed_by_vitkit_models(capsys):
    rows = {row.name: row for row in model_rows()}
    assert rows["t2t-tutorial"].params == 86_950_657
    assert main(["models"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines()
                if line.startswith("t2t-tutorial"))
    assert line.split() == ["t2t-tutorial", "12", "768", "3072", "1", "400x100", "86,950,657"]
