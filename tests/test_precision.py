"""`--precision` per machine (`vitkit.inference.precision`): the rules for CUDA and the bf16
CPUs, the measured int8 choice (never slower than fp32 by its own timing), and its memory."""

import pytest
import torch

import vitkit
from vitkit.errors import ConfigError
from vitkit.inference import precision as precision_module
from vitkit.inference.precision import apply_precision, choose_precision, fast_bf16_cpu

CPU = torch.device("cpu")


def tiny() -> torch.nn.Module:
    return vitkit.create_model({"img_size": [16, 16], "patch_size": 4, "width": 32, "depth": 2,
                                "num_heads": 2, "mlp_dim": 64, "num_classes": 3}).eval()


def test_the_bf16_cpus_are_told_apart_by_their_flags() -> None:
    assert fast_bf16_cpu(frozenset({"avx2", "amx_bf16", "amx_tile"})) == "amx"
    assert fast_bf16_cpu(frozenset({"avx512f", "avx512_bf16"})) == "avx512_bf16"
    assert fast_bf16_cpu(frozenset({"avx2", "fma"})) is None


def test_auto_takes_bf16_on_amx_and_on_cuda_and_says_why() -> None:
    chosen = choose_precision("auto", CPU, flags=frozenset({"amx_bf16"}))
    assert chosen.name == "bf16" and "AMX" in chosen.describe()
    assert choose_precision("auto", torch.device("cuda")).name == "bf16"


def test_auto_without_fast_bf16_measures_and_remembers(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def measured(model, batch):
        calls.append(batch.shape)
        return 0.9  # int8 slower than fp32 here

    monkeypatch.setattr(precision_module, "_int8_speedup", measured)
    model, batch = tiny(), torch.randn(2, 3, 16, 16)
    first = choose_precision("auto", CPU, model, batch, flags=frozenset({"avx2"}))
    assert first.name == "fp32" and "0.90x" in first.reason
    again = choose_precision("auto", CPU, model, batch, flags=frozenset({"avx2"}))
    assert again.name == "fp32" and "measured before" in again.reason and len(calls) == 1
    monkeypatch.setattr(precision_module, "_int8_speedup", lambda model, batch: 2.0)
    other_batch = choose_precision("auto", CPU, model, torch.randn(4, 3, 16, 16),
                                   flags=frozenset({"avx2"}))
    assert other_batch.name == "int8" and "2.0x" in other_batch.reason


def test_each_precision_runs_the_model_close_to_fp32() -> None:
    model, batch = tiny(), torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        reference = model(batch)
        for name, tolerance in (("fp32", 0.0), ("bf16", 0.05), ("int8", 0.05)):
            runner, context = apply_precision(model, choose_precision(name, CPU), CPU)
            with context():
                out = runner(batch).float()
            assert (out - reference).abs().max().item() <= tolerance, name


def test_unknown_and_misplaced_precisions_are_refused() -> None:
    with pytest.raises(ConfigError, match="'fp16' is not one of fp32, bf16, int8, auto"):
        choose_precision("fp16", CPU)
    with pytest.raises(ConfigError, match="int8 is a CPU path"):
        choose_precision("int8", torch.device("cuda"))
