"""compile=true: compiled training steps match eager ones, train end to end from the CLI
(through a resolution schedule, one compile per size), save plain state-dict keys, and the
time budget counts compilation. Two real compiles on tiny models (tens of seconds on CPU)."""

from __future__ import annotations

import copy
import json
import time

import pytest
import torch
import torch.nn.functional as F

import vitkit.runtime as runtime
import vitkit.train.compiling as compiling
from vitkit import load_pretrained
from vitkit.cli import main
from vitkit.config import ViTConfig
from vitkit.errors import ConfigError
from vitkit.model.vit import VisionTransformer
from vitkit.train.checkpoint import load_state as load_checkpoint
from vitkit.train.config import load_train_config
from vitkit.train.loop import run_loop
from vitkit.train.setup import build_run

TINY = ["model.width=16", "model.depth=1", "model.num_heads=2", "model.mlp_dim=32",
        "progress=false"]


def test_a_compiled_training_step_gives_the_eager_loss_and_gradients():
    torch.manual_seed(0)
    config = ViTConfig(img_size=8, patch_size=2, in_chans=1, width=16, depth=2, num_heads=2,
                       mlp_dim=32, num_classes=10, dropout=0.0)
    eager = VisionTransformer(config)
    compiled_module = copy.deepcopy(eager)
    compiled = compiling.compile_for_training(compiled_module, torch.device("cpu"))
    images, labels = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    losses = []
    for model in (eager, compiled):
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        losses.append(loss.detach())
    # Fused kernels reorder float sums: agreement to float32 rounding, not bit for bit.
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    grads = dict(compiled_module.named_parameters())
    for name, param in eager.named_parameters():
        torch.testing.assert_close(grads[name].grad, param.grad, rtol=1e-4, atol=1e-6,
                                   msg=lambda m, n=name: f"{n}: {m}")
    assert not any(k.startswith("_orig_mod") for k in compiled_module.state_dict())


def test_compile_true_trains_from_the_cli_through_a_resolution_schedule(tmp_path):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    out = tmp_path / "run"
    assert main(["train", "digits", *TINY, "compile=true", "total_steps=6", "batch_size=32",
                 "resolution_schedule=[[0, 4], [0.5, 8]]", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 6 and rows[-1]["resolution"] == 8
    # the compile seconds are wall time of the run: inside its elapsed minutes
    assert 0 < rows[-1]["compile_s"] <= rows[-1]["minutes"] * 60
    # two sizes, two compiles of the training graph (no endless recompiling)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 2 * 2
    state = load_checkpoint(out / "last.pt")
    assert not any("_orig_mod" in key for key in state["model"])  # plain keys
    model = load_pretrained(out / "last.pt")
    assert model.config.img_size == (8, 8)
    # and the run resumes (eagerly here) from the compiled run's checkpoint
    assert main(["train", "--resume", str(out / "last.pt"), "compile=false",
                 "total_steps=7"]) == 0
    assert load_checkpoint(out / "last.pt")["position"]["step"] == 7


def test_the_time_budget_counts_compilation(tmp_path, monkeypatch):
    """A stand-in for torch.compile whose first call takes 1.5 s (as compiling does): with a
    1 s budget the run stops after that first step, and the metrics show why."""

    def slow_first_call(model, device):
        calls = []

        def forward(images):
            if not calls:
                calls.append(1)
                time.sleep(1.5)
            return model(images)
        return forward

    monkeypatch.setattr("vitkit.train.step.compile_for_training", slow_first_call)
    cfg = load_train_config("digits", [*TINY, "compile=true", "time_budget=1", "epochs=50",
                                       f"out_dir={tmp_path}"])
    result = run_loop(build_run(cfg))
    assert result.stopped_early == "time budget"
    assert result.position.step == 1
    assert result.final["compile_s"] >= 1.5 > cfg.time_budget


def test_compile_without_a_c_compiler_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime.shutil, "which", lambda name: None)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError, match="compile=false") as error:
        compiling.compile_for_training(model, torch.device("cpu"))
    assert "g++" in str(error.value)
    # following the advice: compile=false trains here without a C compiler
    cfg = load_train_config("digits", [*TINY, "compile=false", "total_steps=1",
                                       f"out_dir={tmp_path}"])
    assert run_loop(build_run(cfg)).position.step == 1


def test_resizing_keeps_adamw_second_moments_non_negative(tmp_path):
    """Moving to a larger grid, AdamW's second moments of the position embedding stay
    non-negative (bicubic resampling overshoots below zero, and their square root would be
    NaN), so the steps at the new size stay finite."""
    cfg = load_train_config("digits", [*TINY, "total_steps=6", "batch_size=32",
                                       "resolution_schedule=[[0, 4], [0.5, 8]]",
                                       f"out_dir={tmp_path}"])
    trainer = build_run(cfg)
    result = run_loop(trainer)
    assert result.position.step == 6 and trainer.model.config.img_size == (8, 8)
    assert min(trainer.optimizer.state[trainer.model.pos_embed]["exp_avg_sq"].flatten()) >= 0
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_inference_compile_gives_the_eager_output_in_fp32_and_bf16():
    """`vitkit benchmark --compile` (compile_for_inference, frozen weights) against eager: to
    float32 rounding, and under bf16 autocast to bf16 rounding (fused kernels round
    differently from eager ones)."""
    from vitkit.inference.compiled import compile_for_inference

    torch._dynamo.reset()
    torch.manual_seed(0)
    config = ViTConfig(img_size=8, patch_size=2, in_chans=1, width=32, depth=2, num_heads=2,
                       mlp_dim=64, num_classes=10)
    model = VisionTransformer(config).eval()
    torch.nn.init.normal_(model.head.weight, std=0.2)  # a zero head would hide any difference
    compiled = compile_for_inference(model, torch.device("cpu"))
    images = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        eager = model(images)
        torch.testing.assert_close(compiled(images), eager, rtol=1e-4, atol=1e-5)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            eager_bf16, compiled_bf16 = model(images), compiled(images)
    torch.testing.assert_close(compiled_bf16.float(), eager_bf16.float(), rtol=0.05,
                               atol=0.05)
    assert (compiled_bf16.float() - eager).abs().max() < 0.1  # bf16, not some other output


def test_benchmark_compile_runs_frozen_and_without_a_compiler_says_drop_it(capsys, monkeypatch):
    torch._dynamo.reset()
    fast = ["--batch-size", "2", "--warmup", "0", "--iters", "2", "--json"]
    assert main(["benchmark", "cifar10-tutorial", "--compile", *fast]) == 0
    result = json.loads(capsys.readouterr().out)
    assert "torch.compile, frozen weights" in result["engine"] and result["images_per_s"] > 0
    monkeypatch.setattr(runtime.shutil, "which", lambda name: None)
    assert main(["benchmark", "cifar10-tutorial", "--compile", *fast]) != 0
    err = capsys.readouterr().err
    assert "drop --compile" in err and "g++" in err
    assert main(["benchmark", "cifar10-tutorial", *fast]) == 0  # the advice, followed
    assert json.loads(capsys.readouterr().out)["images_per_s"] > 0
