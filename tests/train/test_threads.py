"""`vitkit.runtime.set_threads`: asking for the thread count a process already has leaves it
as it is, because `torch.set_num_threads` would also turn MKL's dynamic threading off, which
slows the GEMMs inside SDPA's CPU attention kernel (benchmarks/step_one_process.py
--set-threads). Each check runs in a fresh interpreter: the switch cannot be turned back."""

import csv
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from messages import says
from vitkit.cores import CoreUse, ThreadWatch, choose_threads, cores_available

MKL_STATE = """
import ctypes, os, torch
from vitkit.runtime import set_threads
lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
before = torch.get_num_threads()
set_threads({threads})
print(lib.mkl_serv_get_dynamic(), before, torch.get_num_threads())
"""


def _mkl_state(threads: str) -> tuple[int, int, int]:
    src = Path(__file__).resolve().parents[2] / "src"
    out = subprocess.run([sys.executable, "-c", MKL_STATE.format(threads=threads)],
                         capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"})
    if out.returncode != 0 and "undefined symbol" in out.stderr:
        pytest.skip("this torch build has no MKL service functions to read")
    assert out.returncode == 0, out.stderr
    dynamic, before, after = map(int, out.stdout.split())
    return dynamic, before, after


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="torch built without MKL")
def test_the_current_count_keeps_mkl_dynamic_and_another_count_is_set():
    dynamic, before, after = _mkl_state("torch.get_num_threads()")
    assert dynamic == 1 and after == before  # nothing called: MKL still picks its threads
    assert _mkl_state("None")[0] == 1
    dynamic, before, after = _mkl_state("1 if torch.get_num_threads() > 1 else 2")
    assert after != before and dynamic == 0  # a real change goes through (and costs the switch)


# ---- threads that hold up when other processes use some of the cores (vitkit.cores) ----

@pytest.fixture
def restore_threads(monkeypatch):
    """torch's thread count as it was after the test; OMP_NUM_THREADS unset during it."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_a_core_counts_as_taken_from_four_tenths_of_it():
    assert CoreUse(2, 0.0).free == 2
    assert CoreUse(2, 0.3).free == 2  # background noise: not a taken core
    assert CoreUse(2, 0.5).taken == 1 and CoreUse(2, 0.5).free == 1
    assert CoreUse(4, 2.7).free == 1
    assert CoreUse(2, 2.0).free == 1  # never fewer than one thread


def test_fewer_threads_when_others_hold_cores_and_one_line_says_why(restore_threads, caplog):
    if torch.get_num_threads() < 2:
        torch.set_num_threads(2)
    default = torch.get_num_threads()
    with caplog.at_level(logging.INFO, logger="vitkit"):
        choice = choose_threads(None, measure=lambda: CoreUse(default, 1.0), what="training",
                                pin="threads={n}")
    assert choice.threads == torch.get_num_threads() == default - 1
    assert choice.watch() is not None  # the run keeps following the other processes
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    says(lines[0], "1 of the", "training on", f"threads={default} asks for them")
    caplog.clear()
    torch.set_num_threads(default)
    with caplog.at_level(logging.INFO, logger="vitkit"):  # a verb without a threads flag
        choose_threads(None, measure=lambda: CoreUse(default, 1.0), what="evaluating")
    says(caplog.records[0].getMessage(), "evaluating on",
         f"OMP_NUM_THREADS={default} asks for them")


def test_asked_for_threads_win_and_are_never_moved(restore_threads, monkeypatch):
    busy = lambda: CoreUse(2, 2.0)  # noqa: E731
    choice = choose_threads(2, measure=busy)
    assert choice.threads == torch.get_num_threads() == 2 and choice.pinned
    assert choice.watch() is None
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert choose_threads(None, measure=busy).pinned


def test_idle_cores_keep_torch_default(restore_threads, caplog):
    default = torch.get_num_threads()
    with caplog.at_level(logging.INFO, logger="vitkit"):
        choice = choose_threads(None, measure=lambda: CoreUse(default, 0.1))
        unreadable = choose_threads(None, measure=lambda: None)  # no /proc/stat
    assert choice.threads == unreadable.threads == torch.get_num_threads() == default
    assert not caplog.records


def test_the_watch_follows_cores_taken_and_left(restore_threads, monkeypatch):
    torch.set_num_threads(2)
    readings = iter([(0, 0), (200, 200), (200, 400)])  # (busy, total) ticks on 2 cores
    monkeypatch.setattr("vitkit.cores._cpu_ticks", lambda: next(readings))
    monkeypatch.setattr("vitkit.cores._own_ticks", lambda: 0)
    monkeypatch.setattr("vitkit.cores.cores_available", lambda: 2)
    watch = ThreadWatch(ceiling=2, every=0)
    taken = watch.check()  # every tick busy, none of them this process's: 2 cores busy
    assert torch.get_num_threads() == 1
    says(taken, "training on 1 thread")
    left = watch.check()  # no tick busy since
    assert torch.get_num_threads() == 2
    says(left, "training on 2 threads")


def _busy_loop(cpu: int) -> subprocess.Popen:
    """A process that keeps core `cpu` busy (as another user's job would)."""
    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


def _step_seconds(out: Path, *settings: str) -> tuple[float, str]:
    """Seconds per training step of the digits recipe (batch 64), from the fastest epoch after
    the first, and what the run printed."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    run = subprocess.run([sys.executable, "-m", "vitkit", "train", "epochs=4", "--out",
                          str(out), *settings], capture_output=True, text=True, timeout=300,
                         env=env)
    assert run.returncode == 0, run.stderr
    with open(out / "metrics.csv") as table:
        rates = [float(row["images_per_s"]) for row in csv.DictReader(table)][1:]
    return 64 / max(rates), run.stderr


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux's /proc/stat")
@pytest.mark.skipif(cores_available() > 4, reason="on more than 4 cores one busy core leaves "
                    "most of them free, and the slowdown this guards against does not show")
@pytest.mark.skipif(cores_available() < 2, reason="one core: there is no thread to give up")
def test_training_beside_a_busy_core_is_as_fast_as_one_thread(tmp_path):
    """The README's `vitkit train` with a busy process pinned on one core: its default threads
    step within 1.5x of threads=1 (on 2 cores, 2 threads there were 7-25x slower)."""
    busy = _busy_loop(min(os.sched_getaffinity(0)))
    try:
        time.sleep(0.5)
        default, printed = _step_seconds(tmp_path / "default")
        one, _ = _step_seconds(tmp_path / "one", "threads=1")
    finally:
        busy.kill()
        busy.wait()
    says(printed, "other processes are using", "training on")
    assert default <= 1.5 * one, f"{default * 1e3:.1f} ms against threads=1's {one * 1e3:.1f} ms"
