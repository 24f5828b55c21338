"""What a configuration will look at: sources and their targets, presets, key groups, streams.

`serve` logs it at start, `check-config` prints it first and ends with its one-line verdict, and a
configuration with nothing in it is refused before anything starts: an exporter sampling
nothing looks healthy while it reports nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.config.settings import Config
from exporter.core.printable import printable
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.postgres.collectors import SqlCollector

NOTHING_TO_DO = (
    "nothing to sample or consume: name a preset (--preset NAME or QUEUE_EXPORTER_PRESET; "
    "`queue-exporter presets` lists them) with its backend (--redis-url URL or "
    "QUEUE_EXPORTER_REDIS_URL, --postgres-dsn DSN for attune), event streams "
    "(--events-stream KEY), or a configuration file with key groups, SQL collectors or "
    "streams (--config FILE or QUEUE_EXPORTER_CONFIG; docs/configuration.md)"
)


@dataclass(frozen=True)
class SourceTarget:
    """One backend the exporter reads, and what it reads there."""

    kind: str  # redis keys, postgres, events, native <system>
    target: str  # URL or DSN, secrets masked
    what: str  # "7 key groups", "3 SQL collectors", "1 stream"


@dataclass(frozen=True)
class Inventory:
    presets: tuple[str, ...]
    sources: tuple[SourceTarget, ...]
    key_groups: tuple[str, ...]  # "system pattern (type, state)"
    streams: tuple[str, ...]  # "key (format, group)"
    sql_collectors: tuple[str, ...]
    native_readers: tuple[str, ...]  # the systems whose own records are read
    # "system signal: why": what a system does not record, so nothing serves it
    not_recorded: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.sources

    def verdict(self, warnings: int = 0) -> str:
        """One line: "OK: 2 sources, 7 key groups, 1 stream, 3 SQL collectors" (and the native
        readers, when there are any); "OK with 2 warnings: ..." when something answered but
        not as the configuration means (the warnings are named on lines of their own)."""
        counts = [
            _count(len(self.sources), "source"),
            _count(len(self.key_groups), "key group"),
            _count(len(self.streams), "stream"),
            _count(len(self.sql_collectors), "SQL collector"),
        ]
        if self.native_readers:
            counts.append(_count(len(self.native_readers), "native reader"))
        verdict = "OK" if not warnings else f"OK with {_count(warnings, 'warning')}"
        return f"{verdict}: {', '.join(counts)}"

    def lines(self) -> list[str]:
        """The report, one fact a line, for the log and check-config."""
        lines = [f"presets: {', '.join(self.presets) or 'none'}"]
        lines += [f"source {s.kind}: {s.target} ({s.what})" for s in self.sources]
        lines += [f"key group {group}" for group in self.key_groups]
        lines += [f"events stream {stream}" for stream in self.streams]
        lines += [f"SQL collector {collector}" for collector in self.sql_collectors]
        lines += [f"native reader {system}" for system in self.native_readers]
        lines += [f"not recorded by {entry}" for entry in self.not_recorded]
        return lines


def take(config: Config) -> Inventory:
    sources: list[SourceTarget] = []
    several = config.sources.several_redis()
    groups = [group for redis in config.sources.redis_list() for group in redis.key_groups]
    for redis in config.sources.redis_list():
        if redis.key_groups:
            kind = f"redis keys {redis.name}" if several else "redis keys"
            what = _count(len(redis.key_groups), "key group")
            sources.append(SourceTarget(kind, redis.masked_url(), what))
    postgres = config.sources.postgres
    collectors = postgres.collectors if postgres is not None else []
    finished = [r for r in postgres.finished if r.enabled] if postgres is not None else []
    if postgres is not None and collectors:
        target = postgres.masked_dsn() or f"DSN from {postgres.dsn_file}"
        sources.append(SourceTarget("postgres", target, _count(len(collectors), "SQL collector")))
    cycle = (postgres.sample_interval if postgres is not None else None) or config.sample_interval
    dsn = (postgres.masked_dsn() if postgres is not None else None) or "the postgres DSN"
    for rows in finished:  # sources.postgres.finished: a native reader of finished rows
        what = f"the rows of {rows.table} as jobs finish"
        sources.append(SourceTarget(f"native {rows.name}", dsn, what))
    events = config.sources.events
    streams = events.streams if events is not None else []
    if events is not None and streams:
        target = events_redis(config).masked_url()
        sources.append(SourceTarget("events", target, _count(len(streams), "stream")))
    native = config.sources.native
    readers = native.enabled_by_name() if native is not None else {}
    for name, reader in readers.items():
        connection = reader.redis or config.sources.default_redis() or RedisConnectionConfig()
        what = "its own records" + _labelled(config.sources.redis_source(reader.redis))
        sources.append(SourceTarget(f"native {name}", connection.masked_url(), what))
    return Inventory(
        presets=tuple(ref if isinstance(ref, str) else ref.name for ref in config.presets),
        sources=tuple(sources),
        key_groups=tuple(
            f"{g.system} {printable(g.pattern)} ({g.type_name}, {g.state})" for g in groups
        ),
        streams=tuple(
            f"{printable(s.key)} ({s.format}, group {printable(s.group)}"
            f"{_labelled(config.sources.redis_source(s.redis or events.redis))})"
            for s in streams
            if events is not None
        ),
        sql_collectors=tuple(_collector(c, cycle) for c in collectors),
        native_readers=(*readers, *(rows.name for rows in finished)),
        not_recorded=tuple(
            f"{system} {signal}: {why}"
            for system, signals in sorted(config.not_recorded.items())
            for signal, why in signals.items()
        ),
    )


def _collector(collector: SqlCollector, cycle: float) -> str:
    """Its name, and how often it reads when not every cycle, and why."""
    note = collector.reads_note(cycle)
    return collector.name if note is None else f"{collector.name} ({note})"


def events_redis(config: Config) -> RedisConnectionConfig:
    """Where the event streams are read: events.redis, else sources.redis's connection."""
    events = config.sources.events
    if events is not None and events.redis is not None:
        return events.redis
    return config.sources.default_redis() or RedisConnectionConfig()


def _labelled(redis_source: str | None) -> str:
    """Where a feed's series name their Redis (several Redis sources): say which name."""
    return "" if redis_source is None else f", redis_source {redis_source}"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"
