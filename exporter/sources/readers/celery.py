"""Celery's event protocol as lifecycle signals, and the tasks its workers hold.

Workers started with `-E` (or `worker_send_task_events = True`) publish task-received,
-started, -succeeded, -failed, -retried, -rejected and worker heartbeats to the `celeryev`
fanout exchange. On kombu's Redis transport that is a PUBLISH on `/<db>.celeryev/<routing
key>` of a kombu message (a JSON envelope, the event JSON in its base64 body). The reader
subscribes to that pattern: a read, where Celery's own EventReceiver would declare a queue and
write its binding into the broker. Events published while it is not subscribed are not seen.
The subscription has a connection of its own, which a read cut off at its deadline keeps (the
watchdog severs the other one): what is published meanwhile waits there for the next read. A
subscription lost with its connection (Redis restarted, its output buffer limit) is made again
by redis-py; each such gap is counted in queue_exporter_events_lost_total (one per gap: how many
events it held, Redis does not tell) and named in the log.
A task's queue. Celery names it in one event only, task-sent, which producers send only with
`task_send_sent_event = True` (off by default); the worker's events (received, started,
succeeded, ...) do not name it. So the reader learns it, exactly where Celery records it:
task-sent; kombu's unacked hash (each prefetched message with its routing key, read each read);
and, unless `inspect: false`, one round of Celery's broadcast inspection per read
(celery_inspect.py): `active` and `reserved` (each task a worker runs or holds, with its
routing key), `active_queues` (the queues each worker consumes) and `stats` (its pool's
slots). A task whose own queue was not seen takes its worker's queue when that worker consumes
one queue, else the queue its worker's `task_routes` route its name to when the worker consumes
it; where those routes cannot be read (a router function or class, no inspection), the one
queue its task name was seen routed to among those its worker consumes. Else (a task sent with
a queue= of its own to a worker of several queues) it is counted under `unknown_queue`
("(unknown)", no real queue's name), named in the log and on the status page with what would
tell it. An event that comes after its task's end (the prefork pool may report a retried
attempt after the next attempt ended) counts on that task's queue, with its name: the tasks
that ended lately are remembered (MAX_ENDED).

Running tasks: started and not yet ended, per queue, as `queue_depth{state="active"}`; each
inspection round names what every worker runs (a task that started before the reader
subscribed too) and drops what a worker no longer runs (an end event lost). The longest running
task's age per queue, `queue_oldest_age_seconds{state="active"}`, from its start as Celery
records it (task-started, `active`'s time_start); left out for a queue while one of its
running tasks has no recorded start (known from a heartbeat alone). Without
inspection a task that started before the reader subscribed is known from its worker's
heartbeat (`active`, every 2 s) beyond the tasks seen starting there, on its worker's queue
when it consumes one, else under `unknown_queue`. Messages a
worker prefetched but has not started are in kombu's `unacked` hash, one per delivery, with the
routing key: they are counted as pending of their queue, or scheduled while their ETA
(countdown) is ahead (MAX_UNACKED entries a read at most) (a running task of a late-ack worker
is in that hash too, and counts as active only).

Workers: each on every queue it consumes (inspection), with its pool's slots (`stats`
max-concurrency); busy on a queue by the tasks of that queue it runs. Without inspection
(or before a worker first answered) a worker is known from its heartbeats alone: under
`unknown_queue`, with no slot series (none is made up). A worker-offline event removes it at
once. A worker whose heartbeats say it processed tasks while none of its task events came runs
without task events (`-E` missing): named once in the log, on the status page and in
queue_exporter_native_silent, with the fix.

When no event arrives for `events_timeout` (workers heartbeat every 2 s, idle or not) the
reader cannot say what runs: no worker runs, or workers run without -E. That is not a fault:
the read succeeds (the source stays up, the exporter ready), the running tasks' active depth is
left out, workers age out, prefetched messages are still counted from Redis, and the reader
says so once in the log, on the status page and in queue_exporter_native_silent
(`report_no_events: false`: active depth reads 0 all the same).
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from base64 import b64decode
from collections import Counter, OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import redis

from exporter.core import numbers
from exporter.core.item_time import parse_time
from exporter.core.logs import LogLimiter
from exporter.core.numbers import InvalidValue
from exporter.lifecycle.metrics import apply
from exporter.lifecycle.wire import Event
from exporter.output.catalog import BY_NAME
from exporter.redis.connection import RedisConnectionConfig
from exporter.redis.members import members_of
from exporter.redis.subscription import PatternSubscription
from exporter.sources.readers.celery_inspect import CONF, HeldTask, Inspector, Routes, WorkerReport
from exporter.sources.readers.config import CeleryReaderConfig
from exporter.sources.readers.framework import (
    MAX_KEYS,
    MAX_QUEUES_PER_WORKER,
    MAX_WORKERS,
    RedisReader,
    Signals,
)
from exporter.sources.redis_keys.values import member_values, names, selects

log = logging.getLogger(__name__)
_limited = LogLimiter(log)

DEPTH = BY_NAME["queue_depth"]
OLDEST_AGE = BY_NAME["queue_oldest_age_seconds"]
# Tasks remembered between their events (queue, name, times) at most; the oldest go first.
MAX_TASKS = 100_000
# How long one read drains events at most, as a share of the interval.
DRAIN_SHARE = 0.5
# A kombu message larger than this is no event (Celery's are well under a KiB), nor is a batch
# of more events than this one message (a worker's buffered events, `worker_event_batch`).
MAX_MESSAGE_BYTES = 1 << 20
MAX_BATCH = 10_000
# An inspection round's share of the interval at most (inspect_timeout caps it further).
INSPECT_SHARE = 0.25
# Task names whose routed queues are remembered, and queues per name (task_routes by name).
MAX_ROUTED_NAMES = 10_000
MAX_QUEUES_PER_NAME = 100
# Task events after which the task no longer runs on its worker.
_ENDS = frozenset({"task-succeeded", "task-failed", "task-retried", "task-revoked"})
_CHANGES = ("started", "ended", "ended_unseen")
# Tasks that ended lately, kept for their name, queue and worker: the prefork pool may report
# a retried attempt (task-retried) after its next attempt ended, one pool process having run
# the retry while the main process had not yet taken the other's result. At most this many.
MAX_ENDED = 10_000
MAX_ACTIVE_QUEUES = 10_000  # queues remembered to read 0 once their tasks ended
# kombu's bindings: a set per exchange, a member "<routing key>SEP<pattern>SEP<queue>" per queue
# a worker or producer declared, but those config.not_task_queues names (the celery preset's
# pidbox and event receivers' queues). Read again at most this often: a SCAN of the keyspace.
BINDINGS = "_kombu.binding.*"
# kombu's unacked hash holds one entry per prefetched message (prefetch multiplier x
# concurrency per worker): read this many per HSCAN, this many per read at most. (HSCAN may
# return an entry twice while Redis rehashes the hash: a rare double in a depth gauge.)
UNACKED_SCAN = 1000
MAX_UNACKED = 10_000
BINDINGS_REFRESH = 30.0


@dataclass(slots=True)
class _Task:
    name: str = ""
    queue: str = ""
    enqueued_at: float | None = None
    started_at: float | None = None
    # started_at is when it started as Celery recorded it (task-started, `active`'s
    # time_start), not the inspection round that found it running
    start_recorded: bool = False
    worker: str = ""
    retries: int = 0
    # Its worker's `active` answer no longer lists it: not running, though its end event may
    # still come (then with its duration); a lost end event leaves it here until evicted
    unlisted: bool = False


@dataclass(slots=True)
class _Inspected:
    """What a worker answered in its latest inspection rounds."""

    answered_at: float  # time.monotonic()
    queues: list[str] | None = None
    slots: int | None = None
    running: int | None = None  # tasks it ran at the latest round it answered `active`
    conf_read: bool = False
    routes: Routes | None = None  # its task_routes, when plain data


class CeleryReader(RedisReader):
    def __init__(
        self, config: CeleryReaderConfig, connection: RedisConnectionConfig, interval: float
    ) -> None:
        super().__init__(connection)
        self.name = "native:celery"
        self.config = config
        self.drain_budget = interval * DRAIN_SHARE
        # On a connection of its own: the watchdog severs the other one (interrupt).
        self._events = PatternSubscription(connection, config.channel_pattern(connection))
        self._interrupted = False  # by the watchdog or a shutdown: the drain stops
        self._tasks: OrderedDict[str, _Task] = OrderedDict()
        self._ended: OrderedDict[str, _Task] = OrderedDict()  # MAX_ENDED lately ended
        self._workers: dict[str, tuple[int, float]] = {}  # hostname -> (active, heartbeat time)
        self._beyond_limit = 0  # heartbeats of new workers beyond MAX_WORKERS in this read
        # Per (worker, change) since its last heartbeat: tasks seen starting, seen running and
        # ending, and ending unseen (started before the reader subscribed): its heartbeat's
        # `active` is compared with what ran at that heartbeat, not now.
        self._since_beat: Counter[tuple[str, str]] = Counter()
        # (queue, worker) pairs the last read reported: one no longer reported (worker-offline,
        # its queues learned) leaves queue_workers at once, not at the registry's timeout
        self._reported: set[tuple[str, str]] = set()
        # Queues that had a running task: their active depth reads 0 after it, not nothing
        self._active_queues: set[str] = set()
        self._last_event = time.monotonic()
        self._declared: list[str] = []  # queues found in kombu's bindings: active reads 0
        self._declared_at = -math.inf
        self._inspector = (
            Inspector(config.control(connection), config.sep) if config.inspect else None
        )
        self.inspect_budget = min(config.inspect_timeout, interval * INSPECT_SHARE)
        self._inspected: dict[str, _Inspected] = {}
        self._inspect_refused: str | None = None  # why the ACL or server refused a round
        # task name -> queues its tasks were seen routed to (exactly: task-sent, unacked,
        # inspection): task_routes route by name
        self._routes: dict[str, set[str]] = {}
        # hostname -> (`processed` at its first heartbeat, at its latest); hosts that sent a
        # task event: a worker that processed tasks without any runs without -E
        self._processed: dict[str, tuple[int, int]] = {}
        self._task_events_from: set[str] = set()
        self._unknown_at = -math.inf  # when a task was last counted under unknown_queue

    def read(self, signals: Signals) -> None:
        """Redis's keys first, the events last: a read that fails (cut off at its deadline, a
        lost connection) has taken no event yet, so none is dropped with it; they wait on the
        subscription, which a failed read keeps."""
        self._interrupted = False
        try:
            unacked = self._unacked(signals)
            self._refresh_declared(signals)
            self._inspect(signals)
            self._drain(signals)
        except Exception:
            super().close()  # the subscription stays: its connection is not this one
            raise
        idle = time.monotonic() - max(self._last_event, self._events.made_at or -math.inf)
        no_events = self.config.report_no_events and idle > self.config.events_timeout
        if no_events:
            signals.silent = (
                f"no Celery event for {idle:.0f} s (workers heartbeat every 2 s): no worker runs, "
                "or workers run without -E; start them with -E (worker_send_task_events = True). "
                "Running tasks and workers are not served until events come (queue depths are)"
            )
        else:
            signals.silent = self._without_task_events()
        signals.caveat = self._caveat()
        self._report(signals, unacked, no_events)

    def workers_inspected(self) -> dict[str, tuple[list[str] | None, int | None, bool]]:
        """Per worker that answered inspection: its queues, slots, and whether its routes
        can be read (check-config prints them)."""
        return {
            name: (seen.queues, seen.slots, seen.routes is not None)
            for name, seen in self._inspected.items()
        }

    def interrupt(self) -> None:
        """The read in progress fails now if it waits on Redis's keys; a drain stops at its
        next message instead, keeping its subscription and what it buffered."""
        self._interrupted = True
        super().interrupt()

    def close(self) -> None:
        if self._inspector is not None and self._client is not None:
            # a round cut off left its reply queue; closing, a failure leaves it to kombu's sweep
            with suppress(Exception):
                self._inspector.leave(self._client)
        self._events.close()
        super().close()

    # -- reading --------------------------------------------------------------------------------

    def _drain(self, signals: Signals) -> None:
        """Events waiting on the subscription, until none waits, the drain's budget is spent,
        the read's deadline passes or the watchdog interrupts it: the rest waits for the next
        read. A message taken is applied whole (no deadline check within it: _own_fault)."""
        until = time.monotonic() + self.drain_budget

        def stop() -> bool:
            return time.monotonic() > until or self._interrupted or signals.deadline.passed()

        for channel, data in self._events.messages(stop, lambda: self._on_gap(signals)):
            with _own_fault(signals, channel):  # a poison message costs itself only
                unread = True
                self._on_message(data, signals)
                unread = False
            signals.tally.consumed += unread  # a refused message counts as one event

    def _on_gap(self, signals: Signals) -> None:
        """Redis confirmed a subscription again (subscription.py): events published in
        between were not seen."""
        signals.tally.lost += 1  # how many events the gap held, Redis does not tell
        _limited.warning(
            (id(self), "gap"),  # per reader: each names its first gap at once
            "celery: the events subscription was lost and made again: events published in "
            "between were not seen (one gap counted in queue_exporter_events_lost_total) "
            "[resubscribed]",
        )
        for task in self._tasks.values():
            task.started_at = None  # what ran in the gap is unknown

    def _on_message(self, raw: bytes, signals: Signals) -> None:
        """One kombu message: a JSON envelope whose body holds the event (or a batch of them),
        applied at once: what a read holds is one message, not all it drained (a flood of
        400k heartbeats would be 190 MiB of dicts)."""
        if len(raw) > MAX_MESSAGE_BYTES:
            raise InvalidValue("oversized_field", f"a message of {len(raw)} bytes")
        body = _kombu_body(raw)
        batch = body if isinstance(body, list) else [body]
        if len(batch) > MAX_BATCH:
            signals.tally.refuse("over_limit")
            batch = batch[:MAX_BATCH]
        self._last_event = time.monotonic()
        signals.tally.consumed += len(batch)
        for event in batch:
            with _own_fault(signals, "celery event"):  # one odd event costs itself only
                if not isinstance(event, dict):
                    raise InvalidValue("bad_value", "an event that is no JSON object")
                self._apply(event, signals)

    def _unacked(self, signals: Signals) -> Counter[tuple[str, str, str]]:
        """(queue, task id, state) of each delivered, unacknowledged message: pending, or
        scheduled while its ETA (countdown) is ahead: the worker holds it until then. Read
        UNACKED_SCAN entries at a time, MAX_UNACKED at most: a hash flooded with more costs
        a read no more than that (the excess refused: over_limit, once)."""
        deliveries: Counter[tuple[str, str, str]] = Counter()
        key, taken = self.config.unacked_key, 0
        with signals.record(key):  # not a hash: counted, the rest goes on
            entries = self._connect().hscan_iter(key, count=UNACKED_SCAN)
            for _, raw in entries:
                if taken == MAX_UNACKED:
                    signals.tally.refuse("over_limit")
                    break
                taken += 1
                with signals.record(key):  # an entry that is not kombu's costs itself only
                    queue, task_id, name, state = _delivery(raw, signals.now)
                    deliveries[(queue, task_id, state)] += 1
                    self._learn(task_id, name, queue)
        return deliveries

    def _refresh_declared(self, signals: Signals) -> None:
        """The task queues kombu's bindings name: each reads active 0 while none of its tasks
        runs and the reader hears events (a queue found before any of its tasks ran)."""
        if time.monotonic() - self._declared_at < BINDINGS_REFRESH:
            return
        connection = self._connect()
        scan = connection.scan_iter(match=BINDINGS, count=1000)

        def bindings() -> Iterator[bytes]:
            """Every binding set's members, one listing: MAX_KEYS members over all the sets."""
            for key in signals.names(scan, MAX_KEYS, f"keys {BINDINGS}"):
                with signals.record(key):  # not a set: counted, the rest goes on
                    yield from members_of(connection, key)  # SSCAN: as they are taken

        members = list(signals.names(bindings(), MAX_KEYS, f"members of {BINDINGS}"))
        sep = self.config.sep
        found = member_values(members, f"{{_routing_key}}{sep}{{_pattern}}{sep}{{value}}")
        skipped = re.compile(self.config.not_task_queues or "(?!)")  # (?!): matches nothing
        queues = sorted(queue for queue in found if not skipped.fullmatch(queue))
        self._declared = signals.at_most(queues, MAX_ACTIVE_QUEUES)
        self._declared_at = time.monotonic()

    # -- Celery's inspection -------------------------------------------------------------------

    def _inspect(self, signals: Signals) -> None:
        """One round (celery_inspect.py); what each worker answered replaces what it answered
        before. A round the ACL or the server refuses costs its figures alone (slots, queues
        of workers), named as a caveat; a lost connection fails the read."""
        if self._inspector is None:
            return
        expected = set(self._workers) | set(self._inspected)
        unread = [name for name in expected if not self._conf_read(name)]
        conf_for = unread if expected else None  # nobody known yet: every worker's
        started = signals.now
        try:
            reports = self._inspector.round(
                self._connect(), self.inspect_budget, expected, signals.unreadable, conf_for
            )
        except redis.ResponseError as error:  # NOPERM, an unknown command: not a fault of Redis
            self._inspect_refused = f"{type(error).__name__}: {str(error)[:200]}"
            return
        self._inspect_refused = None
        answered_at = time.monotonic()
        running: dict[str, set[str]] = {}  # per worker that answered `active`: its tasks' ids
        for hostname, report in reports.items():
            if hostname not in self._inspected and len(self._inspected) >= MAX_WORKERS:
                self._beyond_limit += 1
                continue
            seen = self._inspected.setdefault(hostname, _Inspected(answered_at))
            seen.answered_at = answered_at
            self._take_report(hostname, report, seen, started, signals)
            if report.running is not None:
                running[hostname] = {held.task_id for held in report.running}
        for task_id, task in self._tasks.items():  # one pass, whatever the number of workers
            ids = running.get(task.worker)
            ran_before = task.started_at is not None and task.started_at < started
            if ids is not None and ran_before and task_id not in ids:
                task.unlisted = True  # not running now; its end event may still be on its way
        horizon = answered_at - self.config.events_timeout
        for hostname in [
            name for name, seen in self._inspected.items() if seen.answered_at < horizon
        ]:
            del self._inspected[hostname]  # gone without a worker-offline (killed)

    def _take_report(
        self,
        hostname: str,
        report: WorkerReport,
        seen: _Inspected,
        started: float,
        signals: Signals,
    ) -> None:
        if report.queues is not None:
            seen.queues = signals.at_most(report.queues, MAX_QUEUES_PER_WORKER)
        if report.slots is not None:
            seen.slots = report.slots
        if CONF in report.answered:
            seen.conf_read, seen.routes = True, report.routes
        for held in [*(report.running or ()), *(report.reserved or ())]:
            self._learn(held.task_id, held.name, held.queue)
        if report.running is None:
            return
        seen.running = len(report.running)
        self._take_running(hostname, report.running, started, signals)

    def _take_running(
        self, hostname: str, running: list[HeldTask], started: float, signals: Signals
    ) -> None:
        """Each task a worker runs now, one that started before the reader subscribed too."""
        for held in running:
            task = self._task(held.task_id)
            task.worker = hostname
            task.name = task.name or held.name
            task.unlisted = False
            if task.started_at is None:
                task.started_at, task.start_recorded = started, False
                if held.started_at is not None:
                    with signals.record(hostname):  # a time out of range: the round's time
                        task.started_at = numbers.epoch(held.started_at, signals.latest)
                        task.start_recorded = True

    def _learn(self, task_id: str, name: str, queue: str) -> None:
        """A task's queue as Celery recorded it (task-sent, unacked, inspection), and its
        name's route."""
        if not queue:
            return
        if task_id:
            self._task(task_id).queue = queue
        if name and (name in self._routes or len(self._routes) < MAX_ROUTED_NAMES):
            routes = self._routes.setdefault(name, set())
            if len(routes) < MAX_QUEUES_PER_NAME:
                routes.add(queue)

    def _conf_read(self, hostname: str) -> bool:
        seen = self._inspected.get(hostname)
        return seen is not None and seen.conf_read

    def _served(self, hostname: str) -> list[str] | None:
        seen = self._inspected.get(hostname)
        return seen.queues if seen is not None else None

    def _queue_of(self, task: _Task, hostname: str) -> str:
        """The task's queue: as Celery recorded it, else its worker's one queue, else the
        queue its worker's task_routes route its name to when the worker consumes it; where
        those routes are not known (not plain data, not inspected), the one queue its name was
        seen routed to among its worker's; else unknown_queue."""
        if task.queue:
            return task.queue
        served = self._served(hostname)
        if served is not None and len(served) == 1:
            task.queue = served[0]
            return task.queue
        seen = self._inspected.get(hostname)
        if seen is not None and seen.routes is not None and served and task.name:
            queue = seen.routes.queue_of(task.name)
            if queue in served:
                task.queue = queue
                return queue
            # sent with a queue of its own (the caller's queue=): another task of its name
            # seen on one queue tells nothing of this one's
            return self._unknown()
        routed = self._routes.get(task.name, set())
        candidates = routed & set(served) if served is not None else routed
        if len(candidates) == 1:
            task.queue = next(iter(candidates))
            return task.queue
        return self._unknown()

    def _unknown(self) -> str:
        self._unknown_at = time.monotonic()  # named while such tasks come or run (_caveat)
        return self.config.unknown_queue

    def _caveat(self) -> str | None:
        """What the reader cannot tell while it serves what it can, with what would tell it."""
        said = []
        if self._inspect_refused is not None:
            said.append(
                f"Celery's inspection was refused ({self._inspect_refused}): workers' queues "
                "and slots are not known (redis-acl prints the rules it needs; inspect: false "
                "sends none)"
            )
        if time.monotonic() - self._unknown_at < self.config.events_timeout:
            said.append(
                "the queue of some tasks could not be learned: they are counted under "
                f'queue="{self.config.unknown_queue}" (its series say how many). Producers with task_send_sent_event = '
                "True name each task's queue; so does Celery's inspection (inspect: true) for "
                "a worker that consumes one queue, or a task name routed to one queue"
            )
        return "; ".join(said) or None

    def _without_task_events(self) -> str | None:
        """Workers whose heartbeats say they processed tasks while none of their task events
        came: they run without -E, and flat counts would look healthy."""
        quiet = sorted(
            hostname
            for hostname, (first, latest) in self._processed.items()
            if latest > first and hostname not in self._task_events_from
        )
        if not quiet:
            return None
        shown = ", ".join(quiet[:5]) + (f" and {len(quiet) - 5} more" if len(quiet) > 5 else "")
        return (
            f"workers {shown} processed tasks but sent no task event: they run without -E; "
            "start them with -E (or worker_send_task_events = True). Their tasks' throughput, "
            "failures and runtimes are not counted"
        )

    # -- events -> metrics --------------------------------------------------------------------

    def _apply(self, event: dict[str, Any], signals: Signals) -> None:
        """One event; InvalidValue (or anything else it raises) costs it alone (read())."""
        kind = event.get("type")
        if not isinstance(kind, str) or "timestamp" not in event:
            raise InvalidValue("missing_field", "type and timestamp")
        ts = numbers.epoch(event["timestamp"], signals.latest)  # no phantom from the future
        if kind.startswith("worker-"):
            self._worker_event(kind, event, ts)
            return
        task_id = event.get("uuid")
        if not isinstance(task_id, str):
            raise InvalidValue("missing_field", "uuid")
        self._task_event(kind, task_id, event, ts, signals)

    def _worker_event(self, kind: str, event: dict[str, Any], ts: float) -> None:
        hostname = event.get("hostname")
        if not isinstance(hostname, str) or not hostname:
            raise InvalidValue("missing_field", "hostname")
        if kind == "worker-offline":
            self._forget_worker(hostname)  # not reported by this read: gone at once (_report)
            return
        active = event.get("active")
        busy = 0 if active is None else numbers.count(active)
        if hostname not in self._workers and len(self._workers) >= MAX_WORKERS:
            self._beyond_limit += 1  # counted once per read (_report), not per heartbeat
            return
        self._workers[hostname] = (busy, ts)
        processed = event.get("processed")
        if processed is not None:
            count = numbers.count(processed)
            first = self._processed.get(hostname, (count, count))[0]
            self._processed[hostname] = (min(first, count), count)  # a restart counts anew
        for change in _CHANGES:
            self._since_beat.pop((hostname, change), None)

    def _task_event(
        self, kind: str, task_id: str, event: dict[str, Any], ts: float, signals: Signals
    ) -> None:
        late = task_id not in self._tasks and task_id in self._ended
        task = self._task(task_id)
        if late:  # an event of an attempt that ended before it came: the task's own queue
            ended = self._ended[task_id]
            task.name, task.queue, task.worker = ended.name, ended.queue, ended.worker
        if isinstance(event.get("name"), str):
            task.name = event["name"]
        if not late:  # nothing of it runs now
            self._note_since_beat(kind, task, event)
        system = self.config.system
        hostname = str(event.get("hostname", ""))
        if kind != "task-sent" and len(self._task_events_from) < MAX_WORKERS:
            self._task_events_from.add(hostname)  # a worker's event (task-sent: a producer's)

        def emit(name: str, **fields: Any) -> None:
            labels = {"system": system, "queue": self._queue_of(task, task.worker or hostname)}
            event = Event.of(name, ts, signals.latest, job_type=task.name, **labels, **fields)
            apply(signals.tally, event, system)

        if kind == "task-sent":
            queue = str(event.get("queue") or event.get("routing_key") or "")
            self._learn(task_id, task.name, queue)
            task.enqueued_at = ts
            emit("enqueued")
        elif kind == "task-received":
            retries = event.get("retries")
            task.retries = retries if isinstance(retries, int) else 0
            if task.enqueued_at is None or task.retries:  # a retry is enqueued anew
                task.enqueued_at = ts
            emit("dequeued")
        elif kind == "task-started":
            task.started_at, task.worker, task.unlisted = ts, hostname, False
            task.start_recorded = True
            emit("started", enqueued_at=task.enqueued_at)
        elif kind == "task-succeeded":
            runtime = event.get("runtime")
            duration = runtime if isinstance(runtime, int | float) else self._ran(task, ts)
            attempt = task.retries + 1
            emit("completed", duration=duration, enqueued_at=task.enqueued_at, attempt=attempt)
            self._end(task_id)
        elif kind == "task-failed":
            error_type = _error_type(str(event.get("exception", "")))
            duration, attempt = self._ran(task, ts), task.retries + 1
            emit("failed", error_type=error_type, duration=duration, attempt=attempt)
            if error_type == "timeout":
                emit("timed_out")
            self._end(task_id)
        elif kind == "task-retried":
            emit("failed", error_type="retryable", duration=self._ran(task, ts))
            emit("retried")
            task.started_at = None
        elif kind == "task-rejected":
            if event.get("requeue"):
                emit("requeued", reason="rejected")
            else:
                emit("failed", error_type="other")
            self._end(task_id)
        elif kind in ("task-revoked", "task-cancelled"):
            self._end(task_id)

    def _end(self, task_id: str) -> None:
        """The task ended: no longer tracked, but remembered among the lately ended."""
        task = self._tasks.pop(task_id, None)
        if task is not None:
            self._ended[task_id] = task
            if len(self._ended) > MAX_ENDED:
                self._ended.popitem(last=False)

    def _note_since_beat(self, kind: str, task: _Task, event: dict[str, Any]) -> None:
        hostname = event.get("hostname")
        if not isinstance(hostname, str) or hostname not in self._workers:
            return  # no heartbeat of it to compare with yet
        if kind == "task-started" and task.started_at is None:
            self._since_beat[(hostname, "started")] += 1
        elif kind in _ENDS and task.started_at is not None:
            self._since_beat[(task.worker, "ended")] += 1
        elif kind in _ENDS:
            self._since_beat[(hostname, "ended_unseen")] += 1

    def _task(self, task_id: str) -> _Task:
        task = self._tasks.get(task_id)
        if task is None:
            task = self._tasks[task_id] = _Task()
            if len(self._tasks) > MAX_TASKS:
                self._tasks.popitem(last=False)
        return task

    @staticmethod
    def _ran(task: _Task, ended: float) -> float | None:
        """The worker's execution time; a negative one (a start after the end) is refused
        with the event it is in (Event.of: negative_duration), not left out silently."""
        if task.started_at is None:
            return None
        return ended - task.started_at

    def _forget_worker(self, hostname: str) -> None:
        self._workers.pop(hostname, None)
        self._inspected.pop(hostname, None)
        self._processed.pop(hostname, None)
        self._task_events_from.discard(hostname)
        self._forget_running(hostname)

    def _forget_running(self, hostname: str) -> None:
        for task in self._tasks.values():
            if task.worker == hostname:
                task.started_at = None

    # -- what is held now -----------------------------------------------------------------------

    def _report(
        self, signals: Signals, unacked: Counter[tuple[str, str, str]], no_events: bool
    ) -> None:
        if self._beyond_limit:
            signals.tally.refuse("over_limit")
            _limited.warning(
                "workers",
                "celery: %d workers beyond the %d remembered were not taken",
                self._beyond_limit,
                MAX_WORKERS,
            )
            self._beyond_limit = 0
        system = self.config.system
        horizon = signals.now - self.config.events_timeout
        for hostname, (_, beat) in list(self._workers.items()):
            if beat < horizon:  # gone without a worker-offline (killed)
                self._forget_worker(hostname)
        selection = self.config.queues
        zeros = [*names(selection), *self._declared, *self._active_queues]
        running: Counter[str] = Counter({queue: 0 for queue in zeros})
        running_ids = set()
        seen_running: Counter[str] = Counter()  # per worker: the running tasks events told of
        on_worker: Counter[tuple[str, str]] = Counter()  # (worker, queue): tasks it runs
        # per queue, when its longest running task started; None: a running task's start is
        # not recorded (found by an inspection round, or by a heartbeat alone)
        since: dict[str, float | None] = {}
        for task_id, task in self._tasks.items():
            if task.started_at is not None and not task.unlisted:
                queue = self._queue_of(task, task.worker)
                running[queue] += 1
                running_ids.add(task_id)
                seen_running[task.worker] += 1
                on_worker[(task.worker, queue)] += 1
                earliest = since.get(queue, math.inf)
                if earliest is None or not task.start_recorded:
                    since[queue] = None
                else:
                    since[queue] = min(earliest, task.started_at)
        for hostname, unseen in self._unseen_running(seen_running).items():
            served = self._served(hostname)
            queue = served[0] if served and len(served) == 1 else self.config.unknown_queue
            running[queue] += unseen
            on_worker[(hostname, queue)] += unseen
            since[queue] = None
        self._report_workers(signals, on_worker)
        for queue, count in running.items() if not no_events else ():
            if selects(selection, queue):  # the preset's queues param narrows what is served
                signals.samples.add_labelled(DEPTH, (system, queue, "", "active"), count)
                if count and len(self._active_queues) < MAX_ACTIVE_QUEUES:
                    self._active_queues.add(queue)
                if (started_at := since.get(queue)) is not None:
                    age = max(0.0, signals.now - started_at)  # the worker's clock a bit ahead
                    signals.samples.add_labelled(OLDEST_AGE, (system, queue, "", "active"), age)
        for (queue, task_id, state), count in unacked.items():
            if task_id not in running_ids and selects(selection, queue):
                signals.samples.add_labelled(DEPTH, (system, queue, "", state), count)

    def _unseen_running(self, seen_running: Counter[str]) -> Counter[str]:
        """Per worker not inspected, the tasks its heartbeat says it runs beyond those seen
        starting: they started before the reader subscribed (a rolling update, long tasks).
        An inspected worker's `active` answer names them itself (_take_running)."""
        unseen_by_worker: Counter[str] = Counter()
        since = self._since_beat
        for hostname, (active, _) in self._workers.items():
            seen = self._inspected.get(hostname)
            if seen is not None and seen.running is not None:
                continue
            seen_at_beat = seen_running[hostname] - since[(hostname, "started")]
            seen_at_beat += since[(hostname, "ended")]
            unseen = active - seen_at_beat - since[(hostname, "ended_unseen")]
            if unseen > 0:
                unseen_by_worker[hostname] = unseen
        for key in [key for key in since if key[0] not in self._workers]:
            del since[key]
        return unseen_by_worker

    def _report_workers(self, signals: Signals, on_worker: Counter[tuple[str, str]]) -> None:
        """Each worker on every queue it consumes, busy by the tasks of that queue it runs,
        with its pool's free slots beside them; a worker whose queues are not known (not
        inspected) under unknown_queue; slots only as Celery says them."""
        system, selection = self.config.system, self.config.queues
        reported = set()
        for hostname in {*self._workers, *self._inspected}:
            seen = self._inspected.get(hostname)
            beat = self._workers.get(hostname)
            slots = seen.slots if seen is not None else None
            if seen is not None and seen.running is not None:
                busy = seen.running
            else:
                busy = beat[0] if beat is not None else 0
            queues = seen.queues if seen is not None and seen.queues else None
            free = None if slots is None else max(slots - busy, 0)
            with signals.record(hostname):
                if queues is None:
                    capacity = None if free is None else busy + free
                    signals.worker(system, self.config.unknown_queue, hostname, busy, capacity)
                    reported.add((self.config.unknown_queue, hostname))
                    continue
                for queue in queues:
                    if not selects(selection, queue):
                        continue
                    here = busy if len(queues) == 1 else on_worker[(hostname, queue)]
                    capacity = None if free is None else here + free
                    signals.worker(system, queue, hostname, here, capacity)
                    reported.add((queue, hostname))
        gone = self._reported - reported
        signals.tally.departed.extend((system, queue, hostname) for queue, hostname in gone)
        self._reported = reported


