"""The per-key commands of the Redis key sampler, and what their replies mean.

A Cycle turns each key of a key group into the commands that read it (depth, head or tail
item, priority bands, split_by items, due count, stream and consumer group) and the reply
handlers that turn their replies into samples; the helpers below read the replies (RESP2 or
RESP3) and the item's time, and name what hostile data raised. Sending them is the rounds'
(key_rounds.py), which key groups and keys there are is the sampler's (redis_keys.py).
"""

from __future__ import annotations

import itertools
import json
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, get_args

import redis

from exporter.catalog import BY_NAME, QUEUE_LABELS, SYSTEM_QUEUE, MetricSpec
from exporter.redis_cluster import ClusterNodes
from exporter.redis_connection import redis_error_reason
from exporter.redis_pipeline import Args, bound_each, bounded_reads, probe_first, script_read
from exporter.samples import SampleSet
from exporter.sources.item_time import TimeParseError, parse_time
from exporter.sources.key_groups import DueCount, KeyGroup, OldestItem, ScoreWindow, fill
from exporter.sources.key_types import (
    ASKED,
    ITEM_READ,
    Command,
    GroupTally,
    KeyMatch,
    Labels,
    OnReply,
    Route,
    key_of,
)
from exporter.sources.key_values import BuiltKeys, Selector

DEPTH = BY_NAME["queue_depth"]
OLDEST_AGE = BY_NAME["queue_oldest_age_seconds"]
MAX_DEPTH = BY_NAME["queue_max_depth"]
# The label value of items split_by could not attribute: beyond max_items, or with no value.
UNREAD = "__unread__"

DEPTH_COMMAND = {"list": "LLEN", "zset": "ZCARD", "set": "SCARD", "hash": "HLEN", "stream": "XLEN"}
# The reads whose reply tells whether their key exists: a whole key's depth (Redis deletes an
# emptied list, zset, set or hash, so such a key exists exactly when its depth is above 0; a
# stream may exist empty) and a stream's XINFO GROUPS (answered only for a stream that exists).
_TELLS_PRESENCE = frozenset((*DEPTH_COMMAND.values(), "XINFO"))


