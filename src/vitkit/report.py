"""The one shape a verb's result takes: `format()` gives the text `vitkit <verb>` prints,
`to_dict()` the same facts as JSON, `json_lines()` what `--json` prints (one object per line).
`Report` is that shape for a text put together as the verb runs; results with fields of their
own (`Predictions`, `BenchmarkResult`, `SweepReport`) have the same methods."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol


class Formats(Protocol):
    """Anything the CLI prints: text, and the same facts as JSON."""

    def format(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...

    def json_lines(self) -> str: ...


@dataclass(frozen=True)
class Report:
    """What a verb did: `text` to print, `data` to write or return as JSON."""

    text: str
    data: dict[str, Any] = field(default_factory=dict)

    def format(self) -> str:
        return self.text

    def to_dict(self) -> dict[str, Any]:
        return self.data

    def json_lines(self) -> str:
        return json.dumps(self.data)

    def __str__(self) -> str:
        return self.text
