"""The least Redis permissions a configuration needs, as the rules of an ACL SETUSER line.

Queue keys are granted read-only (`%R~`, Redis 7): the user cannot change a queue even
through a command it may run elsewhere. The event streams are read-write, because a consumer
group's reads, acks and claims write the group's state; `queue-exporter:*` is reserved
read-write for the sidecar's own keys (the leader-election lease). docs/security.md explains
each command; `queue-exporter redis-acl CONFIG` prints the line for a configuration.
"""

from __future__ import annotations

import itertools

from exporter.config.settings import Config
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers.config import ReaderConfig
from exporter.sources.redis_keys import values as key_values
from exporter.sources.redis_keys.groups import KeyGroup, fill, placeholders, scan_glob

# Health checks (redis-py PINGs idle connections) and a database number in the URL. Not
# granted: CLIENT SETINFO (Redis 7.2+) and CLIENT MAINT_NOTIFICATIONS (Redis 8), which redis-py
# sends on connect and whose refusal it ignores (docs/security.md).
CONNECTION_COMMANDS = ("ping", "select")
# The key sampler: SCAN for the keys of each group, then one read per key (sources/redis_keys/sampler.py);
# LRANGE, ZRANGE and HVALS read every item of a key split by a label inside its items; the
# reads of head items run inside one EVAL_RO per round (redis_pipeline.bounded_reads), which
# measures a head found too large with MEMORY USAGE instead of copying it again; GET reads the
# JSON string key a head item names (SAQ's jobs); SSCAN (ZSCAN: a sorted set) reads, a page at
# a time, the sets that name a group's queues (redis/members.py). Which keys built from a
# group's values exist (its keys matched) their depths tell, except for a stream, which may
# exist empty: EXISTS after an XLEN of 0 (MEMBER_OR_STREAM_EXISTS). EXISTS also tells which
# members of a group with a marker have their marker key (arq's running jobs), and which keys
# look like queues left out (look_alikes: arq's job keys). TYPE names the type of a key that
# answered WRONGTYPE, and tells how each key of a group of several types is read (Huey's list
# or zset).
SAMPLER_COMMANDS = (
    "scan",
    "type",
    "eval_ro",
    "memory|usage",
    "sscan",
    "zscan",
    "llen",
    "lindex",
    "lrange",
    "scard",
    "zcard",
    "zcount",
    "zrange",
    "zrangebyscore",
    "zrevrangebyscore",
    "hlen",
    "hget",
    "hvals",
    "xlen",
    "xrange",
    "xrevrange",
    "xinfo|groups",
)
# The event consumer (sources/streams/consumer.py): a MULTI of XACK, the group-position script run
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
MEMBER_OR_STREAM_EXISTS = "exists"
RUNNERQ_COMMANDS = ("hmget",)  # activity:{id} hashes, for the type and times of events
# The leader-election lease (exporter/leader/election.py: two keys under OWN_KEYS): Lua scripts loaded
# with SCRIPT LOAD and run with EVALSHA call GET, SET, PEXPIRE, INCR and DEL. Those writes are
# granted in a selector (Redis 7) on OWN_KEYS alone, so that DEL can never reach a stream.
SCRIPT_COMMANDS = ("script|load", "evalsha")
LEASE_COMMANDS = ("get", "set", "pexpire", "incr", "del")
OWN_KEYS = "queue-exporter:*"
# On a Redis Cluster the lease's fencing counter is `{queue-exporter:leader}:fence`, in the
# lease's slot (leader.fence_key).
OWN_TAGGED_KEYS = "{queue-exporter:*"
RUNNERQ_ACTIVITY_KEYS = "activity:*"


