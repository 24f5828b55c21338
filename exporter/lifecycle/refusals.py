"""Refused stream entries: counted by a bounded reason, named in a rate-limited warning.

A refused entry is acknowledged like any other, so it never blocks its stream. Whoever sends
it should hear about it, yet a producer gone wrong can send a million a minute: the warning
names the stream, one entry id and the reason, once per stream and reason per period.
"""

from __future__ import annotations

import logging

from exporter.core.logs import LogLimiter
from exporter.lifecycle.metrics import Tally

log = logging.getLogger(__name__)


class Refusals:
    """The refusals of one stream."""

    def __init__(self, stream: str, period: float = 300.0) -> None:
        self.stream = stream
        self._limiter = LogLimiter(log, period)

    def refuse(self, tally: Tally, entry_id: bytes, reason: str, detail: str = "") -> None:
        tally.refuse(reason)
        self._limiter.warning(
            reason,
            "%s: refused entry %s (%s)%s",
            self.stream,
            entry_id.decode(errors="replace"),
            reason,
            f": {detail}" if detail else "",
        )

    def drop_field(self, tally: Tally, entry_id: bytes, reason: str, detail: str = "") -> None:
        """A malformed optional field of a valid entry: counted by reason like a refused
        entry and named alike, while the entry's event is counted as if it lacked the field."""
        tally.refuse(reason)
        self._limiter.warning(
            reason,
            "%s: dropped a field of entry %s (%s)%s",
            self.stream,
            entry_id.decode(errors="replace"),
            reason,
            f": {detail}" if detail else "",
        )
