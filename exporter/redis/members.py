"""The members of a Redis set or sorted set, read in bounded pieces: the one way every reader
takes a listing kept in a set (RQ's and Sidekiq's queues and workers, kombu's bindings,
Dramatiq's heartbeats), so that a set flooded with a million members costs a read no more than
the members it takes.

SMEMBERS (or ZRANGE 0 -1) sends a whole set in one reply: 1,000,000 members are about 50 MB
that Redis builds and the client parses, whatever the reader then keeps. SSCAN (ZSCAN) with
COUNT sends a page at a time; `members_of` asks for the next page only once the caller has taken
the last, so a caller that stops after its limit (Signals.names, or an islice) has cost Redis
and itself its limit and one page. The reply of a small set (listpack or intset encoded, up
to Redis's set-max-listpack-entries or set-max-intset-entries, 128 and 512 by default) comes
whole, as Redis sends it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal, cast

import redis

# Members asked for per SSCAN/ZSCAN (a hint Redis follows closely for a set kept as a hash).
PAGE = 1000
_Page = tuple[Any, list[Any]]  # a SCAN reply: the next cursor, a page


def members_of(
    client: redis.Redis, key: str | bytes, kind: Literal["set", "zset"] = "set", page: int = PAGE
) -> Iterator[bytes]:
    """The members of the set (`kind` zset: sorted set) at `key`, each once, a page read as the
    previous one is used up. A SCAN may return a member twice (while Redis rehashes the set):
    it is given once. WRONGTYPE raises redis.ResponseError at the first page."""
    seen: set[bytes] = set()
    cursor: Any = 0
    found: list[bytes]  # the clients readers hold answer bytes (no decode_responses)
    while True:
        if kind == "zset":
            cursor, pairs = cast(_Page, client.zscan(key, cursor, count=page))
            found = [member for member, _ in pairs]
        else:
            cursor, found = cast(_Page, client.sscan(key, cursor, count=page))
        for member in found:
            if member not in seen:
                seen.add(member)
                yield member
        if int(cursor) == 0:
            return
