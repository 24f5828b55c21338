"""Recording rules: the rates, ratios and deduplicated gauges that alerts and dashboards share.

Names follow `level:metric:operation`; the level `queue` keeps every target label (namespace,
job, ...) plus system and queue, since rules aggregate with `without` and never drop labels
an operator added. Sampled gauges take `max` across exporter replicas (each samples the same
keys), event counters `sum` (a consumer group hands each event to one replica).
"""

from __future__ import annotations

from dataclasses import dataclass

from alerts.config import RulesConfig

# Counters of job lifecycle events that get a per-queue rate.
JOB_COUNTERS = (
    "enqueued",
    "dequeued",
    "started",
    "completed",
    "failed",
    "retried",
    "timed_out",
    "dead_lettered",
    "scheduled",
    "requeued",
)
# Histograms of job timings that get p50/p95/p99 per queue and job type.
JOB_TIMINGS = ("execution", "wait", "total")
QUANTILES = ("0.5", "0.95", "0.99")
# Labels job counters carry beyond system and queue.
_JOB_DETAIL = ("job_type", "priority", "error_type", "reason")


@dataclass(frozen=True)
class RecordingRule:
    record: str
    expr: str
    labels: tuple[tuple[str, str], ...] = ()


def without(config: RulesConfig, *labels: str) -> str:
    return "without (" + ", ".join((*config.replica_labels, *labels)) + ")"


class Names:
    """The recorded series' names, so alerts refer to them without spelling them twice."""

    def __init__(self, config: RulesConfig) -> None:
        self.window = config.rate_window

    depth = "queue_state:queue_depth:sum"
    backlog = "queue:queue_backlog:sum"
    active = "queue:queue_active_depth:sum"
    dead_letter = "queue:queue_dead_letter_depth:sum"
    oldest_age = "queue:queue_oldest_age_seconds:max"
    capacity_used = "queue:queue_capacity_used:ratio"
    concurrency_used = "queue:queue_concurrency_used:ratio"
    leases_expired = "queue:queue_leases_expired:max"
    scheduled_due = "queue:queue_scheduled_due:max"
    stats_age = "queue:queue_stats_age_seconds:max"
    workers = "queue:queue_workers:sum"
    utilization = "queue:queue_worker_utilization_ratio:max"
    timing_quantile = "queue_job_type:queue_job_{timing}_seconds:histogram_quantile"

    def jobs_rate(self, counter: str) -> str:
        return f"queue:queue_jobs_{counter}:rate{self.window}"

    @property
    def finished_rate(self) -> str:
        return f"queue:queue_jobs_finished:rate{self.window}"

    @property
    def final_failed_rate(self) -> str:
        return f"queue:queue_jobs_failed_final:rate{self.window}"

    @property
    def failure_ratio(self) -> str:
        return f"queue:queue_jobs_failure:ratio_rate{self.window}"

    @property
    def retry_ratio(self) -> str:
        return f"queue:queue_jobs_retry:ratio_rate{self.window}"

    @property
    def failed_by_error_rate(self) -> str:
        return f"queue_error_type:queue_jobs_failed:rate{self.window}"

    @property
    def dequeue_rate(self) -> str:
        return f"queue_result:queue_dequeue_attempts:rate{self.window}"

    @property
    def dequeue_empty_ratio(self) -> str:
        return f"queue:queue_dequeue_empty:ratio_rate{self.window}"

    def timing_bucket_rate(self, timing: str) -> str:
        return f"queue_job_type_le:queue_job_{timing}_seconds_bucket:rate{self.window}"

    @property
    def events_rate(self) -> str:
        return f"stream:queue_exporter_events:rate{self.window}"

    @property
    def events_invalid_rate(self) -> str:
        return f"stream_reason:queue_exporter_events_invalid:rate{self.window}"


