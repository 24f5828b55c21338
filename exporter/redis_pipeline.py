"""Pipelined round trips without redis-py's per-command and per-reply bookkeeping.

redis-py's Pipeline wraps every command (argument checks, response callbacks, stack entries)
and every reply (a Python-level read per reply); at 100k keys a cycle spent more in that than in
the round trips. Here commands are packed by hiredis into one buffer, sent on a pooled
connection, and the replies are parsed by a hiredis Reader of our own straight from the socket.
Replies come as the server sends them (RESP2 or RESP3 shapes differ; callers accept both), and
an error reply becomes a ResponseError in its place, not an exception.

Reads whose replies may be arbitrarily large (queue items) can travel as one `bounded_reads`
command: Redis runs them and sends back only the replies under a size limit.
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterable, Sequence
from typing import Any

import hiredis
import redis
from redis._parsers.base import BaseParser

Args = tuple[Any, ...]
_READ_SIZE = 65536
# Marks put before a command by probe_first and bound_each; the script looks for them.
PROBE, EACH = "~", "*"

# KEYS[i] is read i's key; ARGV[1] the limit in bytes, then per read its command, the number
# of its other arguments and those arguments. A reply whose strings add up to more than the
# limit comes back as that size, an integer; for a command marked with EACH (a read of many
# items), each item over the limit does. A command marked with PROBE (LINDEX 0, ZRANGE 0 0)
# first divides MEMORY USAGE ... SAMPLES 1 (which samples a list's first node, a zset's lowest
# member) by the length: a lower bound of the head's size, known without copying the head.
# Declared no-writes: Redis refuses any write in it, and runs it on read-only replicas and while
# out of memory.
_BOUNDED_READS = """#!lua flags=no-writes
local limit = tonumber(ARGV[1])
local function head_lower_bound(key, command)
  local length = redis.pcall(command == 'LINDEX' and 'LLEN' or 'ZCARD', key)
  if type(length) ~= 'number' or length == 0 then return 0 end
  local usage = redis.pcall('MEMORY', 'USAGE', key, 'SAMPLES', 1)
  if type(usage) ~= 'number' then return 0 end  -- not granted: the head is read and measured
  return math.floor(usage / length)
end
local function size(reply)
  if type(reply) == 'string' then return #reply end
  if type(reply) ~= 'table' or reply.err then return 0 end
  local total = 0
  for _, part in ipairs(reply) do total = total + size(part) end
  return total
end
local replies, at = {}, 2
for i, key in ipairs(KEYS) do
  local command, count, reply = ARGV[at], tonumber(ARGV[at + 1]), nil
  local mark = string.sub(command, 1, 1)
  if mark == '~' or mark == '*' then command = string.sub(command, 2) end
  if mark == '~' then
    local bound = head_lower_bound(key, command)
    if bound > 2 * limit then reply = bound end  -- twice: allocator rounding inflates it
  end
  if reply == nil then
    reply = redis.pcall(command, key, unpack(ARGV, at + 2, at + 1 + count))
    if mark == '*' and type(reply) == 'table' and not reply.err then
      for j, item in ipairs(reply) do
        if type(item) == 'string' and #item > limit then reply[j] = #item end
      end
    else
      local bytes = size(reply)
      if bytes > limit then reply = bytes end
    end
  end
  replies[i] = reply
  at = at + 2 + count
