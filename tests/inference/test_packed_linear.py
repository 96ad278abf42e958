"""bf16 linears prepacked for oneDNN (`vitkit.inference.packed_linear`): the bf16 copy that
`--precision bf16` runs on the CPU gives the unpacked copy's outputs, with token merging, the
class-token shortcut and a deep copy; a copy to be compiled stays unpacked (inductor packs it
itself). Speed is measured in benchmarks/inference.py, not here."""

import copy

import pytest
import torch

import vitkit
from vitkit.inference.bf16 import bf16_copy
from vitkit.inference.merging import apply_token_merging
from vitkit.inference.packed_linear import PackedLinear, prepacking_available
from vitkit.inference.precision import Precision, apply_precision

pytestmark = pytest.mark.skipif(not prepacking_available(),
                                reason="oneDNN runs no bf16 linear on this CPU")
CPU = torch.device("cpu")


def model_with_head() -> torch.nn.Module:
    model = vitkit.create_model({"img_size": [32, 32], "patch_size": 4, "width": 64, "depth": 2,
                                 "num_heads": 4, "mlp_dim": 128, "num_classes": 5}).eval()
    torch.nn.init.normal_(model.head.weight, std=0.2)  # a zero head would hide any difference
    return model


def relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    return ((out.double() - reference.double()).norm() / reference.double().norm()).item()


@pytest.mark.parametrize("shape", [(8, 65, 64), (3, 1, 64), (5, 64)])
def test_a_packed_linear_computes_the_linear_layer_in_bf16(shape: tuple[int, ...]) -> None:
    """Against float64 on the same bf16 numbers: bf16 output rounding only (a few 1e-3), for
    token batches, a single token (the shortcut's) and flat rows; strided input too."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96).bfloat16()
    packed = PackedLinear.from_linear(linear)
    x = torch.randn(*shape).bfloat16()
    reference = torch.nn.functional.linear(x.double(), linear.weight.double(),
                                           linear.bias.double())
    with torch.no_grad():
        assert relative_error(packed(x), reference) < 5e-3
        strided = torch.randn(*shape[:-1], 128).bfloat16()[..., ::2]
        reference = torch.nn.functional.linear(strided.double(), linear.weight.double(),
                                               linear.bias.double())
        assert relative_error(packed(strided), reference) < 5e-3
    assert packed(x).dtype == torch.bfloat16 and packed(x).shape == (*shape[:-1], 96)
    assert torch.equal(packed.weight, linear.weight)  # the plain weight, unpacked again
    assert (packed.in_features, packed.out_features) == (64, 96)


@pytest.mark.parametrize("rows", [1, 7, 520])
def test_a_layout_packed_for_a_row_count_serves_every_row_count(rows: int) -> None:
    """`rows_hint` only picks oneDNN's layout: packed for 7 or 520 rows, the layer answers
    every row count as the default packing does (the same bf16 arithmetic, other blocking),
    and a deep copy keeps the hint."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96).bfloat16()
    default = PackedLinear.from_linear(linear)
    hinted = PackedLinear(linear.weight, linear.bias, rows_hint=rows)
    x = torch.randn(rows, 64).bfloat16()
    other = torch.randn(33, 64).bfloat16()
    with torch.no_grad():
        for batch in (x, other):
            reference = torch.nn.functional.linear(batch.double(), linear.weight.double(),
                                                   linear.bias.double())
            assert relative_error(hinted(batch), reference) < 5e-3
            assert relative_error(hinted(batch), default(batch)) < 5e-3
    copied = copy.deepcopy(hinted)
    assert copied.rows_hint == rows
    with torch.no_grad():
        assert torch.equal(copied(other), hinted(other))


@pytest.mark.parametrize("merge", [0, 3])
def test_the_bf16_copy_is_packed_and_answers_as_the_unpacked_copy(merge: int) -> None:
    model, batch = apply_token_merging(model_with_head(), merge), torch.randn(4, 3, 32, 32)
    packed, unpacked = bf16_copy(model), bf16_copy(model, prepack=False)
    linears = [m for m in packed.modules() if isinstance(m, PackedLinear)]
    assert len(linears) == 2 * 4  # qkv, proj, fc1, fc2 per block
    assert [m for m in packed.modules() if type(m) is torch.nn.Linear] == [packed.head]
    assert packed.head.weight.dtype == torch.float32  # the classifier stays float32
    with torch.inference_mode():
        out, expected, fp32 = packed(batch), unpacked(batch), model(batch)
    assert out.dtype == torch.float32
    assert relative_error(out, expected) < 1e-2  # the same bf16 arithmetic, other kernels
    assert relative_error(out, fp32) < 3e-2  # and bf16's own cost against fp32


def test_a_deep_copy_of_a_packed_model_packs_again() -> None:
    """oneDNN's packed tensors have no storage to copy (a plain deepcopy raises)."""
    packed, batch = bf16_copy(model_with_head()), torch.randn(2, 3, 32, 32)
    copied = copy.deepcopy(packed)
    assert copied.blocks[0].attn.qkv.packed is not packed.blocks[0].attn.qkv.packed
    with torch.inference_mode():
        assert torch.equal(copied(batch), packed(batch))


def test_precision_bf16_runs_packed_and_a_compiled_copy_unpacked() -> None:
    model = model_with_head()
    eager, _ = apply_precision(model, Precision("bf16", "asked"), CPU)
    to_compile, _ = apply_precision(model, Precision("bf16", "asked"), CPU, compiled=True)
    assert isinstance(eager.blocks[0].mlp.fc1, PackedLinear)
    assert type(to_compile.blocks[0].mlp.fc1) is torch.nn.Linear
    assert to_compile.blocks[0].mlp.fc1.weight.dtype == torch.bfloat16
