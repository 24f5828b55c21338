"""`check-config --connect` for event streams: each stream's length, consumer groups and lag.

A Redis that cannot be reached is a failure, named once (not tried again by later kinds).
"""

from __future__ import annotations

import redis

from exporter.core.printable import printable
from exporter.redis.connection import RedisConnectionConfig, redis_error_reason
from exporter.sources.probe import Echo, Findings, ProbeContext, first_line, text
from exporter.sources.streams.config import StreamConfig


def probe(
    shared: RedisConnectionConfig, streams: list[StreamConfig], context: ProbeContext
) -> Findings:
    """The streams on the `shared` connection (events.redis, else sources.redis's), then each
    stream on a Redis of its own."""
    findings = Findings()
    echo, unreachable = context.echo, context.unreachable
    with_shared = [stream for stream in streams if stream.redis is None]
    if with_shared:
        findings.add(_streams_at(shared, with_shared, echo, unreachable))
    for stream in streams:
        if stream.redis is not None:  # a stream on a Redis of its own
            findings.add(_streams_at(stream.redis, [stream], echo, unreachable))
    return findings


def _streams_at(
    connection: RedisConnectionConfig,
    streams: list[StreamConfig],
    echo: Echo,
    unreachable: set[str],
) -> Findings:
    target = connection.masked_url()
    if target in unreachable:  # named FAILED above
        return Findings()
    client = connection.connect()
    try:
        lines = [_stream_line(client, stream.key, stream.group) for stream in streams]
    except redis.RedisError as error:
        echo(f"events at {target}: FAILED ({redis_error_reason(error)}: {first_line(error)})")
        return Findings(failures=[f"redis at {target}"], unreachable={target})
    finally:
        client.close()
    echo(f"events streams at {target}:")
    for line in lines:
        echo(f"  {line}")
    return Findings()


def _stream_line(client: redis.Redis, key: str, wanted: str) -> str:
    shown = printable(key)
    if not client.exists(key):
        return f"stream {shown}: does not exist yet (the group is made when it appears)"
    length = client.xlen(key)
    groups = client.xinfo_groups(key)
    names = [printable(text(group["name"])) for group in groups]
    ours = next((group for group in groups if text(group["name"]) == wanted), None)
    if ours is None:
        state = f"group {printable(wanted)} not created yet (made on first read)"
    else:
        state = f"group {printable(wanted)}: lag {ours.get('lag')}, pending {ours.get('pending')}"
    return f"stream {shown}: length {length}, groups {', '.join(names) or 'none'}; {state}"
