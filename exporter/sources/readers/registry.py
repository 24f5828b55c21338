"""The native readers, registered once: each one's section under `sources.native`, its
settings, how its reader is made, whether its system runs on a Redis Cluster, and what
check-config watches of it.

Everything that treats readers alike reads this table: the build (readers/__init__.py), the
configuration's checks (config/settings.py), check-config and redis-acl (through the
settings' own ACL methods, readers/config.py). A reader's module is imported only when the
reader is enabled: this module is light (the configuration reads it).

A new reader: its module here, its settings (a ReaderConfig and a NativeConfig field in
config.py) and a record in READERS; tests/sources/test_kinds.py holds them together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from exporter.sources.readers.config import (
    BullmqReaderConfig,
    BullReaderConfig,
    CeleryReaderConfig,
    ReaderConfig,
    ResqueReaderConfig,
    RqReaderConfig,
    SaqReaderConfig,
    SidekiqReaderConfig,
)

if TYPE_CHECKING:
    from exporter.redis.connection import RedisConnectionConfig
    from exporter.sources.probe import Findings, ProbeContext
    from exporter.sources.readers.framework import Reader

_Settings = TypeVar("_Settings", bound=ReaderConfig)


@dataclass(frozen=True)
class ReaderKind(Generic[_Settings]):
    name: str  # its section: sources.native.<name>
    config_type: type[_Settings]
    # The reader, from its settings, its Redis and its interval (seconds)
    open: Callable[[_Settings, RedisConnectionConfig, float], Reader]
    # False for a system whose own commands span keys of many slots: its reader is refused a
    # Redis Cluster by the configuration, naming the setting (config/settings.py)
    on_a_cluster: bool = True
    # What `check-config --connect` reads besides its records and commands (readers/probe.py),
    # for a reader whose record says more when run a while: Celery's workers
    watch: Callable[[_Settings, RedisConnectionConfig, ProbeContext], Findings] | None = None


def _rq(settings: RqReaderConfig, connection: RedisConnectionConfig, interval: float) -> Reader:
    from exporter.sources.readers.rq import RqReader

    return RqReader(settings, connection)


def _bullmq(
    settings: BullmqReaderConfig, connection: RedisConnectionConfig, interval: float
) -> Reader:
    from exporter.sources.readers.bullmq import BullmqReader

    return BullmqReader(settings, connection)


def _celery(
    settings: CeleryReaderConfig, connection: RedisConnectionConfig, interval: float
) -> Reader:
    from exporter.sources.readers.celery import CeleryReader

    return CeleryReader(settings, connection, interval)


def _watch_celery(
    settings: CeleryReaderConfig, connection: RedisConnectionConfig, context: ProbeContext
) -> Findings:
    from exporter.sources.readers.celery_probe import watch

    return watch(settings, connection, context)


def _sidekiq(
    settings: SidekiqReaderConfig, connection: RedisConnectionConfig, interval: float
) -> Reader:
    from exporter.sources.readers.sidekiq import SidekiqReader

    return SidekiqReader(settings, connection)


def _saq(settings: SaqReaderConfig, connection: RedisConnectionConfig, interval: float) -> Reader:
    from exporter.sources.readers.saq import SaqReader

    return SaqReader(settings, connection)


def _bull(settings: BullReaderConfig, connection: RedisConnectionConfig, interval: float) -> Reader:
    from exporter.sources.readers.bull import BullReader

    return BullReader(settings, connection)


def _resque(
    settings: ResqueReaderConfig, connection: RedisConnectionConfig, interval: float
) -> Reader:
    from exporter.sources.readers.resque import ResqueReader

    return ResqueReader(settings, connection)


# RQ (rq/rq#1048), kombu's Redis transport (celery/kombu#2204, not merged) and Sidekiq (its
# wiki, "Using Redis") do not run on a Redis Cluster.
READERS: dict[str, ReaderKind[Any]] = {
    kind.name: kind
    for kind in (
        ReaderKind("rq", RqReaderConfig, _rq, on_a_cluster=False),
        ReaderKind("bullmq", BullmqReaderConfig, _bullmq),
        ReaderKind("celery", CeleryReaderConfig, _celery, on_a_cluster=False, watch=_watch_celery),
        ReaderKind("sidekiq", SidekiqReaderConfig, _sidekiq, on_a_cluster=False),
        ReaderKind("saq", SaqReaderConfig, _saq),
        ReaderKind("bull", BullReaderConfig, _bull),
        # its counters are read in one MGET (keys of two slots on a Redis Cluster)
        ReaderKind("resque", ResqueReaderConfig, _resque, on_a_cluster=False),
    )
}
