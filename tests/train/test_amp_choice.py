"""bf16 on a CPU that has AVX512-BF16 but no AMX: measured, not assumed.

An Emerald Rapids Xeon that shows `avx512_bf16` and no AMX flags ran a bf16 matmul at 0.5x
fp32 and the width-192 training step at 0.55x (benchmarks/README.md), where a Zen 4
EPYC with the same flag runs it 1.5-1.7x faster. amp=auto measures such a CPU once (remembered
per machine), the ranks of a run agree, and a resume keeps the precision its run chose.
Asked for bf16 there, `--precision bf16` and `amp=bf16` run it and say it is likely slower.
"""

from __future__ import annotations

import logging

import pytest
import torch

import vitkit
from vitkit.files import cache_root
from vitkit.inference import cpu_probes
from vitkit.inference.precision import choose_precision
from vitkit.train import setup as train_setup
from vitkit.train.amp import training_precision
from vitkit.train.checkpoint import read_checkpoint
from vitkit.train.config import load_train_config
from vitkit.train.loop import run_loop
from vitkit.train.setup import amp_dtype, build_run

CPU = torch.device("cpu")
AVX512_BF16 = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni"})
SLOW, FAST = 0.55, 4.3  # a bf16 matmul on the Emerald Rapids Xeon without AMX, on a Zen 4


def _matmul_measures(monkeypatch, speedup: float) -> list[int]:
    """This CPU shows AVX512-BF16 without AMX and its bf16 matmul measures `speedup`; the
    widths measured are listed in the list returned."""
    measured: list[int] = []
    (cache_root() / "precision.json").unlink(missing_ok=True)  # nothing remembered
    monkeypatch.setattr(cpu_probes, "cpu_model_and_flags", lambda: ("Xeon (mock)", AVX512_BF16))
    monkeypatch.setattr(cpu_probes, "_bf16_matmul_speedup",
                        lambda width: measured.append(width) or speedup)
    return measured


@pytest.mark.parametrize(("speedup", "expected"), [(SLOW, "fp32"), (1.2, "fp32"),
                                                   (FAST, "bf16")])
def test_amp_auto_trains_in_bf16_only_where_the_matmul_measures_faster(monkeypatch, speedup,
                                                                         expected):
    measured = _matmul_measures(monkeypatch, speedup)
    chosen = training_precision("auto", CPU, 192)
    assert chosen.name == expected, chosen.reason
    assert f"a bf16 matmul at width 192 measured {speedup:.{2 if expected == 'fp32' else 1}f}x" \
        in chosen.reason
    assert measured == [192]
    # remembered for this machine: another run (or a resume) decides alike without timing
    again = training_precision("auto", CPU, 192)
    assert again == chosen and measured == [192]
    assert "bf16-matmul" in (cache_root() / "precision.json").read_text()


@pytest.mark.parametrize(("width", "rows"), [(768, 1024), (128, 8192), (16, 65536)])
def test_the_matmul_is_sized_to_about_a_gflop(monkeypatch, width, rows):
    """At 1,024 rows a width-128 matmul is 0.13 GFLOP and measured 0.51-0.98x between three
    calls on one machine; it is sized to about a GFLOP, capped for very narrow models."""
    shapes: list[tuple[int, ...]] = []
    randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *size, **kwargs: shapes.append(size)
                        or randn(*size, **kwargs))
    state = torch.get_rng_state()
    speedup = cpu_probes._bf16_matmul_speedup(width)
    assert shapes == [(rows, width), (width, 4 * width)]
    assert 0 < speedup < 100  # measured on this CPU
    # its own generator: a resume that measures leaves the restored random state as it is
    assert torch.equal(torch.get_rng_state(), state)


def test_amp_bf16_where_it_measures_slower_trains_in_bf16_and_says_so(monkeypatch, caplog):
    _matmul_measures(monkeypatch, SLOW)
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert amp_dtype("bf16", CPU, 192) == torch.bfloat16
    assert "measured 0.55x fp32 on this CPU (AVX512-BF16 without AMX), so bf16 is likely " \
           "slower: amp=auto decides by the machine" in caplog.text
    # the advice: amp=auto trains this model in fp32 here
    assert amp_dtype("auto", CPU, 192) is None


