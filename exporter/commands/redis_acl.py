"""The least Redis permissions a configuration needs, as the rules of an ACL SETUSER line.

Queue keys are granted read-only (`%R~`, Redis 7): the user cannot change a queue even
through a command it may run elsewhere. The event streams are read-write, because a consumer
group's reads, acks and claims write the group's state; `queue-exporter:*` is reserved
read-write for the sidecar's own keys (the leader-election lease). docs/security.md explains
each command; `queue-exporter redis-acl CONFIG` prints the line for a configuration.
"""

from __future__ import annotations

from exporter.config.kinds import KINDS
from exporter.config.settings import Config
from exporter.redis.acl import RedisNeeds
from exporter.sources.redis_keys.acl import SAMPLER_COMMANDS

# Health checks (redis-py PINGs idle connections) and a database number in the URL. Not
# granted: CLIENT SETINFO (Redis 7.2+) and CLIENT MAINT_NOTIFICATIONS (Redis 8), which redis-py
# sends on connect and whose refusal it ignores (docs/security.md).
CONNECTION_COMMANDS = ("ping", "select")
# The key sampler's reads (SAMPLER_COMMANDS, sources/redis_keys/acl.py) are granted whenever
# any key is read: the native readers' and Runner-Q's reads have always been granted with them.
# The leader-election lease (exporter/leader/election.py: two keys under OWN_KEYS): Lua scripts
# loaded with SCRIPT LOAD and run with EVALSHA call GET, SET, PEXPIRE, INCR and DEL. Those
# writes are granted in a selector (Redis 7) on OWN_KEYS alone, so that DEL can never reach a
# stream.
SCRIPT_COMMANDS = ("script|load", "evalsha")
LEASE_COMMANDS = ("get", "set", "pexpire", "incr", "del")
OWN_KEYS = "queue-exporter:*"
# On a Redis Cluster the lease's fencing counter is `{queue-exporter:leader}:fence`, in the
# lease's slot (leader.fence_key).
OWN_TAGGED_KEYS = "{queue-exporter:*"
# A Redis Cluster client: the slot map (redis-py reads CLUSTER SLOTS), the command table (its
# parser of key positions reads COMMAND once), READONLY on a replica's connections for
# read_from: replica, and ASKING before a key sampling read that follows an ASK reply.
CLUSTER_COMMANDS = ("cluster|slots", "command", "readonly", "asking")
# What the exporter asks a Sentinel (redis-py's discovery of the master and of its replicas),
# for an ACL user on the Sentinels themselves.
SENTINEL_COMMANDS = ("ping", "sentinel|masters", "sentinel|slaves", "sentinel|replicas")


def needs(config: Config) -> RedisNeeds:
    """What every source kind of the configuration needs (config/kinds.py), and where the
    lease is taken."""
    found = RedisNeeds()
    for kind in KINDS:
        found.add(kind.acl(config))
    if config.leader_election.enabled and config.leader_election.redis is not None:
        found.connections.append(config.leader_election.redis)
    return found


def acl_rules(config: Config) -> list[str]:
    """The rules after `ACL SETUSER <user> reset on ><password>`: commands, then keys."""
    found = needs(config)
    read_keys = list(dict.fromkeys(found.read_keys))
    commands = [*CONNECTION_COMMANDS, *SCRIPT_COMMANDS]
    if read_keys:
        commands += SAMPLER_COMMANDS
    commands += found.commands
    cluster = any(connection.is_cluster for connection in found.connections)
    if cluster:
        commands += CLUSTER_COMMANDS
    rules = ["-@all", *(f"+{command}" for command in dict.fromkeys(commands))]
    rules += [f"%R~{pattern}" for pattern in read_keys]
    rules += [f"~{key}" for key in found.stream_keys]
    rules += [f"&{channel}" for channel in found.channels]
    own = [f"~{OWN_KEYS}", *([f"~{OWN_TAGGED_KEYS}"] if cluster else [])]
    rules += own
    rules.append(f"({' '.join(own)} {' '.join(f'+{command}' for command in LEASE_COMMANDS)})")
    # GET and MGET, each in a selector on its own keys: the read patterns are broad (a
    # Sidekiq namespace's `*`), and GET granted with them would read any string, secrets too
    rules += [f"(%R~{pattern} +{command})" for command, pattern in dict.fromkeys(found.value_reads)]
    rules += found.writes
    return rules


def sentinel_setuser_line(
    config: Config, user: str = "queue-exporter", password: str = "<password>"
) -> str | None:
    """The ACL SETUSER line for the Sentinels (their sentinel_username), when any Redis of the
    configuration is found through Sentinel; else None."""
    if not any(connection.sentinel for connection in needs(config).connections):
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
