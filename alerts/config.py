"""Every threshold, window and selector of the rules, in one place (the mixin `_config`).

Change a number here and run `python -m alerts`: the rules file and the runbook follow. Tests
build a copy with short windows through `dataclasses.replace`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RulesConfig:
    # Selects the exporter's own series for the absent() alert: the scrape job's name.
    exporter_selector: str = 'job="queue-exporter"'
    # Labels that tell replicas of the exporter apart. Sampled gauges are deduplicated across
    # them (every replica samples the same keys); event counters are summed over them (a
    # consumer group hands each event to one replica).
    replica_labels: tuple[str, ...] = ("instance", "pod")
    # Where runbook_url points: repository-relative by default, override with the published URL.
    runbook_url_base: str = "docs/runbook.md"

    # The window of the recorded rates and ratios.
    rate_window: str = "5m"

    backlog_growth_window: str = "15m"
    backlog_growth_for: str = "15m"
    backlog_min_items: int = 100

    oldest_age_seconds: int = 900
    oldest_age_for: str = "5m"

    dead_letter_window: str = "15m"

    near_capacity_ratio: float = 0.8
    near_capacity_for: str = "5m"
    at_capacity_ratio: float = 1.0
    at_capacity_for: str = "2m"

    failure_ratio: float = 0.1
    # Jobs finished per second below which the failure ratio is too noisy to alert on.
    failure_min_rate: float = 0.01
    failure_for: str = "10m"

    stuck_active_for: str = "15m"
    leases_expired_for: str = "10m"
    scheduled_due_for: str = "10m"

    # How far back a queue counts as having had workers (so systems that send no heartbeats
    # never page for "no workers").
    workers_lookback: str = "1h"
    no_workers_for: str = "5m"
    saturation_ratio: float = 0.95
    saturation_for: str = "15m"

    stats_age_seconds: int = 600
    stats_stale_for: str = "5m"

    source_down_for: str = "5m"
    key_group_unmatched_for: str = "10m"
    stream_lag_entries: int = 10_000
    stream_lag_for: str = "10m"
    events_lost_window: str = "10m"
    events_invalid_window: str = "15m"
    absent_for: str = "5m"
    overflow_window: str = "10m"


DEFAULTS = RulesConfig()


def with_short_windows(config: RulesConfig, window: str = "30s") -> RulesConfig:
    """Every `for` zero and every window `window`: rules a test with 1s scrapes (or a demo)
    sees fire within seconds."""
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(config):
        if field.name.endswith("_for"):
            changes[field.name] = "0s"
        elif field.name.endswith("_window") or field.name == "workers_lookback":
            changes[field.name] = window
    return dataclasses.replace(config, **changes)
