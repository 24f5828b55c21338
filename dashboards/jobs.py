"""Jobs: are jobs failing, slow, retried or dead-lettered?"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from dashboards.common import (
    JOB_TYPE,
    RATE,
    Query,
    new_dashboard,
    panel,
    quantiles,
    tracing_variable,
)

_FINISHED = '{__name__=~"queue_jobs_completed_total|queue_jobs_failed_total", ' + JOB_TYPE + "}"


def _rate(metric: str, by: str, extra: str = "") -> str:
    return f"sum by ({by}) (rate({metric}{{{JOB_TYPE}{extra}}}[{RATE}]))"


def build() -> dashboard.Dashboard:
    return (
        new_dashboard(
            "queue-exporter-jobs",
            "Jobs",
            "Throughput, failures, timings and retries of jobs, from lifecycle events.",
        )
        .with_variable(tracing_variable())
        .with_row(dashboard.Row("Throughput and failures"))
        .with_panel(
            panel(
                "timeseries",
                "Throughput by job type",
                "Jobs completed per second, by job type.",
                "ops",
                Query(_rate("queue_jobs_completed_total", "job_type"), "{{job_type}}"),
                stacked=True,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Failure ratio by error type",
                "Share of finished jobs that failed, split by error type (retryable, "
                "non_retryable, timeout, handler_not_found, other).",
                "percentunit",
                Query(
                    f"{_rate('queue_jobs_failed_total', 'error_type')} / ignoring (error_type) "
                    f"group_left sum(rate({_FINISHED}[{RATE}]))",
                    "{{error_type}}",
                ),
                stacked=True,
                max_value=1,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Jobs started, failed and timed out",
                "Lifecycle transitions per second over the selection.",
                "ops",
                Query(_rate("queue_jobs_started_total", "system"), "{{system}} started"),
                Query(_rate("queue_jobs_failed_total", "system"), "{{system}} failed"),
                Query(_rate("queue_jobs_timed_out_total", "system"), "{{system}} timed out"),
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Failures by queue",
                "Failed jobs per second per queue.",
                "ops",
                Query(_rate("queue_jobs_failed_total", "system, queue"), "{{system}}/{{queue}}"),
            )
        )
        .with_row(dashboard.Row("Timings"))
        .with_panel(
            panel(
                "timeseries",
                "Execution time",
                "p50, p95 and p99 of handler execution time (start to finish).",
                "s",
                *quantiles("queue_job_execution_seconds", JOB_TYPE),
                width=8,
                exemplars=True,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Wait time",
                "p50, p95 and p99 of time from enqueue to start: how long jobs queue.",
                "s",
                *quantiles("queue_job_wait_seconds", JOB_TYPE),
                width=8,
                exemplars=True,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Total time",
                "p50, p95 and p99 of time from enqueue to finish, what a caller experiences.",
                "s",
                *quantiles("queue_job_total_seconds", JOB_TYPE),
                width=8,
                exemplars=True,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "p95 execution time by job type",
                "The slowest job types: p95 execution time of each.",
                "s",
                Query(
                    "histogram_quantile(0.95, sum by (job_type, le) "
                    f"(rate(queue_job_execution_seconds_bucket{{{JOB_TYPE}}}[{RATE}])))",
                    "{{job_type}}",
                ),
                width=24,
                exemplars=True,
            )
        )
        .with_row(dashboard.Row("Retries, dead letters and scheduling"))
        .with_panel(
            panel(
                "timeseries",
                "Retries and requeues",
                "Retries scheduled, jobs requeued (by reason, e.g. lease_expired) and jobs "
                "that ran out of retries, per second.",
                "ops",
                Query(_rate("queue_jobs_retried_total", "system"), "{{system}} retried"),
                Query(
                    _rate("queue_jobs_requeued_total", "system, reason"),
                    "{{system}} requeued {{reason}}",
                ),
                Query(
                    _rate("queue_jobs_max_retries_exceeded_total", "system"),
                    "{{system}} max retries exceeded",
                ),
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Attempts per job",
                "p50, p95 and p99 of attempts a job needed (counted at completion, failure or "
                "dead letter).",
                "short",
                *quantiles("queue_job_attempts", JOB_TYPE),
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Dead letters",
                "Jobs sent to a dead-letter queue per second, by queue.",
                "ops",
                Query(
                    _rate("queue_jobs_dead_lettered_total", "system, queue"), "{{system}}/{{queue}}"
                ),
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Schedule delay and retry delay",
                "p95 of how far ahead jobs are scheduled and of the back-off before retries.",
                "s",
                Query(
                    "histogram_quantile(0.95, sum by (le) "
                    f"(rate(queue_job_schedule_delay_seconds_bucket{{{JOB_TYPE}}}[{RATE}])))",
                    "schedule delay p95",
                ),
                Query(
                    "histogram_quantile(0.95, sum by (le) "
                    f"(rate(queue_job_retry_delay_seconds_bucket{{{JOB_TYPE}}}[{RATE}])))",
                    "retry delay p95",
                ),
            )
        )
    )
