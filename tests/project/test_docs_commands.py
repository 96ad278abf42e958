"""Every command the README and docs/ show runs as written, and every relative link points to a
file that exists.

Commands: in ```bash and ```sh blocks, the lines that start with `vitkit `, `python -m vitkit`
or `torchrun ` (a line ending in a backslash continues on the next one; everything else in the
block, such as `pip install` or a shell comment, is not run). ```python blocks run whole, as one
script. Nothing is appended to a command: the docs write their cheap examples cheap.

Each document is read as one session: its blocks run in order in one temporary working
directory (never the clone), so a `vitkit train` makes the run folder that a later `vitkit eval`
reads. Before the first block the directory holds what a reader of that page already has:
  - `runs/digits`, the run folder of the README's set-up command (`vitkit train`); the suite's
    shared short digits run (`digits_run`, tests/conftest.py) stands in for it (the full one
    takes 30 s to 2.5 min on two shared cores);
  - the reader's own inputs the docs name (`my_digit.png`: any image).

After each block, every file it made must be one the repository's .gitignore ignores (runs/):
a reader who runs the examples in the clone keeps a clean `git status`. The reader's own inputs
(`my_digit*`) and the harness's snippets are exempt.

The skip convention: an HTML comment `<!-- not run in tests: REASON -->`, alone on the line above
a fenced block (a blank line between them is allowed) keeps the whole block out, and REASON is
the skip message (`pytest -rs` lists them). The reasons in use: a download (named checkpoints,
Hub repositories and datasets: tests never touch the network), the real CIFAR-10 copy in
../shared/data with minutes to an hour of training or feature extraction, a run folder that only
such a run makes, the reader's own data (~/pets, photos/), and the full digits recipe (covered by
tests/train/test_train.py; the stand-in run above is the cheap form of it).
"""

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", REPO / "benchmarks" / "README.md",
        *sorted((REPO / "docs").rglob("*.md"))]
SKIP_MARK = re.compile(r"^<!--\s*not run in tests:\s*(.*?)\s*-->\s*$", re.M)
FENCE = re.compile(r"^```(\w*)\s*$")
COMMAND_STARTS = ("vitkit ", "python -m vitkit", "torchrun ")
TIMEOUT_S = 300


