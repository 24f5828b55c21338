"""What a hook wrote to its events stream, read back with plain XRANGE, and its trace ids."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import redis


def events_of(client: redis.Redis, stream: str) -> list[dict[str, str]]:
    """Every entry of the stream, oldest first, as str fields."""
    return [
        {key.decode(): value.decode() for key, value in fields.items()}
        for _, fields in client.xrange(stream)
    ]


def by_job(events: list[dict[str, str]]) -> dict[str, list[dict[str, str]]]:
    """Each job's events, in the order they were written."""
    jobs: dict[str, list[dict[str, str]]] = defaultdict(list)
    for event in events:
        jobs[event["job_id"]].append(event)
    return dict(jobs)


def names(events: list[dict[str, str]]) -> list[str]:
    return [event["event"] for event in events]


def trace_id(event: dict[str, str]) -> str | None:
    """The trace id of an event's traceparent (00-<trace id>-<span id>-<flags>), None without."""
    traceparent = event.get("traceparent")
    return traceparent.split("-")[1] if traceparent else None


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]
