"""Configuration of the event consumer: which streams, how to read them, histogram buckets."""

from __future__ import annotations

import itertools
import os
import socket
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from exporter.core.models import StrictModel
from exporter.output.catalog import BY_NAME
from exporter.redis.connection import RedisConnectionConfig

RUNNERQ_SUFFIX = ":events_stream"


# A stream consumer's source name (source_up, source errors, the status page, its log lines)
# is this prefix and its stream_name.
CONSUMER_PREFIX = "events:"


def stream_name(key: str, redis_source: str | None) -> str:
    """How a stream is named to people: its key, with several Redis sources <key>@<redis_source>,
    since two servers may each hold a stream of that key."""
    return key if redis_source is None else f"{key}@{redis_source}"


class StreamConfig(StrictModel):
    key: str = Field(
        min_length=1,
        description="the stream's Redis key; listed once per Redis (with several Redis sources "
        "one key may be listed for each server: its series carry redis_source, its source name "
        "is events:<key>@<redis_source>)",
    )
    system: str = Field(
        "custom", min_length=1, description="system label of events that carry none"
    )
    format: Literal["v1", "runnerq"] = Field(
        "v1", description="v1 (docs/events.md) or runnerq (its native {q}:events_stream)"
    )
    queue: str | None = Field(
        None, description="runnerq: the queue name (default: the key without :events_stream)"
    )
    group: str = Field("queue-exporter", min_length=1, description="consumer group")
    start: Literal["$", "0"] = Field(
        "$", description="where a new group starts: $ (new events only) or 0 (all retained)"
    )
    redis: RedisConnectionConfig | None = Field(
        None,
        description="where this stream lives, when not with the others (default: events.redis)",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_key(cls, value: Any) -> Any:
        # `--events-stream KEY` and `streams: [KEY]` are the short form of {key: KEY}.
        return {"key": value} if isinstance(value, str) else value

    @property
    def queue_name(self) -> str:
        if self.queue is not None:
            return self.queue
        return self.key.removesuffix(RUNNERQ_SUFFIX)


class EventsSourceConfig(StrictModel):
    streams: list[StreamConfig] = Field(default_factory=list)
    redis: RedisConnectionConfig | None = Field(
        None, description="where the streams live (default: sources.redis's connection)"
    )
    consumer: str | None = Field(
        None, description="consumer name in the group (default: $POD_NAME, $HOSTNAME, host)"
    )
    batch_size: int = Field(1000, ge=1, le=100_000, description="entries per XREADGROUP")
    block_ms: int = Field(1000, ge=10, description="how long an idle read waits for entries")
    claim_idle: float = Field(
        60.0, gt=0, description="seconds an entry stays pending before another consumer claims it"
    )
    stats_interval: float = Field(
        15.0, gt=0, description="seconds between samples of group lag and pending"
    )
    worker_timeout: float = Field(
        60.0, gt=0, description="seconds without a heartbeat after which a worker is gone"
    )
    max_workers: int = Field(10_000, ge=1, description="workers tracked per stream at most")
    max_future: float = Field(
        300.0, ge=0, description="seconds an event time may lie ahead of this clock"
    )
    enrich_cache_size: int = Field(
        10_000, ge=0, description="runnerq: activity types and priorities remembered"
    )
    histogram_buckets: dict[str, list[float]] = Field(
        default_factory=dict, description="bucket bounds per event histogram (name: [bounds])"
    )

    @field_validator("histogram_buckets")
    @classmethod
    def _known_histograms(cls, value: dict[str, list[float]]) -> dict[str, list[float]]:
        for name, bounds in value.items():
            spec = BY_NAME.get(name)
            if spec is None or spec.kind != "histogram" or spec.origin != "events":
                raise ValueError(f"{name!r} is not an event histogram")
            if not bounds or any(b >= a for b, a in itertools.pairwise(bounds)):
                raise ValueError(f"{name}: bounds must be a non-empty increasing list")
        return value

    def consumer_name(self) -> str:
        return (
            self.consumer
            or os.environ.get("POD_NAME")
            or os.environ.get("HOSTNAME")
            or socket.gethostname()
        )

    def buckets(self) -> dict[str, tuple[float, ...]]:
        """Every event histogram's bounds: configured, else the catalog's default."""
        return {
            spec.name: tuple(self.histogram_buckets.get(spec.name, spec.buckets))
            for spec in BY_NAME.values()
            if spec.kind == "histogram" and spec.origin == "events"
        }