@dataclass(frozen=True)
class Block:
    """One fenced block of a document: where it is, its language, its text, why it is skipped."""

    doc: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    skip_reason: str | None

    @property
    def label(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"

    def commands(self) -> list[str]:
        """The shell commands of a bash/sh block (continuation lines joined)."""
        commands, current = [], ""
        for raw in self.text.splitlines():
            line = raw.rstrip()
            if current:
                current += " " + line.strip()
            elif line.startswith(COMMAND_STARTS):
                current = line
            else:
                continue
            if current.endswith("\\"):
                current = current[:-1].rstrip()
            else:
                commands.append(current)
                current = ""
        assert not current, f"{self.label}: a command ends in a backslash"
        return commands


def fenced_blocks(doc: Path) -> list[Block]:
    """Every fenced block of a Markdown file, with the skip mark above it, if any."""
    lines = doc.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        above = i - 1
        while above >= 0 and not lines[above].strip():
            above -= 1
        mark = SKIP_MARK.search(lines[above]) if above >= 0 else None
        blocks.append(Block(doc, i + 1, opening.group(1), "\n".join(lines[i + 1:end]),
                            mark.group(1) if mark else None))
        i = end + 1
    return blocks


def runnable(block: Block) -> bool:
    return (block.lang in ("bash", "sh") and bool(block.commands())) or block.lang == "python"


BLOCKS = [b for doc in DOCS for b in fenced_blocks(doc) if runnable(b)]


def subprocess_env() -> dict[str, str]:
    """The test's environment (offline, temporary caches: conftest.py), with this interpreter's
    `vitkit` and `python` first on PATH and PYTHONPATH made absolute (the cwd changes)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(
            os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    env["MPLBACKEND"] = "Agg"
    return env


def run(command: list[str], cwd: Path, label: str) -> None:
    result = subprocess.run(command, cwd=cwd, env=subprocess_env(), capture_output=True,
                            text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, (
        f"{label}: `{command[-1]}` exited with {result.returncode}\n"
        f"--- stdout (end)\n{result.stdout[-3000:]}\n--- stderr (end)\n{result.stderr[-3000:]}")


@pytest.fixture(scope="module")
def sessions() -> dict[Path, Path]:
    """One working directory per document, shared by its blocks in order."""
    return {}


def session_dir(doc: Path, sessions: dict[Path, Path], digits_run: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Path:
    if doc not in sessions:
        cwd = tmp_path_factory.mktemp(doc.stem)
        shutil.copytree(digits_run, cwd / "runs" / "digits")
        from PIL import Image
        Image.new("L", (28, 28), 0).save(cwd / "my_digit.png")
        sessions[doc] = cwd
    return sessions[doc]


@pytest.mark.parametrize("block", BLOCKS, ids=[b.label for b in BLOCKS])
def test_docs_block_runs_as_written(block: Block, sessions: dict[Path, Path],
                                    request: pytest.FixtureRequest,
                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    if block.skip_reason is not None:
        pytest.skip(block.skip_reason)
    cwd = session_dir(block.doc, sessions, request.getfixturevalue("digits_run"),
                      tmp_path_factory)
    if block.lang == "python":
        snippet = cwd / f"snippet_line{block.line}.py"
        snippet.write_text(block.text + "\n")
        run([sys.executable, str(snippet)], cwd, block.label)
    else:
        for command in block.commands():
            run(["bash", "-c", command], cwd, block.label)
    untracked = [p for p in files_git_would_show(cwd) if not p.startswith(HARNESS_FILES)]
    assert not untracked, (
        f"{block.label}: run in a clone, the example leaves files `git status` shows: "
        f"{', '.join(untracked[:5])}; write them under runs/ (git-ignored)")


# What the harness puts in a session's directory, and the reader's own images made from it.
HARNESS_FILES = ("snippet_line", "my_digit")


def files_git_would_show(cwd: Path) -> list[str]:
    """The files under `cwd` that the repository's .gitignore does not ignore, as if `cwd`
    were the clone a reader runs the examples in."""
    paths = sorted(str(p.relative_to(cwd)) for p in cwd.rglob("*") if p.is_file())
    if not paths:
        return []
    checked = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index", "--stdin"],
                             input="\n".join(paths), capture_output=True, text=True)
    ignored = set(checked.stdout.splitlines())
    return [p for p in paths if p not in ignored]


def test_skip_marks_sit_above_a_block_and_give_a_reason() -> None:
    for doc in DOCS:
        marks = [m for m in SKIP_MARK.finditer(doc.read_text())]
        attached = [b for b in fenced_blocks(doc) if b.skip_reason is not None]
        assert len(marks) == len(attached), f"{doc}: a skip mark is not right above a block"
        assert all(b.skip_reason for b in attached), f"{doc}: a skip mark without a reason"


def test_docs_show_commands_to_run() -> None:
    """The extraction finds the README's tour: a guard against a parser that finds nothing."""
    readme = [b for b in BLOCKS if b.doc.name == "README.md" and b.doc.parent == REPO]
    commands = [c for b in readme if b.skip_reason is None for c in b.commands()]
    verbs = {c.split()[1] for c in commands if c.startswith("vitkit ")}
    assert {"models", "summary", "train", "eval", "predict", "explain", "export"} <= verbs


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|<img[^>]*\ssrc=\"([^\"]+)\"")


def prose(text: str) -> str:
    """The text outside fenced blocks and inline code, where links live."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(REPO)) for d in DOCS])
def test_relative_links_point_to_existing_files(doc: Path) -> None:
    missing = []
    for match in LINK.finditer(prose(doc.read_text())):
        target = match.group(1) or match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a web address or an anchor in the same page
        path = target.split("#", 1)[0]
        if not (doc.parent / path).exists():
            missing.append(target)
    assert not missing, f"{doc.relative_to(REPO)} links to missing files: {missing}"
