"""What a configuration samples and consumes, built: key samplers, SQL collectors, native
readers, event stream consumers and the leader lease.

Kept apart from app.py because this is where redis-py and the readers load: `serve` starts its
HTTP listener first and imports this module after (start-up time to the first answer).
"""

from __future__ import annotations

from exporter.config.kinds import KINDS, BuildContext, Built
from exporter.config.settings import Config
from exporter.leader.election import Leadership, lease_connection
from exporter.lifecycle.metrics import EventMetrics
from exporter.output.telemetry import Telemetry
from exporter.sources.streams.config import EventsSourceConfig


def build(
    config: Config,
    telemetry: Telemetry,
    event_metrics: EventMetrics | None,
    leadership: Leadership | None = None,
) -> Built:
    """The samplers and stream consumers of every source kind (config/kinds.py); native
    readers learn from `leadership` which lease they read under, to tell a replica that leads
    again after another did (framework.Terms)."""
    term = leadership.token if leadership is not None else None
    context = BuildContext(telemetry, event_metrics, term)
    built = Built()
    for kind in KINDS:
        part = kind.build(config, context)
        built.sources += part.sources
        built.consumers += part.consumers
    return built


def build_event_metrics(config: Config, telemetry: Telemetry) -> EventMetrics | None:
    """The one EventMetrics that event streams and native readers feed, when any is on."""
    if not any(kind.feeds_events(config) for kind in KINDS):
        return None
    buckets = (config.sources.events or EventsSourceConfig()).buckets()
    return EventMetrics(telemetry, buckets, by_redis=config.sources.several_redis())


def leadership(config: Config) -> Leadership | None:
    election = config.leader_election
    if not election.enabled:
        return None
    events = config.sources.events
    connection = lease_connection(
        election, config.sources.default_redis(), events.redis if events is not None else None
    )
    return Leadership(election, connection)