class ItemError(Exception):
    """An item whose time cannot be read; `reason` is the error counter's label."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# Exceptions a reply handler may meet in hostile data, and their reason; anything else is
# item_unreadable. A fixed table, so hostile data cannot grow the reason label.
_EXCEPTION_REASONS: tuple[tuple[type[Exception], str], ...] = (
    (TimeParseError, "time_unparsable"),
    (RecursionError, "item_too_deep"),
    (UnicodeDecodeError, "item_not_utf8"),
)


# The read of a list's or zset's item at either end, in the form bounded_reads takes.
END_READS = {
    ("list", "head"): script_read("LINDEX", 0),
    ("list", "tail"): script_read("LINDEX", -1),
    ("zset", "head"): script_read("ZRANGE", 0, 0, "WITHSCORES"),
    ("zset", "tail"): script_read("ZRANGE", -1, -1, "WITHSCORES"),
}


# A cluster node's error for a read its script made of a key that is not there: in a migrating
# slot, a key already moved (the node would answer a command of its own with ASK).
_NOT_LOCAL = "ERR Script attempted to access a non local key"

if any(spec.labels not in (QUEUE_LABELS, SYSTEM_QUEUE) for spec in (DEPTH, OLDEST_AGE, MAX_DEPTH)):
    raise RuntimeError("key_commands: a sampled family has labels for_metric() cannot build")
# Cycle.handle_plain combines samples inline: depths and due counts add up, ages and limits
# keep the largest; a due count is a queue's (system, queue).
DUE_COUNTS = [BY_NAME[name] for name in get_args(DueCount.model_fields["metric"].annotation)]
if (DEPTH.combine, OLDEST_AGE.combine, MAX_DEPTH.combine) != ("sum", "max", "max") or any(
    (spec.combine, spec.labels) != ("sum", SYSTEM_QUEUE) for spec in DUE_COUNTS
):
    raise RuntimeError("key_commands: Cycle.handle_plain combines a sampled family the wrong way")
# Below any age or limit: what a series not yet in a table compares as, when keeping the largest.
_LEAST = float("-inf")


@dataclass
class Learned:
    """What a cycle found that the next one reuses: the same queues, mostly with the same next
    job, come back every cycle, and finding it again cost more than reading them (each field's
    figure where it is used). A cycle reads the last one's and fills its own; what it did not
    meet is forgotten. Per key group or SCAN by id, as each field says."""

    # heads over max_item_bytes: probed first, not copied inside Redis every cycle (probe_first)
    large_heads: set[bytes] = field(default_factory=set)
    # per SCAN (by its groups): which groups took each key, and what it gave them
    routes: dict[tuple[int, ...], dict[bytes, Route]] = field(default_factory=dict)
    # per enumerated group: the keys its values build, what each gives (key_values.BuiltKeys)
    built: dict[int, BuiltKeys] = field(default_factory=dict)
    # per pattern scanned for values: the value each key found names (RedisKeySampler._scanned)
    named: dict[str, dict[bytes, str]] = field(default_factory=dict)
    # per plain group: where the time each (key, head item) names is kept, and its read
    places: dict[int, dict[tuple[bytes, bytes], tuple[bytes, Args]]] = field(default_factory=dict)


class Cycle:
    """Everything that lives for one sample cycle: turns each key into commands, handles their
    replies into `samples`, and keeps what the cycle met on the way (groups that lost a
    cluster node, values found; what the next cycle reuses: `learned`). The rounds (key_rounds.Transport)
    send what it gives them and hand the replies back to it."""

    def __init__(
        self,
        now: float,
        tallies: list[GroupTally],
        max_item_bytes: int,
        nodes: ClusterNodes | None,
        before: Learned,
    ) -> None:
        self.now = now
        self.tallies = tallies  # one per key group, in the sampler's order
        self.samples = SampleSet()
        self.before, self.learned = before, Learned()  # what the last cycle found, and this one
        self.max_item_bytes = max_item_bytes
        self.nodes = nodes  # a Redis Cluster's, or None on one server
        # The groups that lost a cluster node's keys: their series are withdrawn, never served
        # partly summed
        self.lost_groups: set[int] = set()
        self.node_answered = False  # some cluster node answered: the source is up
        # What once() found (BullMQ's groups share one SCAN of meta keys), and whether some
        # node's part of it is missing
        self._found: dict[str, tuple[list[str], bool]] = {}
        # (group, key) whose WRONGTYPE reply asked its TYPE this cycle: asked once for its reads
        self._typed: set[tuple[int, bytes]] = set()

    def answered(self) -> None:
        """A cluster node answered a round."""
        self.node_answered = True

    def once(self, name: str, find: Callable[[], list[str]]) -> tuple[list[str], bool]:
        """What `find` gives, run once a cycle per name (the groups that name one pattern share
        its SCAN), and whether some cluster node's part of it is missing."""
        if name not in self._found:
            lost = len(self.lost_groups)
            found = find()
            self._found[name] = found, len(self.lost_groups) > lost
        return self._found[name]

    def commands_for_key(
        self, tally: GroupTally, key: bytes, captured: dict[str, str], labels: Labels
    ) -> Iterator[Command]:
        """The reads of a key; a key built from known values is also told present or not."""
        commands = self._reads(tally, key, captured, labels)
        return self._telling_presence(tally, key, commands) if tally.enumerated else commands

    def _telling_presence(
        self, tally: GroupTally, key: bytes, commands: Iterator[Command]
    ) -> Iterator[Command]:
        """A built key's reads, the first that tells whether the key exists (_TELLS_PRESENCE)
        telling the tally (Presence), no EXISTS sent: reads of part of a zset (priority bands,
        a score window) add its ZCARD."""
        told = False
        for args, on_reply, owner in commands:
            if not told and args[0] in _TELLS_PRESENCE:
                told = True
                on_reply = Presence(tally, key, args[0], on_reply)
            yield args, on_reply, owner
        if not told:
            yield ("ZCARD", key), Presence(tally, key, "ZCARD", None), tally

    def _reads(
        self, tally: GroupTally, key: bytes, captured: dict[str, str], labels: Labels
    ) -> Iterator[Command]:
        group = tally.group
        if group.max_depth is not None:
            self.samples.add_labelled(MAX_DEPTH, labels.for_metric(MAX_DEPTH), group.max_depth)
        if group.type == "stream":
            yield from self._stream(tally, key, labels)
        elif group.split_by is not None:
            yield from self._split(tally, key, labels)
            return
        else:  # priority bands or a score window: the other groups are PlainGroup's
            for part, low, high in self._score_ranges(group, labels):
                yield ("ZCOUNT", key, low, high), self._depth(tally, part), tally
                if group.oldest is not None:  # the first item of the range (a window's: head)
                    first = (
                        ("ZREVRANGEBYSCORE", high, low)
                        if group.oldest.end == "tail"
                        else ("ZRANGEBYSCORE", low, high)
                    )
                    read = script_read(*first, "LIMIT", 0, 1, "WITHSCORES")
                    yield (ITEM_READ, key, read), self._head_time(tally, part, captured), tally
        if group.due is not None:
            count_due = ("ZCOUNT", key, "-inf", f"({scores_now(self.now, group.due)!r}")
            yield count_due, self._record(BY_NAME[group.due.metric], labels), tally

    def _score_ranges(self, group: KeyGroup, labels: Labels) -> list[tuple[Labels, str, str]]:
        """The score ranges a zset is read in, each (labels, low, high): one per priority band
        (the score encodes the priority), or the window of the items due by now or of those
        still ahead (the score is the time each may run)."""
        bands, window = group.priority_bands, group.scores
        if bands is not None:
            width = bands.width
            return [
                (labels._replace(priority=name), f"{band * width!r}", f"({(band + 1) * width!r}")
                for band, name in sorted(bands.names.items())
            ]
        assert window is not None
        limit = scores_now(self.now, window)
        low, high = {
            "due": ("-inf", f"{limit!r}"),
            "ahead": (f"({limit!r}", "+inf"),
            "positive": ("(0", "+inf"),
        }[window.window]
        return [(labels, low, high)]

    def _split(self, tally: GroupTally, key: bytes, labels: Labels) -> Iterator[Command]:
        """Depth (and head age, due count) per label value read from each item. The key's
        depth comes first, so items beyond max_items still count, under __unread__."""
        group = tally.group
        split = group.split_by
        assert split is not None
        depth = 0

        def on_depth(reply: Any) -> None:
            nonlocal depth
            depth = int(reply)

        yield (DEPTH_COMMAND[group.type], key), on_depth, tally
        last = split.max_items - 1
        read = {
            "list": script_read("LRANGE", 0, last),
            "zset": script_read("ZRANGE", 0, last, "WITHSCORES"),
            "hash": script_read("HVALS"),
        }[group.type]
        due = BY_NAME[group.due.metric] if group.due is not None else None
        due_limit = 0.0 if group.due is None else scores_now(self.now, group.due)
        keep_last = group.oldest is not None and group.oldest.end == "tail"
        keeps = Selector(group.select.get(split.label, ["*"]))

        def on_items(reply: Any) -> None:
            items = _listed_items(reply, scored=group.type == "zset")
            heads: dict[str, tuple[bytes | int, float | None]] = {}
            unreadable = too_large = 0
            for item, score in items:
                if isinstance(item, int):  # its size: over max_item_bytes, left in Redis
                    too_large += 1
                    value: str | None = UNREAD
                else:
                    value = _json_field(item, split.field)
                if value is None:
                    unreadable += 1
                    value = UNREAD
                elif not keeps(value):
                    continue
                item_labels = labels._replace(**{split.label: value})
                self.samples.add_labelled(DEPTH, item_labels, 1.0)
                tally.series[item_labels] = None
                if due is not None and score is not None:
                    self.samples.add_labelled(
                        due, item_labels.for_metric(due), float(score < due_limit)
                    )
                if keep_last or value not in heads:
                    heads[value] = (item, score)
            unread = depth - len(items)
            if unread > 0:
                self._depth(tally, labels._replace(**{split.label: UNREAD}))(unread)
                tally.failed(key, "items_unread", f"{unread} beyond max_items")
            if unreadable:
                tally.failed(key, "label_unreadable", f"{unreadable} item(s)")
            if too_large:
                tally.failed(key, "item_too_large", f"{too_large} item(s)")
            for name in keeps.names:  # a queue named in the selection reads 0 when it has none
                named = labels._replace(**{split.label: name})
                self._depth(tally, named)(0)
                if due is not None:
                    self.samples.add_labelled(due, named.for_metric(due), 0.0)
            new = sorted(value for value in keeps.left_out if value not in tally.unselected)
            tally.left_out(split.label, new)
            oldest = group.oldest
            if oldest is None:
                return
            for value, (item, score) in heads.items():  # each head's age, failing alone
                if isinstance(item, int):  # too large to read (counted): a score tells its time
                    if oldest.time_in != "score":
                        continue
                    item = b""
                try:
                    self._age(
                        labels._replace(**{split.label: value}), item_time(oldest, item, score)
                    )
                except Exception as error:  # hostile data may raise anything
                    tally.failed(key, exception_reason(error))

        yield (ITEM_READ, key, bound_each(read)), on_items, tally

    def _stream(self, tally: GroupTally, key: bytes, labels: Labels) -> Iterator[Command]:
        group = tally.group
        if group.stream_group:
            yield ("XINFO", "GROUPS", key), self._stream_group(tally, key, labels), tally
            return
        yield ("XLEN", key), self._depth(tally, labels), tally
        if group.oldest is not None:
            first = (
                script_read("XRANGE", "-", "+", "COUNT", 1)
                if group.oldest.end == "head"
                else script_read("XREVRANGE", "+", "-", "COUNT", 1)
            )
            yield (ITEM_READ, key, first), self._stream_head(labels), tally

    # -- reply handlers --------------------------------------------------------------------

    def _record(self, spec: MetricSpec, labels: Labels) -> OnReply:
        series = labels.for_metric(spec)
        add = self.samples.add_labelled

        def record(reply: Any) -> None:
            add(spec, series, float(reply))

        return record

    def _depth(self, tally: GroupTally, labels: Labels) -> OnReply:
        add = self.samples.add_labelled

        def record(reply: Any) -> None:
            add(DEPTH, labels, float(reply))
            tally.series[labels] = None

        return record

    def _age(self, labels: Labels, item_time: float) -> None:
        self.samples.add_labelled(OLDEST_AGE, labels, max(0.0, self.now - item_time))

    def _head_time(self, tally: GroupTally, labels: Labels, captured: dict[str, str]) -> OnReply:
        oldest = tally.group.oldest
        assert oldest is not None

        def on_head(reply: Any) -> Command | None:
            head = head_item(reply)
            if head is None:
                return None  # empty: no age
            item, score = head
            if oldest.time_in in ("hash", "string"):
                return self.kept_time_read(tally, labels, *kept_where(oldest, captured, item))
            self._age(labels, item_time(oldest, item, score))
            return None

        return on_head

    def kept_time_read(self, tally: GroupTally, labels: Labels, key: bytes, read: Args) -> Command:
        """The read of the time a head item's hash field or string key keeps (the item names
        it, kept_where: RQ's, BullMQ's and Bull's job ids)."""
        oldest = tally.group.oldest
        assert oldest is not None

        def on_time(reply: Any) -> None:
            self._age(labels, kept_time(oldest, reply))

        return (ITEM_READ, key, read), on_time, tally

    def _kept_times(self, tally: GroupTally, reads: list[tuple[Args, bytes, KeyMatch]]) -> Command:
        """One command reading the times a plain group's head items name (one bounded_reads),
        and its handler: each time an age, each read failing alone as in handle. A command and
        a handler per read cost a bull cycle at 10k queues 1.68-1.93x its floor's CPU, this
        way 1.66-1.74x with the loop changes beside it (docs/benchmarks.md)."""
        oldest = tally.group.oldest
        assert oldest is not None
        keys = [key for _, key, _ in reads]
        args = bounded_reads(keys, [read for read, _, _ in reads], self.max_item_bytes)
        time_of = partial(kept_time, oldest)

        def read_again(read: tuple[Args, bytes, KeyMatch]) -> Command:
            return self.kept_time_read(tally, read[2].labels, read[1], read[0])

        def on_times(replies: Any) -> list[Command]:
            return self._ages(tally, reads, replies, time_of, read_again)

        return args, on_times, tally

    def _stream_head(self, labels: Labels) -> OnReply:
        def on_entries(reply: Any) -> None:
            if reply:
                self._age(labels, _stream_id_time(reply[0][0]))

        return on_entries

    def _stream_group(self, tally: GroupTally, key: bytes, labels: Labels) -> OnReply:
        group = tally.group
        wanted = (group.stream_group or "").encode()

        def on_groups(reply: Any) -> Command | None:
            groups = (_as_map(entry) for entry in reply)
            info = next((entry for entry in groups if entry.get(b"name") == wanted), None)
            if info is None:
                raise ItemError("stream_group_missing")
            self.samples.add_labelled(DEPTH, labels, float(info.get(b"lag") or 0))
            pending = float(info.get(b"pending") or 0)
            active = labels._replace(state="active")
            self.samples.add_labelled(DEPTH, active, pending)
            tally.series.update(dict.fromkeys((labels, active)))
            if group.oldest is None:
                return None
            # The oldest undelivered entry is the first after the group's last delivered id.
            after = b"(" + info.get(b"last-delivered-id", b"0-0")
            read = (ITEM_READ, key, script_read("XRANGE", after, "+", "COUNT", 1))
            return read, self._stream_head(labels), tally

        return on_groups

    # -- the rounds' replies (key_rounds.Transport) -------------------------------------------

    def _redirect(
        self, nodes: ClusterNodes, command: Command, reply: redis.ResponseError
    ) -> Command | None:
        """A key whose slot is migrating and that has already moved: the command its node
        answered with ASK, to the node the reply names (sent after ASKING); an item read the
        node's script could not make, again on its own with its key declared (so that it meets
        that ASK); a command read where SCAN found its key and MOVED from there to the node the
        slot map already names (the key sits on the node importing its slot), again to that
        node. None for any other error."""
        args, on_reply, tally = command
        if nodes.moved_to_its_node(reply, key_of(args)):
            return command  # a follow-up: routed by slot
        if args[0] is ITEM_READ:
            if not str(reply).startswith(_NOT_LOCAL):
                return None
            _, key, read = args
            declared = bounded_reads([key], [read], self.max_item_bytes)
            return declared, _one_read(on_reply), tally
        target = nodes.asked(reply)
        return None if target is None else ((ASKED, target, args), on_reply, tally)

    def node_lost(
        self, node: str, commands: list[Command], plain: list[PlainKey], error: redis.RedisError
    ) -> None:
        detail = f"node {node}: {redis_error_reason(error)}"
        for args, _, tally in commands:
            self.lose_group(tally, key_of(args), detail)
        for group, key, _ in plain:
            self.lose_group(group.tally, key, detail)

    def handle(self, commands: list[Command], replies: list[Any]) -> Iterator[Command]:
        for command, reply in zip(commands, replies, strict=True):
            args, on_reply, tally = command
            if args[0] is ITEM_READ and type(reply) is int:  # its size: over the limit, in Redis
                self._too_large(tally, args[1], reply)
                continue
            if isinstance(reply, redis.ResponseError):
                redirect = (
                    None if self.nodes is None else self._redirect(self.nodes, command, reply)
                )
                if redirect is not None:
                    yield redirect
                    continue
                reason = response_reason(reply)
                if reason == "wrong_type" and type(on_reply) is Presence:
                    on_reply.tally.present(on_reply.key)  # a key of another type exists
                if self.nodes is not None and self.nodes.noticed(reply):
                    # the key is served elsewhere now: its series would be a partial sum
                    self.lose_group(tally, key_of(args), str(reply)[:80], reason)
                elif args[0] == "TYPE":  # not read: unnamed
                    tally.failed(key_of(args), "wrong_type")
                elif reason == "wrong_type":
                    yield from self.wrong_type(tally, key_of(args))
                else:
                    tally.failed(key_of(args), reason)
                continue
            try:
                follow_up = on_reply(reply)
            except Exception as error:  # hostile data may raise anything
                _unreadable(tally, key_of(args), error)
                continue
            if isinstance(follow_up, list):  # a batch's (_kept_times)
                yield from follow_up
            elif follow_up is not None:
                yield follow_up

    def wrong_type(self, tally: GroupTally, key: bytes) -> Iterator[Command]:
        """A key of another type than its group's: its TYPE is read, so that the failure names
        the type found. Read only after a WRONGTYPE reply (rare), once per group and key."""
        if (id(tally), key) in self._typed:
            return
        self._typed.add((id(tally), key))

        def on_type(reply: Any) -> None:
            found = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
            tally.failed(key, "wrong_type", "deleted since" if found == "none" else f"a {found}")

        yield ("TYPE", key), on_type, tally

    def _too_large(self, tally: GroupTally, key: bytes, size: int) -> None:
        """An item over max_item_bytes, measured in Redis: its head is probed next cycle."""
        self.learned.large_heads.add(key)
        tally.failed(key, "item_too_large", f"{size} bytes")

    def handle_plain(
        self, keys: list[PlainKey], direct: list[Any], heads: list[Any]
    ) -> list[Command]:
        """The replies of plain groups' keys (see PlainGroup): each key's depth and due count
        (`direct`), then its head's age or the read of the time its hash keeps. A read that
        gave no value is handed to handle as the one command it is (_plain_read), which names
        its failure or on a cluster follows its ASK or MOVED.

        Samples go straight into the tables, combined as their specs say (depths add up, ages
        and limits keep the largest: checked where this module is loaded), without a call per
        sample: these loops run once per key. A run of one group's keys is read in a loop per
        kind of reply (depths, due counts, heads), each loop only over the replies it reads."""
        again: list[Command] = []
        kept: dict[PlainGroup, list[tuple[Args, bytes, KeyMatch]]] = {}  # per group, one read
        for spec in (DEPTH, OLDEST_AGE, MAX_DEPTH):  # each family plain groups sample is in
            self.samples.table(spec)  # the samples, empty if no key gave one of it
        at = heads_at = 0
        for group, run in runs(keys):  # a round's keys are mostly of one group: its locals
            again += self._plain_counts(group, run, direct, at)
            at += (1 if group.due_spec is None else 2) * len(run)
            if group.read is not None:
                run_heads = heads[heads_at : heads_at + len(run)]
                heads_at += len(run)
                again += self._plain_heads(group, run, run_heads, kept)
        if (at, heads_at) != (len(direct), len(heads)):
            raise RuntimeError(f"{len(direct)} + {len(heads)} replies for {at} + {heads_at} reads")
        return again + [self._kept_times(group.tally, reads) for group, reads in kept.items()]

    def _plain_read(self, kind: str, plain_key: PlainKey) -> Command:
        """One read of a plain key ("depth", "due" or "head") as a command of its own with its
        handler, for a reply that gave no value: handle names the failure, or follows it."""
        group, key, (captured, labels) = plain_key
        tally = group.tally
        if kind == "depth":
            on_depth = self._depth(tally, labels)
            command = group.depth_command
            return (
                (command, key),
                Presence(tally, key, command, on_depth) if group.built else on_depth,
                tally,
            )
        if kind == "due":
            assert group.due_spec is not None
            return ("ZCOUNT", key, *group.due_window), self._record(group.due_spec, labels), tally
        read = group.probe_read if key in self.before.large_heads else group.read
        return (ITEM_READ, key, read), self._head_time(tally, labels, captured), tally

    def _plain_counts(
        self, group: PlainGroup, run: list[PlainKey], direct: list[Any], at: int
    ) -> list[Command]:
        """A run's depths (from `direct` at `at`, each followed by its key's due count if the
        group counts them) into their tables, and the queues' limits; a built key whose depth
        is above 0 exists."""
        tally, built, series = group.tally, group.built, group.tally.series
        again: list[Command] = []
        depth_table, max_table = self.samples.table(DEPTH), self.samples.table(MAX_DEPTH)
        depth_of, max_depth = depth_table.get, group.max_depth
        step = 1 if group.due_spec is None else 2
        for plain_key, depth in zip(run, direct[at : at + step * len(run) : step], strict=True):
            _, key, match = plain_key
            labels = match[1]
            if type(depth) is int:
                depth_table[labels] = depth_of(labels, 0.0) + depth
                series[labels] = None
                if built and depth:  # a built key exists when its depth is above 0
                    tally.present(key)
            else:
                again += self.handle([self._plain_read("depth", plain_key)], [depth])
            if max_depth is not None and not max_table.get(labels[:2], _LEAST) >= max_depth:
                max_table[labels[:2]] = max_depth  # per (system, queue)
        if group.due_spec is not None:
            due_table = self.samples.table(group.due_spec)
            dues = direct[at + 1 : at + 2 * len(run) : 2]
            for plain_key, due_count in zip(run, dues, strict=True):
                if type(due_count) is int:
                    queue = plain_key[2][1][:2]  # (system, queue)
                    due_table[queue] = due_table.get(queue, 0.0) + due_count
                else:
                    again += self.handle([self._plain_read("due", plain_key)], [due_count])
        return again

    def _plain_heads(
        self,
        group: PlainGroup,
        run: list[PlainKey],
        heads: list[Any],
        kept: dict[PlainGroup, list[tuple[Args, bytes, KeyMatch]]],
    ) -> list[Command]:
        """A run's head reads: each an age, or (its time kept where the item points) the read
        of that time: added to `kept` on one server, a read each on a cluster (which follows
        ASK: handle)."""
        read_again = partial(self._plain_read, "head")
        if group.head_time is not None:
            return self._ages(group.tally, run, heads, group.head_time, read_again)
        tally, kept_in = group.tally, group.kept_in
        assert kept_in is not None
        again: list[Command] = []
        known_places, places, on_cluster = group.places_before, group.places, self.nodes is not None
        for plain_key, head in zip(run, heads, strict=True):
            if head is None:  # an empty queue
                continue
            _, key, match = plain_key
            if type(head) is int or isinstance(head, redis.ResponseError):
                again += self.handle([read_again(plain_key)], [head])
                continue
            try:
                item = head_item(head)
                if item is None:
                    continue
                where = known_places.get((key, item[0]))
                if where is None:
                    where = kept_where(kept_in, match[0], item[0])
            except Exception as error:  # hostile data may raise anything
                _unreadable(tally, key, error)
                continue
            places[key, item[0]] = where
            if on_cluster:
                again.append(self.kept_time_read(tally, match[1], *where))
            else:
                kept.setdefault(group, []).append((where[1], where[0], match))
        return again

    def _ages(
        self,
        tally: GroupTally,
        reads: Sequence[tuple[Any, bytes, KeyMatch]],
        replies: list[Any],
        time_of: Callable[[Any], float | None],
        read_again: Callable[[Any], Command],
    ) -> list[Command]:
        """Bounded reads' replies, each the time of an item (`time_of`; None: an empty queue)
        as an age into its table; a read that gave no value goes to handle on its own
        (`read_again`), hostile data is counted on its key."""
        again: list[Command] = []
        age_table, now = self.samples.table(OLDEST_AGE), self.now
        for read, reply in zip(reads, replies, strict=True):
            _, key, match = read
            if type(reply) is int or isinstance(reply, redis.ResponseError):
                again += self.handle([read_again(read)], [reply])
                continue
            try:
                at = time_of(reply)
            except Exception as error:  # hostile data may raise anything
                _unreadable(tally, key, error)
                continue
            if at is None:  # the queue is empty
                continue
            labels = match[1]
            age = now - at
            if not age > 0.0:  # a time ahead of this clock is no wait (as max(0.0, age))
                age = 0.0
            if not age_table.get(labels, _LEAST) >= age:
                age_table[labels] = age
        return again

    def lose_group(
        self, tally: GroupTally, key: bytes, detail: str, reason: str = "node_down"
    ) -> None:
        if id(tally) not in self.lost_groups:
            self.lost_groups.add(id(tally))
            tally.failed(key, reason, detail)

    def withdraw_lost_groups(self) -> None:
        """A group some of whose keys sat on a cluster node that did not answer: its series
        would be partial sums, so none of them is served this cycle."""
        for tally in (tally for tally in self.tallies if id(tally) in self.lost_groups):
            for spec in (DEPTH, OLDEST_AGE):
                self.samples.discard(spec, tally.series)
            tally.series.clear()


