"""The v1 event stream (docs/events.md): each entry one event, parsed by lifecycle/wire.py."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from exporter.lifecycle.metrics import Tally, apply
from exporter.lifecycle.refusals import Refusals
from exporter.lifecycle.wire import InvalidEvent, parse, parse_flat
from exporter.sources.readers.entries import Fields

if TYPE_CHECKING:
    import redis


class V1Decoder:
    """The entries of one v1 stream; `system` labels the events that carry none."""

    def __init__(self, system: str, max_future: float) -> None:
        self.system = system
        self.max_future = max_future

    def decode(
        self,
        client: redis.Redis,
        entries: list[tuple[bytes, Fields]],
        now: float,
        tally: Tally,
        refusals: Refusals,
    ) -> None:
        decode_v1(entries, self.system, now, self.max_future, tally, refusals)

    def interrupt(self) -> None:
        """Nothing of its own to interrupt: it reads no key."""

    def close(self) -> None:
        """No connection of its own."""


def decode_v1(
    entries: Iterable[tuple[bytes, Fields]],
    system: str,
    now: float,
    max_future: float,
    tally: Tally,
    refusals: Refusals,
) -> None:
    """Parse and apply v1 entries; invalid ones are refused by reason, never raised."""
    consumed = 0
    for entry_id, fields in entries:
        consumed += 1
        try:
            # hiredis's flat lists are read as they are (never made dicts), redis-py's dicts
            # as dicts: the same parse, field by field (wire.Layout).
            event = (
                parse(fields, now, max_future)
                if isinstance(fields, dict)
                else parse_flat(fields, now, max_future)
            )
        except InvalidEvent as error:
            refusals.refuse(tally, entry_id, error.reason, error.detail)
            continue
        if event.dropped_field is not None:  # a malformed optional field: counted, event kept
            refusals.drop_field(tally, entry_id, *event.dropped_field)
        apply(tally, event, system)
    tally.consumed += consumed
