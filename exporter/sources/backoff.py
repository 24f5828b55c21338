"""Waits between attempts at a backend that fails: from half a second, doubling up to a
ceiling, back to the start after a success. The sampling loop (sources/runner.py) and the event
consumers (sources/streams/consumer.py) both retry this way, through outage.Outage: soon after a blip,
rarely during an outage.
"""

from __future__ import annotations

FIRST_WAIT = 0.5


class Backoff:
    def __init__(self, ceiling: float, first: float = FIRST_WAIT) -> None:
        self.first = first
        self.ceiling = ceiling
        self._next = first

    def failed(self) -> float:
        """Seconds to wait before the next attempt (the one after waits twice as long)."""
        wait = min(self._next, self.ceiling)
        self._next = min(self._next * 2, self.ceiling)
        return wait

    def succeeded(self) -> None:
        self._next = self.first
