"""Queues: is any queue backing up, full, or dead-lettering?"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from dashboards.common import DEDUP, QUEUE, RATE, Query, new_dashboard, panel

_DEPTH = f"{DEDUP} (queue_depth{{{QUEUE}}})"
_PENDING = f'{DEDUP} (queue_depth{{{QUEUE}, state="pending"}})'
_ACTIVE = f'{DEDUP} (queue_depth{{{QUEUE}, state="active"}})'
_DEAD = f'{DEDUP} (queue_depth{{{QUEUE}, state="dead_letter"}})'
_BY_QUEUE = "system, queue"
_QUEUE_LEGEND = "{{system}}/{{queue}}"


def build() -> dashboard.Dashboard:
    return (
        new_dashboard(
            "queue-exporter-queues",
            "Queues",
            "Depth, age, dead letters and capacity of every queue the exporter samples.",
        )
        .with_row(dashboard.Row("Overview"))
        .with_panel(
            panel(
                "stat",
                "Pending items",
                "Items waiting to be served, over all selected queues and priorities.",
                "short",
                Query(f"sum({_PENDING})", "pending"),
                width=6,
                height=4,
            )
        )
        .with_panel(
            panel(
                "stat",
                "Dead-letter items",
                "Items in dead-letter queues: work that was given up on.",
                "short",
                Query(f"sum({_DEAD})", "dead letters"),
                width=6,
                height=4,
            )
        )
        .with_panel(
            panel(
                "stat",
                "Oldest pending item",
                "Age of the oldest item still waiting, over the selected queues.",
                "s",
                Query(f'max(queue_oldest_age_seconds{{{QUEUE}, state="pending"}})', "oldest"),
                width=6,
                height=4,
            )
        )
        .with_panel(
            panel(
                "stat",
                "Fullest queue",
                "The highest share of its depth limit any selected queue uses "
                "(queues with a configured maximum depth only).",
                "percentunit",
                Query(
                    f"max(sum by ({_BY_QUEUE}) ({_PENDING}) "
                    f"/ max by ({_BY_QUEUE}) (queue_max_depth{{{QUEUE}}}))",
                    "fullest",
                ),
                width=6,
                height=4,
                max_value=1,
            )
        )
        .with_row(dashboard.Row("Depth and age"))
        .with_panel(
            panel(
                "timeseries",
                "Depth by queue and state",
                "Items per queue and state (pending, active, scheduled, retry, dead_letter, "
                "completed, failed), summed over priorities.",
                "short",
                Query(f"sum by ({_BY_QUEUE}, state) ({_DEPTH})", _QUEUE_LEGEND + " {{state}}"),
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Pending depth by priority",
                "Pending items per queue and priority: a high-priority backlog starves less "
                "than a low-priority one.",
                "short",
                Query(
                    f"sum by ({_BY_QUEUE}, priority) ({_PENDING})",
                    _QUEUE_LEGEND + " p{{priority}}",
                ),
                stacked=True,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Oldest item age",
                "Age of the item at the head of each queue (the next to be served), by state; "
                "rising steadily means nothing consumes the queue.",
                "s",
                Query(
                    f"max by ({_BY_QUEUE}, state) (queue_oldest_age_seconds{{{QUEUE}}})",
                    _QUEUE_LEGEND + " {{state}}",
                ),
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Dead-letter depth",
                "Items in each queue's dead-letter list; any growth is work that failed for good.",
                "short",
                Query(f"sum by ({_BY_QUEUE}) ({_DEAD})", _QUEUE_LEGEND),
            )
        )
        .with_panel(
            panel(
                "bargauge",
                "Top queues by backlog",
                "The ten queues with the most pending items right now.",
                "short",
                Query(f"topk(10, sum by ({_BY_QUEUE}) ({_PENDING}))", _QUEUE_LEGEND),
                width=8,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Overdue scheduled items and expired leases",
                "Scheduled items already due but not moved (the scheduler lags) and in-flight "
                "items past their lease (the reaper lags).",
                "short",
                Query(
                    f"sum by ({_BY_QUEUE}) ({DEDUP} (queue_scheduled_due{{{QUEUE}}}))",
                    _QUEUE_LEGEND + " overdue",
                ),
                Query(
                    f"sum by ({_BY_QUEUE}) ({DEDUP} (queue_leases_expired{{{QUEUE}}}))",
                    _QUEUE_LEGEND + " expired leases",
                ),
                width=16,
            )
        )
        .with_row(dashboard.Row("Capacity and flow"))
        .with_panel(
            panel(
                "timeseries",
                "Capacity use (depth / max depth)",
                "Pending items over the configured backpressure limit; at 100% enqueues are "
                "refused.",
                "percentunit",
                Query(
                    f"sum by ({_BY_QUEUE}) ({_PENDING}) "
                    f"/ max by ({_BY_QUEUE}) (queue_max_depth{{{QUEUE}}})",
                    _QUEUE_LEGEND,
                ),
                width=8,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Concurrency use (active / limit)",
                "Running jobs over the queue's concurrency limit (Attune max_concurrent); at "
                "100% new work waits.",
                "percentunit",
                Query(
                    f"sum by ({_BY_QUEUE}) ({_ACTIVE}) "
                    f"/ max by ({_BY_QUEUE}) (queue_concurrency_limit{{{QUEUE}}})",
                    _QUEUE_LEGEND,
                ),
                width=8,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Statistics age (Attune)",
                "Time since each queue's statistics row was updated; only meaningful while the "
                "queue holds work.",
                "s",
                Query(f"max by ({_BY_QUEUE}) (queue_stats_age_seconds{{{QUEUE}}})", _QUEUE_LEGEND),
                width=8,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Executions by status (Attune)",
                "Executions not yet finished, by the system's own status (requested, "
                "scheduling, scheduled, running, canceling).",
                "short",
                Query(
                    f"sum by (system, status) ({DEDUP} (queue_executions{{{QUEUE}}}))",
                    "{{system}} {{status}}",
                ),
                width=8,
                stacked=True,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Enqueue vs completion rate",
                "Jobs entering and leaving each queue per second; enqueue above completion for "
                "long means the backlog grows.",
                "ops",
                Query(
                    f"sum by ({_BY_QUEUE}) (rate(queue_jobs_enqueued_total{{{QUEUE}}}[{RATE}]))",
                    _QUEUE_LEGEND + " enqueued",
                ),
                Query(
                    f"sum by ({_BY_QUEUE}) (rate(queue_jobs_completed_total{{{QUEUE}}}[{RATE}]))",
                    _QUEUE_LEGEND + " completed",
                ),
                width=16,
            )
        )
    )
