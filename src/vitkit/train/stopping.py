"""Why a run stops before its last step: SIGINT or SIGTERM (caught, so the run saves last.pt
and the CLI exits 128 + the signal), the time budget, or another rank that stopped."""

from __future__ import annotations

import signal
from contextlib import suppress
from typing import Any

SIGNALS = ("SIGINT", "SIGTERM")


class StopRequest:
    """The reason the run should stop at the next step or evaluation batch ("" to go on)."""

    def __init__(self) -> None:
        self.reason = ""
        self._previous: dict[int, Any] = {}

    def signalled(self) -> bool:
        """SIGINT or SIGTERM arrived: stop at the next step or evaluation batch."""
        return self.reason in SIGNALS

    def catch_signals(self) -> None:
        """SIGINT and SIGTERM set the reason instead of ending the process."""

        def request_stop(signum: int, _frame: Any) -> None:
            self.reason = signal.Signals(signum).name

        for signum in (signal.SIGINT, signal.SIGTERM):
            with suppress(ValueError):  # signals can only be caught in the main thread
                self._previous[signum] = signal.signal(signum, request_stop)

    def release_signals(self) -> None:
        """The handlers from before `catch_signals`."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
