"""Every metric family the exporter can serve: one table that telemetry, docs and tests share.

The names and label sets are the outward contract (docs/metrics.md is generated from this table).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Kind = Literal["gauge", "counter", "histogram"]
Origin = Literal["sampled", "events", "self"]
Combine = Literal["sum", "max"]

QUEUE_LABELS = ("system", "queue", "priority", "state")
SYSTEM_QUEUE = ("system", "queue")
JOB_LABELS = ("system", "queue", "job_type", "priority")
# The label naming the Redis a series comes from, last, when sources.redis lists several
# (key samples, events and native readers alike; README "Several Redis servers"). The families
# that carry it then are the ones with MetricSpec.per_redis.
SOURCE_LABEL = "redis_source"

STATES = ("pending", "active", "scheduled", "retry", "dead_letter", "completed", "failed")
# Why the HTTP endpoint refused a login (queue_exporter_http_auth_failures_total): no or an
# unreadable Authorization header, an unknown user, a wrong password, the client out of
# failed logins (or too many checks pending), a verified client certificate without an
# allowed SAN.
AUTH_FAILURE_REASONS = (
    "missing",
    "malformed",
    "unknown_user",
    "wrong_password",
    "rate_limited",
    "client_certificate",
)


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: Kind
    labels: tuple[str, ...]
    help: str
    origin: Origin
    # How two samples of one series in one cycle combine: depths add up (Celery keeps one list
    # per priority step of a queue), ages and limits keep the largest.
    combine: Combine = "sum"
    # Histograms: the default explicit bucket bounds (configurable per histogram).
    buckets: tuple[float, ...] = ()
    # With several Redis sources, the family also carries SOURCE_LABEL, last: every queue and
    # job family, and the self-metrics of a stream or native reader (two servers may each
    # hold a stream of the same key). Not in `labels`: one Redis alone never gives it.
    per_redis: bool = False
    # UCUM, for OTLP: only the semantic-convention families carry one (our names say theirs).
    unit: str = ""

    def __hash__(self) -> int:
        """The name's (cached by str): specs key the tables a sampling cycle adds each series
        to, and the generated hash of all the fields was a tenth of a 100k-key cycle."""
        return hash(self.name)

    def combined(self, earlier: float, value: float) -> float:
        return earlier + value if self.combine == "sum" else max(earlier, value)

    def with_label(self, label: str) -> MetricSpec:
        """The family with one more label, last (redis_source, with several Redis sources)."""
        return replace(self, labels=(*self.labels, label))


def _sampled(
    name: str, kind: Kind, labels: tuple[str, ...], help: str, combine: Combine = "sum"
) -> MetricSpec:
    return MetricSpec(name, kind, labels, help, "sampled", combine, per_redis=True)


def _self(
    name: str, kind: Kind, labels: tuple[str, ...], help: str, per_redis: bool = False
) -> MetricSpec:
    return MetricSpec(name, kind, labels, help, "self", per_redis=per_redis)


SAMPLED: tuple[MetricSpec, ...] = (
    _sampled("queue_depth", "gauge", QUEUE_LABELS, "Items in the queue, by priority and state."),
    _sampled(
        "queue_depth_estimate",
        "gauge",
        QUEUE_LABELS,
        "The PostgreSQL planner's estimate of queue_depth (table statistics as of the last "
        "ANALYZE), served instead of an exact count too costly to take each cycle.",
    ),
    _sampled(
        "queue_oldest_age_seconds",
        "gauge",
        QUEUE_LABELS,
        "Age of the item at the head of the queue (the next to be served), where the layout "
        "records a time.",
        "max",
    ),
    _sampled(
        "queue_max_depth",
        "gauge",
        SYSTEM_QUEUE,
        "Configured backpressure limit of the queue.",
        "max",
    ),
    _sampled(
        "queue_concurrency_limit",
        "gauge",
        SYSTEM_QUEUE,
        "Jobs of the queue allowed to run at once.",
    ),
    _sampled(
        "queue_leases_expired",
        "gauge",
        SYSTEM_QUEUE,
        "In-flight items whose lease deadline has passed (the reaper will requeue them).",
    ),
    _sampled(
        "queue_scheduled_due",
        "gauge",
        SYSTEM_QUEUE,
        "Scheduled items already due but not yet moved to the queue.",
    ),
    _sampled(
        "queue_stats_age_seconds",
        "gauge",
        SYSTEM_QUEUE,
        "Time since the queue's statistics row was last updated.",
        "max",
    ),
    _sampled(
        "queue_executions",
        "gauge",
        ("system", "queue", "status"),
        "Executions not yet finished, by the system's own status (Attune: requested, "
        "scheduling, scheduled, running, canceling).",
    ),
    # Totals a system keeps itself (Attune's total_enqueued / total_completed). The events
    # feed counts into the same families: one definition, two ways in.
    _sampled(
        "queue_jobs_enqueued_total",
        "counter",
        JOB_LABELS,
        "Jobs enqueued.",
    ),
    _sampled(
        "queue_jobs_completed_total",
        "counter",
        JOB_LABELS,
        "Jobs completed.",
    ),
)

SELF: tuple[MetricSpec, ...] = (
    _self("queue_exporter_build_info", "gauge", ("version", "python"), "Build information."),
    _self(
        "queue_exporter_source_up",
        "gauge",
        ("source",),
        "1 when the source's last sample succeeded, 0 while it is failing.",
    ),
    _self(
        "queue_exporter_source_duration_seconds",
        "gauge",
        ("source",),
        "Duration of the source's last sample cycle.",
    ),
    _self(
        "queue_exporter_source_last_success_timestamp_seconds",
        "gauge",
        ("source",),
        "Unix time of the source's last successful sample.",
    ),
    _self(
        "queue_exporter_source_errors_total",
        "counter",
        ("source", "reason", "system", "pattern"),
        "Failed sample cycles and per-key read errors, by reason; a key group's errors carry "
        "its system and pattern (empty for a whole cycle's failure).",
    ),
    _self(
        "queue_exporter_keys_matched",
        "gauge",
        ("source", "system", "pattern"),
        "Keys the key group matched in the source's last cycle (0 included; enumerated groups: "
        "the keys built from their values).",
    ),
    _self(
        "queue_exporter_http_auth_failures_total",
        "counter",
        ("reason",),
        "Refused logins to the HTTP endpoint, by reason: " + ", ".join(AUTH_FAILURE_REASONS) + ".",
    ),
    _self(
        "queue_exporter_series_overflow_total",
        "counter",
        ("metric",),
        "Label sets refused by the per-metric cardinality cap and folded into the overflow series.",
    ),
    _self(
        "queue_exporter_leader",
        "gauge",
        (),
        "1 on the replica that runs the samplers (the elected leader, or any replica without "
        "leader election), 0 on a follower.",
    ),
)


def _event(
    name: str, kind: Kind, labels: tuple[str, ...], help: str, buckets: tuple[float, ...] = ()
) -> MetricSpec:
    return MetricSpec(name, kind, labels, help, "events", buckets=buckets, per_redis=True)


# Default buckets (seconds unless noted), each suited to what it measures.
_EXECUTION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)
_WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600, 7200, 21600, 86400)
_DELAY_BUCKETS = (1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 21600, 86400)
_SCHEDULE_BUCKETS = (1, 10, 60, 300, 900, 3600, 21600, 86400, 604800)
_ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 7, 10, 15, 20, 50)
_OPERATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 10)
_CYCLE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60)

_JOB_COUNTERS = (
    # queue_jobs_enqueued_total and queue_jobs_completed_total are defined in SAMPLED.
    ("queue_jobs_dequeued_total", JOB_LABELS, "Jobs taken from the queue by a worker."),
    ("queue_jobs_started_total", JOB_LABELS, "Jobs whose handler started."),
    ("queue_jobs_failed_total", (*JOB_LABELS, "error_type"), "Failed attempts, by error class."),
    ("queue_jobs_retried_total", JOB_LABELS, "Jobs scheduled for another attempt."),
    ("queue_jobs_timed_out_total", JOB_LABELS, "Job attempts that timed out."),
    ("queue_jobs_dead_lettered_total", JOB_LABELS, "Jobs moved to the dead-letter queue."),
    ("queue_jobs_scheduled_total", JOB_LABELS, "Jobs scheduled for later execution."),
    ("queue_jobs_requeued_total", (*JOB_LABELS, "reason"), "Jobs put back (e.g. lease expired)."),
    ("queue_jobs_lease_extended_total", JOB_LABELS, "Lease extensions of running jobs."),
    ("queue_jobs_max_retries_exceeded_total", JOB_LABELS, "Jobs that exhausted their retries."),
    ("queue_idempotency_conflicts_total", JOB_LABELS, "Enqueues refused by a key in use."),
    ("queue_idempotency_reused_total", JOB_LABELS, "Enqueues that reused an idempotency key."),
)

EVENTS: tuple[MetricSpec, ...] = (
    *(_event(name, "counter", labels, help) for name, labels, help in _JOB_COUNTERS),
    _event(
        "queue_dequeue_attempts_total",
        "counter",
        ("system", "queue", "result"),
        "Dequeue attempts by result: hit, empty or error.",
    ),
    _event("queue_reaper_requeued_total", "counter", SYSTEM_QUEUE, "Items the reaper requeued."),
    _event("queue_reaper_errors_total", "counter", SYSTEM_QUEUE, "Failed reaper cycles."),
    _event(
        "queue_scheduler_processed_total",
        "counter",
        SYSTEM_QUEUE,
        "Scheduled items the scheduler moved to the queue.",
    ),
    _event("queue_scheduler_errors_total", "counter", SYSTEM_QUEUE, "Failed scheduler cycles."),
    _event(
        "queue_job_execution_seconds",
        "histogram",
        JOB_LABELS,
        "Handler execution time of a job attempt.",
        _EXECUTION_BUCKETS,
    ),
    _event(
        "queue_job_wait_seconds",
        "histogram",
        JOB_LABELS,
        "Time from enqueue to start.",
        _WAIT_BUCKETS,
    ),
    _event(
        "queue_job_total_seconds",
        "histogram",
        JOB_LABELS,
        "Time from enqueue to the end of an attempt (completed, failed or timed out).",
        _WAIT_BUCKETS,
    ),
    _event(
        "queue_job_retry_delay_seconds",
        "histogram",
        JOB_LABELS,
        "Backoff delay before the next attempt.",
        _DELAY_BUCKETS,
    ),
    _event(
        "queue_job_schedule_delay_seconds",
        "histogram",
        JOB_LABELS,
        "Time from scheduling until the job is due.",
        _SCHEDULE_BUCKETS,
    ),
    _event(
        "queue_job_attempts",
        "histogram",
        JOB_LABELS,
        "Attempts a job took, observed at completion, failure or dead letter.",
        _ATTEMPT_BUCKETS,
    ),
    _event(
        "queue_backend_operation_seconds",
        "histogram",
        (*SYSTEM_QUEUE, "operation"),
        "Duration of a queue backend operation (enqueue, dequeue, snapshot_write, ...).",
        _OPERATION_BUCKETS,
    ),
    _event(
        "queue_idempotency_check_seconds",
        "histogram",
        SYSTEM_QUEUE,
        "Duration of an idempotency key check.",
        _OPERATION_BUCKETS,
    ),
    _event(
        "queue_reaper_cycle_seconds",
        "histogram",
        SYSTEM_QUEUE,
        "Duration of a reaper cycle (requeueing expired leases).",
        _CYCLE_BUCKETS,
    ),
    _event(
        "queue_scheduler_cycle_seconds",
        "histogram",
        SYSTEM_QUEUE,
        "Duration of a scheduler cycle (moving due items to the queue).",
        _CYCLE_BUCKETS,
    ),
    _event(
        "queue_workers",
        "gauge",
        (*SYSTEM_QUEUE, "state"),
        "Live workers (heartbeat within the timeout), busy or idle.",
    ),
    _event(
        "queue_worker_slots",
        "gauge",
        (*SYSTEM_QUEUE, "state"),
        "Job slots of live workers, busy or free.",
    ),
    _event(
        "queue_worker_utilization_ratio",
        "gauge",
        SYSTEM_QUEUE,
        "Busy slots over all slots of live workers.",
    ),
    # A stream's or native reader's own series: `stream` is the stream's key (native:<system>
    # for a reader), and with several Redis sources redis_source says whose.
    _self(
        "queue_exporter_events_total",
        "counter",
        ("stream",),
        "Events consumed, per stream.",
        per_redis=True,
    ),
    _self(
        "queue_exporter_events_invalid_total",
        "counter",
        ("stream", "reason"),
        "Events refused as invalid (acknowledged and skipped), by reason.",
        per_redis=True,
    ),
    _self(
        "queue_exporter_events_lost_total",
        "counter",
        ("stream",),
        (
            "Stream entries the consumer group can no longer read (trimmed, or lost by Redis, "
            'unread); for stream="native:celery", times the event subscription was lost and '
            "redone (events published meanwhile are gone)."
        ),
        per_redis=True,
    ),
    _self(
        "queue_exporter_native_silent",
        "gauge",
        ("stream",),
        "1 while a native reader hears nothing from its system though its backend answers "
        "(Celery: no event for events_timeout: workers idle without -E, stopped or scaled to "
        "zero), or may not read what one figure needs (Bull, BullMQ: CLIENT LIST refused, no "
        "worker count); it stays up and ready and leaves out only the series it cannot vouch for "
        "(running tasks, workers). 0 while it hears.",
        per_redis=True,
    ),
    _self(
        "queue_exporter_stream_lag",
        "gauge",
        ("stream", "group"),
        "Entries of the stream not yet delivered to the consumer group.",
        per_redis=True,
    ),
    _self(
        "queue_exporter_stream_pending",
        "gauge",
        ("stream", "group"),
        "Entries delivered to the consumer group but not yet acknowledged.",
        per_redis=True,
    ),
)

ALL: tuple[MetricSpec, ...] = SAMPLED + SELF + EVENTS
BY_NAME: dict[str, MetricSpec] = {spec.name: spec for spec in ALL}
# Families only a native reader (sources.native) serves, one series per reader: a deployment
# running none (the demo) has no series of them, which is no gap.
NATIVE_ONLY: frozenset[str] = frozenset({"queue_exporter_native_silent"})
# Families only a native reader or a preset's opt-in (estimate=true of pgboss or
# graphile_worker) serves: a configuration that turns neither on (the demo) has no series of
# them, which is no gap.
OPT_IN: frozenset[str] = NATIVE_ONLY | {"queue_depth_estimate"}


# -- OpenTelemetry's messaging semantic conventions ----------------------------------------------
#
# Served beside (never instead of) the families above when `messaging_conventions` is on: each
# a family of this catalog under the convention's name, its series and values the same. Only
# what measures the same thing is mapped (docs/metrics.md has the table and what is left out).
# The conventions' status is Development: their names may change in a later release.

SEMCONV_STATUS = "development"
SEMCONV_URL = "https://opentelemetry.io/docs/specs/semconv/messaging/messaging-metrics/"
# Our label -> the convention's attribute. Every other label is kept as it is. (error.type
# would be error_type's, but no mapped family has it: docs/metrics.md.)
SEMCONV_ATTRIBUTES = {"system": "messaging.system", "queue": "messaging.destination.name"}
# Required on every messaging metric: the system-specific name of the operation.
SEMCONV_OPERATION = "messaging.operation.name"
# OpenTelemetry's Prometheus compatibility: a unit's suffix (one in braces adds none).
_PROMETHEUS_UNITS = {"s": "seconds", "{message}": ""}


@dataclass(frozen=True)
class Convention:
    """One semantic-convention metric and the family of ours it is read from."""

    name: str  # the convention's (dotted) name, as OTLP carries it
    unit: str  # UCUM, as the convention gives it
    source: str  # the family of this catalog with the same measurements
    operation: str  # its messaging.operation.name
    why: str  # why the two measure the same thing (docs/metrics.md)


CONVENTIONS: tuple[Convention, ...] = (
    Convention(
        "messaging.process.duration",
        "s",
        "queue_job_execution_seconds",
        "process",
        "the handler's time on one attempt, which the convention calls processing (failed "
        "attempts too, without error.type: the histogram does not split by outcome)",
    ),
    Convention(
        "messaging.client.consumed.messages",
        "{message}",
        "queue_jobs_dequeued_total",
        "dequeue",
        "jobs handed to a worker: once per delivery, as the convention counts",
    ),
    Convention(
        "messaging.client.sent.messages",
        "{message}",
        "queue_jobs_enqueued_total",
        "enqueue",
        "jobs the producer put on the queue (failed sends are not in the family: no error.type)",
    ),
)
CONVENTIONS_BY_SOURCE: dict[str, tuple[Convention, ...]] = {
    source: tuple(c for c in CONVENTIONS if c.source == source)
    for source in {c.source for c in CONVENTIONS}
}


def prometheus_name(convention: Convention, kind: Kind) -> str:
    """The convention's name in Prometheus exposition, as OpenTelemetry's Prometheus
    compatibility writes it: dots become underscores, then the unit's suffix, then `_total`
    for a counter (messaging.process.duration in s: messaging_process_duration_seconds)."""
    suffix = _PROMETHEUS_UNITS[convention.unit]
    name = convention.name.replace(".", "_") + (f"_{suffix}" if suffix else "")
    return f"{name}_total" if kind == "counter" else name


def convention_spec(spec: MetricSpec, convention: Convention, otlp: bool) -> MetricSpec:
    """The convention's family read from `spec` (with the labels it has, redis_source too):
    the convention's name and attributes, dotted for OTLP, underscored for Prometheus, the
    operation's attribute last."""
    labels = (*(SEMCONV_ATTRIBUTES.get(label, label) for label in spec.labels), SEMCONV_OPERATION)
    name = convention.name if otlp else prometheus_name(convention, spec.kind)
    if not otlp:
        labels = tuple(label.replace(".", "_") for label in labels)
    help = f"OpenTelemetry messaging semantic convention ({SEMCONV_STATUS}): {spec.name}."
    return replace(spec, name=name, labels=labels, help=help, unit=convention.unit)


