"""Native signals: what a queue system records itself, read into the lifecycle families.

`sources.native` holds one typed section per system that has a reader; a preset turns its
reader on (`sources.native.rq: {enabled: true}`), a preset param or the operator's own
section turns it off. framework.py explains how a reader runs and feeds the metrics;
registry.py lists the readers (and says how to add one).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers.config import NativeConfig
from exporter.sources.readers.registry import READERS

if TYPE_CHECKING:
    from exporter.lifecycle.metrics import EventMetrics
    from exporter.sources.readers.framework import NativeSource

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
    leader lease's fencing token (Leadership.token), None without leader election. The
    enabled reader's module alone is imported (registry.py): a configuration loads what it
    uses."""
    if config is None:
        return []
    from exporter.sources.readers.framework import NativeSource

    sources = []
    for name, settings in config.enabled_by_name().items():
        connection = settings.redis or default_connection or RedisConnectionConfig()
        interval = settings.interval or default_interval
        make_reader = functools.partial(READERS[name].open, settings, connection, interval)
        label = redis_source(settings.redis)
        sources.append(NativeSource(make_reader, interval, metrics, label, term))
    return sources