@contextmanager
def _own_fault(signals: Signals, key: str | bytes) -> Iterator[None]:
    """signals.record without its deadline check: a message taken off the subscription is gone
    from it, so it is applied whole; the drain checks the deadline between messages."""
    try:
        yield
    except Exception as error:
        signals.unreadable(key, error)


def _delivery(raw: bytes, now: float) -> tuple[str, str, str, str]:
    """An unacked entry's (queue, task id, task name, state); ValueError when it is not
    kombu's."""
    message, _exchange, routing_key = json.loads(raw)
    headers = message.get("headers") or {}
    eta = headers.get("eta")
    later = isinstance(eta, str) and parse_time(eta, "iso") > now
    state = "scheduled" if later else "pending"
    return str(routing_key), str(headers.get("id", "")), str(headers.get("task") or ""), state


def _kombu_body(raw: bytes) -> Any:
    envelope = json.loads(raw)
    body = envelope["body"]
    if envelope.get("properties", {}).get("body_encoding") == "base64":
        body = b64decode(body)
    return json.loads(body)


def _error_type(exception: str) -> str:
    name = exception.split("(", 1)[0].rsplit(".", 1)[-1]
    if name in ("TimeLimitExceeded", "SoftTimeLimitExceeded"):
        return "timeout"
    if name == "NotRegistered":
        return "handler_not_found"
    if name == "WorkerLostError":
        return "other"
    return "non_retryable"  # task-failed is final: a retried attempt sends task-retried
