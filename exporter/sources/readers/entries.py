"""What the stream consumer asks of a decoder: read a batch of entries into one Tally.

Every stream format is read through this one protocol (sources/streams/formats.py registers
them): the consumer reads, acknowledges and claims entries and knows no format. A decoder
counts each entry it is handed (`tally.consumed`), refuses one it cannot read by a bounded
reason (lifecycle/refusals.py) and raises only for what is not the entries' fault (a lost
connection, a Redis Cluster moving slots): the batch then stays pending and is read again.
Anything else it raises makes the consumer decode the batch entry by entry, so that only the
entry that raised is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import redis

    from exporter.lifecycle.metrics import Tally
    from exporter.lifecycle.refusals import Refusals

# An entry's fields: a dict (redis-py's replies) or the flat list hiredis parses (names and
# values alternating), which a decoder reads as it is where it can (v1.py).
Fields = dict[bytes, bytes] | list[bytes]


class EntryDecoder(Protocol):
    def decode(
        self,
        client: redis.Redis,
        entries: list[tuple[bytes, Fields]],
        now: float,
        tally: Tally,
        refusals: Refusals,
    ) -> None:
        """Read `entries` (id, fields), read on `client` (the stream's connection), into
        `tally`; `now` is the batch's arrival time (events later than now + max_future are
        refused)."""
        ...

    def interrupt(self) -> None:
        """From another thread, at shutdown: a read of the decoder's own fails now."""
        ...

    def close(self) -> None:
        """Let go of connections of its own (the next decode opens them anew)."""
        ...


def as_dict(fields: Fields) -> dict[bytes, bytes]:
    """An entry's fields as a dict, whichever form Redis's reply took."""
    if isinstance(fields, dict):
        return fields
    pairs = iter(fields)  # Redis sends whole pairs: no strict check
    return dict(zip(pairs, pairs, strict=False))
