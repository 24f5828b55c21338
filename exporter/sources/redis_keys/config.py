"""The `sources.redis` settings: a light model the configuration reads without redis-py."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.redis_keys.groups import AnyKeyGroup


class RedisSourceConfig(RedisConnectionConfig):
    name: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="this Redis's name (required when sources.redis is a list): its "
        "redis_source label value, and its source name redis:<name>",
    )
    presets: list[str | dict[str, Any]] = Field(
        default_factory=list,
        description="list form: presets whose key groups only this Redis samples (names, or "
        "{name, params}); the top-level presets apply to every Redis",
    )
    sample_interval: float | None = Field(
        None, gt=0, description="seconds between key samples (default: the global interval)"
    )
    scan_count: int = Field(1000, ge=10, description="SCAN COUNT hint")
    pipeline_size: int = Field(1000, ge=1, description="commands per pipelined round trip")
    max_item_bytes: int = Field(
        256 * 1024,
        ge=64,
        description="largest item read (a head item, the hash field it names, a stream entry, "
        "an item of a key split by a label); a larger one never leaves Redis: its queue keeps "
        "the depth, skips the age and counts reason item_too_large (split: under __unread__)",
    )
    max_keys: int = Field(
        100_000,
        ge=1,
        description="keys one cycle reads, over every key group (scanned, or built from "
        "discovered queues; each group sure of an even share, what a group leaves unused lent "
        "to the others): the rest are not read, counted once a cycle per group as reason "
        "too_many_keys and named; about 1 KiB of memory a key (docs/security.md)",
    )
    cycle_timeout: float | None = Field(
        None,
        gt=0,
        description="seconds a whole sampling cycle may take before it is interrupted and the "
        "source marked down (default: the sample interval)",
    )
    read_from: Literal["primary", "replica"] = Field(
        "primary",
        description="replica: SCAN and every read go to a replica where one is available "
        "(Sentinel: one of the master's replicas; Cluster: each slot's replica), sparing the "
        "primary, at the cost of replication lag in the values; a redis:// URL is the server it "
        "names. Event streams are always consumed on the primary",
    )
    key_groups: list[AnyKeyGroup] = Field(default_factory=list)
