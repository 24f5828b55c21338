"""What the event consumer needs of a Redis ACL: its streams read-write (a consumer group's
reads, acks and claims write the group's state), and what each stream's format reads
besides (formats.py). commands/redis_acl.py puts every kind's needs into one line.
"""

from __future__ import annotations

from exporter.redis.acl import RedisNeeds
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.redis_keys.groups import scan_glob
from exporter.sources.streams.config import EventsSourceConfig
from exporter.sources.streams.formats import FORMATS

# The event consumer (consumer.py): a MULTI of XACK, the group-position script run
# with EVAL (EXISTS, XINFO, XRANGE, XGROUP CREATE/SETID inside it) and XREADGROUP; XREAD
# BLOCK while idle; XAUTOCLAIM.
EVENTS_COMMANDS = (
    "multi",
    "exec",
    "eval",
    "exists",
    "xinfo|stream",
    "xinfo|groups",
    "xrange",
    "xgroup|create",
    "xgroup|setid",
    "xreadgroup",
    "xread",
    "xack",
    "xautoclaim",
)


def needs(events: EventsSourceConfig) -> RedisNeeds:
    if not events.streams:
        return RedisNeeds(connections=[events.redis] if events.redis is not None else [])
    formats = [FORMATS[name] for name in dict.fromkeys(s.format for s in events.streams)]
    own: list[RedisConnectionConfig] = [s.redis for s in events.streams if s.redis is not None]
    return RedisNeeds(
        commands=[*EVENTS_COMMANDS, *(c for f in formats for c in f.acl_commands)],
        read_keys=[key for f in formats for key in f.acl_read_keys],
        stream_keys=[scan_glob(stream.key) for stream in events.streams],
        connections=[*([events.redis] if events.redis is not None else []), *own],
    )
