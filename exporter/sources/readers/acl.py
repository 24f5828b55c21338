"""What the native readers need of a Redis ACL, as each reader's settings say it
(ReaderConfig.ACL_COMMANDS and its acl_* methods, readers/config.py).
commands/redis_acl.py puts every source kind's needs into one ACL SETUSER line.
"""

from __future__ import annotations

from exporter.redis.acl import RedisNeeds
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers.config import ReaderConfig


def needs(readers: list[ReaderConfig], default: RedisConnectionConfig) -> RedisNeeds:
    """The enabled readers' needs; `default` is the Redis of a reader that names none."""
    found = RedisNeeds()
    for reader in readers:
        connection = reader.redis or default
        found.add(
            RedisNeeds(
                commands=list(reader.ACL_COMMANDS),
                read_keys=reader.acl_read_keys(),
                channels=reader.acl_channels(connection),
                value_reads=reader.acl_value_reads(),
                writes=reader.acl_writes(connection),
                connections=[reader.redis] if reader.redis is not None else [],
            )
        )
    return found
