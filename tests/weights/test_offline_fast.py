"""Without a network and without HF_HUB_OFFLINE, Hub names fail at once with vitkit's advice
(no ~26 s of huggingface_hub retries first), and what is cached still loads.

The Hub stands at a local port nothing listens on (HF_ENDPOINT), so every connection is refused
the way an unplugged machine's are; the offline variables are unset, as on a machine where
nobody set them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from transformers import ViTConfig as HFViTConfig
from transformers import ViTForImageClassification

from vitkit.network import hub_unreachable

# start-up and import included. The retries alone took 26 s; a cached model took 12.8 s on a
# 2-core machine busy with other work, so the bar sits between the two.
FAST_S = 20


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again on leaving: connections are refused


def run_offline(args: list[str], home: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "VITKIT_OFFLINE")}
    env.update(HF_HOME=str(home), HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}")
    for name in ("HF_HUB_CACHE", "HF_DATASETS_CACHE"):
        env.pop(name, None)
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "vitkit.cli", *args], env=env,
                            capture_output=True, text=True, timeout=120)
    return result, time.perf_counter() - start


def test_the_probe_names_the_host_that_did_not_answer() -> None:
    port = closed_port()
    reason = hub_unreachable(f"http://127.0.0.1:{port}")
    assert reason is not None and f"127.0.0.1:{port}" in reason


def test_an_uncached_model_repository_fails_at_once(tmp_path: Path) -> None:
    result, seconds = run_offline(["summary", "hf-hub:someorg/absent"], tmp_path / "hf")
    assert result.returncode == 2, result.stderr
    assert "the Hub could not be reached (127.0.0.1:" in result.stderr
    assert "hf download someorg/absent" in result.stderr
    assert "Retrying" not in result.stderr and seconds < FAST_S


def test_an_uncached_dataset_fails_at_once(tmp_path: Path) -> None:
    result, seconds = run_offline(["train", "data=hf:someorg/absent", "--out", str(tmp_path / "r")],
                                  tmp_path / "hf")
    assert result.returncode == 2, result.stderr
    assert "the Hugging Face Hub cannot be reached (127.0.0.1:" in result.stderr
    assert "is not in the datasets cache" in result.stderr
    assert "Retrying" not in result.stderr and seconds < FAST_S


def test_a_cached_model_repository_still_loads_without_the_offline_flag(tmp_path: Path) -> None:
    snapshot = tmp_path / "hf" / "hub" / "models--someorg--tiny" / "snapshots" / "c0ffee"
    (snapshot.parents[1] / "refs").mkdir(parents=True)
    (snapshot.parents[1] / "refs" / "main").write_text("c0ffee")
    config = HFViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=128, num_labels=3)
    ViTForImageClassification(config).save_pretrained(snapshot)
    result, seconds = run_offline(["summary", "hf-hub:someorg/tiny"], tmp_path / "hf")
    assert result.returncode == 0, result.stderr
    assert "Retrying" not in result.stderr and seconds < FAST_S
    assert "image 32x32x3, patch 8, 17 tokens, width 64, depth 2" in result.stdout


@pytest.mark.parametrize("variable", ["HTTPS_PROXY", "ALL_PROXY"])
def test_behind_a_proxy_no_direct_probe_is_made(monkeypatch: pytest.MonkeyPatch,
                                                variable: str) -> None:
    monkeypatch.setenv(variable, "http://proxy.example:3128")
    assert hub_unreachable(f"http://127.0.0.1:{closed_port()}") is None
