"""Workers and backend: are workers there, busy, starved; is the backend healthy?"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from dashboards.common import DEDUP, QUEUE, RATE, SYSTEM, Query, new_dashboard, panel, quantiles

_QUEUE_LEGEND = "{{system}}/{{queue}}"


def _rate(metric: str, by: str, selector: str = QUEUE) -> str:
    return f"sum by ({by}) (rate({metric}{{{selector}}}[{RATE}]))"


def build() -> dashboard.Dashboard:
    return (
        new_dashboard(
            "queue-exporter-workers",
            "Workers and backend",
            "Workers from heartbeats, dequeue polling, backend latency, reaper, scheduler and "
            "idempotency.",
        )
        .with_row(dashboard.Row("Workers"))
        .with_panel(
            panel(
                "timeseries",
                "Workers busy and idle",
                "Workers that sent a heartbeat recently, busy or idle; a worker silent past the "
                "timeout is no longer counted.",
                "short",
                Query(f"sum by (state) ({DEDUP} (queue_workers{{{QUEUE}}}))", "{{state}}"),
                width=8,
                stacked=True,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Worker slots busy and free",
                "Concurrency slots over all workers: busy slots run a job, free ones can take one.",
                "short",
                Query(f"sum by (state) ({DEDUP} (queue_worker_slots{{{QUEUE}}}))", "{{state}}"),
                width=8,
                stacked=True,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Utilisation",
                "Busy slots over all slots per queue; near 100% for long means saturated workers.",
                "percentunit",
                Query(
                    f"max by (system, queue) (queue_worker_utilization_ratio{{{QUEUE}}})",
                    _QUEUE_LEGEND,
                ),
                width=8,
                max_value=1,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Dequeue hits vs empty polls",
                "Dequeue attempts per second that got a job (hit), found nothing (empty) or "
                "failed (error); many empty polls mean idle, polling workers.",
                "ops",
                Query(_rate("queue_dequeue_attempts_total", "result"), "{{result}}"),
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Backend operation latency p95",
                "p95 latency of each backend operation (enqueue, dequeue, snapshot reads and "
                "writes, pool waits).",
                "s",
                Query(
                    "histogram_quantile(0.95, sum by (operation, le) "
                    f"(rate(queue_backend_operation_seconds_bucket{{{SYSTEM}}}[{RATE}])))",
                    "{{operation}}",
                ),
            )
        )
        .with_row(dashboard.Row("Reaper and scheduler"))
        .with_panel(
            panel(
                "timeseries",
                "Reaper health",
                "Items the reaper requeued (expired leases) and its errors, per second.",
                "ops",
                Query(_rate("queue_reaper_requeued_total", "system"), "{{system}} requeued"),
                Query(_rate("queue_reaper_errors_total", "system"), "{{system}} errors"),
                width=6,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Reaper cycle duration",
                "p50, p95 and p99 of one reaper cycle.",
                "s",
                *quantiles("queue_reaper_cycle_seconds", SYSTEM),
                width=6,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Scheduler health",
                "Scheduled items the scheduler moved to their queue and its errors, per second.",
                "ops",
                Query(_rate("queue_scheduler_processed_total", "system"), "{{system}} processed"),
                Query(_rate("queue_scheduler_errors_total", "system"), "{{system}} errors"),
                width=6,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Scheduler cycle duration",
                "p50, p95 and p99 of one scheduler cycle.",
                "s",
                *quantiles("queue_scheduler_cycle_seconds", SYSTEM),
                width=6,
            )
        )
        .with_row(dashboard.Row("Idempotency"))
        .with_panel(
            panel(
                "timeseries",
                "Idempotency conflicts and reuses",
                "Submissions refused as duplicates (conflicts) and answered with an earlier "
                "result (reuses), per second.",
                "ops",
                Query(
                    _rate("queue_idempotency_conflicts_total", "system, queue"),
                    _QUEUE_LEGEND + " conflicts",
                ),
                Query(
                    _rate("queue_idempotency_reused_total", "system, queue"),
                    _QUEUE_LEGEND + " reused",
                ),
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Idempotency check latency",
                "p50, p95 and p99 of the idempotency-key check before enqueue.",
                "s",
                *quantiles("queue_idempotency_check_seconds", SYSTEM),
            )
        )
    )