end
return replies
"""


def round_trip(client: redis.Redis, commands: Sequence[Args]) -> list[Any]:
    """Send all commands at once; one reply per command, a ResponseError where one failed."""
    return SentCommands(client, commands).replies()


class SentCommands:
    """Commands sent at once on one of the client's connections, their replies not yet read:
    several servers (a cluster's nodes) work on theirs at the same time while one thread reads
    each in turn. Redis buffers its replies however many, so sending never waits on reading."""

    def __init__(self, client: redis.Redis, commands: Sequence[Args]) -> None:
        self._pool = client.connection_pool
        self._connection = self._pool.get_connection()
        self._count = len(commands)
        try:
            packed = b"".join(hiredis.pack_command(args) for args in commands)
            self._connection.send_packed_command([packed])  # type: ignore[no-untyped-call]
        except BaseException:
            self._done(failed=True)
            raise

    def replies(self) -> list[Any]:
        """One reply per command (a ResponseError where one failed); the connection goes back
        to its pool, or is dropped if reading failed."""
        failed = True
        try:
            # The connection's socket is private to redis-py (`_sock`): pyproject.toml pins the
            # redis range this is tested with (CI runs the floor, the dev venv the newest).
            sock: socket.socket | None = getattr(self._connection, "_sock", None)
            if sock is None:
                raise redis.ConnectionError("the connection has no socket after sending")
            replies = _read_replies(sock, self._count)
            failed = False
            return replies
        finally:
            self._done(failed)

    def _done(self, failed: bool) -> None:
        if failed:
            self._connection.disconnect()  # type: ignore[no-untyped-call]  # a half-read stream is unusable
        self._pool.release(self._connection)


def transaction(client: redis.Redis, commands: Sequence[Args]) -> list[Any]:
    """Run the commands in one MULTI/EXEC, in one round trip: their replies, with the error
    redis-py would raise in place of a command that failed while the others ran. A transaction
    Redis refused whole (EXECABORT: a command it would not queue) raises that command's error."""
    replies = round_trip(client, [("MULTI",), *commands, ("EXEC",)])
    results = replies[-1]
    if isinstance(results, redis.ResponseError):
        refused = [reply for reply in replies[:-1] if isinstance(reply, redis.ResponseError)]
        raise _as_raised(refused[0] if refused else results)
    return [
        _as_raised(reply) if isinstance(reply, redis.ResponseError) else reply for reply in results
    ]


def _as_raised(error: redis.ResponseError) -> redis.ResponseError:
    """The error reply as redis-py's own parser makes it (NoPermissionError for NOPERM, ...)."""
    parsed: redis.ResponseError = BaseParser.parse_error(str(error))  # type: ignore[no-untyped-call]
    return parsed


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


def script_read(command: str, *arguments: Any) -> Args:
    """A read in the form bounded_reads takes, its key apart: the command, the number of
    arguments that follow the key, and those arguments."""
    return (command, len(arguments), *arguments)


def probe_first(read: Args) -> Args:
    """`read` (a script_read of LINDEX 0 or ZRANGE 0 0) with a look at a lower bound of the
    head's size first: a head already known to be too large is not copied again to measure it.
    It costs two more commands inside the script, so only heads found too large get it."""
    command, *rest = read
    return (PROBE + command, *rest)


def bound_each(read: Args) -> Args:
    """`read` (a script_read of a command that returns many items: LRANGE, ZRANGE, HVALS) with
    each item over the limit replaced by its size, rather than the whole reply."""
    command, *rest = read
    return (EACH + command, *rest)


# The same script for a Redis Cluster node, where the keys a script declares must share one
# slot: the keys come undeclared in ARGV (first their count), flagged allow-cross-slot-keys so
# a round's reads of any slots of the node run in one script.
_BOUNDED_READS_ANY_SLOT = _BOUNDED_READS.replace(
    "#!lua flags=no-writes\n",
    """#!lua flags=no-writes,allow-cross-slot-keys
local count, keys, rest = tonumber(ARGV[1]), {}, {}
for i = 2, count + 1 do keys[#keys + 1] = ARGV[i] end
for i = count + 2, #ARGV do rest[#rest + 1] = ARGV[i] end
local KEYS, ARGV = keys, rest
""",
    1,
)


def bounded_reads(
    keys: Sequence[Any], reads: Iterable[Args], limit: int, any_slot: bool = False
) -> Args:
    """One command that runs each read (from script_read) on its key inside Redis. Its reply is
    theirs in order, with the size (an integer) in place of any reply over `limit` bytes: a
    huge item is measured where it lies and never sent, nor held in this process.

    One script per round keeps one round trip per round: a script per read cost twice the
    reads' own time (bench/key_sampling.py). EVAL rather than EVALSHA: its text is small next
    to a round's commands, and there is no script cache to reload after a restart. EVAL_RO
    (Redis 7) declares the keys read-only, as the sampler's ACL grants them.
    """
    reads_flat = itertools.chain.from_iterable(reads)
    if any_slot:  # a cluster node: keys of several slots
        return ("EVAL_RO", _BOUNDED_READS_ANY_SLOT, 0, len(keys), *keys, limit, *reads_flat)
    return ("EVAL_RO", _BOUNDED_READS, len(keys), *keys, limit, *reads_flat)