def read_key_patterns(config: Config) -> list[str]:
    """Glob patterns of every key the sampler and the Runner-Q decoder read."""
    patterns: list[str] = []
    groups = [group for redis in config.sources.redis_list() for group in redis.key_groups]
    for group in groups:
        patterns += _group_keys(group)
        patterns += [scan_glob(members.key) for members in group.values_from_set.values()]
        for keys in group.values_from_keys.values():
            patterns += [scan_glob(key) for key in ([keys] if isinstance(keys, str) else keys)]
        for oldest in (view.oldest for view in group.views()):
            if oldest is not None:
                named = (oldest.hash_key, oldest.string_key)
                patterns += [scan_glob(key) for key in named if key is not None]
        if group.marker is not None:
            patterns.append(scan_glob(group.marker.key))
        if group.look_alikes is not None:  # every key of the pattern is looked at
            patterns += [scan_glob(group.pattern), scan_glob(group.look_alikes.member_key)]
    events = config.sources.events
    if events is not None and any(stream.format == "runnerq" for stream in events.streams):
        patterns.append(RUNNERQ_ACTIVITY_KEYS)
    for reader in _native_readers(config):
        patterns += reader.acl_read_keys()
    return list(dict.fromkeys(patterns))


def _native_readers(config: Config) -> list[ReaderConfig]:
    native = config.sources.native
    return native.enabled() if native is not None else []


def _group_keys(group: KeyGroup) -> list[str]:
    """Each key when a group lists its values (Celery's bare queue names: its queues param
    naming queues, no glob, no '*'), else its glob (found queues may have any name)."""
    names = placeholders(group.pattern)
    listed = {name: _listed(group, name) for name in names}
    if not names or any(values is None for values in listed.values()):
        return [scan_glob(group.pattern)]
    combinations = itertools.product(*(listed[name] or [] for name in names))
    return [scan_glob(fill(group.pattern, dict(zip(names, c, strict=True)))) for c in combinations]


def _listed(group: KeyGroup, name: str) -> list[str] | None:
    """Every value the placeholder can take, when the group names them all; else None."""
    selection = group.select.get(name)
    if selection is not None and selection == key_values.names(selection):
        return sorted({*group.values.get(name, []), *selection})  # found ones are selected too
    found_elsewhere = name in group.values_from_set or name in group.values_from_keys
    return None if found_elsewhere or name not in group.values else group.values[name]


def stream_keys(config: Config) -> list[str]:
    events = config.sources.events
    return [scan_glob(stream.key) for stream in events.streams] if events is not None else []


# A Redis Cluster client: the slot map (redis-py reads CLUSTER SLOTS), the command table (its
# parser of key positions reads COMMAND once), READONLY on a replica's connections for
# read_from: replica, and ASKING before a key sampling read that follows an ASK reply.
CLUSTER_COMMANDS = ("cluster|slots", "command", "readonly", "asking")
# What the exporter asks a Sentinel (redis-py's discovery of the master and of its replicas),
# for an ACL user on the Sentinels themselves.
SENTINEL_COMMANDS = ("ping", "sentinel|masters", "sentinel|slaves", "sentinel|replicas")


def _redis_connections(config: Config) -> list[RedisConnectionConfig]:
    connections: list[RedisConnectionConfig] = list(config.sources.redis_list())
    events = config.sources.events
    if events is not None:
        connections += [c for c in (events.redis, *(s.redis for s in events.streams)) if c]
    connections += [reader.redis for reader in _native_readers(config) if reader.redis]
    if config.leader_election.enabled and config.leader_election.redis is not None:
        connections.append(config.leader_election.redis)
    return connections


