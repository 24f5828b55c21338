"""What a source kind needs of a Redis ACL, and how `check-config` tries a command under one.

Each source kind says what it needs (config/kinds.py: its `acl` hook) as a RedisNeeds;
commands/redis_acl.py puts them together into one ACL SETUSER line, docs/security.md explains
each command.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.redis.connection import RedisConnectionConfig


@dataclass
class RedisNeeds:
    """The least permissions one source kind needs, as ACL rules take them."""

    commands: list[str] = field(default_factory=list)
    read_keys: list[str] = field(default_factory=list)  # glob patterns, read-only: %R~
    stream_keys: list[str] = field(default_factory=list)  # read-write: ~ (consumer groups)
    channels: list[str] = field(default_factory=list)  # Pub/Sub patterns: &
    # (command, key glob) of commands that read a string's value (GET, MGET): each granted in
    # a selector on its own keys (redis_acl.value_reads)
    value_reads: list[tuple[str, str]] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)  # selectors of the writes it must make
    connections: list[RedisConnectionConfig] = field(default_factory=list)  # where it reads

    def add(self, other: RedisNeeds) -> None:
        self.commands += other.commands
        self.read_keys += other.read_keys
        self.stream_keys += other.stream_keys
        self.channels += other.channels
        self.value_reads += other.value_reads
        self.writes += other.writes
        self.connections += other.connections


# A harmless form of each command a native reader sends (ReaderConfig.ACL_COMMANDS and its
# value reads), which `check-config --connect` sends under the sidecar's own user to find what
# its ACL refuses: reads of at most one entry of a key the reader reads (which need not exist),
# CLIENT LIST of the Pub/Sub connections alone. {key}: such a key. MULTI and EXEC are tried
# around another of the reader's commands, PSUBSCRIBE on a connection of its own
# (sources/readers/probe.py).
COMMAND_TRIALS: dict[str, tuple[str, ...]] = {
    "scan": ("SCAN", "0", "MATCH", "{key}", "COUNT", "1"),
    "sscan": ("SSCAN", "{key}", "0", "COUNT", "1"),
    "zrange": ("ZRANGE", "{key}", "0", "0"),
    "lrange": ("LRANGE", "{key}", "0", "0"),
    "zrangebyscore": ("ZRANGEBYSCORE", "{key}", "+inf", "+inf", "LIMIT", "0", "0"),
    "zrevrangebyscore": ("ZREVRANGEBYSCORE", "{key}", "+inf", "+inf", "LIMIT", "0", "0"),
    "zcount": ("ZCOUNT", "{key}", "+inf", "+inf"),
    "zrank": ("ZRANK", "{key}", "-"),
    "zscore": ("ZSCORE", "{key}", "-"),
    "hmget": ("HMGET", "{key}", "-"),
    "hget": ("HGET", "{key}", "-"),
    "hscan": ("HSCAN", "{key}", "0", "COUNT", "1"),
    "xrevrange": ("XREVRANGE", "{key}", "+", "-", "COUNT", "1"),
    "xinfo|stream": ("XINFO", "STREAM", "{key}"),
    "xread": ("XREAD", "COUNT", "1", "STREAMS", "{key}", "$"),
    "pttl": ("PTTL", "{key}"),
    "time": ("TIME",),
    "get": ("GET", "{key}"),
    "mget": ("MGET", "{key}"),
    "client|list": ("CLIENT", "LIST", "TYPE", "pubsub"),
}


def key_of(glob: str) -> str | None:
    """A key the glob matches (its `*` and `?` filled in), None for a glob with a [class]."""
    key, escaped = [], False
    for char in glob:
        if escaped:
            key.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in "*?":
            key.append("queue-exporter-check" if char == "*" else "q")
        elif char == "[":
            return None
        else:
            key.append(char)
    return "".join(key)


def refusal_needs(command: str, error: Exception, key_glob: str, channel: str) -> str:
    """What the ACL (or the server) needs for a command `error` refused."""
    text = str(error).lower()  # Redis 7.0: "access a key"; 7.2: "access one of the keys"
    if "permissions to access" in text and "key" in text:
        return f"the ACL needs %R~{key_glob}"
    if "permissions to access" in text and "channel" in text:
        return f"the ACL needs &{channel}"
    if text.startswith("unknown command") or "unknown subcommand" in text:
        return f"the server needs the {command.upper().replace('|', ' ')} command (renamed?)"
    return f"the ACL needs +{command}"
