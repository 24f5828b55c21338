"""From events to metric updates: per-batch tallies, the worker registry, the self-metrics.

A batch of events becomes one Tally (counter increments and histogram observations keyed
by metric and label values); the tally reaches telemetry in one call per batch, so the cost
per event is a few dict operations, not an SDK call (store.py explains why).
docs/events.md has the table of which event updates which family.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from opentelemetry.metrics import CallbackOptions, Counter, Observation

from exporter.lifecycle.wire import Event, InvalidEvent, TraceContext
from exporter.output.catalog import BY_NAME, SOURCE_LABEL, MetricSpec
from exporter.output.samples import LabelValues, Series
from exporter.output.store import (
    OVERFLOW,
    CounterSeries,
    Exemplar,
    HistogramSeries,
    MetricStore,
    SeriesKey,
)
from exporter.output.telemetry import Telemetry

# A queue's workers: busy, idle, busy slots, free slots (None: a worker does not say its slots)
WorkerTotal = tuple[int, int, int | None, int | None]
NO_WORKERS: WorkerTotal = (0, 0, 0, 0)

_V = TypeVar("_V")
_Series = TypeVar("_Series", CounterSeries, HistogramSeries)

# The families whose series keep exemplars of the events that carry a traceparent: the job
# durations (one a bucket) and the completions, failures and time-outs (docs/metrics.md lists
# them).
EXEMPLIFIED = (
    "queue_job_execution_seconds",
    "queue_job_total_seconds",
    "queue_job_wait_seconds",
    "queue_jobs_completed_total",
    "queue_jobs_failed_total",
    "queue_jobs_timed_out_total",
)

# Failures after which the job is not retried: its attempts are final.
FINAL_ERROR_TYPES = frozenset({"non_retryable", "handler_not_found"})


@dataclass(slots=True)
class Heartbeat:
    system: str
    queue: str
    worker: str
    active: int
    capacity: int | None  # None: the system does not say (no slot series for its queue)
    ts: float


@dataclass(slots=True)
class Tally:
    """What one batch adds: counters, observations, heartbeats, consumed/invalid/lost counts."""

    counts: dict[tuple[str, LabelValues], float] = field(default_factory=dict)
    observations: dict[tuple[str, LabelValues], list[float]] = field(default_factory=dict)
    # The counts and observations of events that carried a trace context (traceparent)
    exemplars: dict[tuple[str, LabelValues], list[Exemplar]] = field(default_factory=dict)
    heartbeats: list[Heartbeat] = field(default_factory=list)
    # (system, queue, worker) of workers gone from a queue (Celery's worker-offline, or a
    # worker whose queues became known): they leave its series now, not at their timeout
    departed: list[tuple[str, str, str]] = field(default_factory=list)
    consumed: int = 0
    invalid: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    # The batch's plain frequent events (readers/v1.py's tally_plain), recorded straight into
    # the series they hold (FrequentEvent.record): (event, ts, enqueued_at, duration, attempt)
    plain: list[PlainEvent] = field(default_factory=list)

    def count(self, metric: str, labels: LabelValues, amount: float = 1.0) -> None:
        key = (metric, labels)
        counts = self.counts
        counts[key] = counts.get(key, 0.0) + amount

    def observe(self, metric: str, labels: LabelValues, value: float) -> None:
        key = (metric, labels)
        observations = self.observations
        values = observations.get(key)
        if values is None:
            observations[key] = [value]
        else:
            values.append(value)

    def exemplify(
        self, metric: str, labels: LabelValues, value: float, trace: TraceContext, ts: float
    ) -> None:
        """The trace an observation (or a counter's increment) of `value` at `ts` was made in."""
        exemplar = Exemplar(value, trace.trace_id, trace.span_id, ts)
        self.exemplars.setdefault((metric, labels), []).append(exemplar)

    def refuse(self, reason: str) -> None:
        self.invalid[reason] = self.invalid.get(reason, 0) + 1


# -- event -> metric updates --------------------------------------------------------------------

Handler = Callable[[Tally, Event, LabelValues], None]


def apply(tally: Tally, event: Event, default_system: str) -> None:
    """Add one valid event's metric updates to the tally."""
    handler = _JOB_HANDLERS.get(event.name)
    if handler is not None:
        handler(
            tally,
            event,
            (event.system or default_system, event.queue, event.job_type, event.priority),
        )
    else:
        _SYSTEM_HANDLERS[event.name](tally, event, (event.system or default_system, event.queue))


# The handlers of frequent events update tally.counts (and started's observation) inline: a
# method call per update is a tenth of the consumer's time per event (bench/event_ingest.py).


def _counter(metric: str) -> Handler:
    def handle(tally: Tally, _: Event, job: LabelValues) -> None:
        counts, key = tally.counts, (metric, job)
        counts[key] = counts.get(key, 0.0) + 1.0

    return handle


def _dequeued(tally: Tally, event: Event, job: LabelValues) -> None:
    counts, key = tally.counts, ("queue_jobs_dequeued_total", job)
    counts[key] = counts.get(key, 0.0) + 1.0
    key = ("queue_dequeue_attempts_total", (job[0], job[1], "hit"))
    counts[key] = counts.get(key, 0.0) + 1.0


def _started(tally: Tally, event: Event, job: LabelValues) -> None:
    counts, key = tally.counts, ("queue_jobs_started_total", job)
    counts[key] = counts.get(key, 0.0) + 1.0
    if event.enqueued_at is not None:
        observations, key = tally.observations, ("queue_job_wait_seconds", job)
        wait = max(event.ts - event.enqueued_at, 0.0)
        values = observations.get(key)
        if values is None:
            observations[key] = [wait]
        else:
            values.append(wait)
        if event.trace is not None:
            tally.exemplify("queue_job_wait_seconds", job, wait, event.trace, event.ts)


def _attempt_ended(tally: Tally, event: Event, job: LabelValues) -> None:
    """Execution time (duration, else ts - started_at) and time since enqueue."""
    duration = event.duration
    if duration is None and event.started_at is not None:
        duration = max(event.ts - event.started_at, 0.0)
    # setdefault's spare list costs less than a call to tally.observe (every job's last event).
    observations = tally.observations
    trace = event.trace
    if duration is not None:
        observations.setdefault(("queue_job_execution_seconds", job), []).append(duration)
        if trace is not None:
            tally.exemplify("queue_job_execution_seconds", job, duration, trace, event.ts)
    if event.enqueued_at is not None:
        total = max(event.ts - event.enqueued_at, 0.0)
        observations.setdefault(("queue_job_total_seconds", job), []).append(total)
        if trace is not None:
            tally.exemplify("queue_job_total_seconds", job, total, trace, event.ts)


def _attempts(tally: Tally, event: Event, job: LabelValues) -> None:
    if event.attempt is not None:
        key = ("queue_job_attempts", job)
        tally.observations.setdefault(key, []).append(float(event.attempt))


def _completed(tally: Tally, event: Event, job: LabelValues) -> None:
    counts, key = tally.counts, ("queue_jobs_completed_total", job)
    counts[key] = counts.get(key, 0.0) + 1.0
    if event.trace is not None:
        tally.exemplify("queue_jobs_completed_total", job, 1.0, event.trace, event.ts)
    _attempt_ended(tally, event, job)
    _attempts(tally, event, job)


def _failed(tally: Tally, event: Event, job: LabelValues) -> None:
    failed = (*job, event.error_type)
    tally.count("queue_jobs_failed_total", failed)
    if event.trace is not None:
        tally.exemplify("queue_jobs_failed_total", failed, 1.0, event.trace, event.ts)
    _attempt_ended(tally, event, job)
    if event.error_type in FINAL_ERROR_TYPES:
        _attempts(tally, event, job)


def _timed_out(tally: Tally, event: Event, job: LabelValues) -> None:
    tally.count("queue_jobs_timed_out_total", job)
    if event.trace is not None:
        tally.exemplify("queue_jobs_timed_out_total", job, 1.0, event.trace, event.ts)
    _attempt_ended(tally, event, job)


def _delay(event: Event) -> float | None:
    if event.delay is not None:
        return event.delay
    if event.scheduled_for is not None:
        return max(event.scheduled_for - event.ts, 0.0)
    return None


def _retried(tally: Tally, event: Event, job: LabelValues) -> None:
    tally.count("queue_jobs_retried_total", job)
    delay = _delay(event)
    if delay is not None:
        tally.observe("queue_job_retry_delay_seconds", job, delay)


def _scheduled(tally: Tally, event: Event, job: LabelValues) -> None:
    tally.count("queue_jobs_scheduled_total", job)
    delay = _delay(event)
    if delay is not None:
        tally.observe("queue_job_schedule_delay_seconds", job, delay)


def _dead_lettered(tally: Tally, event: Event, job: LabelValues) -> None:
    tally.count("queue_jobs_dead_lettered_total", job)
    _attempts(tally, event, job)


def _requeued(tally: Tally, event: Event, job: LabelValues) -> None:
    tally.count("queue_jobs_requeued_total", (*job, event.reason))


def _idempotency(metric: str) -> Handler:
    def handle(tally: Tally, event: Event, job: LabelValues) -> None:
        tally.count(metric, job)
        if event.duration is not None:
            tally.observe("queue_idempotency_check_seconds", job[:2], event.duration)

    return handle


def _dequeue_result(result: str) -> Handler:
    def handle(tally: Tally, _: Event, queue: LabelValues) -> None:
        tally.count("queue_dequeue_attempts_total", (*queue, result))

    return handle


def _backend_op(tally: Tally, event: Event, queue: LabelValues) -> None:
    duration = _duration(event)
    tally.observe("queue_backend_operation_seconds", (*queue, event.operation), duration)


def _duration(event: Event) -> float:
    if event.duration is None:  # wire.parse refuses such events
        raise InvalidEvent("missing_field", f"{event.name} needs duration")
    return event.duration


def _cycle(kind: str, moved: str) -> Handler:
    def handle(tally: Tally, event: Event, queue: LabelValues) -> None:
        tally.observe(f"queue_{kind}_cycle_seconds", queue, _duration(event))
        tally.count(f"queue_{kind}_{moved}_total", queue, float(event.count or 0))
        if not event.ok:
            tally.count(f"queue_{kind}_errors_total", queue)

    return handle


def _heartbeat(tally: Tally, event: Event, queue: LabelValues) -> None:
    if event.active is None or event.capacity is None:  # wire.parse refuses such events
        raise InvalidEvent("missing_field", "worker_heartbeat needs active and capacity")
    tally.heartbeats.append(
        Heartbeat(queue[0], queue[1], event.worker, event.active, event.capacity, event.ts)
    )


_JOB_HANDLERS: dict[str, Handler] = {
    "enqueued": _counter("queue_jobs_enqueued_total"),
    "dequeued": _dequeued,
    "started": _started,
    "completed": _completed,
    "failed": _failed,
    "retried": _retried,
    "timed_out": _timed_out,
    "dead_lettered": _dead_lettered,
    "scheduled": _scheduled,
    "requeued": _requeued,
    "lease_extended": _counter("queue_jobs_lease_extended_total"),
    "max_retries_exceeded": _counter("queue_jobs_max_retries_exceeded_total"),
    "idempotency_conflict": _idempotency("queue_idempotency_conflicts_total"),
    "idempotency_reused": _idempotency("queue_idempotency_reused_total"),
}
_SYSTEM_HANDLERS: dict[str, Handler] = {
    "dequeue_empty": _dequeue_result("empty"),
    "dequeue_error": _dequeue_result("error"),
    "backend_op": _backend_op,
    "reaper_cycle": _cycle("reaper", "requeued"),
    "scheduler_cycle": _cycle("scheduler", "processed"),
    "worker_heartbeat": _heartbeat,
}


# -- the frequent job events, by keys built once per label set ---------------------------------

FREQUENT_JOB_EVENTS = ("enqueued", "dequeued", "started", "completed")


class FrequentEvent:
    """A frequent job event of one label set: readers/v1.py lists a plain entry with it in
    the batch's Tally, without an Event or a handler call, and EventMetrics.record updates the
    series it holds in the store, without a tally dict or a lookup per update: the consumer
    went from 0.72-0.83x of the bare loop's CPU (median 0.79x) to 0.79-0.93x (median 0.86x),
    26.8k to 24.0k instructions per event (bench/event_ingest.py, bench/event_decode.py;
    docs/benchmarks.md). It updates what its handler above does for an event without a trace
    context (one with a trace goes through the handlers, which keep its exemplars);
    tests/sources/readers/test_v1_plain.py checks the same series for any entry."""

    __slots__ = ("_held", "attempts", "count", "execution", "hit", "name", "total", "wait")

    def __init__(self, name: str, job: LabelValues) -> None:
        if name not in FREQUENT_JOB_EVENTS:
            raise ValueError(f"{name} is not a frequent job event")
        self.name = name
        self.count = (f"queue_jobs_{name}_total", job)
        self.hit = ("queue_dequeue_attempts_total", (job[0], job[1], "hit"))
        self.wait = ("queue_job_wait_seconds", job)
        self.execution = ("queue_job_execution_seconds", job)
        self.total = ("queue_job_total_seconds", job)
        self.attempts = ("queue_job_attempts", job)
        self._held: _Held | None = None

    def record(
        self,
        store: MetricStore,
        suffix: LabelValues,
        now: float,
        ts: float,
        enqueued_at: float | None,
        duration: float | None,
        attempt: int | None,
        not_own: dict[SeriesKey, Any],
    ) -> None:
        """Into the series it updates, under the store's lock (apply's `held`). The values are
        sound: readers/v1.py's plain path takes only numbers in parse()'s ranges. `not_own`:
        the batch's series that are not their label set's own (below)."""
        held = self._held
        if held is None or held.generation != store.generation or held.suffix is not suffix:
            held = self._held = _Held(store.generation, suffix)
        (held.count or self._ask(store.counter_series, held, "count", not_own)).add(1.0, now)
        name = self.name
        if name == "dequeued":
            (held.hit or self._ask(store.counter_series, held, "hit", not_own)).add(1.0, now)
        elif name == "started":
            if enqueued_at is not None:
                wait = held.wait or self._ask(store.histogram_series, held, "wait", not_own)
                wait.observe(max(ts - enqueued_at, 0.0), now)
        elif name == "completed":
            if duration is not None:
                execution = held.execution or self._ask(
                    store.histogram_series, held, "execution", not_own
                )
                execution.observe(duration, now)
            if enqueued_at is not None:
                total = held.total or self._ask(store.histogram_series, held, "total", not_own)
                total.observe(max(ts - enqueued_at, 0.0), now)
            if attempt is not None:
                attempts = held.attempts or self._ask(
                    store.histogram_series, held, "attempts", not_own
                )
                attempts.observe(float(attempt), now)

    # A series is asked for at its first update, so none is made that its event does not update.
    # It is held only when it is its own. One that is not (the overflow's, or one under clipped
    # labels) is kept for the batch in `not_own` and asked for again the next: the store counts
    # a refused label set once a batch, as it does for MetricStore.apply's updates.

    def _ask(
        self,
        ask: Callable[[str, LabelValues], tuple[_Series, bool]],
        held: _Held,
        slot: str,
        not_own: dict[SeriesKey, Any],
    ) -> _Series:
        """The series of `slot` (store.counter_series or histogram_series as `ask`)."""
        slot_key: SeriesKey = getattr(self, slot)
        key = (slot_key[0], (*slot_key[1], *held.suffix))
        series: _Series | None = not_own.get(key)
        if series is None:
            series, own = ask(*key)
            if own:
                setattr(held, slot, series)
            else:
                not_own[key] = series
        return series


class _Held:
    """The series a FrequentEvent updates, held as of the store's generation, under its
    stream's suffix (None: not asked for yet)."""

    __slots__ = ("attempts", "count", "execution", "generation", "hit", "suffix", "total", "wait")

    def __init__(self, generation: int, suffix: LabelValues) -> None:
        self.generation = generation
        self.suffix = suffix
        self.count: CounterSeries | None = None
        self.hit: CounterSeries | None = None
        self.wait: HistogramSeries | None = None
        self.execution: HistogramSeries | None = None
        self.total: HistogramSeries | None = None
        self.attempts: HistogramSeries | None = None


PlainEvent = tuple[FrequentEvent, float, float | None, float | None, int | None]


def record_plain(
    store: MetricStore, plain: list[PlainEvent], suffix: LabelValues
) -> Callable[[float], None]:
    """A batch's plain events into their series: MetricStore.apply's `held`."""

    def held(now: float) -> None:
        not_own: dict[SeriesKey, Any] = {}
        for event, ts, enqueued_at, duration, attempt in plain:
            event.record(store, suffix, now, ts, enqueued_at, duration, attempt, not_own)

    return held


# -- workers ------------------------------------------------------------------------------------


# Refused workers a registry remembers (WorkerRegistry.record): ~100 bytes each.
MAX_REFUSALS = 50_000


class WorkerRegistry:
    """Live workers of one stream (or native reader), from their heartbeats.

    A worker whose last heartbeat (by event time) is older than `timeout` is forgotten:
    it leaves every worker series and no memory of it is kept. `redis_source`: the name of
    the Redis the feed reads, with several Redis sources; every series it feeds carries it.
    """

    def __init__(self, timeout: float, max_workers: int, redis_source: str | None = None) -> None:
        self.timeout = timeout
        self.max_workers = max_workers
        self.redis_source = redis_source
        # What the feed's label values end with: its redis_source, or nothing.
        self.suffix: tuple[str, ...] = () if redis_source is None else (redis_source,)
        self._workers: dict[tuple[str, str, str], Heartbeat] = {}
        self._refused: set[tuple[str, str, str]] = set()  # refused lately (record)
        self._refusals_until = 0.0
        self._lock = threading.Lock()

    def record(self, heartbeats: list[Heartbeat], admit: Callable[[LabelValues], bool]) -> int:
        """Take the heartbeats of known workers, and of new ones while there is room for
        them (max_workers) and their queue (`admit`); how many max_workers refused. A worker
        refused is remembered for `timeout` (up to max_workers of them): its heartbeats in
        the meantime are neither counted again nor asked about, so a flood of names that
        keeps beating is counted once per name, not once per read (up to MAX_REFUSALS names
        remembered)."""
        refused = 0
        with self._lock:
            self._forget_refusals_when_due()
            workers = self._workers
            for beat in heartbeats:
                key = (beat.system, beat.queue, beat.worker)
                known = workers.get(key)
                if known is None:
                    if key in self._refused:
                        continue
                    if len(workers) >= self.max_workers:
                        refused += 1
                    elif admit((*key[:2], *self.suffix)):
                        workers[key] = beat
                        continue
                    if len(self._refused) < MAX_REFUSALS:
                        self._refused.add(key)
                elif beat.ts >= known.ts:  # consumers may deliver out of order
                    workers[key] = beat
        return refused

    def forget(self, departed: list[tuple[str, str, str]]) -> None:
        """Workers gone from a queue (system, queue, worker) leave its series now."""
        with self._lock:
            for key in departed:
                self._workers.pop(key, None)

    def _forget_refusals_when_due(self) -> None:
        """Once per timeout: room may have freed since (workers and queues left)."""
        now = time.monotonic()
        if now >= self._refusals_until:
            self._refused.clear()
            self._refusals_until = now + self.timeout

    def prune(self, now: float) -> None:
        oldest = now - self.timeout
        with self._lock:
            gone = [key for key, beat in self._workers.items() if beat.ts < oldest]
            for key in gone:
                del self._workers[key]

    def totals(self, now: float) -> dict[LabelValues, WorkerTotal]:
        """(system, queue[, redis_source]) -> busy workers, idle workers, busy slots, free
        slots (None when a worker of the queue does not say its slots: no slot is invented)."""
        self.prune(now)
        totals: dict[LabelValues, WorkerTotal] = {}
        with self._lock:
            beats = list(self._workers.values())
        for beat in beats:
            key = (beat.system, beat.queue, *self.suffix)
            busy = beat.active if beat.capacity is None else min(beat.active, beat.capacity)
            working = int(busy > 0)
            if beat.capacity is None:
                one: WorkerTotal = (working, 1 - working, None, None)
            else:
                one = (working, 1 - working, busy, beat.capacity - busy)
            totals[key] = add_worker_totals(totals.get(key, NO_WORKERS), one)
        return totals


def add_worker_totals(a: WorkerTotal, b: WorkerTotal) -> WorkerTotal:
    """Workers add up; slots add up while every worker says its slots, else none are served."""
    if a[2] is None or a[3] is None or b[2] is None or b[3] is None:
        return (a[0] + b[0], a[1] + b[1], None, None)
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])


