"""What the hook tests share: the stream as written (plain XRANGE, str fields) and as the
exporter's consumer parses it, trace ids, a driver's JSON lines, an exporter reading the
stream (an events source), and an events Redis that hangs."""

from __future__ import annotations

import json
import os
import signal
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import redis

from exporter.lifecycle import wire
from exporter.runtime.app import App
from tests.conftest import wait_for
from tests.private_redis import PrivateRedis

_E = TypeVar("_E")


def events_by_job(client: redis.Redis, stream: str) -> dict[str, list[wire.Event]]:
    """Every event of the stream, parsed as the consumer parses them (none refused, no field
    dropped), by job id, each job's in the order they happened (in_lifecycle_order)."""
    found: dict[str, list[wire.Event]] = defaultdict(list)
    for _, fields in client.xrange(stream):
        event = wire.parse(fields)
        assert event.dropped_field is None, (event, fields)
        found[event.job_id].append(event)
    return {job: in_lifecycle_order(events, lambda e: e.ts) for job, events in found.items()}


def in_lifecycle_order(events: list[_E], ts: Callable[[_E], float]) -> list[_E]:
    """A job's events by their ts, those of equal ts in stream order. One process writes its
    events in the order they happen, but the sender's (enqueued) and the worker's reach the
    stream in either order: a worker may send `started` before the sender has flushed."""
    return sorted(events, key=ts)


def epoch(moment: datetime) -> float:
    """A library's time (naive ones are UTC, as RQ's and Celery's are) in seconds."""
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


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


def events_of(client: redis.Redis, stream: str) -> list[dict[str, str]]:
    """Every entry of the stream, oldest first, as str fields; each one the consumer parses
    whole (none refused, no field dropped), as events_by_job's."""
    entries = [fields for _, fields in client.xrange(stream)]
    for fields in entries:
        assert wire.parse(fields).dropped_field is None, fields
    return [{key.decode(): value.decode() for key, value in fields.items()} for fields in entries]


def by_job(events: list[dict[str, str]]) -> dict[str, list[dict[str, str]]]:
    """Each job's events, in the order they happened (in_lifecycle_order)."""
    jobs: dict[str, list[dict[str, str]]] = defaultdict(list)
    for event in events:
        jobs[event["job_id"]].append(event)
    return {job: in_lifecycle_order(found, lambda e: float(e["ts"])) for job, found in jobs.items()}


def event_names(events: list[dict[str, str]]) -> list[str]:
    return [event["event"] for event in events]


def trace_id(event: dict[str, str]) -> str | None:
    """The trace id of an event's traceparent (00-<trace id>-<span id>-<flags>), None without."""
    traceparent = event.get("traceparent")
    return traceparent.split("-")[1] if traceparent else None


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@contextmanager
def hung_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A private Redis that takes connections and answers nothing (SIGSTOP): a blocking call to
    it waits its whole deadline. Killed at the end if it was not before (SIGKILL reaches a
    stopped process)."""
    server = PrivateRedis(tmp_path).start()
    try:
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGSTOP)
        yield server
    finally:
        server.stop()
