"""What every verb does last: print the report its library call returned."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vitkit.report import Formats


def print_report(report: Formats, as_json: bool = False) -> None:
    """A verb's report: its text, or its JSON lines (`--json` where the verb prints JSON)."""
    text = report.json_lines() if as_json else report.format()
    if text:
        print(text)
