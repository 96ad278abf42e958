"""The package's shape, as checks that fail when it breaks (each is shown failing on a planted
tree): no import circle between files, dependencies between vitkit's top-level modules and
packages point down the layers (function-level imports count), one owner per concept (no
branch on a task's name outside vitkit.tasks; `resize_batch` defined in vitkit.data.transforms
and imported from there; a run folder's file names spelled only in
vitkit.weights.formats.run_folder), serve built without the predict verb, and each CLI verb a
module with its parser beside its command."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "vitkit"
# Each unit may import only the units before it (README.md, "Layout").
LAYERS = ("errors", "fieldtypes", "files", "network", "report", "version", "config",
          "preprocess", "tasks", "runtime", "cores", "model", "objectives", "weights", "catalog",
          "summary", "data", "export", "inference", "predict", "analysis", "evaluation", "train",
          "recipes", "arguments", "serve", "cli")
ENTRY_POINTS = ("__init__.py", "__main__.py")  # they may import anything, nothing imports them


def unit_of(path: Path) -> str:
    """`vitkit/train/loop.py` -> "train"; `vitkit/config.py` -> "config"."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0].removesuffix(".py")


def module_of(path: Path) -> str:
    """`vitkit/train/loop.py` -> "vitkit.train.loop"; `vitkit/model/__init__.py` ->
    "vitkit.model"."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(("vitkit", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def file_of(module: str) -> Path | None:
    """The file of a vitkit module ("vitkit.model" -> `vitkit/model/__init__.py`), or None
    (not vitkit's, or a name inside a module)."""
    parts = module.split(".")
    if parts[0] != "vitkit":
        return None
    base = PACKAGE.joinpath(*parts[1:])
    candidates = [base / "__init__.py"] if len(parts) == 1 else \
        [base.with_name(base.name + ".py"), base / "__init__.py"]
    return next((path for path in candidates if path.is_file()), None)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `path`, at any depth of the code;
    `from P import y` gives "P.y" where that is a module of vitkit's (`from vitkit import
    config` gives "vitkit.config"), else "P"."""
    package = module_of(path) if path.name == "__init__.py" else \
        module_of(path).rsplit(".", 1)[0]
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
            for alias in node.names:
                submodule = f"{name}.{alias.name}"
                found.append((node.lineno, submodule if file_of(submodule) else name))
    return list(dict.fromkeys(found))


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


def file_imports() -> dict[str, dict[str, str]]:
    """Each file of vitkit (relative path) -> {each vitkit file it imports: where ("file:line")};
    importing `P.m` counts as importing `m`'s file, not `P/__init__.py` too."""
    graph: dict[str, dict[str, str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        edges = graph.setdefault(name, {})
        for line, module in imported_modules(path):
            target = file_of(module)
            if target is not None and target != path:
                edges.setdefault(target.relative_to(PACKAGE).as_posix(), f"{name}:{line}")
    return graph


def import_circles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one file in `graph` (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                circles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return circles


def test_no_import_circle_between_files():
    graph = file_imports()
    found = []
    for circle in import_circles(graph):
        edges = [where for source in circle for target, where in graph[source].items()
                 if target in circle]
        found.append(" <-> ".join(circle) + "\n    " + ", ".join(sorted(edges)))
    assert not found, "files that import each other (move the shared piece to its owner):\n" \
        + "\n".join(found)


def test_the_circle_check_sees_function_level_imports(tmp_path, monkeypatch):
    """The check can fail: a pair joined by an import inside a function body and by `from P
    import m` of a submodule is a circle; a one-way import is not."""
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "__init__.py").write_text("")
    (tmp_path / "model" / "stems.py").write_text("from vitkit.model import resnet\n")
    (tmp_path / "model" / "resnet.py").write_text(
        "def f():\n    from vitkit.model.stems import Stem\n")
    (tmp_path / "config.py").write_text("from vitkit.model import stems\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path)
    assert import_circles(file_imports()) == [["model/resnet.py", "model/stems.py"]]


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


# -- the task: one owner, no branch on its name elsewhere ------------------------------------------
TASK_NAMES = ("classification", "regression", "multilabel")
TASK_CLASSES = ("Classification", "Regression", "Multilabel")
TASK_OWNER = "tasks"  # vitkit/tasks/: the one place that may tell the tasks apart


def task_branches(path: Path) -> list[str]:
    """Where `path` branches on a task's name: a comparison with one (==, !=, in, not in; also
    against a tuple, list or set holding one), a `case` of one, a dict literal keyed by two or
    more of them (a lookup by name), an isinstance check against a task class. A name passed
    as a value (`TaskSpec("regression")`, a default) is no branch; nor is a format's table
    with one task among its keys (Hugging Face's problem_type)."""
    def is_name(node: ast.AST | None) -> bool:
        return isinstance(node, ast.Constant) and node.value in TASK_NAMES

    def holds_name(node: ast.AST) -> bool:
        return is_name(node) or (isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(
            is_name(element) for element in node.elts))

    found = []
    for node in sorted((node for node in ast.walk(ast.parse(path.read_text()))
                        if hasattr(node, "lineno")), key=lambda node: node.lineno):
        where = f"{path.relative_to(PACKAGE)}:{node.lineno}"
        if isinstance(node, ast.Compare) and any(
                holds_name(side) for side in (node.left, *node.comparators)):
            found.append(f"{where} compares with a task's name")
        elif isinstance(node, ast.MatchValue) and is_name(node.value):
            found.append(f"{where} matches a task's name")
        elif isinstance(node, ast.Dict) and sum(map(is_name, node.keys)) >= 2:
            found.append(f"{where} looks a task up by name")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id == "isinstance" and len(node.args) == 2 and any(
                    isinstance(name, ast.Name) and name.id in TASK_CLASSES
                    for name in ast.walk(node.args[1])):
            found.append(f"{where} asks which task class it holds")
    return found


def task_branches_outside_the_owner() -> list[str]:
    return [branch for path in sorted(PACKAGE.rglob("*.py"))
            if unit_of(path) != TASK_OWNER for branch in task_branches(path)]


def test_no_branch_on_a_task_name_outside_the_task_package():
    found = task_branches_outside_the_owner()
    assert not found, ("branches on a task's name outside vitkit.tasks (give the task classes "
                       "a method or attribute, and call it):\n" + "\n".join(found))


def test_the_task_branch_check_can_fail(tmp_path, monkeypatch):
    """The check sees each kind of branch, not a task named as a value, nor the owner's own."""
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "base.py").write_text('ok = kind == "regression"\n')
    (tmp_path / "report.py").write_text(
        'def f(task, kind, t):\n'
        '    if task.kind == "regression":\n'
        '        pass\n'
        '    if kind not in (None, "classification"):\n'
        '        pass\n'
        '    words = {"regression": "target(s)", "multilabel": "label(s)"}[kind]\n'
        '    match kind:\n'
        '        case "multilabel":\n'
        '            pass\n'
        '    return isinstance(t, (Regression, int))\n')
    (tmp_path / "config.py").write_text(
        'spec = TaskSpec("regression")\nTUTORIAL = {"t2t-tutorial": "regression"}\n'
        'PROBLEMS = {"single_label_classification": None, "regression": "regression"}\n'
        'def g(kind="classification"):\n    return kind\n')
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path)
    found = task_branches_outside_the_owner()
    assert [line.split(" ", 1)[0] for line in found] == [
        "report.py:2", "report.py:4", "report.py:6", "report.py:8", "report.py:10"], found


# -- one owner per concept: the resize path, a run folder's file names -------------------------
RESIZE_OWNER = "data/transforms.py"  # the one resize path for batches of arrays and images
RUN_FILES_OWNER = "weights/formats/run_folder.py"  # the one list of a run folder's files


def resize_batch_elsewhere() -> list[str]:
    """Where a file other than RESIZE_OWNER defines `resize_batch` (a function or a name bound
    to something), or imports it from anywhere but its owner ("file:line")."""
    owner = module_of(PACKAGE / RESIZE_OWNER)
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.name == "resize_batch"
            bound = isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "resize_batch"
                for target in node.targets)
            defined = function or bound
            if defined and name != RESIZE_OWNER:
                found.append(f"{name}:{node.lineno} defines resize_batch")
            if isinstance(node, ast.ImportFrom) and any(
                    alias.name == "resize_batch" for alias in node.names) and \
                    node.module != owner:
                found.append(f"{name}:{node.lineno} imports resize_batch from {node.module} "
                             f"(import it from {owner})")
    return found


def test_resize_batch_has_one_owner():
    found = resize_batch_elsewhere()
    assert not found, "one resize path, in vitkit.data.transforms:\n" + "\n".join(found)


def test_the_resize_owner_check_can_fail(tmp_path, monkeypatch):
    """The check sees a second definition and an import through another module, not the
    owner's own definition nor an import from it."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "transforms.py").write_text("def resize_batch(images, size): ...\n")
    (tmp_path / "data" / "augment.py").write_text(
        "from vitkit.data.transforms import resize_batch\n")
    (tmp_path / "data" / "arrays.py").write_text(
        "import torch\ndef resize_batch(x, size):\n    return x\n")
    (tmp_path / "train.py").write_text(
        "def f():\n    from vitkit.data.augment import resize_batch\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path)
    assert [line.split(" ", 1)[0] for line in resize_batch_elsewhere()] == [
        "data/arrays.py:2", "train.py:2"]


def run_file_names_elsewhere(names: tuple[str, ...]) -> list[str]:
    """Where a file other than RUN_FILES_OWNER spells one of `names` (a run folder's files) as
    a string of its own ("file:line"); a name inside a message's words is no spelling of it."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name == RUN_FILES_OWNER:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{name}:{node.lineno} spells {node.value!r}")
    return found


def test_a_run_folders_file_names_have_one_owner():
    from vitkit.weights.formats.run_folder import RUN_FILES

    found = run_file_names_elsewhere(RUN_FILES)
    assert not found, ("a run folder's file names are spelled in "
                       "vitkit.weights.formats.run_folder only (import LAST, BEST, ... from "
                       "it):\n" + "\n".join(found))


def test_the_run_file_names_check_can_fail(tmp_path, monkeypatch):
    """The check sees a file name spelled as a path part or a constant outside the owner, not
    the owner's own list nor a message that mentions a file."""
    (tmp_path / "weights" / "formats").mkdir(parents=True)
    (tmp_path / "weights" / "formats" / "run_folder.py").write_text('LAST = "last.pt"\n')
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "loop.py").write_text(
        'from vitkit.weights.formats.run_folder import LAST\n'
        'def f(out):\n'
        '    print("saved last.pt; continue with --resume")\n'
        '    return out / "last.pt", out / LAST\n')
    (tmp_path / "train" / "recorder.py").write_text('CSV = "metrics.csv"\n')
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path)
    assert [line.split(" ", 1)[0] for line in run_file_names_elsewhere(
        ("last.pt", "metrics.csv"))] == ["train/loop.py:4", "train/recorder.py:1"]


# -- serve: built on the library below the verbs, not on the predict verb -------------------------
def imports_of(folder: Path, module: str) -> list[str]:
    """Where the files under `folder` import `module` or a module inside it ("file:line"),
    function-level imports included."""
    return [f"{path.relative_to(PACKAGE)}:{line}" for path in sorted(folder.rglob("*.py"))
            for line, name in imported_modules(path)
            if name == module or name.startswith(module + ".")]


def test_serve_does_not_import_the_predict_verb():
    found = imports_of(PACKAGE / "serve", "vitkit.predict")
    assert not found, ("vitkit.serve imports the predict verb's module (take what it needs "
                       "from vitkit.inference.predictor, vitkit.inference.prediction or "
                       "vitkit.data):\n" + "\n".join(found))


def test_the_serve_import_check_can_fail(tmp_path, monkeypatch):
    """The check sees a function-level import of the verb module, not of a module whose name
    only starts the same, nor of the library below it."""
    (tmp_path / "serve").mkdir()
    (tmp_path / "serve" / "uploads.py").write_text(
        "def f():\n    from vitkit.predict import array_items\n")
    (tmp_path / "serve" / "app.py").write_text(
        "from vitkit.inference.predictor import Predictor\nimport vitkit.predictions\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path)
    assert imports_of(tmp_path / "serve", "vitkit.predict") == ["serve/uploads.py:2"]


# -- the CLI: one module per verb, its parser beside its command, nothing heavy to build it ------
CLI_CORE = ("__init__.py", "__main__.py", "output.py")  # main and the exit statuses; printing
# What vitkit.cli's files may import when they are imported (building the parser for `vitkit
# --help`): the flag helpers and the names they check. A verb imports what it runs inside `run`.
PARSER_IMPORTS = ("vitkit.arguments", "vitkit.cli", "vitkit.config", "vitkit.errors",
                  "vitkit.fieldtypes", "vitkit.serve.command", "vitkit.version")
# What only running a verb loads: `vitkit --help` must not (the package root's own imports aside).
VERB_LIBRARIES = ("vitkit.train", "vitkit.evaluation", "vitkit.predict", "vitkit.analysis",
                  "vitkit.summary", "vitkit.data", "vitkit.serve.app",
                  "vitkit.inference.benchmark", "fastapi", "matplotlib")


def import_time_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of what importing `path` imports: its statements outside function bodies
    and `if TYPE_CHECKING:` blocks; `from vitkit import X` gives "vitkit.X"."""
    found = []

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                found.extend((node.lineno, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                name = node.module or ""
                if node.level:
                    name = ".".join(["vitkit", "cli", *([name] if name else [])])
                found.extend((node.lineno, f"vitkit.{alias.name}" if name == "vitkit" else name)
                             for alias in node.names)
            for field in ("body", "orelse", "finalbody", "handlers"):
                visit([child for child in getattr(node, field, [])
                       if isinstance(child, (ast.stmt, ast.excepthandler))])

    visit(ast.parse(path.read_text()).body)
    return found


def cli_structure_problems(folder: Path) -> list[str]:
    """What keeps `folder` (vitkit/cli/) from its shape: every module outside CLI_CORE is a verb
    module defining `add_parser(verbs)` and `run(args)`, which `build_parser` in `__init__.py`
    asks for; no file imports at import time more than PARSER_IMPORTS and the standard
    library."""
    problems = []
    verbs = sorted(path for path in folder.glob("*.py") if path.name not in CLI_CORE)
    for path in verbs:
        defined = {node.name for node in ast.parse(path.read_text()).body
                   if isinstance(node, ast.FunctionDef)}
        missing = sorted({"add_parser", "run"} - defined)
        if missing:
            problems.append(f"cli/{path.name} defines no {' or '.join(missing)}: a verb module "
                            "declares its parser (add_parser) beside its command (run)")
    core = ast.parse((folder / "__init__.py").read_text())
    build = [node for node in core.body
             if isinstance(node, ast.FunctionDef) and node.name == "build_parser"]
    asked = {alias.name for function in build for node in ast.walk(function)
             if isinstance(node, ast.ImportFrom) and node.module == "vitkit.cli"
             for alias in node.names}
    problems += [f"build_parser does not ask cli/{path.name} for its parser"
                 for path in verbs if path.stem not in asked]
    for path in sorted(folder.glob("*.py")):
        for line, name in import_time_imports(path):
            allowed = name.split(".")[0] in {*sys.stdlib_module_names, "__future__"} or any(
                name == prefix or name.startswith(prefix + ".") for prefix in PARSER_IMPORTS)
            if not allowed:
                problems.append(f"cli/{path.name}:{line} imports {name} when it is imported: "
                                "import it in run(), so building the parser stays light")
    return problems


def test_each_verb_is_a_module_with_its_parser_and_its_command():
    problems = cli_structure_problems(PACKAGE / "cli")
    assert not problems, "\n".join(problems)


def test_the_cli_structure_check_can_fail(tmp_path):
    (tmp_path / "__init__.py").write_text(
        "def build_parser():\n    from vitkit.cli import good, heavy\n")
    (tmp_path / "output.py").write_text("import argparse\n")
    (tmp_path / "good.py").write_text("from typing import TYPE_CHECKING\n"
                                      "from vitkit.arguments import positive_int\n"
                                      "if TYPE_CHECKING:\n    from vitkit.train import x\n"
                                      "def add_parser(verbs): ...\n"
                                      "def run(args):\n    from vitkit.train import loop\n")
    (tmp_path / "heavy.py").write_text("import torch\nfrom vitkit import predict\n"
                                       "def add_parser(verbs): ...\ndef run(args): ...\n")
    (tmp_path / "half.py").write_text("def run(args): ...\n")
    problems = cli_structure_problems(tmp_path)
    assert len(problems) == 4, problems
    assert problems[0].startswith("cli/half.py defines no add_parser")
    assert problems[1] == "build_parser does not ask cli/half.py for its parser"
    assert "cli/heavy.py:1 imports torch" in problems[2]
    assert "cli/heavy.py:2 imports vitkit.predict" in problems[3]


def test_building_the_parser_loads_no_verb_library():
    script = ("import sys; from vitkit.cli import build_parser; build_parser(); "
              f"print(sorted(m for m in sys.modules for p in {VERB_LIBRARIES!r} "
              "if m == p or m.startswith(p + '.')))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=True)
    assert done.stdout.strip() == "[]", f"`vitkit --help` loads {done.stdout.strip()}"
