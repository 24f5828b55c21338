"""What a configuration samples and consumes, built: key samplers, SQL collectors, native
readers, event stream consumers and the leader lease.

Kept apart from app.py because this is where redis-py and the readers load: `serve` starts its
HTTP listener first and imports this module after (start-up time to the first answer).
"""

from __future__ import annotations

from exporter.config.settings import Config
from exporter.leader.election import Leadership, lease_connection
from exporter.lifecycle.metrics import EventMetrics
from exporter.output.telemetry import Telemetry
from exporter.sources import readers as native
from exporter.sources.redis_keys.sampler import redis_samplers
from exporter.sources.source import Source
from exporter.sources.streams.config import EventsSourceConfig
from exporter.sources.streams.consumer import StreamConsumer, build_consumers


def build_sources(
    config: Config,
    telemetry: Telemetry,
    event_metrics: EventMetrics | None,
    leadership: Leadership | None = None,
) -> list[Source]:
    """The samplers of the configuration; native readers learn from `leadership` which lease
    they read under, to tell a replica that leads again after another did (framework.Terms)."""
    term = leadership.token if leadership is not None else None
    sources: list[Source] = list(
        redis_samplers(config.sources.redis, telemetry, config.sample_interval)
    )
    postgres_config = config.sources.postgres
    if postgres_config is not None and (postgres_config.collectors or postgres_config.finished):
        from exporter.sources.postgres import (
            source as postgres,  # psycopg loads only when PostgreSQL is sampled
        )

        connector = postgres.PostgresConnector(postgres_config)
        sources.extend(
            postgres.build_sources(postgres_config, telemetry, config.sample_interval, connector)
        )
        if event_metrics is not None and postgres_config.finished:
            from exporter.sources.readers import finished_rows

            sources.extend(
                finished_rows.build_sources(
                    postgres_config, connector, event_metrics, config.sample_interval, term
                )
            )
    if event_metrics is not None:
        sources.extend(
            native.build_sources(
                config.sources.native,
                config.sources.default_redis(),
                event_metrics,
                config.sample_interval,
                config.sources.redis_source,
                term,
            )
        )
    return sources


def build_event_metrics(config: Config, telemetry: Telemetry) -> EventMetrics | None:
    """The one EventMetrics that event streams and native readers feed, when any is on."""
    events, readers = config.sources.events, config.sources.native
    postgres = config.sources.postgres
    finished = postgres is not None and any(reader.enabled for reader in postgres.finished)
    streams = events is not None and bool(events.streams)
    if not streams and not (readers and readers.enabled()) and not finished:
        return None
    buckets = (events or EventsSourceConfig()).buckets()
    return EventMetrics(telemetry, buckets, by_redis=config.sources.several_redis())


def stream_consumers(
    config: Config, telemetry: Telemetry, event_metrics: EventMetrics | None
) -> list[StreamConsumer]:
    return build_consumers(
        config.sources.events,
        config.sources.default_redis(),
        telemetry,
        event_metrics,
        config.sources.redis_source,
    )


def leadership(config: Config) -> Leadership | None:
    election = config.leader_election
    if not election.enabled:
        return None
    events = config.sources.events
    connection = lease_connection(
        election, config.sources.default_redis(), events.redis if events is not None else None
    )
    return Leadership(election, connection)
