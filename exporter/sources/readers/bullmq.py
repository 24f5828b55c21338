"""BullMQ's own events as lifecycle signals: each queue's `<prefix>:<queue>:events` stream.

BullMQ writes every transition of a job to its queue's events stream (added, active,
completed, failed, delayed, waiting, stalled, retries-exhausted, ...; the same in 5.x and
6.x). The reader follows each stream with plain XREAD from the last id it read, remembered in
memory: no consumer group, nothing written, so BullMQ and its QueueEvents listeners are not
disturbed. Times come from the job hash (`timestamp`, `delay`, `processedOn`, `finishedOn`),
read in one pipelined HMGET per job an event names; for a job removed when it finished
(`removeOnComplete`), its name and start are what its `added` and `active` entries said.

Nothing is lost or counted twice unnoticed:
- the positions are stored after every successful read (one SET of
  `queue-exporter:native:bullmq:<prefix>`), so a restarted exporter or a new leader goes on
  where the last read stopped (its counters start at zero: Prometheus reads a reset); only
  with nothing stored does the first read take the streams' ends as a baseline;
- XINFO STREAM and XREAD run in one MULTI, so the stream's `entries-added` (Redis 7) and its
  first entry tell exactly how many entries BullMQ trimmed (`MAXLEN ~ maxLenEvents`, 10,000 by
  default) before they were read: counted in `queue_exporter_events_lost_total`;
- a stream deleted or recreated (obliterate, Redis restarted without its data) is read again
  from its start.

On a Redis Cluster (BullMQ with a hash-tagged prefix or queue names: every key of a queue in
its tag's slot) a MULTI may touch one slot: the XINFO STREAM + XREAD pairs run in one MULTI per
slot, a node's MULTIs in one round trip, every node's sent at once (round_trips); SCAN covers every
primary, and the job hashes and the positions key are read through the cluster client, which
sends each key to its slot's node. A MOVED or lost node fails the read; the next one reads the
slot map again.

A retried attempt has no `failed` event of its own: BullMQ moves the job to `delayed` (with
backoff) or back to `waiting` (prev active); with a `failedReason` in the job hash that is a
retryable failure and a retry, without one a rate-limit push-back. A stalled job (its lock
expired: the worker died or blocked) is moved back to `waiting` and `stalled` follows, one
requeue; failed for stalling too often, it is a failure of class `other`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from redis.crc import key_slot
from redis.exceptions import AskError

from exporter.core import numbers
from exporter.core.logs import LogLimiter
from exporter.lifecycle.metrics import apply
from exporter.lifecycle.wire import Event
from exporter.redis.connection import RedisConnectionConfig
from exporter.redis.pipeline import Args, in_transaction, round_trips, transaction_results
from exporter.sources.readers.bullmq_workers import client_list_refused, worker_connections
from exporter.sources.readers.config import BullmqReaderConfig
from exporter.sources.readers.framework import MAX_KEYS, MAX_QUEUES, RedisReader, Signals
from exporter.sources.redis_keys.groups import key_regex, literal, scan_glob
from exporter.sources.redis_keys.values import select

if TYPE_CHECKING:
    from redis.cluster import RedisCluster

    from exporter.redis.cluster import ClusterNodes

log = logging.getLogger(__name__)
_limited = LogLimiter(log)

_JOB_FIELDS = ("name", "timestamp", "delay", "processedOn", "finishedOn", "atm", "failedReason")
# Events that need the job hash (for times, the job type or whether a move was a retry).
_NEEDS_JOB = frozenset({b"active", b"completed", b"failed", b"delayed"})
_STREAM_GONE = "no such key"
# Stored positions outlive an exporter that is gone for a while, not forever.
POSITIONS_TTL_MS = 7 * 86_400_000
# Jobs whose name and start the reader remembers from the stream, per kind (~100 bytes each).
MAX_REMEMBERED = 50_000
_T = TypeVar("_T")
# The failedReason of a job failed for stalling too often (its worker died or blocked).
_STALLED = b"job stalled more than allowable limit"
# A queue's XINFO STREAM and XREAD replies.
_StreamReplies = dict[str, tuple[Any, Any]]


@dataclass(slots=True)
class _Position:
    """Where the reader is in one stream: the last id read and how many entries the stream
    had had added up to it (its `entries-added` counts every entry ever added)."""

    last_id: bytes
    added: int


@dataclass(slots=True)
class _Job:
    job_type: str = ""
    runnable_at: float | None = None  # created, plus its delay
    processed_on: float | None = None
    finished_on: float | None = None
    attempts: int | None = None
    failed_reason: bool = False


class BullmqReader(RedisReader):
    def __init__(self, config: BullmqReaderConfig, connection: RedisConnectionConfig) -> None:
        super().__init__(connection)
        self.name = "native:bullmq"
        self.config = config
        self._positions: dict[str, _Position] = {}
        self._started = False  # a read succeeded: a queue new since is read in full
        # What the stream itself said about jobs not finished yet (name when added, when it
        # could run: added or due, start when active), for a job whose hash is gone when the
        # reader gets to it: removeOnComplete and removeOnFail delete it in the script that
        # writes `completed` / `failed`.
        self._names: dict[tuple[str, bytes], str] = {}
        self._runnable: dict[tuple[str, bytes], float] = {}
        self._starts: dict[tuple[str, bytes], float] = {}
        self._meta = key_regex(f"{literal(config.prefix)}:{{value}}:meta")
        self._nodes: ClusterNodes | None = None  # on a Redis Cluster

    def interrupt(self) -> None:
        super().interrupt()
        if self._nodes is not None:
            self._nodes.sever()

    def close(self) -> None:
        super().close()
        if self._nodes is not None:
            self._nodes.close()
            self._nodes = None

    def _server(self) -> redis.Redis | RedisCluster:
        """The one Redis, or a cluster client (it routes each key to its slot's node)."""
        if not self.connection.is_cluster:
            return self._connect()
        if self._nodes is None:
            from exporter.redis.cluster import ClusterNodes

            self._nodes = ClusterNodes(self.connection.connect_cluster())
        return self._nodes.cluster

    def collect(self, signals: Signals) -> None:
        client = self._server()
        # Positions move on only when the whole read succeeded (framework.Progress): a read
        # that fails applies nothing, so the next one reads the same entries again.
        positions = {queue: replace(position) for queue, position in self._positions.items()}
        baseline = False  # the streams' ends are taken, not read: nothing stored to go on from
        try:
            if not self._started:
                stored = self._stored_positions(client)
                baseline, positions = stored is None, stored or {}
            queues = self._queues(client, signals)
            batches = self._follow(client, queues, positions, baseline, signals)
            self._apply(client, batches, signals)
            if self.config.workers:
                self._workers(client, queues, signals)
            moved = {queue: positions[queue] for queue in queues if queue in positions}
            self._store_positions(client, moved)
        except redis.RedisError as error:
            # Next time a new connection; on a cluster also a new slot map, when this one led
            # astray (MOVED, ASK, CLUSTERDOWN, TRYAGAIN: a slot resharded, a node failed over).
            if isinstance(error, redis.ConnectionError | redis.TimeoutError | AskError) or (
                self._nodes is not None and self._nodes.noticed(error)
            ):
                self.close()
            raise

        def moved_on() -> None:
            self._positions, self._started = moved, True

        signals.on_success(moved_on)

    def _stored_positions(self, client: redis.Redis | RedisCluster) -> dict[str, _Position] | None:
        """The positions the last successful read stored: a restarted exporter (or a new
        leader) goes on from there, so nothing is counted twice or skipped, and what BullMQ
        trimmed meanwhile is counted as lost. None: none stored, or unreadable (the first
        read is then a baseline)."""
        raw = client.get(self.config.positions_key)
        if raw is None:
            return None
        try:
            stored = json.loads(raw)
            return {
                str(queue): _Position(str(last_id).encode(), int(added))
                for queue, (last_id, added) in stored.items()
            }
        except (ValueError, TypeError, AttributeError, RecursionError, OverflowError) as error:
            _limited.warning(
                "positions", "bullmq: stored positions unreadable (%r): starting afresh", error
            )
            return None

    def _store_positions(
        self, client: redis.Redis | RedisCluster, positions: dict[str, _Position]
    ) -> None:
        document = {q: [p.last_id.decode(), p.added] for q, p in positions.items()}
        try:
            client.set(self.config.positions_key, json.dumps(document), px=POSITIONS_TTL_MS)
        except redis.ResponseError as error:  # refused (ACL, read-only replica): memory only
            _limited.warning(
                "store", "bullmq: positions not stored (%s): a restart starts afresh", error
            )

    def _events_key(self, queue: str) -> str:
        return f"{self.config.prefix}:{queue}:events"

    def _queues(self, client: redis.Redis | RedisCluster, signals: Signals) -> list[str]:
        """Every queue has a meta hash (the Queue constructor and every add write it)."""
        pattern = scan_glob(f"{literal(self.config.prefix)}:{{_q}}:meta")
        names = set()
        scan = client.scan_iter(match=pattern, count=1000)
        for key in signals.names(scan, MAX_KEYS, f"keys {pattern}"):
            match = self._meta.match(key.decode("utf-8", "replace"))
            if match:
                names.add(match.group("value"))
        selected = select(names, self.config.queues)[0]  # the preset's queues param narrows them
        return signals.at_most(selected, MAX_QUEUES, "queues")

    def _workers(
        self, client: redis.Redis | RedisCluster, queues: list[str], signals: Signals
    ) -> None:
        """Each queue's workers from one CLIENT LIST (bullmq_workers.py); on a cluster, the
        node listing the most of them, as BullMQ does."""
        prefix, system = self.config.prefix, self.config.system
        try:
            if self._nodes is None:
                assert isinstance(client, redis.Redis)
                replies = [client.client_list()]
            else:
                replies = [node.client_list() for _, node in self._nodes.primaries()]
        except redis.ResponseError as error:  # NOPERM, or no CLIENT: the worker count alone
            signals.silent = client_list_refused(error)
            return
        database = self.connection.database
        lists = [worker_connections(reply, prefix, queues, database) for reply in replies]
        for worker in max(lists, key=len, default=[]):
            # capacity None: CLIENT LIST does not tell the worker's concurrency (no slot series)
            signals.worker(system, worker.queue, worker.identity, int(not worker.waiting), None)

    # -- following the streams ----------------------------------------------------------------

    def _follow(
        self,
        client: redis.Redis | RedisCluster,
        queues: list[str],
        positions: dict[str, _Position],
        baseline: bool,
        signals: Signals,
    ) -> list[tuple[str, list[tuple[bytes, dict[bytes, bytes]]]]]:
        """XINFO STREAM + XREAD of each queue in one MULTI: the new entries of each stream, the
        entries trimmed before they were read counted as lost."""
        if self._nodes is None:
            assert isinstance(client, redis.Redis)
            replies = self._read_streams([(client, [queues])], positions)
        else:
            replies = self._read_streams(self._by_slot(self._nodes, queues), positions)
        batches = []
        for queue in queues:
            info, read = replies[queue]
            entries = self._new_entries(queue, info, read, positions, baseline, signals)
            if entries:
                batches.append((queue, entries))
        return batches

    def _by_slot(
        self, nodes: ClusterNodes, queues: list[str]
    ) -> list[tuple[redis.Redis, list[list[str]]]]:
        """On a cluster, per node the queues of each slot (a queue's keys share its hash tag's
        slot, and a MULTI may touch one slot)."""
        by_node: dict[str, tuple[redis.Redis, dict[int, list[str]]]] = {}
        for queue in queues:
            key = self._events_key(queue).encode()
            name, node = nodes.node_of(key)
            by_node.setdefault(name, (node, {}))[1].setdefault(key_slot(key), []).append(queue)
        return [(node, list(slots.values())) for node, slots in by_node.values()]

    def _read_streams(
        self, groups: list[tuple[redis.Redis, list[list[str]]]], positions: dict[str, _Position]
    ) -> _StreamReplies:
        """XINFO STREAM + XREAD of each queue, one MULTI per group of queues: a server's (a
        cluster node's) in one round trip, every server's at once (round_trips)."""
        calls = [
            (client, [c for queues in batches for c in self._stream_reads(queues, positions)])
            for client, batches in groups
        ]
        replies: _StreamReplies = {}
        for (client, batches), node_replies in zip(groups, round_trips(calls), strict=True):
            parse_info = client.response_callbacks["XINFO STREAM"]
            parse_read = client.response_callbacks["XREAD"]
            for queues in batches:
                size = 2 * len(queues) + 2
                results, node_replies = (
                    transaction_results(node_replies[:size]),
                    node_replies[size:],
                )
                for queue, info, read in zip(queues, results[::2], results[1::2], strict=True):
                    replies[queue] = (_parsed(parse_info, info), _parsed(parse_read, read))
        return replies

    def _stream_reads(self, queues: list[str], positions: dict[str, _Position]) -> list[Args]:
        commands: list[Args] = []
        for queue in queues:
            key, last_id = (
                self._events_key(queue),
                positions.get(queue, _Position(b"0-0", 0)).last_id,
            )
            commands.append(("XINFO", "STREAM", key))
            commands.append(("XREAD", "COUNT", self.config.max_events, "STREAMS", key, last_id))
        return in_transaction(commands)

    def _new_entries(
        self,
        queue: str,
        info: Any,
        read: Any,
        positions: dict[str, _Position],
        baseline: bool,
        signals: Signals,
    ) -> list[tuple[bytes, dict[bytes, bytes]]]:
        if isinstance(info, redis.ResponseError):
            if _STREAM_GONE not in str(info):  # not a stream: this queue alone is skipped
                signals.unreadable(self._events_key(queue), info)
                return []
            info = {"entries-added": 0, "last-generated-id": b"0-0", "length": 0}
        added = int(info.get("entries-added") or 0)
        last_generated = _stream_id(info.get("last-generated-id") or b"0-0")
        position = positions.get(queue)
        if position is None and baseline:
            positions[queue] = _Position(info.get("last-generated-id") or b"0-0", added)
            return []
        if position is None:  # a queue created since: all its events are new
            position = positions[queue] = _Position(b"0-0", 0)
        if added < position.added or last_generated < _stream_id(position.last_id):
            # deleted or recreated since: read the new stream from its start next time
            positions[queue] = _Position(b"0-0", 0)
            return []
        signals.tally.lost += self._trimmed(queue, info, position, added)
        entries = _entries(read)
        if entries:
            position.last_id = entries[-1][0]
        position.added += len(entries)
        signals.tally.consumed += len(entries)
        return entries

    def _trimmed(self, queue: str, info: dict[str, Any], position: _Position, added: int) -> int:
        """Entries added after our position that are gone before we read them: when the
        stream's first entry lies beyond our position, all it holds is unread, and the rest
        of what was added since was trimmed (or deleted)."""
        length = int(info.get("length") or 0)
        first = info.get("first-entry")
        first_id = _stream_id(first[0]) if first else None
        if first_id is not None and first_id <= _stream_id(position.last_id):
            return 0
        lost = max(added - position.added - length, 0)
        position.added += lost
        if lost:
            _limited.warning(
                ("trimmed", queue),
                "bullmq: queue %s: %d event(s) trimmed from its stream before they were read",
                queue,
                lost,
            )
        return lost

    # -- events -> lifecycle ------------------------------------------------------------------

    def _apply(
        self,
        client: redis.Redis | RedisCluster,
        batches: list[tuple[str, list[tuple[bytes, dict[bytes, bytes]]]]],
        signals: Signals,
    ) -> None:
        wanted = sorted(
            {
                (queue, fields[b"jobId"])
                for queue, entries in batches
                for _, fields in entries
                if b"jobId" in fields and _needs_job(fields)
            }
        )
        jobs = self._jobs(client, wanted, signals)
        for queue, entries in batches:
            for index, (entry_id, fields) in enumerate(entries):
                if _stall_move(fields, entries[index + 1 : index + 2]):
                    continue  # counted by the `stalled` entry that follows
                # whatever one entry raises (a time refused, garbage) costs it alone
                with signals.record(f"{self._events_key(queue)} {entry_id.decode()}"):
                    job = jobs.get((queue, fields.get(b"jobId", b""))) or _Job()
                    self._emit(signals, queue, entry_id, fields, job)

    def _jobs(
        self, client: redis.Redis | RedisCluster, wanted: list[tuple[str, bytes]], signals: Signals
    ) -> dict[tuple[str, bytes], _Job]:
        if not wanted:
            return {}
        pipe = client.pipeline(transaction=False)
        for queue, job_id in wanted:
            pipe.hmget(f"{self.config.prefix}:{queue}:".encode() + job_id, _JOB_FIELDS)
        jobs = {}
        for key, fields in zip(wanted, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(fields, Exception):  # not a hash: counted, and so is its job
                queue, job_id = key
                signals.unreadable(f"{self.config.prefix}:{queue}:{job_id!r}", fields)
                continue
            if not any(fields):
                continue  # removed (removeOnComplete): counted without times
            with signals.record(f"{self.config.prefix}:{key[0]}:{key[1]!r}"):
                jobs[key] = _job(fields, signals.latest)
        return jobs

    def _emit(
        self,
        signals: Signals,
        queue: str,
        entry_id: bytes,
        fields: dict[bytes, bytes],
        job: _Job,
    ) -> None:
        system = self.config.system
        now = _stream_id(entry_id)[0] / 1000.0
        kind = fields.get(b"event", b"")
        seen = (queue, fields.get(b"jobId", b""))
        if kind == b"added":
            _remember(self._names, seen, fields.get(b"name", b"").decode())
            _remember(self._runnable, seen, now)
        elif kind == b"active":
            _remember(self._starts, seen, now)
        job_type = job.job_type or self._names.get(seen, "")
        started = job.processed_on if job.processed_on is not None else self._starts.get(seen)
        runnable = job.runnable_at if job.runnable_at is not None else self._runnable.get(seen)

        def event(name: str, ts: float = now, **extra: Any) -> None:
            labels = {"system": system, "queue": queue, "job_type": job_type}
            apply(signals.tally, Event.of(name, ts, signals.latest, **labels, **extra), system)

        if kind == b"added":
            event("enqueued")
        elif kind == b"active":
            event("started", enqueued_at=runnable)
        elif kind in (b"completed", b"failed"):
            finished = job.finished_on or now
            # a negative execution time is refused (Event.of: negative_duration), not made 0
            duration = None if started is None else finished - started
            extra: dict[str, Any] = {"duration": duration, "attempt": job.attempts}
            for memory in (self._names, self._starts, self._runnable):
                memory.pop(seen, None)
            if kind == b"completed":
                event("completed", finished, enqueued_at=runnable, **extra)
            else:
                reason = fields.get(b"failedReason", b"")
                error_type = "other" if reason.startswith(_STALLED) else "non_retryable"
                event("failed", finished, error_type=error_type, **extra)
        elif kind == b"retries-exhausted":
            event("max_retries_exceeded")
        elif kind == b"stalled":
            event("requeued", reason="stalled")
        elif kind == b"delayed":
            due = numbers.due(fields.get(b"delay", b"0")) / 1000.0
            _remember(self._runnable, seen, due)
            self._moved(event, job, started, now, delay=max(due - now, 0.0))
        elif kind == b"waiting" and fields.get(b"prev") == b"active":
            self._moved(event, job, started, now, delay=0.0)

    @staticmethod
    def _moved(event: Any, job: _Job, started: float | None, now: float, delay: float) -> None:
        """A job put back to delayed or waiting: a retry when its last attempt failed."""
        if job.failed_reason:
            # two clocks (the entry's time is Redis', processedOn the worker's): a negative
            # span is skew, taken as the v1 path takes a wait across clocks, as 0
            duration = None if started is None else max(now - started, 0.0)
            event("failed", error_type="retryable", duration=duration)
            event("retried", delay=delay)
        elif delay > 0:
            event("scheduled", delay=delay)
        else:
            event("requeued", reason="rate_limited")


def _remember(memory: dict[tuple[str, bytes], _T], key: tuple[str, bytes], value: _T) -> None:
    """Keep at most MAX_REMEMBERED jobs: the longest remembered (never seen finishing, or
    started before the exporter) are forgotten first."""
    memory.pop(key, None)
    memory[key] = value
    if len(memory) > MAX_REMEMBERED:
        del memory[next(iter(memory))]


def _stall_move(fields: dict[bytes, bytes], following: list[Any]) -> bool:
    """A stalled job is moved back to wait (`waiting`, prev active) and then `stalled` is
    written for it, in one script: the pair is one requeue."""
    if fields.get(b"event") != b"waiting" or fields.get(b"prev") != b"active" or not following:
        return False
    after = following[0][1]
    return bool(after.get(b"event") == b"stalled" and after.get(b"jobId") == fields.get(b"jobId"))


def _needs_job(fields: dict[bytes, bytes]) -> bool:
    kind = fields.get(b"event")
    return kind in _NEEDS_JOB or (kind == b"waiting" and fields.get(b"prev") == b"active")


def _entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The one stream's entries of an XREAD reply: [[key, entries]] (RESP2) or {key: entries}
    (RESP3); nothing new is an empty reply."""
    if not reply:
        return []
    streams = list(reply.values()) if isinstance(reply, dict) else [entries for _, entries in reply]
    return list(streams[0])


def _job(fields: list[bytes | None], latest: float) -> _Job:
    """A job's hash; its times from 1970 to `latest` (numbers.epoch_ms), else InvalidValue."""
    name, timestamp, delay, processed_on, finished_on, attempts, failed_reason = fields
    created = _at(timestamp, latest)
    return _Job(
        job_type=(name or b"").decode("utf-8", "replace"),
        runnable_at=None if created is None else created + (_ms(delay) or 0.0),
        processed_on=_at(processed_on, latest),
        finished_on=_at(finished_on, latest),
        attempts=numbers.count(attempts) if attempts else None,
        failed_reason=bool(failed_reason),
    )


def _ms(raw: bytes | None) -> float | None:
    """A span BullMQ wrote in ms, in seconds; None when absent."""
    return numbers.finite(raw) / 1000.0 if raw else None


def _at(raw: bytes | None, latest: float) -> float | None:
    """A time BullMQ wrote in ms, in seconds (numbers.epoch_ms); None when absent."""
    return numbers.epoch_ms(raw, latest) if raw else None


def _stream_id(raw: bytes | str) -> tuple[int, int]:
    text = raw.decode() if isinstance(raw, bytes) else raw
    milliseconds, _, sequence = text.partition("-")
    return int(milliseconds), int(sequence or 0)


def _parsed(parse: Any, reply: Any) -> Any:
    """A raw reply as redis-py's own command would return it; an error as it is."""
    return reply if isinstance(reply, Exception) else parse(reply)