def acl_rules(config: Config) -> list[str]:
    """The rules after `ACL SETUSER <user> reset on ><password>`: commands, then keys."""
    commands = [*CONNECTION_COMMANDS, *SCRIPT_COMMANDS]
    if read_key_patterns(config):
        commands += SAMPLER_COMMANDS
    if any(_sends_exists(group) for group in _key_groups(config)):
        commands.append(MEMBER_OR_STREAM_EXISTS)
    if stream_keys(config):
        commands += EVENTS_COMMANDS
        if RUNNERQ_ACTIVITY_KEYS in read_key_patterns(config):
            commands += RUNNERQ_COMMANDS
    for reader in _native_readers(config):
        commands += reader.ACL_COMMANDS
    cluster = any(connection.is_cluster for connection in _redis_connections(config))
    if cluster:
        commands += CLUSTER_COMMANDS
    rules = ["-@all", *(f"+{command}" for command in dict.fromkeys(commands))]
    rules += [f"%R~{pattern}" for pattern in read_key_patterns(config)]
    rules += [f"~{key}" for key in stream_keys(config)]
    default_connection = config.sources.default_redis() or RedisConnectionConfig()
    for reader in _native_readers(config):
        rules += [
            f"&{channel}" for channel in reader.acl_channels(reader.redis or default_connection)
        ]
    own = [f"~{OWN_KEYS}", *([f"~{OWN_TAGGED_KEYS}"] if cluster else [])]
    rules += own
    rules.append(f"({' '.join(own)} {' '.join(f'+{command}' for command in LEASE_COMMANDS)})")
    rules += [f"(%R~{pattern} +{command})" for command, pattern in value_reads(config)]
    for reader in _native_readers(config):
        rules += reader.acl_writes(reader.redis or default_connection)
    return rules


def _key_groups(config: Config) -> list[KeyGroup]:
    return [group for redis in config.sources.redis_list() for group in redis.key_groups]


def _sends_exists(group: KeyGroup) -> bool:
    """A group whose members' marker keys are checked (key_commands.Cycle._marked), or its
    look-alikes' member keys (sources/redis_keys/look_alikes.py), or whose
    keys are streams built from known values and read by XLEN (no consumer group): an XLEN of
    0 is followed by EXISTS (key_commands.Cycle._counts)."""
    built_stream = group.enumerated and group.type == "stream" and not group.stream_group
    return built_stream or group.marker is not None or group.look_alikes is not None


def value_reads(config: Config) -> list[tuple[str, str]]:
    """(command, key glob) of every command that reads a string's value (GET, MGET), each
    granted in a selector on its own keys: the read patterns are broad (a Sidekiq namespace's
    `*`), and GET granted with them would read any string, secrets included."""
    reads: list[tuple[str, str]] = []
    groups = [group for redis in config.sources.redis_list() for group in redis.key_groups]
    for oldest in (view.oldest for group in groups for view in group.views()):
        if oldest is not None and oldest.string_key is not None:
            reads.append(("get", scan_glob(oldest.string_key)))
    for reader in _native_readers(config):
        reads += reader.acl_value_reads()
    return list(dict.fromkeys(reads))


def sentinel_setuser_line(
    config: Config, user: str = "queue-exporter", password: str = "<password>"
) -> str | None:
    """The ACL SETUSER line for the Sentinels (their sentinel_username), when any Redis of the
    configuration is found through Sentinel; else None."""
    if not any(connection.sentinel for connection in _redis_connections(config)):
        return None
    rules = ["-@all", *(f"+{command}" for command in SENTINEL_COMMANDS)]
    return " ".join(["ACL", "SETUSER", user, "reset", "on", f">{password}", *rules])


def setuser_line(config: Config, user: str = "queue-exporter", password: str = "<password>") -> str:
    """The whole command, quoted for redis-cli (Celery's keys hold control bytes)."""
    words = ["ACL", "SETUSER", user, "reset", "on", f">{password}", *acl_rules(config)]
    return " ".join(_quoted(word) for word in words)


def _quoted(word: str) -> str:
    if word and all(c.isprintable() and not c.isspace() and c not in "\"'\\" for c in word):
        return word
    escaped = "".join(
        f"\\{c}" if c in '"\\' else c if c.isprintable() else f"\\x{ord(c):02x}" for c in word
    )
    return f'"{escaped}"'


# A harmless form of each command a native reader sends (ReaderConfig.ACL_COMMANDS and its
# value reads), which `check-config --connect` sends under the sidecar's own user to find what
# its ACL refuses: reads of at most one entry of a key the reader reads (which need not exist),
# CLIENT LIST of the Pub/Sub connections alone. {key}: such a key. MULTI and EXEC are tried
# around another of the reader's commands, PSUBSCRIBE on a connection of its own (commands/check_config.py).
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
