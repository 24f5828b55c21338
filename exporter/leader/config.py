"""The `leader_election` settings: a light model the configuration reads without redis-py."""

from __future__ import annotations

import os
import socket
import uuid

from pydantic import Field, model_validator

from exporter.core.models import StrictModel
from exporter.redis.connection import RedisConnectionConfig


class LeaderElectionConfig(StrictModel):
    enabled: bool = Field(
        False, description="sample on one elected replica at a time (events stay shared)"
    )
    key: str = Field("queue-exporter:leader", min_length=1, description="the lease's Redis key")
    lease_ttl: float = Field(
        15.0, gt=0, description="seconds a lease lasts without renewal (takeover time)"
    )
    renew_interval: float = Field(5.0, gt=0, description="seconds between renewals and attempts")
    identity: str | None = Field(
        None, description="this replica's name in the lease (default: $POD_NAME, $HOSTNAME, host)"
    )
    redis: RedisConnectionConfig | None = Field(
        None, description="where the lease lives (default: sources.redis's, else events')"
    )

    @model_validator(mode="after")
    def _renew_before_expiry(self) -> LeaderElectionConfig:
        if self.renew_interval >= self.lease_ttl:
            raise ValueError("renew_interval must be shorter than lease_ttl")
        return self

    def holder_name(self) -> str:
        """Identity plus a per-process nonce: two processes under one name never share a lease."""
        identity = (
            self.identity
            or os.environ.get("POD_NAME")
            or os.environ.get("HOSTNAME")
            or socket.gethostname()
        )
        return f"{identity}/{uuid.uuid4().hex[:8]}"
