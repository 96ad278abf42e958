"""The tables of benchmarks/README.md, written by the scripts that measure them.

Each table is one delimited block per measurement and machine:

    <!-- table: throughput.py · AMD EPYC (2 cores; avx2) -->
    ...the command and what it printed...
    <!-- end table -->

A script given `--write-readme` replaces its block for the machine it ran on (the CPU as
`vitkit.runtime.cpu_description()` names it, or the GPU for benchmarks/gpu.py) and leaves every
other block as it is; a block that does not exist yet goes after the script's last block, or at
the end of the file under a heading of its own. Any other command's output can be written the
same way:

    python benchmarks/readme_tables.py --name "vitkit benchmark --sweep" -- vitkit benchmark --sweep
"""

from __future__ import annotations

import argparse
import io
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

README = Path(__file__).resolve().with_name("README.md")
FLAG = "--write-readme"
END = "<!-- end table -->"
START = re.compile(r"^<!-- table: (?P<name>.+?) · (?P<machine>.+?) -->$", re.M)
CLOSE = re.compile(rf"^{re.escape(END)}$", re.M)


def cpu_machine() -> str:
    """This machine's CPU as every benchmark names it (cpu_description() less torch/threads)."""
    from vitkit.runtime import cpu_description

    return cpu_description().split(" · ")[0]


def opening(name: str, machine: str) -> str:
    return f"<!-- table: {name} · {machine} -->"


def command_line(script: str, argv: Sequence[str] | None = None) -> str:
    """The command that ran, as a reader retypes it: `python benchmarks/SCRIPT ARGS`, without
    the flag that wrote the table."""
    args = [a for a in (sys.argv[1:] if argv is None else argv) if a != FLAG]
    return " ".join(["python", f"benchmarks/{script}", *(shlex.quote(a) for a in args)])


def render(name: str, machine: str, command: str, output: str) -> str:
    """One block: the machine, then the command and its output as one fenced block."""
    text = output.strip("\n").replace("```", "'''")
    return "\n".join([opening(name, machine), f"**{machine}**", "", "```", f"$ {command}",
                      text, "```", END])


def blocks(readme_text: str) -> list[tuple[str, str, int, int]]:
    """(name, machine, start, end) of every block; end is just past its closing line."""
    found = []
    for match in START.finditer(readme_text):
        close = CLOSE.search(readme_text, match.end())
        if close is None:
            raise ValueError(f"benchmarks/README.md: {match.group(0)} has no {END} line")
        found.append((match["name"], match["machine"], match.start(), close.end()))
    return found


def replace_block(readme_text: str, name: str, machine: str, block: str) -> str:
    """The README with this name's block for this machine replaced, or inserted after the
    script's last block (else appended under a heading of the script's name)."""
    found = blocks(readme_text)
    for block_name, block_machine, start, end in found:
        if (block_name, block_machine) == (name, machine):
            return readme_text[:start] + block + readme_text[end:]
    script = name.split()[0]
    same_script = [end for block_name, _, _, end in found if block_name.split()[0] == script]
    if same_script:
        at = same_script[-1]
        return readme_text[:at] + "\n\n" + block + readme_text[at:]
    return readme_text.rstrip("\n") + f"\n\n## {script}\n\n" + block + "\n"


def write_table(name: str, output: str, *, command: str, machine: str | None = None,
                readme: Path = README) -> Path:
    """Write (or replace) the block of `name` on `machine` (default: this CPU)."""
    machine = machine or cpu_machine()
    text = readme.read_text()
    readme.write_text(replace_block(text, name, machine, render(name, machine, command, output)))
    print(f"wrote the table '{name} · {machine}' in {readme}", file=sys.stderr)
    return readme


def add_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(FLAG, action="store_true",
                        help="write this run's output as its table for this machine in "
                             "benchmarks/README.md (replacing the one there)")


class _Tee(io.TextIOBase):
    """Passes writes through to the stream and keeps a copy."""

    def __init__(self, stream) -> None:
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()


@contextmanager
def recording(name: str, enabled: bool, *, argv: Sequence[str] | None = None,
              machine: str | None = None, readme: Path = README) -> Iterator[None]:
    """Print as usual; when `enabled` and the body ends without an error, write what it
    printed (Python's stdout, not subprocesses') as the table `name` for this machine."""
    if not enabled:
        yield
        return
    script = name.split()[0]
    tee = _Tee(sys.stdout)
    sys.stdout = tee
    try:
        yield
    finally:
        sys.stdout = tee.stream
    write_table(name, tee.copy.getvalue(), command=command_line(script, argv), machine=machine,
                readme=readme)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help='the table\'s name, e.g. "vitkit benchmark '
                                                      '--sweep"')
    parser.add_argument("--machine", help="default: this CPU, as cpu_description() names it")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        print(f"{shlex.join(command)} exited with {done.returncode}; no table written",
              file=sys.stderr)
        return done.returncode
    write_table(args.name, done.stdout, command=shlex.join(command), machine=args.machine)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