def test_precision_bf16_and_auto_say_what_the_matmul_measured(monkeypatch):
    model = vitkit.create_model({"img_size": [16, 16], "patch_size": 4, "width": 32,
                                 "depth": 1, "num_heads": 2, "mlp_dim": 64,
                                 "num_classes": 3}).eval()
    _matmul_measures(monkeypatch, SLOW)
    asked = choose_precision("bf16", CPU, model)
    assert asked.name == "bf16"
    assert "a bf16 matmul at width 32 measured 0.55x fp32" in asked.reason
    assert "--precision auto chooses by measuring" in asked.reason
    auto = choose_precision("auto", CPU)  # no model to time: the rule alone
    assert auto.name == "fp32"
    assert auto.reason == ("no fast bf16 on this CPU: a bf16 matmul at width 768 measured 0.55x "
                           "fp32 on this CPU (AVX512-BF16 without AMX)")
    _matmul_measures(monkeypatch, FAST)
    assert choose_precision("bf16", CPU, model).reason == "asked"
    assert choose_precision("auto", CPU).name == "bf16"


def test_the_ranks_train_in_bf16_only_when_every_rank_chose_it(monkeypatch):
    _matmul_measures(monkeypatch, FAST)
    info = train_setup.DistInfo(rank=1, world_size=2, local_rank=1)
    asked: list[int] = []
    monkeypatch.setattr(train_setup, "min_over_ranks",
                        lambda value, info: asked.append(value) or 0)  # rank 0 chose fp32
    assert amp_dtype("auto", CPU, 192, info=info) is None
    assert asked == [1]
    _matmul_measures(monkeypatch, SLOW)  # a rank that chose fp32 takes part in the vote too
    assert amp_dtype("auto", CPU, 192, info=info) is None
    assert asked == [1, 0]


WIDE = ["epochs=1", "warmup_epochs=0", "train_limit=64", "test_limit=32", "model.width=128",
        "model.depth=1", "model.num_heads=2", "model.mlp_dim=128", "model.patch_size=4",
        "progress=false"]


def _autocast_seen(built) -> set[bool]:
    seen: set[bool] = set()
    built.model.register_forward_hook(
        lambda module, args, output: seen.add(torch.is_autocast_enabled("cpu")))
    return seen


def test_a_resume_keeps_the_precision_its_run_chose(monkeypatch, tmp_path, caplog):
    """Exact resuming: a run that chose bf16 continues in bf16 even where the matmul now
    measures slower (another process on the cores, the cache gone)."""
    _matmul_measures(monkeypatch, FAST)
    first = build_run(load_train_config("digits", [*WIDE, f"out_dir={tmp_path}"]))
    assert first.amp_dtype == torch.bfloat16
    run_loop(first)
    assert read_checkpoint(tmp_path).trained_as == {"precision": "bf16", "device": "cpu"}

    measured = _matmul_measures(monkeypatch, SLOW)  # the cache gone, the matmul slower
    cfg = load_train_config("digits", [*WIDE, "epochs=2", f"out_dir={tmp_path}"])
    with caplog.at_level(logging.INFO, logger="vitkit"):
        resumed = build_run(cfg, resume=tmp_path)
    assert "precision bf16 (amp=auto: bf16, as the run trained before this resume)" in caplog.text
    assert "warning: this run trained in bf16, which continues so the resume is exact, but a " \
        "bf16 matmul at width 128 measured 0.55x fp32 on this CPU (AVX512-BF16 without AMX), " \
        "so bf16 is likely slower; amp=off trains on in fp32" in caplog.text
    seen = _autocast_seen(resumed)
    run_loop(resumed)
    assert seen == {True}
    # a new run on the same settings measures, and trains in fp32
    fresh = build_run(load_train_config("digits", [*WIDE, f"out_dir={tmp_path / 'new'}"]))
    assert fresh.amp_dtype is None and measured == [128]  # measured once, then remembered
    # the warning's advice: amp=off trains on in fp32
    cfg = load_train_config("digits", [*WIDE, "epochs=3", "amp=off", f"out_dir={tmp_path}"])
    assert build_run(cfg, resume=tmp_path).amp_dtype is None