def _suffixed(
    table: dict[tuple[str, LabelValues], _V], suffix: LabelValues
) -> dict[tuple[str, LabelValues], _V]:
    """A batch's updates under label values with `suffix` added, last (one entry per label
    set of the batch, not per event)."""
    return {(metric, (*labels, *suffix)): value for (metric, labels), value in table.items()}


def stream_attributes(redis_source: str | None, **labels: str) -> dict[str, str]:
    """The labels of a stream's (or native reader's) self-metrics, in the catalog's order,
    then the name of its Redis with several Redis sources: one key on two servers is two
    series."""
    return labels if redis_source is None else {**labels, SOURCE_LABEL: redis_source}


# -- the metrics of all streams of one exporter ------------------------------------------------

# The guard's name for the (system, queue) pairs of the three worker gauges: each pair is two
# series of queue_workers and of queue_worker_slots, one of the utilization ratio. Heartbeats
# of a queue without room are refused (counted), not folded into an overflow queue.
WORKER_QUEUES = "queue_workers"


class EventMetrics:
    """Registers the event families and self-metrics once; consumers report batches to it."""

    def __init__(
        self,
        telemetry: Telemetry,
        buckets: dict[str, tuple[float, ...]],
        by_redis: bool = False,
    ) -> None:
        """`by_redis`: several Redis sources, so every feed names its Redis (worker_registry's
        redis_source) and every event series carries it as redis_source."""
        self._store = telemetry.store
        self._health = telemetry.health
        self._by_redis = by_redis
        # (reader, redis_source or None) -> 1 while the native reader hears nothing, else 0
        self._silent: dict[tuple[str, str | None], float] = {}
        if by_redis:
            self._store.label_events(SOURCE_LABEL)
        for name, bounds in buckets.items():
            self._store.set_buckets(name, bounds)
        self._store.guard.set_samples_per_series(WORKER_QUEUES, 2, folds=False)
        self._registries: list[WorkerRegistry] = []
        # (stream, group, redis_source or None) -> the group's lag and pending entries.
        self._stream_stats: dict[
            tuple[str, str, str | None], tuple[float | None, float | None]
        ] = {}
        self._lock = threading.Lock()
        # the readers last: a render may call them from another thread at once
        self._store.add_gauge_reader(self._worker_gauges)
        meter = telemetry.meter

        def counter(name: str) -> Counter:
            return meter.create_counter(name, description=BY_NAME[name].help)

        self._events = counter("queue_exporter_events_total")
        self._invalid = counter("queue_exporter_events_invalid_total")
        self._lost = counter("queue_exporter_events_lost_total")
        for name, callback in (
            ("queue_exporter_stream_lag", self._observe_stream(0)),
            ("queue_exporter_stream_pending", self._observe_stream(1)),
            ("queue_exporter_native_silent", self._observe_silence),
        ):
            meter.create_observable_gauge(
                name, callbacks=[callback], description=BY_NAME[name].help
            )

    def worker_registry(
        self, timeout: float, max_workers: int, redis_source: str | None = None
    ) -> WorkerRegistry:
        """A feed's registry; `redis_source` names its Redis, when and only when by_redis."""
        if self._by_redis != (redis_source is not None):
            raise ValueError(
                f"a feed's redis_source ({redis_source!r}) does not match by_redis={self._by_redis}"
            )
        registry = WorkerRegistry(timeout, max_workers, redis_source)
        with self._lock:
            self._registries.append(registry)
        return registry

    def record(self, stream: str, tally: Tally, workers: WorkerRegistry) -> None:
        """One batch: its counters and observations (under the feed's redis_source, if any),
        heartbeats and self-metrics."""
        held = record_plain(self._store, tally.plain, workers.suffix) if tally.plain else None
        if workers.suffix:
            self._store.apply(
                _suffixed(tally.counts, workers.suffix),
                _suffixed(tally.observations, workers.suffix),
                _suffixed(tally.exemplars, workers.suffix),
                held,
            )
        else:
            self._store.apply(tally.counts, tally.observations, tally.exemplars, held)
        if tally.departed:
            workers.forget(tally.departed)
        if tally.heartbeats:
            refused = workers.record(tally.heartbeats, self._admit_worker_queue)
            if refused:
                self._store.guard.refused(WORKER_QUEUES, refused)
        source = workers.redis_source
        attributes = stream_attributes(source, stream=stream)
        if tally.consumed:
            self._events.add(tally.consumed, attributes)
        for reason, count in tally.invalid.items():
            self._invalid.add(count, stream_attributes(source, stream=stream, reason=reason))
        if tally.lost:
            self._lost.add(tally.lost, attributes)

    def declare_stream(self, stream: str, workers: WorkerRegistry) -> None:
        """Zero-valued self-metrics from the start: no empty series until the first event."""
        attributes = stream_attributes(workers.redis_source, stream=stream)
        self._events.add(0, attributes)
        self._lost.add(0, attributes)

    def report_silence(self, reader: str, workers: WorkerRegistry, why: str | None) -> None:
        """A native reader's read: whether it heard nothing (why) or its system again (None)."""
        with self._lock:
            self._silent[(reader, workers.redis_source)] = 0.0 if why is None else 1.0
        self._health.silence(reader, why)

    def report_caveat(self, reader: str, why: str | None) -> None:
        """What a native reader hears but cannot tell (None: nothing), for the status page."""
        self._health.caveat(reader, why)

    def _observe_silence(self, _: CallbackOptions) -> Iterator[Observation]:
        with self._lock:
            silent = list(self._silent.items())
        for (reader, redis_source), value in silent:
            yield Observation(value, stream_attributes(redis_source, stream=reader))

    def set_stream_stats(
        self,
        stream: str,
        group: str,
        workers: WorkerRegistry,
        lag: float | None,
        pending: float | None,
    ) -> None:
        """The group's lag and pending entries, as of its last XINFO GROUPS; `workers` is the
        feed's registry, which names its Redis."""
        with self._lock:
            self._stream_stats[(stream, group, workers.redis_source)] = (lag, pending)

    # -- gauges ------------------------------------------------------------------------------

    def _admit_worker_queue(self, queue: LabelValues) -> bool:
        """Room for the queue's worker series under the cap (refusals are counted there)."""
        return self._store.guard.admit(WORKER_QUEUES, queue) != (OVERFLOW, OVERFLOW)

    def _worker_gauges(self) -> list[tuple[MetricSpec, Series]]:
        """The worker gauges of every stream's live workers, summed per queue (and Redis)."""
        totals = self._worker_totals()
        self._store.guard.keep_only(WORKER_QUEUES, set(totals))  # queues left: room freed
        workers: dict[LabelValues, float] = {}
        slots: dict[LabelValues, float] = {}
        utilization: dict[LabelValues, float] = {}
        for (system, queue, *source), (busy, idle, busy_slots, free_slots) in totals.items():
            workers[(system, queue, "busy", *source)] = busy
            workers[(system, queue, "idle", *source)] = idle
            if busy_slots is None or free_slots is None:
                continue  # a worker that does not say its slots: no slot series, none made up
            slots[(system, queue, "busy", *source)] = busy_slots
            slots[(system, queue, "free", *source)] = free_slots
            if busy_slots + free_slots > 0:
                utilization[(system, queue, *source)] = busy_slots / (busy_slots + free_slots)
        gauges = (
            ("queue_workers", workers),
            ("queue_worker_slots", slots),
            ("queue_worker_utilization_ratio", utilization),
        )
        spec = self._store.event_spec
        return [(spec(name), Series((series,))) for name, series in gauges if series]

    def _worker_totals(self) -> dict[LabelValues, WorkerTotal]:
        now = time.time()
        merged: dict[LabelValues, WorkerTotal] = {}
        with self._lock:
            registries = list(self._registries)
        clip = self._store.guard.clip
        for registry in registries:
            for labels, total in registry.totals(now).items():
                key = clip(labels)
                merged[key] = add_worker_totals(merged.get(key, NO_WORKERS), total)
        return merged

    def _observe_stream(self, index: int) -> Callable[[CallbackOptions], Iterator[Observation]]:
        def observe(_: CallbackOptions) -> Iterator[Observation]:
            with self._lock:
                stats = list(self._stream_stats.items())
            for (stream, group, redis_source), values in stats:
                value = values[index]
                if value is not None:
                    labels = stream_attributes(redis_source, stream=stream, group=group)
                    yield Observation(value, labels)

        return observe