class PlainGroup:
    """A key group read in bulk: per key a whole-key depth command, a zset's due count, and for
    a list or zset the read of its head or tail item, whose time is in the item or its score,
    or in the hash field or string key the item names (read next: on one server a group's in
    one command per round, Cycle._kept_times; on a cluster a read each, which follows ASK).
    Bands, split, score windows and streams take the general path (Cycle). A round's plain keys
    travel as a run of depth (and due count) commands and a run of item reads, their replies
    consumed in loops (Cycle.handle_plain), not a tuple and closures per key: a bull cycle at
    10k queues cost 3.0-3.4x its floor's CPU the general way, 1.2-1.4x this way
    (docs/benchmarks.md). Series, failures and reports are the general path's
    (tests/test_key_sampling_rounds.py)."""

    __slots__ = (
        "built",
        "cost",
        "cycle",
        "depth_command",
        "due_spec",
        "due_window",
        "head_time",
        "kept_in",
        "max_depth",
        "places",
        "places_before",
        "probe_read",
        "read",
        "tally",
    )

    def __init__(self, tally: GroupTally, cycle: Cycle) -> None:
        group = tally.group
        self.tally, self.cycle, self.max_depth = tally, cycle, group.max_depth
        self.depth_command = DEPTH_COMMAND[group.type]
        self.built = group.enumerated  # its keys' depths tell which exist (GroupTally.present)
        self.due_spec: MetricSpec | None = None
        self.due_window: tuple[str, ...] = ()  # ZCOUNT's range of the scores already due
        if group.due is not None:
            self.due_spec = BY_NAME[group.due.metric]
            self.due_window = ("-inf", f"({scores_now(cycle.now, group.due)!r}")
        oldest = group.oldest if group.type in ("list", "zset") else None
        self.read: Args | None = None
        self.probe_read: Args | None = None
        # The time a head read gives; None when the item names where its time is kept
        self.head_time: Callable[[Any], float | None] | None = None
        # Where the time is when the item names where it is kept (a hash, a string key)
        self.kept_in: OldestItem | None = None
        if oldest is not None:
            if oldest.time_in in ("hash", "string"):
                self.kept_in = oldest
            else:
                self.head_time = head_time(oldest)
            self.read = END_READS[group.type, oldest.end]
            # a head found too large last cycle is probed before it is copied (probe_first)
            self.probe_read = probe_first(self.read) if oldest.end == "head" else self.read
        self.cost = 1 + (self.read is not None) + (self.due_spec is not None)
        # where the times its head items name are kept, as last cycle found them and as this
        # one does: kept_where cost about 10% of a bull cycle's CPU (docs/benchmarks.md)
        self.places_before = cycle.before.places.get(id(group), {})
        self.places = cycle.learned.places.setdefault(id(group), {})

    @staticmethod
    def suits(group: KeyGroup) -> bool:
        return (
            group.type != "stream"
            and group.priority_bands is None
            and group.split_by is None
            and group.scores is None
        )


