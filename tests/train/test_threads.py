"""`vitkit.runtime.set_threads`: asking for the thread count a process already has leaves it
as it is, because `torch.set_num_threads` would also turn MKL's dynamic threading off, which
slows the GEMMs inside SDPA's CPU attention kernel (benchmarks/step_one_process.py
--set-threads). Each check runs in a fresh interpreter: the switch cannot be turned back."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

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
