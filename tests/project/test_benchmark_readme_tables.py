"""benchmarks/README.md's tables are written by the scripts that measure them: a script's
`--write-readme` replaces its own block for its machine and leaves every other block as it is,
and every block in the README is one the helper can find and replace."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"


@pytest.fixture(scope="module")
def tables() -> ModuleType:
    spec = importlib.util.spec_from_file_location("readme_tables", BENCHMARKS / "readme_tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["readme_tables"] = module
    spec.loader.exec_module(module)
    return module


def readme_with(tables: ModuleType, tmp_path: Path) -> Path:
    readme = tmp_path / "README.md"
    readme.write_text("# Benchmarks\n\n## Throughput\n\n"
                      + tables.render("throughput.py", "CPU A", "python benchmarks/throughput.py",
                                      "old A") + "\n\n"
                      + tables.render("throughput.py", "CPU B", "python benchmarks/throughput.py",
                                      "old B") + "\n\n## Attention\n\nprose stays\n")
    return readme


def test_a_table_is_replaced_in_place_and_the_others_stay(tables, tmp_path) -> None:
    readme = readme_with(tables, tmp_path)
    before = readme.read_text()
    tables.write_table("throughput.py", "new A\n", command="python benchmarks/throughput.py",
                       machine="CPU A", readme=readme)
    after = readme.read_text()
    assert "new A" in after and "old A" not in after and "old B" in after
    assert after.index("new A") < after.index("old B")  # the same place
    assert after.replace("new A", "old A") == before


def test_a_new_machine_goes_after_its_script_and_a_new_script_at_the_end(tables, tmp_path):
    readme = readme_with(tables, tmp_path)
    tables.write_table("throughput.py", "C's", command="c", machine="CPU C", readme=readme)
    tables.write_table("gpu.py", "a GPU's", command="g", machine="GPU X", readme=readme)
    text = readme.read_text()
    assert text.index("old B") < text.index("C's") < text.index("## Attention")
    assert text.index("prose stays") < text.index("## gpu.py") < text.index("a GPU's")
    names = [(name, machine) for name, machine, _, _ in tables.blocks(text)]
    assert names == [("throughput.py", "CPU A"), ("throughput.py", "CPU B"),
                     ("throughput.py", "CPU C"), ("gpu.py", "GPU X")]


def test_recording_writes_what_the_run_printed_and_nothing_when_it_fails(tables, tmp_path,
                                                                           capsys) -> None:
    readme = readme_with(tables, tmp_path)
    with tables.recording("throughput.py", True, argv=["--reps", "3", "--write-readme"],
                          machine="CPU A", readme=readme):
        print("measured A")
    assert "measured A" in capsys.readouterr().out  # still printed
    text = readme.read_text()
    assert "measured A" in text and "$ python benchmarks/throughput.py --reps 3\n" in text
    with pytest.raises(RuntimeError), tables.recording("throughput.py", True, machine="CPU B",
                                                       readme=readme):
        print("half a table")
        raise RuntimeError("the run failed")
    assert "half a table" not in readme.read_text() and "old B" in readme.read_text()
    with tables.recording("throughput.py", False, machine="CPU B", readme=readme):
        print("not asked")
    assert "not asked" not in readme.read_text()


def test_every_table_in_the_benchmarks_readme_is_well_formed(tables) -> None:
    text = (BENCHMARKS / "README.md").read_text()
    found = tables.blocks(text)
    assert found, "no tables found"
    lines = text.splitlines()
    openings = [line for line in lines if line.startswith("<!-- table: ")]
    assert len(openings) == len(found) == lines.count(tables.END)
    keys = [(name, machine) for name, machine, _, _ in found]
    assert len(set(keys)) == len(keys), "a script has two tables for one machine"
    scripts = {p.name for p in BENCHMARKS.glob("*.py")}
    starts = [start for _, _, start, _ in found[1:]] + [len(text)]
    for (name, machine, start, end), next_start in zip(found, starts, strict=True):
        assert end <= next_start, f"{name} · {machine}: tables nest"
        assert name.split()[0] in scripts or name.startswith("vitkit "), name
        block = text[start:end].splitlines()
        assert block[1] == f"**{machine}**" and block[3] == "```" and block[4].startswith("$ ")
        assert block[-2] == "```"
