"""Every threshold, window and selector of the rules, in one place (the mixin `_config`).

Change a number here and run `python -m alerts`: the rules file and the runbook follow. Tests
build a copy with short windows through `dataclasses.replace`.
"""

from __future__ import annotations

import dataclasses
import re
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
    at_capacity_ratio: float = 1  # written as Helm writes the number back: 1, not 1.0
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
    # Work waiting this long while nothing finishes (where jobs that end are counted), or while
    # the head of the queue does not move (where they are not), is a stalled queue.
    stalled_window: str = "15m"
    # Seconds the oldest pending item's age gains per second (its slope over stalled_window)
    # above which the head counts as not moving: 1 while one item stays at the head.
    stalled_age_growth: float = 0.9
    not_processing_for: str = "5m"
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

# What a user sets without editing code (`python -m alerts --set NAME=VALUE`, the chart's
# prometheusRule.thresholds): each alert's threshold and `for` duration. Windows stay code:
# the recording rules' names carry them (rate5m).
THRESHOLDS: tuple[str, ...] = tuple(
    field.name
    for field in dataclasses.fields(RulesConfig)
    if field.name.endswith("_for") or field.type in ("int", "float")
)


def job_selector(job: str) -> str:
    """The exporter_selector of a scrape job's name."""
    escaped = job.replace("\\", "\\\\").replace('"', '\\"')
    return f'job="{escaped}"'


def with_settings(config: RulesConfig, settings: dict[str, Any]) -> RulesConfig:
    """`config` with the settable fields in `settings` changed (`job` sets the selector); a
    name that is not one is refused, naming those that are."""
    changes = dict(settings)
    if "job" in changes:
        changes["exporter_selector"] = job_selector(str(changes.pop("job")))
    settable = {*THRESHOLDS, "exporter_selector", "runbook_url_base"}
    unknown = sorted(changes.keys() - settable)
    if unknown:
        raise ValueError(
            f"not a setting: {', '.join(unknown)} (settable: job, {', '.join(sorted(settable))})"
        )
    typed = {name: _typed(name, value) for name, value in changes.items()}
    return dataclasses.replace(config, **typed)


def _typed(name: str, value: Any) -> Any:
    kind = {field.name: field.type for field in dataclasses.fields(RulesConfig)}[name]
    try:
        if kind == "int":
            return int(value)
        if kind == "float":
            return float(value)
    except ValueError:
        raise ValueError(f"{name}: {value!r} is not a number") from None
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name}: {value!r} is not a text")
    if name.endswith("_for") and not _DURATION.fullmatch(value):
        raise ValueError(f"{name}: {value!r} is not a Prometheus duration (5m, 1h30m, 0s)")
    return value


_DURATION = re.compile(r"(\d+(ms|s|m|h|d|w|y))+")


def tokenized(config: RulesConfig = DEFAULTS) -> RulesConfig:
    """`config` with each setting the Helm chart takes replaced by a token, `__qe_<name>__`,
    that its PrometheusRule template replaces with the value from values.yaml."""
    changes: dict[str, Any] = {name: token(name) for name in THRESHOLDS}
    changes["exporter_selector"] = job_selector(token("job"))
    changes["runbook_url_base"] = token("runbook_url_base")
    return dataclasses.replace(config, **changes)


def token(name: str) -> str:
    return f"__qe_{name}__"


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
