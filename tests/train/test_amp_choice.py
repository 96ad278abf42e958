"""bf16 on a CPU that has AVX512-BF16 but no AMX is measured, not assumed: the same flag
can run bf16 slower or faster than fp32 (benchmarks/README.md). amp=auto times a bf16 matmul
once per machine (remembered), the ranks of a run agree, and a resume keeps the precision its
run chose. Asked for bf16 there, `--precision bf16` and `amp=bf16` run it and say it is likely
slower, naming the setting that decides by the machine.
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
SLOW, FAST = 0.55, 4.3  # a bf16 matmul's speed-up over fp32: slower, faster


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


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
    says(chosen.reason, "width 192", f"{speedup:.{2 if expected == 'fp32' else 1}f}x")
    assert measured == [192]
    # remembered for this machine: another run (or a resume) decides alike without timing
    again = training_precision("auto", CPU, 192)
    assert again == chosen and measured == [192]
    assert "bf16-matmul" in (cache_root() / "precision.json").read_text()


@pytest.mark.parametrize(("width", "rows"), [(768, 1024), (128, 8192), (16, 65536)])
def test_the_matmul_is_sized_to_about_a_gflop(monkeypatch, width, rows):
    """The timed matmul is sized to about a GFLOP (a smaller one times too noisily), capped
    for very narrow models, and leaves the global random state as it was."""
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
    says(caplog.text, "0.55x fp32", "AVX512-BF16 without AMX", "likely slower", "amp=auto")
    # the advice: amp=auto trains this model in fp32 here
    assert amp_dtype("auto", CPU, 192) is None


def test_precision_bf16_and_auto_say_what_the_matmul_measured(monkeypatch):
    model = vitkit.create_model({"img_size": [16, 16], "patch_size": 4, "width": 32,
                                 "depth": 1, "num_heads": 2, "mlp_dim": 64,
                                 "num_classes": 3}).eval()
    _matmul_measures(monkeypatch, SLOW)
    asked = choose_precision("bf16", CPU, model)
    assert asked.name == "bf16"
    says(asked.reason, "width 32", "0.55x fp32", "--precision auto")
    auto = choose_precision("auto", CPU)  # no model to time: the rule alone
    assert auto.name == "fp32"
    says(auto.reason, "no fast bf16", "width 768", "0.55x fp32", "AVX512-BF16 without AMX")
    assert choose_precision("auto", CPU, model).name == "fp32"  # the advice: auto measures
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
    says(caplog.text, "precision bf16", "amp=auto", "as the run trained before this resume")
    says(caplog.text, "trained in bf16", "resume is exact", "width 128", "0.55x fp32",
         "likely slower", "amp=off")
    seen = _autocast_seen(resumed)
    run_loop(resumed)
    assert seen == {True}
    # a new run on the same settings measures, and trains in fp32
    fresh = build_run(load_train_config("digits", [*WIDE, f"out_dir={tmp_path / 'new'}"]))
    assert fresh.amp_dtype is None and measured == [128]  # measured once, then remembered
    # the warning's advice: amp=off trains on in fp32
    cfg = load_train_config("digits", [*WIDE, "epochs=3", "amp=off", f"out_dir={tmp_path}"])
    assert build_run(cfg, resume=tmp_path).amp_dtype is None