class Presence:
    """The reply handler of a built key's read that tells whether the key exists (as
    _TELLS_PRESENCE says; a stream's XLEN of 0 asks EXISTS), then hands the reply on. A
    WRONGTYPE reply means a key of another type exists: Cycle.handle tells the tally."""

    __slots__ = ("command", "key", "tally", "then")

    def __init__(self, tally: GroupTally, key: bytes, command: str, then: OnReply | None) -> None:
        self.tally, self.key, self.command, self.then = tally, key, command, then

    def __call__(self, reply: Any) -> Command | list[Command] | None:
        if self.command == "XINFO" or reply:
            self.tally.present(self.key)
        elif self.command == "XLEN":
            if self.then is not None:
                self.then(reply)
            return ("EXISTS", self.key), self._exists, self.tally
        return self.then(reply) if self.then is not None else None

    def _exists(self, reply: Any) -> None:
        if reply:
            self.tally.present(self.key)


# A plain group's key to read: its group, the key, what it gives (values and labels).
PlainKey = tuple[PlainGroup, bytes, KeyMatch]


def scores_now(now: float, scores: DueCount | ScoreWindow) -> float:
    """The time `now` as a score of a zset whose scores are times in that unit and divisor."""
    return now * (1000.0 if scores.unit == "ms" else 1.0) * scores.divisor


