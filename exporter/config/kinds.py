"""The source kinds, registered once: for each, its section of `sources`, how it is built, what
`check-config --connect` probes, what `redis-acl` grants it, how it is inventoried and masked.

Every place that treats the sources alike loops over KINDS: runtime/build.py,
commands/check_config.py, commands/redis_acl.py, config/inventory.py and config/effective.py
(the effective YAML, secrets masked). The kinds themselves live in sources/: the key sampler
(redis_keys/), the SQL collectors and the finished-rows readers of one PostgreSQL pool
(postgres/, readers/finished_rows.py), the event stream consumers (streams/, their formats in
streams/formats.py) and the native readers (readers/, each in readers/registry.py).

The hooks import what is heavy (redis-py, psycopg, the readers, the probes) when they run:
this module is light, since serve logs the inventory before it loads them.

A new kind: its package under sources/, its section in SourcesConfig (config/settings.py) and a
record here; tests/sources/test_kinds.py checks that every record has every hook.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from exporter.config.settings import Config
from exporter.core.printable import printable
from exporter.redis.acl import RedisNeeds
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.postgres.config import PostgresSourceConfig
from exporter.sources.probe import Findings, ProbeContext
from exporter.sources.readers.config import NativeConfig
from exporter.sources.redis_keys.config import RedisSourceConfig
from exporter.sources.streams.config import EventsSourceConfig

if TYPE_CHECKING:
    from exporter.lifecycle.metrics import EventMetrics
    from exporter.output.telemetry import Telemetry
    from exporter.sources.source import Source
    from exporter.sources.streams.consumer import StreamConsumer


@dataclass(frozen=True)
class BuildContext:
    telemetry: Telemetry
    event_metrics: EventMetrics | None  # what every event feed updates; None: no feed is on
    term: Callable[[], int | None] | None = None  # the leader lease's token (Leadership.token)


@dataclass
class Built:
    """What a kind builds: sources the runner samples, stream consumers that run threads."""

    sources: list[Source] = field(default_factory=list)
    consumers: list[StreamConsumer] = field(default_factory=list)


@dataclass(frozen=True)
class SourceTarget:
    """One backend the exporter reads, and what it reads there."""

    kind: str  # redis keys, postgres, events, native <system>
    target: str  # URL or DSN, secrets masked
    what: str  # "7 key groups", "3 SQL collectors", "1 stream"


@dataclass
class Inventoried:
    """What a kind will look at, for the inventory (config/inventory.py)."""

    sources: list[SourceTarget] = field(default_factory=list)
    key_groups: list[str] = field(default_factory=list)  # "system pattern (type, state)"
    streams: list[str] = field(default_factory=list)  # "key (format, group)"
    sql_collectors: list[str] = field(default_factory=list)
    native_readers: list[str] = field(default_factory=list)  # the systems whose records are read


@dataclass(frozen=True)
class SourceKind:
    name: str
    section: str  # its field of SourcesConfig: sources.<section>
    config_type: type[Any]  # the model of that section (of each item, for a list)
    build: Callable[[Config, BuildContext], Built]
    # whether it updates the lifecycle families (EventMetrics is made only when one does)
    feeds_events: Callable[[Config], bool]
    probe: Callable[[Config, ProbeContext], Findings]
    acl: Callable[[Config], RedisNeeds]
    inventory: Callable[[Config], Inventoried]
    # masks the secrets of its section in the configuration's JSON document
    mask: Callable[[Config, dict[str, Any]], None]


# -- redis keys: the key sampler, one per Redis with key groups ---------------------------------


def _build_key_samplers(config: Config, context: BuildContext) -> Built:
    from exporter.sources.redis_keys.sampler import redis_samplers

    samplers = redis_samplers(config.sources.redis, config.sample_interval)
    return Built(sources=list(samplers))


def _probe_key_groups(config: Config, context: ProbeContext) -> Findings:
    from exporter.sources.redis_keys import probe

    return probe.probe(config.sources.redis, context)


def _key_groups_acl(config: Config) -> RedisNeeds:
    from exporter.sources.redis_keys import acl

    return acl.needs(config.sources.redis_list())


def _key_groups_inventoried(config: Config) -> Inventoried:
    found = Inventoried()
    several = config.sources.several_redis()
    for redis in config.sources.redis_list():
        if redis.key_groups:
            kind = f"redis keys {redis.name}" if several else "redis keys"
            what = counted(len(redis.key_groups), "key group")
            found.sources.append(SourceTarget(kind, redis.masked_url(), what))
        found.key_groups += [
            f"{g.system} {printable(g.pattern)} ({g.type_name}, {g.state})"
            for g in redis.key_groups
        ]
    return found


def _mask_redis(config: Config, document: dict[str, Any]) -> None:
    redis = config.sources.redis
    if isinstance(redis, list):
        for index, source in enumerate(redis):
            document["sources"]["redis"][index]["url"] = source.masked_url()
    elif redis is not None:
        document["sources"]["redis"]["url"] = redis.masked_url()


# -- postgres: SQL collectors and finished-rows readers, on one pool ----------------------------


def _build_postgres(config: Config, context: BuildContext) -> Built:
    postgres_config = config.sources.postgres
    if postgres_config is None or not (postgres_config.collectors or postgres_config.finished):
        return Built()
    from exporter.sources.postgres import (
        source as postgres,  # psycopg loads only when PostgreSQL is sampled
    )

    connector = postgres.PostgresConnector(postgres_config)
    built = Built(
        sources=list(postgres.build_sources(postgres_config, config.sample_interval, connector))
    )
    if context.event_metrics is not None and postgres_config.finished:
        from exporter.sources.readers import finished_rows

        built.sources += finished_rows.build_sources(
            postgres_config, connector, context.event_metrics, config.sample_interval, context.term
        )
    return built


def _postgres_feeds_events(config: Config) -> bool:
    postgres = config.sources.postgres
    return postgres is not None and any(reader.enabled for reader in postgres.finished)


def _probe_postgres(config: Config, context: ProbeContext) -> Findings:
    postgres_config = config.sources.postgres
    if postgres_config is None or not (
        postgres_config.collectors or _postgres_feeds_events(config)
    ):
        return Findings()
    from exporter.sources.postgres import probe
    from exporter.sources.readers import finished_rows_probe

    findings = probe.probe(postgres_config, context)
    if not findings.unreachable:  # a server that refused is named once, above
        findings.add(finished_rows_probe.probe(postgres_config, context))
    return findings


def _no_redis(config: Config) -> RedisNeeds:
    return RedisNeeds()


def _postgres_inventoried(config: Config) -> Inventoried:
    postgres = config.sources.postgres
    if postgres is None:
        return Inventoried()
    found = Inventoried()
    if postgres.collectors:
        target = postgres.masked_dsn() or f"DSN from {postgres.dsn_file}"
        what = counted(len(postgres.collectors), "SQL collector")
        found.sources.append(SourceTarget("postgres", target, what))
    cycle = postgres.sample_interval or config.sample_interval
    dsn = postgres.masked_dsn() or "the postgres DSN"
    for rows in (rows for rows in postgres.finished if rows.enabled):  # a native reader of rows
        what = f"the rows of {rows.table} as jobs finish"
        found.sources.append(SourceTarget(f"native {rows.name}", dsn, what))
        found.native_readers.append(rows.name)
    for collector in postgres.collectors:  # how often it reads when not every cycle, and why
        note = collector.reads_note(cycle)
        found.sql_collectors.append(
            collector.name if note is None else f"{collector.name} ({note})"
        )
    return found


def _mask_postgres(config: Config, document: dict[str, Any]) -> None:
    postgres = config.sources.postgres
    if postgres is not None and postgres.dsn is not None:
        document["sources"]["postgres"]["dsn"] = postgres.masked_dsn()


# -- events: one consumer per stream, each format read by its decoder --------------------------


def _build_consumers(config: Config, context: BuildContext) -> Built:
    if not _events_feed_events(config):  # no stream: the consumer's modules stay unloaded
        return Built()
    from exporter.sources.streams.consumer import build_consumers

    consumers = build_consumers(
        config.sources.events,
        config.sources.default_redis(),
        context.event_metrics,
        context.telemetry.health,
        context.telemetry.count_error,
        config.sources.redis_source,
    )
    return Built(consumers=consumers)


def _events_feed_events(config: Config) -> bool:
    events = config.sources.events
    return events is not None and bool(events.streams)


def _probe_streams(config: Config, context: ProbeContext) -> Findings:
    events = config.sources.events
    if events is None or not events.streams:
        return Findings()
    from exporter.sources.streams import probe

    return probe.probe(config.sources.events_redis(), events.streams, context)


def _streams_acl(config: Config) -> RedisNeeds:
    events = config.sources.events
    if events is None:
        return RedisNeeds()
    from exporter.sources.streams import acl

    return acl.needs(events)


def _streams_inventoried(config: Config) -> Inventoried:
    events = config.sources.events
    if events is None or not events.streams:
        return Inventoried()
    target = config.sources.events_redis().masked_url()
    source = SourceTarget("events", target, counted(len(events.streams), "stream"))
    return Inventoried(
        sources=[source],
        streams=[
            f"{printable(s.key)} ({s.format}, group {printable(s.group)}"
            f"{labelled(config.sources.redis_source(s.redis or events.redis))})"
            for s in events.streams
        ],
    )


def _mask_events(config: Config, document: dict[str, Any]) -> None:
    events = config.sources.events
    if events is None:
        return
    if events.redis is not None:
        document["sources"]["events"]["redis"]["url"] = events.redis.masked_url()
    for index, stream in enumerate(events.streams):
        if stream.redis is not None:
            stream_redis = document["sources"]["events"]["streams"][index]["redis"]
            stream_redis["url"] = stream.redis.masked_url()


# -- native: the readers of sources.native (readers/registry.py) ------------------------------


def _build_readers(config: Config, context: BuildContext) -> Built:
    if context.event_metrics is None:
        return Built()
    from exporter.sources import readers

    sources = readers.build_sources(
        config.sources.native,
        config.sources.default_redis(),
        context.event_metrics,
        config.sample_interval,
        config.sources.redis_source,
        context.term,
    )
    return Built(sources=list(sources))


def _readers_feed_events(config: Config) -> bool:
    native = config.sources.native
    return native is not None and bool(native.enabled())


def _default_redis(config: Config) -> RedisConnectionConfig:
    return config.sources.default_redis() or RedisConnectionConfig()


def _probe_readers(config: Config, context: ProbeContext) -> Findings:
    native = config.sources.native
    if native is None:
        return Findings()
    from exporter.sources.readers import probe

    return probe.probe(native.enabled_by_name(), _default_redis(config), context)


def _readers_acl(config: Config) -> RedisNeeds:
    native = config.sources.native
    if native is None:
        return RedisNeeds()
    from exporter.sources.readers import acl

    return acl.needs(native.enabled(), _default_redis(config))


def _readers_inventoried(config: Config) -> Inventoried:
    native = config.sources.native
    found = Inventoried()
    for name, reader in (native.enabled_by_name() if native is not None else {}).items():
        connection = reader.redis or _default_redis(config)
        what = "its own records" + labelled(config.sources.redis_source(reader.redis))
        found.sources.append(SourceTarget(f"native {name}", connection.masked_url(), what))
        found.native_readers.append(name)
    return found


def _mask_readers(config: Config, document: dict[str, Any]) -> None:
    native = config.sources.native
    for name, reader in native.enabled_by_name().items() if native is not None else ():
        if reader.redis is not None:
            document["sources"]["native"][name]["redis"]["url"] = reader.redis.masked_url()


KINDS: tuple[SourceKind, ...] = (
    SourceKind(
        name="redis keys",
        section="redis",
        config_type=RedisSourceConfig,
        build=_build_key_samplers,
        feeds_events=lambda config: False,
        probe=_probe_key_groups,
        acl=_key_groups_acl,
        inventory=_key_groups_inventoried,
        mask=_mask_redis,
    ),
    SourceKind(
        name="postgres",
        section="postgres",
        config_type=PostgresSourceConfig,
        build=_build_postgres,
        feeds_events=_postgres_feeds_events,
        probe=_probe_postgres,
        acl=_no_redis,
        inventory=_postgres_inventoried,
        mask=_mask_postgres,
    ),
    SourceKind(
        name="events",
        section="events",
        config_type=EventsSourceConfig,
        build=_build_consumers,
        feeds_events=_events_feed_events,
        probe=_probe_streams,
        acl=_streams_acl,
        inventory=_streams_inventoried,
        mask=_mask_events,
    ),
    SourceKind(
        name="native",
        section="native",
        config_type=NativeConfig,
        build=_build_readers,
        feeds_events=_readers_feed_events,
        probe=_probe_readers,
        acl=_readers_acl,
        inventory=_readers_inventoried,
        mask=_mask_readers,
    ),
)


def counted(number: int, noun: str) -> str:
    """ "1 stream", "2 streams"."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def labelled(redis_source: str | None) -> str:
    """Where a feed's series name their Redis (several Redis sources): say which name."""
    return "" if redis_source is None else f", redis_source {redis_source}"
