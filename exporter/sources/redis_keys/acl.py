"""What the key sampler needs of a Redis ACL: its reads of each key group's keys (read-only),
EXISTS where a group checks keys built from its values, GET in a selector of its own keys.

commands/redis_acl.py puts every source kind's needs into one ACL SETUSER line.
"""

from __future__ import annotations

import itertools

from exporter.redis.acl import RedisNeeds
from exporter.sources.redis_keys import values as key_values
from exporter.sources.redis_keys.config import RedisSourceConfig
from exporter.sources.redis_keys.groups import (
    KeyGroup,
    OrderedGroup,
    StreamGroup,
    fill,
    oldest_of,
    placeholders,
    scan_glob,
)

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

MEMBER_OR_STREAM_EXISTS = "exists"


def needs(sources: list[RedisSourceConfig]) -> RedisNeeds:
    """The keys every group reads (its keys, the sets and keys that name its values, the hashes
    and strings its oldest items are named in, its markers and look-alikes), EXISTS where a
    group sends it, and GET of the strings a group's oldest item is named in."""
    groups = [group for source in sources for group in source.key_groups]
    patterns: list[str] = []
    for group in groups:
        patterns += _group_keys(group)
        patterns += [scan_glob(members.key) for members in group.values_from_set.values()]
        for keys in group.values_from_keys.values():
            patterns += [scan_glob(key) for key in ([keys] if isinstance(keys, str) else keys)]
        for view in group.views():
            oldest = oldest_of(view)
            if oldest is not None:
                named = (oldest.hash_key, oldest.string_key)
                patterns += [scan_glob(key) for key in named if key is not None]
            if not isinstance(view, OrderedGroup):
                continue
            if view.marker is not None:
                patterns.append(scan_glob(view.marker.key))
            if view.look_alikes is not None:  # every key of the pattern is looked at
                patterns += [scan_glob(view.pattern), scan_glob(view.look_alikes.member_key)]
    value_reads = [
        ("get", scan_glob(oldest.string_key))
        for oldest in (oldest_of(view) for group in groups for view in group.views())
        if oldest is not None and oldest.string_key is not None
    ]
    exists = any(_sends_exists(group) for group in groups)
    return RedisNeeds(
        commands=[MEMBER_OR_STREAM_EXISTS] if exists else [],
        read_keys=patterns,
        value_reads=value_reads,
        connections=list(sources),
    )


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


def _sends_exists(group: KeyGroup) -> bool:
    """A group whose members' marker keys are checked (key_commands.Cycle._marked), or its
    look-alikes' member keys (sources/redis_keys/look_alikes.py), or whose
    keys are streams built from known values and read by XLEN (no consumer group): an XLEN of
    0 is followed by EXISTS (key_commands.Cycle._counts)."""
    if isinstance(group, StreamGroup):
        return group.enumerated and not group.stream_group
    members = (view for view in group.views() if isinstance(view, OrderedGroup))
    return any(view.marker is not None or view.look_alikes is not None for view in members)
