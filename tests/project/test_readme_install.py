"""The README's set-up: the two commands stay as they are, and the CPU-only install it offers
works with this project's requirements (pip keeps a `+cpu` PyTorch build: every torch and
torchvision requirement, extras included, accepts it). Nothing is installed here."""

import re
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
SETUP = ("pip install -e . && vitkit train                   "
         "# install, then train on the embedded digits\n"
         'pip install -e ".[dev]" && python -m pytest        # the test suite (what .ci/run runs)')
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)


def torch_requirements() -> list[Requirement]:
    """Every torch and torchvision requirement of pyproject.toml, extras included."""
    text = (REPO / "pyproject.toml").read_text()
    return [Requirement(spec) for spec in re.findall(r'"(torch(?:vision)?\b[^"]*)"', text)]


def test_the_two_setup_commands_are_unchanged_and_come_first():
    assert bash_blocks(README)[0].strip() == SETUP


def test_the_cpu_only_install_is_offered_before_pip_install():
    block = next(b for b in bash_blocks(README) if CPU_INDEX in b)
    lines = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert lines == [f"pip install torch --index-url {CPU_INDEX}", "pip install -e ."]
    assert "3 GB of CUDA wheels" in README and "torchvision" in README
    assert "local disk" not in README  # one machine's install time is not a user's


def test_every_torch_requirement_accepts_a_cpu_build():
    pinned = torch_requirements()
    assert {r.name for r in pinned} == {"torch", "torchvision"}
    for requirement in pinned:  # the CPU build of the version installed here
        cpu_build = version(requirement.name).split("+")[0] + "+cpu"
        assert requirement.specifier.contains(cpu_build), (requirement, cpu_build)