def head_item(reply: Any) -> tuple[bytes, float | None] | None:
    """(item, score) from LINDEX (bytes) or ZRANGE ... WITHSCORES: [member, score] in RESP2,
    [[member, score]] in RESP3."""
    if isinstance(reply, bytes):  # an empty string is an item too (not JSON, not a time)
        return reply, None
    if not reply:
        return None
    member, score = reply[0] if isinstance(reply[0], list) else reply[:2]
    return member, float(score)


def _listed_items(reply: Any, scored: bool) -> list[tuple[bytes | int, float | None]]:
    """(item, score) pairs of LRANGE / HVALS, or of ZRANGE ... WITHSCORES: a flat
    [member, score, ...] list in RESP2, [[member, score], ...] in RESP3. An item over
    max_item_bytes is its size (bound_each)."""
    if not scored:
        return [(item, None) for item in reply]
    if reply and isinstance(reply[0], list):
        return [(member, float(score)) for member, score in reply]
    return [(member, float(score)) for member, score in zip(reply[::2], reply[1::2], strict=True)]


def _json_field(item: bytes, field: str) -> str | None:
    """A field of the item's JSON as a label value; None when there is none to read (not JSON,
    nested past the recursion limit, no such string field): the item counts as __unread__."""
    try:
        value = _json_value(item, (field,))
    except (ItemError, RecursionError):
        return None
    return value if isinstance(value, str) and value else None


