"""Keys that look like a key group's queues but are not among them (a group's `look_alikes`).

arq names a queue nowhere but in its zset's key, which may be any name: a queue that holds
jobs while no live worker names it in a health-check key, and that nobody lists, is found by
nothing the group reads. Such a zset looks like a queue (its first member is a job id with an
arq:job:<id> key), but looking so does not make it one (arq's own arq:abort holds job ids too,
an app may keep some in a zset of its own), so it is named for listing, never counted.

Cost per cycle: one SCAN MATCH <the group's glob> TYPE <its type> (Redis visits every key, as
any SCAN; it returns only keys of that type), then for at most max_keys keys left out one read
of the first member (one bounded_reads per node, so a huge member stays in Redis) and one
EXISTS each (pipelined per node).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis

from exporter.redis.pipeline import Args, bounded_reads, round_trip, script_read
from exporter.sources.redis_keys.groups import (
    KeyGroup,
    OrderedGroup,
    fill,
    key_regex,
    scan_glob,
)
from exporter.sources.redis_keys.types import text

# The read of a key's first member, in the form bounded_reads takes.
_FIRST_MEMBER = {"list": script_read("LINDEX", 0), "zset": script_read("ZRANGE", 0, 0)}

NodeOf = Callable[[bytes], redis.Redis]


def look_alikes(
    group: KeyGroup,
    known: set[bytes],
    shards: Sequence[redis.Redis],
    node_of: NodeOf,
    scan_count: int,
    max_item_bytes: int,
    cluster: bool,
) -> tuple[list[bytes], int]:
    """The keys of the group's type and pattern, not in `known`, whose first member names an
    existing member_key; and how many keys left out were not checked (beyond max_keys)."""
    rule = group.look_alikes if isinstance(group, OrderedGroup) else None
    if rule is None:
        raise TypeError(f"key group {group.pattern!r} has no look_alikes")
    excluded = {key.encode() for key in rule.exclude}
    regex, glob = key_regex(group.pattern), scan_glob(group.pattern)
    candidates: list[bytes] = []
    unchecked = 0
    for shard in shards:
        for key in shard.scan_iter(match=glob, count=scan_count, _type=group.key_type):
            if key in known or key in excluded or not regex.match(text(key)):
                continue
            if len(candidates) < rule.max_keys:
                candidates.append(key)
            else:
                unchecked += 1
    named: dict[bytes, bytes] = {}  # a key left out -> the member_key its first member names
    read = _FIRST_MEMBER[group.key_type]
    heads = _first_members(node_of, candidates, read, max_item_bytes, cluster)
    for key, head in zip(candidates, heads, strict=True):
        member = _member(head)
        if member is not None:
            named[key] = fill(rule.member_key, {"member": member}).encode()
    exists = _exists(node_of, list(named.values()))
    return [key for key, found in zip(named, exists, strict=True) if found == 1], unchecked


def _member(head: Any) -> str | None:
    """A first member's text: None for an empty key, a member over max_item_bytes (its size,
    an int), an error, or one that is not UTF-8 (no job id)."""
    if isinstance(head, list):  # ZRANGE's
        head = head[0] if head else None
    if not isinstance(head, bytes):
        return None
    try:
        return head.decode()
    except UnicodeDecodeError:
        return None


def _first_members(
    node_of: NodeOf, keys: list[bytes], read: Args, limit: int, cluster: bool
) -> list[Any]:
    """Each key's first member (its read's reply), one bounded_reads per node (on a cluster
    node, of keys of several slots)."""
    replies: list[Any] = [None] * len(keys)
    for node, positions in _by_node(node_of, keys):
        node_keys = [keys[at] for at in positions]
        (answered,) = round_trip(
            node, [bounded_reads(node_keys, [read] * len(node_keys), limit, cluster)]
        )
        if isinstance(answered, redis.ResponseError):  # no reply for any: none is named
            continue
        for at, reply in zip(positions, answered, strict=True):
            replies[at] = reply
    return replies


def _exists(node_of: NodeOf, keys: list[bytes]) -> list[Any]:
    """EXISTS of each key, pipelined per node."""
    replies: list[Any] = [None] * len(keys)
    for node, positions in _by_node(node_of, keys):
        answered = round_trip(node, [("EXISTS", keys[at]) for at in positions])
        for at, reply in zip(positions, answered, strict=True):
            replies[at] = reply
    return replies


def _by_node(node_of: NodeOf, keys: list[bytes]) -> list[tuple[redis.Redis, list[int]]]:
    """The positions of the keys each node serves."""
    by_node: dict[int, tuple[redis.Redis, list[int]]] = {}
    for at, key in enumerate(keys):
        node = node_of(key)
        by_node.setdefault(id(node), (node, []))[1].append(at)
    return list(by_node.values())
