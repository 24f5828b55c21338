"""Every metric family the exporter can serve: one table that telemetry, docs and tests share.

The names and label sets are the outward contract (docs/metrics.md is generated from this table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["gauge", "counter", "histogram"]
Origin = Literal["sampled", "events", "self"]
Combine = Literal["sum", "max"]

QUEUE_LABELS = ("system", "queue", "priority", "state")
SYSTEM_QUEUE = ("system", "queue")
JOB_LABELS = ("system", "queue", "job_type", "priority")

STATES = ("pending", "active", "scheduled", "retry", "dead_letter", "completed", "failed")
ERROR_TYPES = ("retryable", "non_retryable", "timeout", "handler_not_found", "other")


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


def _sampled(
    name: str, kind: Kind, labels: tuple[str, ...], help: str, combine: Combine = "sum"
) -> MetricSpec:
    return MetricSpec(name, kind, labels, help, "sampled", combine)


def _self(name: str, kind: Kind, labels: tuple[str, ...], help: str) -> MetricSpec:
    return MetricSpec(name, kind, labels, help, "self")


SAMPLED: tuple[MetricSpec, ...] = (
    _sampled("queue_depth", "gauge", QUEUE_LABELS, "Items in the queue, by priority and state."),
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
        ("source", "reason"),
        "Failed sample cycles and per-item read errors, by reason.",
    ),
    _self(
        "queue_exporter_series_overflow_total",
        "counter",
        ("metric",),
        "Label sets refused by the per-metric cardinality cap and folded into the overflow series.",
    ),
)

ALL: tuple[MetricSpec, ...] = SAMPLED + SELF
BY_NAME: dict[str, MetricSpec] = {spec.name: spec for spec in ALL}
