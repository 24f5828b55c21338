"""A sampling source of a test's own, for the runner's scheduling and fencing: the Source
protocol's hooks with no backend behind them; a test's subclass writes sample()."""

from __future__ import annotations


class PlainSource:
    name = "plain"
    interval = 0.1
    deadline = 10.0

    def error_reason(self, error: Exception) -> str:
        return "other"

    def interrupt(self) -> None:
        pass  # no backend call to cut short

    def close(self) -> None:
        pass  # no connection to let go of