def recording_rules(config: RulesConfig) -> list[RecordingRule]:
    names = Names(config)
    window = config.rate_window
    dedup = without(config)
    rules = [
        RecordingRule(names.depth, f"sum without (priority) (max {dedup} (queue_depth))"),
        *(
            RecordingRule(name, f'sum without (state) ({names.depth}{{state="{state}"}})')
            for name, state in (
                (names.backlog, "pending"),
                (names.active, "active"),
                (names.dead_letter, "dead_letter"),
            )
        ),
        RecordingRule(
            names.oldest_age,
            f'max {without(config, "priority", "state")} (queue_oldest_age_seconds{{state="pending"}})',
        ),
        RecordingRule(names.capacity_used, f"{names.backlog} / max {dedup} (queue_max_depth)"),
        RecordingRule(
            names.concurrency_used, f"{names.active} / max {dedup} (queue_concurrency_limit)"
        ),
        RecordingRule(names.leases_expired, f"max {dedup} (queue_leases_expired)"),
        RecordingRule(names.scheduled_due, f"max {dedup} (queue_scheduled_due)"),
        RecordingRule(names.stats_age, f"max {dedup} (queue_stats_age_seconds)"),
        *(
            RecordingRule(
                names.jobs_rate(counter),
                f"sum {without(config, *_JOB_DETAIL)} (rate(queue_jobs_{counter}_total[{window}]))",
            )
            for counter in JOB_COUNTERS
        ),
        # Completed and failed in one selector: a queue that only ever fails still has a rate.
        RecordingRule(
            names.finished_rate,
            f"sum {without(config, *_JOB_DETAIL)} "
            f'(rate({{__name__=~"queue_jobs_completed_total|queue_jobs_failed_total"}}[{window}]))',
        ),
        # A failed attempt that is retried is no failure of the job: final failures are the
        # failed attempts less the retried ones (a queue with no retry counter retries none).
        RecordingRule(
            names.final_failed_rate,
            f"clamp_min({names.jobs_rate('failed')} - ({names.jobs_rate('retried')} "
            f"or {names.jobs_rate('failed')} * 0), 0)",
        ),
        # The failed share of the jobs that ended for good (completed, or failed and not retried)
        RecordingRule(
            names.failure_ratio,
            f"{names.final_failed_rate} / ({names.final_failed_rate} + "
            f"({names.jobs_rate('completed')} or {names.final_failed_rate} * 0))",
        ),
        # Retries have their own ratio: the retried share of the attempts that ended
        RecordingRule(names.retry_ratio, f"{names.jobs_rate('retried')} / {names.finished_rate}"),
        RecordingRule(
            names.failed_by_error_rate,
            f"sum {without(config, 'job_type', 'priority')} (rate(queue_jobs_failed_total[{window}]))",
        ),
        RecordingRule(
            names.dequeue_rate,
            f"sum {dedup} (rate(queue_dequeue_attempts_total[{window}]))",
        ),
        RecordingRule(
            names.dequeue_empty_ratio,
            f'sum without (result) ({names.dequeue_rate}{{result="empty"}}) '
            f"/ sum without (result) ({names.dequeue_rate})",
        ),
        # Heartbeats reach every replica often enough for each to know every worker: max.
        RecordingRule(names.workers, f"sum without (state) (max {dedup} (queue_workers))"),
        RecordingRule(names.utilization, f"max {dedup} (queue_worker_utilization_ratio)"),
    ]
    for timing in JOB_TIMINGS:
        bucket_rate = names.timing_bucket_rate(timing)
        rules.append(
            RecordingRule(
                bucket_rate,
                f"sum {without(config, 'priority')} "
                f"(rate(queue_job_{timing}_seconds_bucket[{window}]))",
            )
        )
        rules.extend(
            RecordingRule(
                names.timing_quantile.format(timing=timing),
                f"histogram_quantile({quantile}, {bucket_rate})",
                (("quantile", quantile),),
            )
            for quantile in QUANTILES
        )
    rules += [
        RecordingRule(
            names.events_rate, f"sum {dedup} (rate(queue_exporter_events_total[{window}]))"
        ),
        RecordingRule(
            names.events_invalid_rate,
            f"sum {dedup} (rate(queue_exporter_events_invalid_total[{window}]))",
        ),
    ]
    return rules
