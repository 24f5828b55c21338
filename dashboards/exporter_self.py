"""The exporter itself: is it blind, slow, behind on events, or dropping series?"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from dashboards.common import RATE, TARGET, Query, new_dashboard, panel

# A stream is its key and, with several Redis sources, its Redis (redis_source): one key on two
# servers is two streams. With one Redis the label is absent and the grouping is by key alone.
STREAM = "stream, redis_source"
STREAM_LEGEND = "{{stream}} {{redis_source}}"


def _rate(metric: str, by: str) -> str:
    return f"sum by ({by}) (rate({metric}{{{TARGET}}}[{RATE}]))"


def build() -> dashboard.Dashboard:
    return (
        new_dashboard(
            "queue-exporter-self",
            "Exporter",
            "The exporter's own health: sources, sampling, event consumption, cardinality.",
        )
        .with_row(dashboard.Row("Sources"))
        .with_panel(
            panel(
                "stat",
                "Sources down",
                "Sources (per exporter instance) whose last sample failed; their queue series "
                "are withdrawn while they fail.",
                "short",
                Query(f"count(queue_exporter_source_up{{{TARGET}}} == 0) or vector(0)", "down"),
                width=6,
                height=4,
            )
        )
        .with_panel(
            panel(
                "stat",
                "Exporter instances",
                "Exporter processes scraped, by version.",
                "short",
                Query(f"count by (version) (queue_exporter_build_info{{{TARGET}}})", "{{version}}"),
                width=6,
                height=4,
            )
        )
        .with_panel(
            panel(
                "stat",
                "Longest time since a successful sample",
                "The stalest source over all instances: time since its last successful sample.",
                "s",
                Query(
                    f"max(time() - queue_exporter_source_last_success_timestamp_seconds{{{TARGET}}})",
                    "stalest",
                ),
                width=12,
                height=4,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Sources up",
                "1 while a source's samples succeed, 0 while it fails, per instance.",
                "none",
                Query(f"queue_exporter_source_up{{{TARGET}}}", "{{instance}} {{source}}"),
                width=8,
                max_value=1,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Sample duration",
                "Duration of each source's last sample cycle; close to the sample interval "
                "means the source cannot keep up.",
                "s",
                Query(
                    f"queue_exporter_source_duration_seconds{{{TARGET}}}", "{{instance}} {{source}}"
                ),
                width=8,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Source errors by reason",
                "Failed sample cycles and per-item read errors per second, by source and reason.",
                "ops",
                Query(
                    _rate("queue_exporter_source_errors_total", "source, reason"),
                    "{{source}} {{reason}}",
                ),
                width=8,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Keys matched by key group",
                "Keys each key group matched in its last cycle. A group at 0 finds nothing to "
                "read (a pattern typo, the wrong database): its queues look empty "
                "(alert QueueExporterKeyGroupUnmatched).",
                "short",
                Query(
                    f"max by (system, pattern) (queue_exporter_keys_matched{{{TARGET}}})",
                    "{{system}} {{pattern}}",
                ),
                width=12,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Read errors by key group",
                "Keys and items a key group could not read per second, by reason (wrong type, "
                "item not JSON, time missing, ...); the exporter's log and status page name the "
                "keys.",
                "ops",
                Query(
                    f'sum by (system, pattern, reason) (rate(queue_exporter_source_errors_total{{{TARGET},pattern!=""}}[{RATE}]))',
                    "{{system}} {{pattern}} {{reason}}",
                ),
                width=12,
            )
        )
        .with_row(dashboard.Row("Events"))
        .with_panel(
            panel(
                "timeseries",
                "Events read",
                "Lifecycle events consumed per second, by stream (and Redis, with several).",
                "ops",
                Query(_rate("queue_exporter_events_total", STREAM), STREAM_LEGEND),
                width=8,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Stream lag",
                "Entries of each stream not yet delivered to the exporter's consumer group.",
                "short",
                Query(
                    f"max by ({STREAM}, group) (queue_exporter_stream_lag{{{TARGET}}})",
                    STREAM_LEGEND + " {{group}}",
                ),
                width=8,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Pending entries",
                "Entries delivered to a consumer but not yet acknowledged.",
                "short",
                Query(
                    f"max by ({STREAM}, group) (queue_exporter_stream_pending{{{TARGET}}})",
                    STREAM_LEGEND + " {{group}}",
                ),
                width=8,
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Lost events",
                "Entries trimmed from a stream before the exporter read them, per second.",
                "ops",
                Query(_rate("queue_exporter_events_lost_total", STREAM), STREAM_LEGEND),
            )
        )
        .with_panel(
            panel(
                "timeseries",
                "Invalid events by reason",
                "Entries skipped as invalid per second, by reason.",
                "ops",
                Query(
                    _rate("queue_exporter_events_invalid_total", f"{STREAM}, reason"),
                    STREAM_LEGEND + " {{reason}}",
                ),
            )
        )
        .with_row(dashboard.Row("Cardinality"))
        .with_panel(
            panel(
                "timeseries",
                "Series overflow",
                "Label sets refused per second by the per-metric cardinality cap and folded "
                "into the overflow series, by metric.",
                "ops",
                Query(_rate("queue_exporter_series_overflow_total", "metric"), "{{metric}}"),
                width=24,
            )
        )
    )
