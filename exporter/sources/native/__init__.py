"""Native signals: what a queue system records itself, read into the lifecycle families.

`sources.native` holds one typed section per system that has a reader; a preset turns its
reader on (`sources.native.rq: {enabled: true}`), a preset param or the operator's own
section turns it off. framework.py explains how a reader runs and feeds the metrics;
docs/presets.md says how to add one.
"""

from __future__ import annotations

import functools

from exporter.events.metrics import EventMetrics
from exporter.models import StrictModel
from exporter.redis_connection import RedisConnectionConfig
from exporter.sources.native.bullmq import BullmqReader, BullmqReaderConfig
from exporter.sources.native.celery import CeleryReader, CeleryReaderConfig
from exporter.sources.native.framework import NativeSource, Reader, ReaderConfig
from exporter.sources.native.rq import RqReader, RqReaderConfig
from exporter.sources.native.sidekiq import SidekiqReader, SidekiqReaderConfig


class NativeConfig(StrictModel):
    rq: RqReaderConfig | None = None
    bullmq: BullmqReaderConfig | None = None
    celery: CeleryReaderConfig | None = None
    sidekiq: SidekiqReaderConfig | None = None

    def enabled(self) -> list[ReaderConfig]:
        return list(self.enabled_by_name().values())

    def enabled_by_name(self) -> dict[str, ReaderConfig]:
        """The readers turned on, by their section name."""
        sections = {name: getattr(self, name) for name in type(self).model_fields}
        return {
            name: reader
            for name, reader in sections.items()
            if isinstance(reader, ReaderConfig) and reader.enabled
        }


def build_sources(
    config: NativeConfig | None,
    default_connection: RedisConnectionConfig | None,
    metrics: EventMetrics,
    default_interval: float,
) -> list[NativeSource]:
    if config is None:
        return []
    sources = []
    for settings in config.enabled():
        connection = settings.redis or default_connection or RedisConnectionConfig()
        interval = settings.interval or default_interval
        make_reader = functools.partial(_reader, settings, connection, interval)
        sources.append(NativeSource(make_reader, interval, metrics))
    return sources


def _reader(settings: ReaderConfig, connection: RedisConnectionConfig, interval: float) -> Reader:
    if isinstance(settings, RqReaderConfig):
        return RqReader(settings, connection)
    if isinstance(settings, BullmqReaderConfig):
        return BullmqReader(settings, connection)
    if isinstance(settings, CeleryReaderConfig):
        return CeleryReader(settings, connection, interval)
    if isinstance(settings, SidekiqReaderConfig):
        return SidekiqReader(settings, connection)
    raise TypeError(f"no reader for {type(settings).__name__}")
