"""Native signals: what a queue system records itself, read into the lifecycle families.

`sources.native` holds one typed section per system that has a reader; a preset turns its
reader on (`sources.native.rq: {enabled: true}`), a preset param or the operator's own
section turns it off. framework.py explains how a reader runs and feeds the metrics;
docs/presets.md says how to add one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers.config import (
    BullmqReaderConfig,
    BullReaderConfig,
    CeleryReaderConfig,
    NativeConfig,
    ReaderConfig,
    RqReaderConfig,
    SaqReaderConfig,
    SidekiqReaderConfig,
)

if TYPE_CHECKING:
    from exporter.lifecycle.metrics import EventMetrics
    from exporter.sources.readers.framework import NativeSource, Reader

__all__ = ["NativeConfig", "build_sources"]


def build_sources(
    config: NativeConfig | None,
    default_connection: RedisConnectionConfig | None,
    metrics: EventMetrics,
    default_interval: float,
    redis_source: Callable[[RedisConnectionConfig | None], str | None] = lambda _: None,
    term: Callable[[], int | None] | None = None,
) -> list[NativeSource]:
    """A source per enabled reader; `redis_source` names a reader's Redis (its own connection,
    or None: the default one) in the redis_source label, or None with one Redis; `term` is the
    leader lease's fencing token (Leadership.token), None without leader election."""
    if config is None:
        return []
    from exporter.sources.readers.framework import NativeSource

    sources = []
    for settings in config.enabled():
        connection = settings.redis or default_connection or RedisConnectionConfig()
        interval = settings.interval or default_interval
        make_reader = functools.partial(_reader, settings, connection, interval)
        label = redis_source(settings.redis)
        sources.append(NativeSource(make_reader, interval, metrics, label, term))
    return sources


def _reader(settings: ReaderConfig, connection: RedisConnectionConfig, interval: float) -> Reader:
    """The enabled reader's module alone is imported: a configuration loads what it uses."""
    if isinstance(settings, RqReaderConfig):
        from exporter.sources.readers.rq import RqReader

        return RqReader(settings, connection)
    if isinstance(settings, BullmqReaderConfig):
        from exporter.sources.readers.bullmq import BullmqReader

        return BullmqReader(settings, connection)
    if isinstance(settings, CeleryReaderConfig):
        from exporter.sources.readers.celery import CeleryReader

        return CeleryReader(settings, connection, interval)
    if isinstance(settings, SidekiqReaderConfig):
        from exporter.sources.readers.sidekiq import SidekiqReader

        return SidekiqReader(settings, connection)
    if isinstance(settings, SaqReaderConfig):
        from exporter.sources.readers.saq import SaqReader

        return SaqReader(settings, connection)
    if isinstance(settings, BullReaderConfig):
        from exporter.sources.readers.bull import BullReader

        return BullReader(settings, connection)
    raise TypeError(f"no reader for {type(settings).__name__}")
