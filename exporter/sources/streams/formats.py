"""The stream formats, registered once: how the consumer reads each, what more it needs.

A stream's `format` (StreamConfig.format) names one record here. The consumer reads its
entries through the record's decoder (sources/readers/entries.py: one protocol for every
format) and knows no format itself; `redis-acl` grants what the decoder reads besides the
stream (commands/redis_acl.py). Each decoder's module is imported only when a stream of its
format is consumed: this module is light (the configuration reads it).

A new format: its decoder's module in sources/readers/, a record in FORMATS, and its name in
StreamConfig.format's Literal (tests/sources/streams/test_formats.py holds them together).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from exporter.redis.connection import RedisConnectionConfig
    from exporter.sources.readers.entries import EntryDecoder
    from exporter.sources.streams.config import EventsSourceConfig, StreamConfig

# How a stream's decoder is made: from its settings, the events settings and its connection.
Opener = Callable[["StreamConfig", "EventsSourceConfig", "RedisConnectionConfig"], "EntryDecoder"]


@dataclass(frozen=True)
class StreamFormat:
    name: str  # StreamConfig.format
    open: Opener
    # What its decoder sends besides the consumer's own commands, and the keys it reads
    # (ACL glob patterns), for redis-acl and check-config.
    acl_commands: tuple[str, ...] = ()
    acl_read_keys: tuple[str, ...] = ()


def _v1(
    stream: StreamConfig, settings: EventsSourceConfig, connection: RedisConnectionConfig
) -> EntryDecoder:
    from exporter.sources.readers.v1 import V1Decoder

    return V1Decoder(stream.system, settings.max_future)


def _runnerq(
    stream: StreamConfig, settings: EventsSourceConfig, connection: RedisConnectionConfig
) -> EntryDecoder:
    from exporter.sources.readers.runnerq import RunnerQStream

    return RunnerQStream(
        stream.system,
        stream.queue_name,
        settings.enrich_cache_size,
        settings.max_future,
        connection,
    )


FORMATS: dict[str, StreamFormat] = {
    record.name: record
    for record in (
        StreamFormat("v1", _v1),
        # Runner-Q's events name an activity whose activity:{id} hash holds its type and times
        StreamFormat("runnerq", _runnerq, acl_commands=("hmget",), acl_read_keys=("activity:*",)),
    )
}
