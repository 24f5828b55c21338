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
import select
import socket
import ssl
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
local key_list, key_base, count, arg_base = KEYS, 0, #KEYS, 0
local limit = tonumber(ARGV[arg_base + 1])
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
local replies, at = {}, arg_base + 2
for i = 1, count do
  local key = key_list[key_base + i]
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


def round_trips(calls: Sequence[tuple[redis.Redis, Sequence[Args]]]) -> list[list[Any]]:
    """Each client's commands, every client's sent before any reply is read: several servers
    (a cluster's nodes) work on theirs at once. Their replies, in order; the first round trip
    that failed is raised, every other connection read or dropped."""
    sent = [SentCommands(client, commands) for client, commands in calls]
    try:
        return [one.replies() for one in sent]
    finally:
        for one in sent:
            one.abandon()  # those not read: their connections are dropped


class SentCommands:
    """Commands sent at once on one of the client's connections, their replies not yet read:
    several servers (a cluster's nodes) work on theirs at the same time while one thread reads
    each in turn, or whichever is in first (first_in). Redis buffers its replies however many,
    so sending never waits on reading. Failing to send or to read is raised by replies()."""

    __slots__ = ("_connection", "_count", "_error", "_pool", "_reader", "_replies", "_sock")

    def __init__(self, client: redis.Redis, commands: Sequence[Args]) -> None:
        self._pool = client.connection_pool
        self._connection: Any = None
        self._count = len(commands)
        self._replies: list[Any] = []
        self._reader = hiredis.Reader(replyError=redis.ResponseError)
        self._error: redis.RedisError | None = None
        # The connection's socket while replies are awaited. It is private to redis-py
        # (`_sock`): pyproject.toml pins the redis range this is tested with (CI runs the floor,
        # the dev venv the newest).
        self._sock: socket.socket | None = None
        try:
            self._connection = self._pool.get_connection()
            packed = b"".join(map(hiredis.pack_command, commands))
            self._connection.send_packed_command([packed])
            self._sock = getattr(self._connection, "_sock", None)
            if self._sock is None:
                raise redis.ConnectionError("the connection has no socket after sending")
        except redis.RedisError as error:
            self._fail(error)
        except BaseException:
            self._done(failed=True)
            raise
        if not commands:
            self._sock = None
            self._done(failed=False)

    def replies(self) -> list[Any]:
        """One reply per command (a ResponseError where one failed); the connection goes back
        to its pool, or is dropped if reading failed."""
        while not self.read_some():
            pass
        if self._error is not None:
            raise self._error
        return self._replies

    def read_some(self) -> bool:
        """One read from the socket (waiting up to its timeout), its replies parsed: True once
        every reply is in or reading failed (then replies() raises the error)."""
        sock = self._sock
        if sock is None:
            return True
        replies, gets = self._replies, self._reader.gets
        append = replies.append  # a round's every reply passes here: no lookup per reply
        try:
            self._reader.feed(_received(sock))
            for _ in range(self._count - len(replies)):
                reply = gets()
                if reply is False:
                    return False
                append(reply)
        except redis.RedisError as error:
            self._fail(error)
            return True
        except BaseException:
            self._done(failed=True)  # a half-read stream is unusable
            raise
        self._sock = None
        self._done(failed=False)
        return True

    def abandon(self) -> None:
        """Replies no longer wanted (the cycle failed): the connection is dropped."""
        if self._sock is not None:
            self._fail(redis.ConnectionError("replies abandoned"))

    def _fail(self, error: redis.RedisError) -> None:
        self._error, self._sock = error, None
        self._done(failed=True)

    def _done(self, failed: bool) -> None:
        if self._connection is None:  # connecting failed
            return
        if failed:
            self._connection.disconnect()  # a half-read stream is unusable
        self._pool.release(self._connection)

    @staticmethod
    def first_in(sent: Sequence[SentCommands]) -> SentCommands:
        """The first of these whose replies are all in (or whose reading failed), reading each
        one's replies as they arrive. If none of them sends anything for the socket timeout,
        they all fail with a TimeoutError, as each would waiting alone."""
        poller, by_fd = select.poll(), {}
        for one in sent:
            if one._sock is None:
                return one
            by_fd[one._sock.fileno()] = one
            poller.register(one._sock, select.POLLIN)
        timeout = sent[0]._connection.socket_timeout  # connected: it has a socket
        while True:
            ready = [one for one in sent if _buffered(one._sock)] or [
                by_fd[fd] for fd, _ in poller.poll(None if timeout is None else timeout * 1000)
            ]
            if not ready:
                for one in sent:
                    one._fail(redis.TimeoutError("timed out reading pipelined replies"))
                return sent[0]
            for one in ready:
                if one.read_some():
                    return one


def _received(sock: socket.socket) -> bytes:
    """What one read from the socket gives (waiting up to its timeout)."""
    try:
        data = sock.recv(_READ_SIZE)
    except TimeoutError as error:
        raise redis.TimeoutError("timed out reading pipelined replies") from error
    except OSError as error:
        raise redis.ConnectionError(f"reading pipelined replies failed: {error}") from error
    if not data:
        raise redis.ConnectionError("connection closed while reading pipelined replies")
    return data


def _buffered(sock: socket.socket | None) -> bool:
    """Data already read from the socket and held by TLS, which polling the socket cannot see."""
    return isinstance(sock, ssl.SSLSocket) and sock.pending() > 0


def transaction(client: redis.Redis, commands: Sequence[Args]) -> list[Any]:
    """Run the commands in one MULTI/EXEC, in one round trip (transaction_results)."""
    return transaction_results(round_trip(client, in_transaction(commands)))


def in_transaction(commands: Sequence[Args]) -> list[Args]:
    """The commands wrapped in MULTI ... EXEC."""
    return [("MULTI",), *commands, ("EXEC",)]


def transaction_results(replies: list[Any]) -> list[Any]:
    """What the replies to in_transaction(commands) say: the commands' replies, with the error
    redis-py would raise in place of a command that failed while the others ran. A transaction
    Redis refused whole (EXECABORT: a command it would not queue) raises that command's error."""
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
# a round's reads of any slots of the node run in one script. They are read where they lie in
# ARGV, not copied into tables first: that copy cost each node about a tenth of its CPU.
_BOUNDED_READS_ANY_SLOT = _BOUNDED_READS.replace(
    """#!lua flags=no-writes
local key_list, key_base, count, arg_base = KEYS, 0, #KEYS, 0
""",
    """#!lua flags=no-writes,allow-cross-slot-keys
local key_list, key_base, count = ARGV, 1, tonumber(ARGV[1])
local arg_base = count + 1
""",
    1,
)
if _BOUNDED_READS_ANY_SLOT == _BOUNDED_READS:
    raise RuntimeError("redis_pipeline: the any-slot script's prologue no longer matches")


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
