"""Pipelined round trips without redis-py's per-command and per-reply bookkeeping.

redis-py's Pipeline wraps every command (argument checks, response callbacks, stack entries)
and every reply (a Python-level read per reply); at 100k keys a cycle spent more in that than in
the round trips. Here commands are packed by hiredis into one buffer, sent on a pooled
connection, and the replies are parsed by a hiredis Reader of our own straight from the socket.
Replies come as the server sends them (RESP2 or RESP3 shapes differ; callers accept both), and
an error reply becomes a ResponseError in its place, not an exception.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

import hiredis
import redis

Args = tuple[Any, ...]
_READ_SIZE = 65536


def round_trip(client: redis.Redis, commands: Sequence[Args]) -> list[Any]:
    """Send all commands at once; one reply per command, a ResponseError where one failed."""
    pool = client.connection_pool
    connection = pool.get_connection()
    try:
        packed = b"".join(hiredis.pack_command(args) for args in commands)
        connection.send_packed_command([packed])  # type: ignore[no-untyped-call]
        sock: socket.socket | None = getattr(connection, "_sock", None)
        if sock is None:
            raise redis.ConnectionError("the connection has no socket after sending")
        return _read_replies(sock, len(commands))
    except BaseException:
        connection.disconnect()  # type: ignore[no-untyped-call]  # a half-read stream is unusable
        raise
    finally:
        pool.release(connection)


def _read_replies(sock: socket.socket, count: int) -> list[Any]:
    reader = hiredis.Reader(replyError=redis.ResponseError)
    replies: list[Any] = []
    while len(replies) < count:
        reply = reader.gets()
        if reply is not False:
            replies.append(reply)
            continue
        try:
            data = sock.recv(_READ_SIZE)
        except TimeoutError as error:
            raise redis.TimeoutError("timed out reading pipelined replies") from error
        except OSError as error:
            raise redis.ConnectionError(f"reading pipelined replies failed: {error}") from error
        if not data:
            raise redis.ConnectionError("connection closed while reading pipelined replies")
        reader.feed(data)
    return replies