def _json_value(document: str | bytes, path: Iterable[str | None]) -> Any:
    """The value at `path` (the names of nested objects) of a JSON document: a queue item's
    time, or a kept one (Dramatiq's messages, Bee-Queue's jobs in a hash keyed by id)."""
    try:
        value = json.loads(document)
    except ValueError as error:
        raise ItemError("item_not_json") from error
    for name in path:
        value = value.get(name) if isinstance(value, dict) else None
    if value is None or isinstance(value, (dict, list)):  # a tuple: no union built per call
        raise ItemError("time_missing")
    return value


def _as_map(reply: Any) -> dict[bytes, Any]:
    """A RESP3 map arrives as a dict, its RESP2 form as a flat [key, value, ...] list."""
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2], strict=True))


def item_time(oldest: OldestItem, item: bytes, score: float | None) -> float:
    if oldest.time_in == "score":
        if score is None:
            raise ItemError("time_missing")
        return parse_time(score, oldest.format, oldest.divisor)
    if oldest.time_in == "item":
        return parse_time(item, oldest.format, oldest.divisor)
    text = item.decode("utf-8", "replace")
    if oldest.json_after is not None:
        _, separator, text = text.partition(oldest.json_after)
        if not separator:
            raise ItemError("item_not_json")
    return parse_time(_json_value(text, (oldest.field,)), oldest.format, oldest.divisor)


