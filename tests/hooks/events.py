"""What the hook tests share: the stream as the exporter's consumer would parse it, and an
exporter reading it (an events source)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import redis

from exporter.lifecycle import wire
from exporter.runtime.app import App
from tests.conftest import wait_for


def events_by_job(client: redis.Redis, stream: str) -> dict[str, list[wire.Event]]:
    """Every event of the stream, parsed as the consumer parses them (none refused, no field
    dropped), by job id, in stream order."""
    found: dict[str, list[wire.Event]] = defaultdict(list)
    for _, fields in client.xrange(stream):
        event = wire.parse(fields)
        assert event.dropped_field is None, (event, fields)
        found[event.job_id].append(event)
    return dict(found)


def names(events: list[wire.Event]) -> list[str]:
    return [event.name for event in events]


def exporter_reading(run_exporter: Callable[..., App], redis_url: str, stream: str, system: str):
    """An exporter whose events source reads `stream`, once its consumer group exists (a group
    created at $ counts only what follows)."""
    config = {
        "sources": {
            "redis": {"url": redis_url},
            "events": {
                "streams": [{"key": stream, "system": system}],
                "block_ms": 50,
                "stats_interval": 0.2,
            },
        }
    }
    app = run_exporter(config)
    wait_for(lambda: app.health.snapshot()[f"events:{stream}"].up)
    return app