@dataclass(frozen=True)
class Signal:
    """What operators page on, as the series that carry it: a series of `metric` with a queue
    label (and a `state` among `states`, when given). A system serves each signal or names it
    as not recorded (the configuration's `not_recorded`, which the presets fill): never a
    value made up in its place."""

    name: str
    metric: str
    states: tuple[str, ...]
    what: str


SIGNALS: tuple[Signal, ...] = (
    Signal("waiting", "queue_depth", ("pending",), "jobs waiting to run"),
    Signal("running", "queue_depth", ("active",), "jobs running"),
    Signal("failed_kept", "queue_depth", ("failed", "dead_letter"), "failed jobs kept"),
    Signal("oldest_waiting", "queue_oldest_age_seconds", ("pending",), "oldest waiting job's age"),
    Signal("longest_running", "queue_oldest_age_seconds", ("active",), "longest running job's age"),
    Signal("completed", "queue_jobs_completed_total", (), "jobs completed"),
    Signal("failed", "queue_jobs_failed_total", (), "jobs failed"),
    Signal("retried", "queue_jobs_retried_total", (), "jobs retried"),
    Signal("workers", "queue_workers", (), "live workers per queue"),
    Signal("slots", "queue_worker_slots", (), "job slots of the live workers per queue"),
)
SIGNAL_WHAT: dict[str, str] = {signal.name: signal.what for signal in SIGNALS}