# A JSON document parsed without json.loads's layers (its checks for bytes and for whitespace
# around the document cost as much as the parse of a small queue item itself).
_parse_document = json.JSONDecoder().raw_decode
_from_iso = datetime.fromisoformat
# What a JSON item's time field may be for parse_time; anything else goes to item_time.
_TIME_VALUES = (str, int, float)


def head_time(oldest: OldestItem) -> Callable[[Any], float | None]:
    """The time of the item a head read returned (LINDEX's item, ZRANGE's member and score;
    None for an empty queue), as head_item and item_time read it, for a loop over many keys.

    A list's JSON item (the common layout) is read the short way when it is a plain JSON
    object: decoded strictly, parsed whole from its first character, its field a string or a
    number. Any other reply goes the general way, which reads it as it always did or raises
    what is wrong with it: both ways give the same time or the same error."""

    def general(reply: Any) -> float | None:
        head = head_item(reply)
        return None if head is None else item_time(oldest, *head)

    field = oldest.field
    if oldest.time_in != "json" or oldest.json_after is not None or field is None:
        return general
    time_format, divisor = oldest.format, oldest.divisor
    iso = time_format == "iso"

    def json_item(reply: Any) -> float | None:
        if type(reply) is bytes:
            try:
                text = reply.decode()
                document, end = _parse_document(text)
                value, whole = document[field], end == len(text)
                if whole and iso and type(value) is str:
                    parsed = _from_iso(value)  # as parse_time reads it, when it has its offset
                    if parsed.tzinfo is not None:
                        return parsed.timestamp()
                elif whole and type(value) in _TIME_VALUES:
                    return parse_time(value, time_format, divisor)
            except Exception:  # hostile data may raise anything: the general way names it
                pass
        return general(reply)

    return json_item


