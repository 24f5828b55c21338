"""The consumer-group reader: one per stream, in its own thread.

Each read is one transaction: XACK of the previous batch (applied by then), the group
position check (group_position.py: creates the group when missing, never behind what was
applied, and counts entries lost to trimming or to a Redis that lost data), and XREADGROUP.
When nothing is waiting, XREAD BLOCK on the group's last-delivered id waits for new entries
without consuming them.

Entries left pending by a consumer that died are claimed with XAUTOCLAIM once they have been
idle for `claim_idle`; this consumer's own pending entries (a restart under the same pod name,
or a connection broken mid-read) are re-read first. Metrics live in memory, so an entry
applied but not acked before a crash is lost with the rest of that process's counts:
re-applying it is right. An entry costs only itself, whatever it holds: refused, counted,
named and acknowledged (refusals.py), never a reason to read the batch again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from operator import itemgetter
from typing import Any, cast

import redis
from redis.exceptions import AskError

from exporter.core.logs import LogLimiter
from exporter.lifecycle.metrics import EventMetrics, Tally, WorkerRegistry
from exporter.lifecycle.refusals import Refusals
from exporter.output.health import HealthBoard
from exporter.redis.connection import RedisConnectionConfig, redis_error_reason, sever
from exporter.redis.pipeline import Args, transaction
from exporter.sources.outage import Outage
from exporter.sources.readers.entries import Fields
from exporter.sources.streams.config import (
    CONSUMER_PREFIX,
    EventsSourceConfig,
    StreamConfig,
    stream_name,
)
from exporter.sources.streams.formats import FORMATS
from exporter.sources.streams.group_position import POSITION_SCRIPT, Seen

log = logging.getLogger(__name__)
# A stream that does not exist is said once per stream every few minutes: a typo in its key
# would otherwise look like a quiet system.
_missing_streams = LogLimiter(log)

Entry = tuple[bytes, Fields | None]
# An entry's id and fields, each read in one C call per entry (hiredis's [id, fields] lists)
_entry_id, _entry_fields = itemgetter(0), itemgetter(1)

# The longest wait between attempts while the stream's Redis fails (exporter/sources/backoff.py): a
# Redis that answers again is read within one socket_timeout plus MAX_RETRY.
MAX_RETRY = 5.0
# Seconds the acknowledgement of the last batch may take at shutdown.
FINAL_ACK_TIMEOUT = 0.5


class StreamConsumer:
    def __init__(
        self,
        stream: StreamConfig,
        settings: EventsSourceConfig,
        connection: RedisConnectionConfig,
        metrics: EventMetrics,
        health: HealthBoard | None = None,
        count_error: Callable[[str, str], object] | None = None,
        redis_source: str | None = None,
    ) -> None:
        self.stream = stream
        self.settings = settings
        self.connection = connection
        self.metrics = metrics
        self.health = health
        # With several Redis sources its key and Redis (one key may live on two servers).
        self.stream_name = stream_name(stream.key, redis_source)
        self.name = CONSUMER_PREFIX + self.stream_name
        self.consumer = settings.consumer_name()
        self.workers: WorkerRegistry = metrics.worker_registry(
            settings.worker_timeout, settings.max_workers, redis_source
        )
        self._key = stream.key.encode()
        self._client: redis.Redis | None = None
        self._start = stream.start  # for a group this consumer has seen nothing of
        self._seen = Seen()
        self._acks: list[bytes] = []
        self._recovered = False
        self._group_ready = False
        self._next_claim = 0.0
        self._next_stats = 0.0
        self._block_ms = min(settings.block_ms, int(connection.socket_timeout * 800))
        self._refusals = Refusals(self.stream_name)
        # Lost entries are counted in queue_exporter_events_lost_total; this names the stream
        # and the cause, once per cause every few minutes.
        self._gaps = LogLimiter(log)
        # Its failures: health, count, log and backoff as every source's (outage.py)
        self.outage = Outage(
            self.name, self.name, log, health, count_error, MAX_RETRY, back="reading again"
        )
        # The stream's format reads its entries (sources/streams/formats.py)
        self._decoder = FORMATS[stream.format].open(stream, settings, connection)
        self.thread: threading.Thread | None = None
        # Whether the consumer waits for new entries (nothing read unapplied, nothing to ack),
        # and whether shutdown began: see stop_waiting.
        self._wait_lock = threading.Lock()
        self._waiting = False
        self._stopping = False
        metrics.declare_stream(stream.key, self.workers)

    # -- running ------------------------------------------------------------------------------

    def start(self, stop: threading.Event) -> None:
        self.thread = threading.Thread(target=self.run, args=(stop,), name=self.name, daemon=True)
        self.thread.start()

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    got = self.poll()
                    self.outage.succeeded(time.monotonic() - started)
                    if not got:
                        # An idle consumer meets a hung Redis here: its wait times out and the
                        # stream is down at once, not after the next read's deadline as well.
                        started = time.monotonic()
                        self.wait_for_entries()
                except Exception as error:  # the thread must outlive any error
                    if stop.is_set():  # interrupted by shutdown: not a failure of the stream
                        break
                    if not isinstance(error, redis.RedisError):
                        log.exception("%s: unexpected error", self.name)
                    stop.wait(self._failed(error, time.monotonic() - started))
        finally:
            self.close()

    def interrupt(self) -> None:
        """From another thread, at shutdown, once the consumer had its chance to finish: a read
        blocked on a hung Redis fails now instead of at its deadline. An interrupted read was
        not applied: its entries stay pending for this consumer name (re-read at its restart)
        or for another replica (claimed after claim_idle)."""
        sever(self._client)
        self._decoder.interrupt()

    def poll(self) -> int:
        """One read: ack the last batch, check for lost entries, read and apply the next.
        Also recovers, claims and samples group stats when due. Returns entries applied."""
        client = self._connect()
        now = time.monotonic()
        applied = 0
        if not self._recovered:  # first poll, or a reply lost with a connection
            applied += self._recover_own_pending(client)
        if now >= self._next_claim and self._group_ready:
            self._flush_acks(client)  # our applied entries are not the dead consumer's
            applied += self._claim(client)
            self._next_claim = now + max(self.settings.claim_idle / 2, 0.5)
        applied += self._read(client)
        if now >= self._next_stats and self._group_ready:
            self._sample_stats(client)
            self._next_stats = now + self.settings.stats_interval
        return applied

    def wait_for_entries(self) -> None:
        """Block until the stream holds an entry the group has not seen (or block_ms pass).
        Its Redis errors are raised, a timeout included: an idle consumer of a hung Redis is
        down after one socket_timeout."""
        client = self._connect()
        last = self._seen.last_id or "0-0"
        with self._wait_lock:
            if self._stopping:
                return
            self._waiting = True
        try:
            client.xread({self._key: last}, count=1, block=self._block_ms)
        finally:
            with self._wait_lock:
                self._waiting = False

    def stop_waiting(self) -> None:
        """From another thread, as shutdown begins: a consumer waiting for new entries has no
        read in progress and nothing to ack, so its wait ends now rather than after block_ms
        (which used to outlast the shutdown's grace and log a read cut off). A read in progress
        is left to finish."""
        with self._wait_lock:
            self._stopping = True
            if self._waiting:
                sever(self._client)

    def close(self) -> None:
        """Let go of the connection, then acknowledge what was applied on a connection of its
        own with a short deadline: shutdown never waits on a hung Redis for long."""
        if self._client is not None:
            self._client.close()
            self._client = None
        self._decoder.close()
        if not self._acks:
            return
        deadline = {"socket_timeout": FINAL_ACK_TIMEOUT, "connect_timeout": FINAL_ACK_TIMEOUT}
        client = None
        try:
            client = self.connection.model_copy(update=deadline).connect_for_key(self._key)
            self._flush_acks(client)
        except redis.RedisError as error:
            log.warning(
                "%s: could not ack %d entries at shutdown (%s); they stay pending",
                self.name,
                len(self._acks),
                redis_error_reason(error),
            )
        finally:
            if client is not None:
                client.close()

    # -- reading ------------------------------------------------------------------------------

    def _read(self, client: redis.Redis) -> int:
        group, key = self.stream.group, self._key
        commands: list[Args] = [("XACK", key, group, *self._acks)] if self._acks else []
        # EVAL, not EVALSHA: a restarted Redis has an empty script cache, and a read whose
        # check failed with NOSCRIPT would still run, unchecked, in the same transaction.
        commands.append(("EVAL", POSITION_SCRIPT, 1, key, group, self._start, *self._seen.args()))
        count = self.settings.batch_size
        commands.append(
            ("XREADGROUP", "GROUP", group, self.consumer, "COUNT", count, "STREAMS", key, ">")
        )
        # Packed and parsed by hiredis (redis/pipeline.py): redis-py's transaction pipeline and
        # its per-entry dicts cost 0.5 µs more per event, ~6% (bench/event_ingest.py).
        replies = transaction(client, commands)
        self._acks = []
        check, reply = replies[-2], replies[-1]
        if isinstance(check, Exception):
            raise check
        status, lost, last, added, read, newest = check
        if status == 1:  # the stream does not exist (yet, or it expired with its group)
            _missing_streams.warning(
                self.name,
                "events stream %r (group %s) does not exist: nothing to consume until it is "
                "written [stream_missing]",
                self.stream_name,
                self.stream.group,
            )
            self._start = "0"  # never seen: whatever it holds when it appears is new
            self._group_ready = False
            return 0
        self._group_ready = True
        if status == 2:
            # A restored copy brings back entries pending under this name that were applied:
            # the recovery acks them (and applies only what this consumer never saw).
            self._recovered = False
        if lost:
            self._gap(int(lost), "data_lost" if status == 2 else "trimmed")
        if isinstance(reply, Exception):
            raise reply
        entries = _stream_entries(reply)
        self._apply(client, entries, lost=int(lost))
        # Only now: a batch a broken connection kept from being applied is not "seen".
        self._seen = Seen(
            entries[-1][0].decode() if entries else _text(last),
            int(added),
            int(read) + len(entries) if int(read) >= 0 else -1,
            _text(newest),
        )
        self._acks = list(map(_entry_id, entries))
        return len(entries)

    def _apply(self, client: redis.Redis, entries: list[Entry], lost: int = 0) -> None:
        """Decode and record a batch. Never raises for what an entry holds: once applied, the
        batch is acknowledged; only a lost connection leaves it pending, to be read again."""
        if all(map(_entry_fields, entries)):  # the list as it is: no copy of 1,000 entries
            present = cast(list[tuple[bytes, Fields]], entries)
        else:  # pending, then deleted before anyone applied them
            present = [(entry_id, fields) for entry_id, fields in entries if fields]
            self._gap(len(entries) - len(present), "deleted_pending")
            lost += len(entries) - len(present)
        now = time.time()
        tally = Tally(lost=lost)
        try:
            self._decode(client, present, now, tally)
            self.metrics.record(self.stream.key, tally, self.workers)
        except (redis.ConnectionError, redis.TimeoutError):
            raise
        except Exception as error:
            log.warning(
                "%s: a batch of %d entries raised %s; applying them one by one",
                self.name,
                len(present),
                type(error).__name__,
            )
            self._apply_one_by_one(client, present, now, lost)

    def _apply_one_by_one(
        self,
        client: redis.Redis,
        entries: list[tuple[bytes, Fields]],
        now: float,
        lost: int,
    ) -> None:
        """Each entry in a tally of its own: whatever raises costs only the entry that raised.
        All are decoded before any is recorded, so a lost connection still records nothing."""
        tallies = [Tally(lost=lost)]
        for entry in entries:
            tally = Tally()
            try:
                self._decode(client, [entry], now, tally)
            except (redis.ConnectionError, redis.TimeoutError):
                raise
            except Exception as error:
                tally = Tally(consumed=1)
                self._refusals.refuse(
                    tally, entry[0], "unprocessable", f"{type(error).__name__}: {error}"[:200]
                )
            tallies.append(tally)
        for tally in tallies:
            self.metrics.record(self.stream.key, tally, self.workers)

    def _decode(
        self,
        client: redis.Redis,
        entries: list[tuple[bytes, Fields]],
        now: float,
        tally: Tally,
    ) -> None:
        self._decoder.decode(client, entries, now, tally, self._refusals)

    def _gap(self, count: int, reason: str) -> None:
        self._gaps.warning(
            reason,
            "%s: %d entries lost before the group applied them [%s]",
            self.name,
            count,
            reason,
        )

    def _recover_own_pending(self, client: redis.Redis) -> int:
        """Entries delivered to this consumer name and never applied: before a restart, or in
        a read whose reply a broken connection lost. Acks go first: what was applied is no
        longer pending. Entries up to the last one this process saw delivered were applied
        (a Redis restored from an older copy brings them back pending): acked, not applied."""
        applied, after = 0, "0"
        while True:
            self._flush_acks(client)
            try:
                reply: Any = client.xreadgroup(
                    self.stream.group,
                    self.consumer,
                    {self._key: after},
                    count=self.settings.batch_size,
                )
            except redis.ResponseError as error:
                if "NOGROUP" not in str(error):
                    raise
                break  # no group (or no stream) yet: nothing can be pending for us
            entries: list[Entry] = reply[0][1] if reply else []
            if not entries:
                break
            self._apply(client, [entry for entry in entries if not self._seen.covers(entry[0])])
            self._acks = [entry_id for entry_id, _ in entries]
            applied += len(entries)
            after = entries[-1][0].decode()
        self._recovered = True
        return applied

    def _claim(self, client: redis.Redis) -> int:
        """Entries another consumer left pending for longer than claim_idle."""
        applied, cursor = 0, "0-0"
        idle_ms = int(self.settings.claim_idle * 1000)
        for _ in range(100):  # bounded: the rest waits for the next round
            self._flush_acks(client)
            try:
                reply = client.xautoclaim(
                    self._key,
                    self.stream.group,
                    self.consumer,
                    idle_ms,
                    start_id=cursor,
                    count=self.settings.batch_size,
                )
            except redis.ResponseError as error:
                if not str(error).startswith("NOGROUP"):
                    raise
                self._group_ready = False  # destroyed, or gone with its stream: the read
                break  # places it again
            cursor, entries = reply[0], reply[1]
            deleted = reply[2] if len(reply) > 2 else []
            if deleted:  # claimed, but trimmed before anyone applied them: lost
                self._gap(len(deleted), "deleted_pending")
            self._apply(client, entries, lost=len(deleted))
            self._acks = [entry_id for entry_id, _ in entries]
            if entries:
                log.info("%s: claimed %d pending entries", self.name, len(entries))
            applied += len(entries)
            if cursor in (b"0-0", "0-0"):
                break
        return applied

    def _sample_stats(self, client: redis.Redis) -> None:
        for group in client.xinfo_groups(self._key):
            name = group.get("name")
            if name in (self.stream.group.encode(), self.stream.group):
                lag, pending = group.get("lag"), group.get("pending")
                self.metrics.set_stream_stats(
                    self.stream.key,
                    self.stream.group,
                    self.workers,
                    float(lag) if lag is not None else None,
                    float(pending) if pending is not None else None,
                )

    def _flush_acks(self, client: redis.Redis) -> None:
        if self._acks:
            client.xack(self._key, self.stream.group, *self._acks)
            self._acks = []

    def _connect(self) -> redis.Redis:
        """Every command of a consumer touches its stream's key alone: on a Redis Cluster they
        go to the primary of its slot (and a transaction may only touch one slot)."""
        if self._client is None:
            self._client = self.connection.connect_for_key(self._key)
        return self._client

    def _failed(self, error: Exception, duration: float) -> float:
        """Count, log and mark down the failure, and drop what it left unusable; the seconds
        to wait before the next read."""
        why = str(error).splitlines()[0][:300] if str(error) else type(error).__name__
        wait = self.outage.failed(redis_error_reason(error), duration, why)
        if isinstance(error, redis.ConnectionError | redis.TimeoutError):
            # A read may have reached Redis and lost only its reply: its entries are pending
            # under this consumer's name, unapplied, until the recovery reads them again.
            self._recovered = False
        if self._client and isinstance(
            error, redis.ConnectionError | redis.TimeoutError | AskError
        ):
            # AskError (MOVED too): the stream's slot is on another cluster node now, or is
            # moving there; the next connection asks the slot map where it is.
            self._client.close()
            self._client = None
        if isinstance(error, redis.ConnectionError | redis.TimeoutError | AskError):
            self._decoder.close()  # its connections too: a new cluster client reads the slot map
        if isinstance(error, redis.ResponseError) and str(error).startswith("NOGROUP"):
            # The stream or its group vanished (Redis restarted empty, the key was deleted):
            # the next read goes through the position check again, which recreates the group.
            self._group_ready = False
        return wait


def _stream_entries(reply: Any) -> list[Entry]:
    """The entries of an XREADGROUP reply of the one stream it names, as hiredis parses it
    (RESP2: [[key, entries]], RESP3: {key: entries}, nil when none): each an entry id and its
    flat field list, the [id, fields] lists hiredis made, not copied."""
    if not reply:
        return []
    entries: list[Entry] = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
    return entries


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def build_consumers(
    settings: EventsSourceConfig | None,
    default_connection: RedisConnectionConfig | None,
    metrics: EventMetrics | None,
    health: HealthBoard,
    count_error: Callable[[str, str], object],
    redis_source: Callable[[RedisConnectionConfig | None], str | None] = lambda _: None,
) -> list[StreamConsumer]:
    """One consumer per configured stream; the connection defaults to sources.redis's. The
    EventMetrics are shared with other feeds (native readers); the consumers' failures go to
    `health` and `count_error` (Telemetry's), as every source's do through its runner.
    `redis_source` names a stream's Redis (its own connection, or None: the default one) in
    the redis_source label (SourcesConfig.redis_source), or None with one Redis."""
    if settings is None or not settings.streams:
        return []
    if metrics is None:
        raise ValueError("event streams are configured: their consumers need EventMetrics")
    connection = settings.redis or default_connection or RedisConnectionConfig()
    names = [redis_source(stream.redis or settings.redis) for stream in settings.streams]
    return [
        StreamConsumer(
            stream,
            settings,
            stream.redis or connection,
            metrics,
            health,
            count_error,
            name,
        )
        for stream, name in zip(settings.streams, names, strict=True)
    ]
