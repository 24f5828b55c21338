"""`queue-exporter emit`: send lifecycle events by hand, to test an installation end to end."""

from __future__ import annotations

import click
import redis

from exporter.core.logs import mask_connection_string
from exporter.lifecycle import wire
from exporter.lifecycle.producer import add_entries
from exporter.redis.connection import DEFAULT_REDIS_URL


@click.command("emit")
@click.option(
    "--redis-url",
    envvar="QUEUE_EXPORTER_REDIS_URL",
    default=DEFAULT_REDIS_URL,
    show_default=True,
    help="Redis URL of the stream.",
)
@click.option("--stream", required=True, help="Stream key to XADD to.")
@click.option(
    "--maxlen", type=int, default=1_000_000, show_default=True, help="XADD MAXLEN ~ bound."
)
@click.option("--repeat", type=int, default=1, show_default=True, help="Send the event N times.")
@click.argument("fields", nargs=-1, required=True)
def emit(redis_url: str, stream: str, maxlen: int, repeat: int, fields: tuple[str, ...]) -> None:
    """Send one v1 event given as FIELD=VALUE pairs (event=NAME required; v and ts are added).

    Example: queue-exporter emit --stream app:events event=completed queue=emails
    job_type=send duration=0.42
    """
    pairs: dict[str, str] = {}
    for item in fields:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"expected FIELD=VALUE, got {item!r}", param_hint="FIELDS")
        pairs[name] = value
    event = pairs.pop("event", None)
    if event is None:
        raise click.BadParameter("event=NAME is required", param_hint="FIELDS")
    ts = pairs.pop("ts", None)
    pairs.pop("v", None)
    try:
        entry = wire.encode(event, pairs, float(ts) if ts else None)
    except (wire.InvalidEvent, ValueError) as error:
        raise click.ClickException(f"invalid event: {error}") from None
    client = redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=5)
    try:
        pipe = client.pipeline(transaction=False)
        add_entries(pipe, stream, [entry] * repeat, maxlen)
        ids = pipe.execute()
    except redis.RedisError as error:
        raise click.ClickException(f"{mask_connection_string(redis_url)}: {error}") from None
    finally:
        client.close()
    for entry_id in ids:
        click.echo(entry_id.decode())