def runs(keys: list[PlainKey]) -> Iterator[tuple[PlainGroup, list[PlainKey]]]:
    """A round's plain keys in runs of one group (a page of keys is one group's)."""
    for group, run in itertools.groupby(keys, key=operator.itemgetter(0)):
        yield group, list(run)


def kept_where(oldest: OldestItem, captured: dict[str, str], item: bytes) -> tuple[bytes, Args]:
    """The key, and its read, of the time a head item names (its hash's field, or a string
    key's JSON): RQ's, BullMQ's and Bull's job ids."""
    values = {**captured, "item": item.decode()}
    if oldest.time_in == "hash":
        key, field = fill(oldest.hash_key or "", values), oldest.field or ""
        if "{" in field:  # else a field of every hash alike (Bull's timestamp): no fill each
            field = fill(field, values)
        return key.encode(), script_read("HGET", field)
    return fill(oldest.string_key or "", values).encode(), script_read("GET")


def kept_time(oldest: OldestItem, reply: Any) -> float:
    """The time a hash field or string key keeps: the reply of its read (kept_where)."""
    if reply is None:
        raise ItemError("time_missing")
    if oldest.json_field is not None:
        reply = _json_value(reply, oldest.json_field.split("."))
    return parse_time(reply, oldest.format, oldest.divisor)


def _stream_id_time(entry_id: bytes) -> float:
    return int(entry_id.split(b"-", 1)[0]) / 1000.0


def exception_reason(error: Exception) -> str:
    """The reason label for what a reply handler raised."""
    if isinstance(error, ItemError):
        return error.reason
    for kind, reason in _EXCEPTION_REASONS:
        if isinstance(error, kind):
            return reason
    return "item_unreadable"


def _unreadable(tally: GroupTally, key: bytes, error: Exception) -> None:
    """Count and name a read whose reply handler raised (hostile data)."""
    reason = exception_reason(error)
    tally.failed(key, reason, type(error).__name__ if reason == "item_unreadable" else "")


def _one_read(on_reply: OnReply) -> OnReply:
    """The handler of a bounded_reads of one read, from that read's handler."""

    def on_replies(replies: Any) -> Command | list[Command] | None:
        reply = replies[0]
        if type(reply) is int:  # its size: over max_item_bytes, left in Redis
            raise ItemError("item_too_large")
        if isinstance(reply, redis.ResponseError):
            raise ItemError(response_reason(reply))
        return on_reply(reply)

    return on_replies


def response_reason(error: redis.ResponseError) -> str:
    message = str(error)
    if message.startswith("WRONGTYPE"):
        return "wrong_type"
    if message.startswith(("MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN")):
        return "slot_moved"
    if message.removeprefix("ERR ").startswith("no such key"):  # XINFO GROUPS, no stream
        return "stream_missing"
    return "response_error"
