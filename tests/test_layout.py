"""The package's shape: dependencies between vitkit's top-level modules and packages point one
way (function-level imports count), no class is a hub, the training loop reads on one screen or
a few."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "vitkit"
# Each unit may import only the units before it (README.md, "Layout").
LAYERS = ("errors", "fieldtypes", "files", "network", "report", "version", "config",
          "preprocess", "tasks", "runtime", "model", "weights", "catalog", "summary", "export",
          "inference", "data", "predict", "analysis", "evaluation", "train", "recipes",
          "arguments", "serve", "cli")
ENTRY_POINTS = ("__init__.py", "__main__.py")  # they may import anything, nothing imports them


def unit_of(path: Path) -> str:
    """`vitkit/train/loop.py` -> "train"; `vitkit/config.py` -> "config"."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0].removesuffix(".py")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `path`, at any depth of the code;
    `from vitkit import X` gives "vitkit.X"."""
    module = ".".join(("vitkit", *path.relative_to(PACKAGE).with_suffix("").parts))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            if name == "vitkit":
                found += [(node.lineno, f"vitkit.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, name))
    return found


ROOT = "vitkit (the package root)"


def dependencies() -> dict[tuple[str, str], str]:
    """(importing unit, imported unit) -> one place it happens ("file:line")."""
    units = {unit_of(path) for path in PACKAGE.rglob("*.py")}
    edges: dict[tuple[str, str], str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).as_posix() in ENTRY_POINTS:
            continue
        source = unit_of(path)
        for line, name in imported_modules(path):
            parts = name.split(".")
            if parts[0] != "vitkit":
                continue
            target = parts[1] if len(parts) > 1 and parts[1] in units - {"__init__"} else ROOT
            if target != source:
                edges.setdefault((source, target), f"{path.relative_to(PACKAGE)}:{line}")
    return edges


def test_every_unit_has_a_layer():
    units = {unit_of(path) for path in PACKAGE.rglob("*.py")} - {"__init__", "__main__"}
    assert units <= set(LAYERS), f"add {sorted(units - set(LAYERS))} to LAYERS"


def test_dependencies_point_down_the_layers():
    upward = [f"{source} -> {target} ({where})"
              for (source, target), where in dependencies().items()
              if target not in LAYERS or LAYERS.index(target) > LAYERS.index(source)]
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)


def test_the_dependency_check_sees_function_level_imports(tmp_path, monkeypatch):
    """The check can fail: an import inside a function body, or from the package root, counts."""
    (tmp_path / "cli.py").write_text("")
    (tmp_path / "config.py").write_text("def f():\n    from vitkit.cli import main\n")
    (tmp_path / "errors.py").write_text("def g():\n    from vitkit import __version__\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path)
    edges = dependencies()
    assert ("config", "cli") in edges and ("errors", ROOT) in edges


def _classes() -> list[tuple[str, int]]:
    out = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                out.append((f"{path.relative_to(PACKAGE)}:{node.name}",
                            node.end_lineno - node.lineno + 1))
    return out


def test_no_class_is_a_hub():
    big = [(name, lines) for name, lines in _classes() if lines > 300]
    assert not big, f"classes over 300 lines: {big}"


@pytest.mark.parametrize("path, limit", [("train/loop.py", 350), ("cli.py", 600)])
def test_the_files_that_tend_to_grow_stay_readable(path, limit):
    lines = len((PACKAGE / path).read_text().splitlines())
    assert lines <= limit, f"{path} has {lines} lines (limit {limit})"
