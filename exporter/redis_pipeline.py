"""Pipelined round trips without redis-py's per-command bookkeeping.

redis-py's Pipeline wraps every command (argument checks, response callbacks, stack entries);
at 100k keys a cycle that bookkeeping cost more than the round trips. Here commands are packed
by hiredis in one buffer and the replies are read back as the connection's parser gives them
(without redis-py's response callbacks; RESP2 and RESP3 shapes differ, callers accept both).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import hiredis
import redis

Args = tuple[Any, ...]


def round_trip(client: redis.Redis, commands: Sequence[Args]) -> list[Any]:
    """Send all commands at once; one reply per command, a ResponseError where one failed."""
    pool = client.connection_pool
    connection = pool.get_connection()
    try:
        packed = b"".join(hiredis.pack_command(args) for args in commands)
        connection.send_packed_command([packed])  # type: ignore[no-untyped-call]
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(connection.read_response())
            except redis.ResponseError as error:  # an error reply: the stream stays in step
                replies.append(error)
        return replies
    except BaseException:
        connection.disconnect()  # type: ignore[no-untyped-call]  # a half-read stream is unusable
        raise
    finally:
        pool.release(connection)
