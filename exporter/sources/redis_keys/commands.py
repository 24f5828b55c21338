"""The reads of the Redis key sampler's keys, and what their replies mean.

A key group is read in bulk (GroupReads): each key takes the same commands (a depth per part:
the whole key, or each priority band or score window of a zset; a due count; the read of each
part's first item), a round's keys of one group travel as one run of each command, and their
replies are read in one loop per command, not a tuple and a closure per key: a bull cycle at
10k queues cost 3.0-3.4x its floor's CPU a closure per read, 1.2-1.4x in bulk
(docs/benchmarks.md). Some layouts' options read each key on its own (Cycle.read_of_key:
split_by, every item read and counted by a label inside it; marker; oldest.end: earliest; a
stream consumer group's XINFO), and those reads and every follow-up (the time
a head item names, a WRONGTYPE key's TYPE, a read sent again after ASK or MOVED) is a Command:
its arguments, its reply handler, its group. A key of a group of several types (Huey's list or
zset) is asked its TYPE first, and its reads follow as such commands of its own, as the type it
holds (Cycle.typed_reads): not in bulk, a handler per read (Huey's few instances; a group of
many keys and several types would pay that). Sending them is the rounds' (sources/redis_keys/rounds.py),
which key groups and keys there are is the sampler's (sources/redis_keys/sampler.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple, cast, get_args

import redis

from exporter.core import numbers
from exporter.output.catalog import BY_NAME, QUEUE_LABELS, SYSTEM_QUEUE, MetricSpec
from exporter.output.samples import SampleSet
from exporter.redis.cluster import ClusterNodes
from exporter.redis.connection import redis_error_reason
from exporter.redis.pipeline import Args, bound_each, bounded_reads, probe_first, script_read
from exporter.sources.redis_keys.groups import (
    DueCount,
    HashGroup,
    KeyGroup,
    LabelFromItems,
    MemberMarker,
    OldestItem,
    OneTypeGroup,
    OrderedGroup,
    StreamGroup,
    ZsetGroup,
    fill,
    oldest_of,
)
from exporter.sources.redis_keys.items import (
    ItemError,
    as_map,
    checked_time,
    exception_reason,
    head_item,
    head_time,
    item_time,
    kept_time,
    kept_where,
    listed_items,
    response_reason,
    scores_now,
    split_value,
    stream_head_time,
)
from exporter.sources.redis_keys.types import (
    ASKED,
    ITEM_READ,
    Command,
    FoundKey,
    GroupTally,
    KeyMatch,
    Labels,
    OnReply,
    Route,
    key_of,
)
from exporter.sources.redis_keys.values import BuiltKeys, Selector

DEPTH = BY_NAME["queue_depth"]
OLDEST_AGE = BY_NAME["queue_oldest_age_seconds"]
MAX_DEPTH = BY_NAME["queue_max_depth"]
# The label value of items split_by could not attribute: beyond max_items, or with no value.
UNREAD = "__unread__"

DEPTH_COMMAND = {"list": "LLEN", "zset": "ZCARD", "set": "SCARD", "hash": "HLEN", "stream": "XLEN"}
# The reads whose reply tells whether their key exists: a whole key's depth (Redis deletes an
# emptied list, zset, set or hash, so such a key exists exactly when its depth is above 0; a
# stream may exist empty: EXISTS asks) and a stream's XINFO GROUPS (answered only for a stream
# that exists). A WRONGTYPE reply to one says a key of another type exists.
_TELLS_PRESENCE = frozenset((*DEPTH_COMMAND.values(), "XINFO"))


# The read of a list's, zset's or stream's item at either end, in the form bounded_reads takes.
END_READS = {
    ("list", "head"): script_read("LINDEX", 0),
    ("list", "tail"): script_read("LINDEX", -1),
    ("zset", "head"): script_read("ZRANGE", 0, 0, "WITHSCORES"),
    ("zset", "tail"): script_read("ZRANGE", -1, -1, "WITHSCORES"),
    ("stream", "head"): script_read("XRANGE", "-", "+", "COUNT", 1),
    ("stream", "tail"): script_read("XREVRANGE", "+", "-", "COUNT", 1),
}


# A cluster node's error for a read its script made of a key that is not there: in a migrating
# slot, a key already moved (the node would answer a command of its own with ASK).
_NOT_LOCAL = "ERR Script attempted to access a non local key"

if any(spec.labels not in (QUEUE_LABELS, SYSTEM_QUEUE) for spec in (DEPTH, OLDEST_AGE, MAX_DEPTH)):
    raise RuntimeError("key_commands: a sampled family has labels for_metric() cannot build")
# The bulk loops combine samples inline: depths and due counts add up, ages and limits keep
# the largest; a due count is a queue's (system, queue).
DUE_COUNTS = [BY_NAME[name] for name in get_args(DueCount.model_fields["metric"].annotation)]
if (DEPTH.combine, OLDEST_AGE.combine, MAX_DEPTH.combine) != ("sum", "max", "max") or any(
    (spec.combine, spec.labels) != ("sum", SYSTEM_QUEUE) for spec in DUE_COUNTS
):
    raise RuntimeError("key_commands: the bulk loops combine a sampled family the wrong way")


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
    # per key group: where the time each (key, head item) names is kept, and its read
    places: dict[int, dict[tuple[bytes, bytes], tuple[bytes, Args]]] = field(default_factory=dict)


class Part(NamedTuple):
    """One count each key of a group gives, and the read of its first item: the whole key's
    depth or a score range's (a priority band, the window of due or of future items), or a
    zset's due count."""

    command: str  # the count: LLEN, ZCARD, SCARD, HLEN, XLEN or ZCOUNT
    bounds: tuple[str, ...]  # ZCOUNT's low and high; () for a whole key's
    spec: MetricSpec | None  # queue_depth or a due count; None: read only to tell presence
    priority: str | None = None  # a band's priority label
    read: Args | None = None  # the read of its first item (script_read form) if ages are read
    probe: Args | None = None  # that read for a head found too large last cycle (probe_first)


def parts_of(group: OneTypeGroup, now: float) -> list[Part]:
    """The parts each key of a bulk-read group is read in: the whole key's, or (a zset's
    priority bands or score window) each score range's."""
    if isinstance(group, ZsetGroup) and (group.priority_bands or group.scores):
        return _ranges_of(group, now)
    oldest = oldest_of(group)
    end = "head" if oldest is None else oldest.end
    read = END_READS.get((group.type, end)) if oldest is not None else None
    # a head found too large last cycle is probed before it is copied (probe_first)
    probe = probe_first(read) if read and end == "head" and group.type != "stream" else read
    due = [_due_part(group.due, now)] if isinstance(group, ZsetGroup) and group.due else []
    return [Part(DEPTH_COMMAND[group.type], (), DEPTH, None, read, probe), *due]


def _ranges_of(group: ZsetGroup, now: float) -> list[Part]:
    """A zset's parts by score: its due count, each priority band's or its window's count
    and first member, and (keys built from values) its ZCARD, which tells whether it exists."""
    oldest, bands, window = group.oldest, group.priority_bands, group.scores
    end = "head" if oldest is None else oldest.end
    ranges: list[tuple[str | None, str, str]]  # each part's priority, low and high score
    if bands is not None:
        width = bands.width
        ranges = [
            (name, f"{band * width!r}", f"({(band + 1) * width!r}")
            for band, name in sorted(bands.names.items())
        ]
    else:
        assert window is not None
        limit = scores_now(now, window)
        low, high = {
            "due": ("-inf", f"{limit!r}"),
            "ahead": (f"({limit!r}", "+inf"),
            "positive": ("(0", "+inf"),
        }[window.window]
        ranges = [(None, low, high)]
    parts = [] if group.due is None else [_due_part(group.due, now)]
    for priority, low, high in ranges:
        first = ("ZREVRANGEBYSCORE", high, low) if end == "tail" else ("ZRANGEBYSCORE", low, high)
        read = None if oldest is None else script_read(*first, "LIMIT", 0, 1, "WITHSCORES")
        parts.append(Part("ZCOUNT", (low, high), DEPTH, priority, read, read))
    if group.enumerated:  # no part tells whether the key exists: its ZCARD does
        parts.append(Part("ZCARD", (), None))
    return parts


def _due_part(due: DueCount, now: float) -> Part:
    """A zset's count of the members whose score (a time) is already past."""
    return Part("ZCOUNT", ("-inf", f"({scores_now(now, due)!r}"), BY_NAME[due.metric])


class GroupReads:
    """How one key group's keys are read this cycle, in bulk (the module's docstring): the
    commands of a run of its keys (`commands`), their replies read by Cycle.handle_runs."""

    __slots__ = (
        "built",
        "cost",
        "kept_in",
        "max_depth",
        "parts",
        "places",
        "places_before",
        "reads",
        "tally",
        "time_of",
    )

    def __init__(self, tally: GroupTally, cycle: Cycle, group: KeyGroup) -> None:
        """`group`: the tally's, or (a group of several types) its view of one type."""
        group = group.of_type(group.key_type)
        self.tally, self.max_depth = tally, group.max_depth
        self.built = group.enumerated  # its keys' depths tell which exist (GroupTally.present)
        self.parts = parts_of(group, cycle.now)
        self.reads = [part for part in self.parts if part.read is not None]
        self.cost = len(self.parts) + len(self.reads)
        oldest = oldest_of(group)
        # The time a first item's read gives (None: an empty queue), or where the item says
        # its time is kept (a hash, a string key)
        self.time_of: Callable[[Any], float | None] | None = None
        self.kept_in: OldestItem | None = None
        if oldest is not None and oldest.time_in in ("hash", "string"):
            self.kept_in = oldest
        elif oldest is not None:
            self.time_of = stream_head_time if group.type == "stream" else head_time(oldest)
        # where the times its head items name are kept, as last cycle found them and as this
        # one does: kept_where cost about 10% of a bull cycle's CPU (docs/benchmarks.md)
        self.places_before = cycle.before.places.get(id(group), {})
        self.places = cycle.learned.places.setdefault(id(group), {})

    @staticmethod
    def suits(group: KeyGroup) -> bool:
        """Whether the group is read in bulk: a group of one type that Cycle.read_of_key
        does not read key by key."""
        return isinstance(group, OneTypeGroup) and Cycle.read_of_key(group) is None

    def commands(
        self, keys: list[bytes], large_heads: set[bytes]
    ) -> tuple[list[Args], list[bytes], list[Args]]:
        """A run of keys' commands, a run of each part's count, and their item reads (keys,
        reads): in the order handle_runs reads the replies."""
        direct: list[Args] = []
        for part in self.parts:
            command, bounds = part.command, part.bounds
            if bounds:
                direct += [(command, key, *bounds) for key in keys]
            else:
                direct += [(command, key) for key in keys]
        read_keys: list[bytes] = []
        reads: list[Args] = []
        for part in self.reads:
            read_keys += keys
            read, probe = part.read, part.probe
            assert read is not None and probe is not None  # self.reads: the parts with a read
            reads += [probe if key in large_heads else read for key in keys]
        return direct, read_keys, reads


class Rows:
    """One table's values as the bulk loops read them, a row per key (or part of one): two
    lists appended to while the replies are read, added into the table once the cycle's reads
    are done (Cycle.finish). The same dict writes cost less in a loop of their own than among
    the reads: at 1M keys the cycle's own CPU was 1.56x the floor's this way, 1.77x with the
    depths, ages and limits written inside the loops that read the replies (medians of 4,
    bench/key_sampling_split.py --before, docs/benchmarks.md)."""

    __slots__ = ("labels", "sums", "table", "values")

    def __init__(self, spec: MetricSpec, table: dict[Any, float]) -> None:
        self.table = table
        self.sums = spec.combine == "sum"  # else the largest value of a label set is kept
        self.labels: list[Any] = []
        self.values: list[float] = []

    def add_each(self, labels: list[Any], value: float) -> None:
        """Rows of one value."""
        self.labels += labels
        self.values += [value] * len(labels)

    def add_into_table(self) -> None:
        """Each row into the table, combined with a value of its label set already there."""
        table, rows = self.table, zip(self.labels, self.values, strict=True)
        if self.sums:
            for labels, value in rows:
                table[labels] = table.get(labels, 0.0) + value
        else:
            for labels, value in rows:
                if table.setdefault(labels, value) < value:
                    table[labels] = value


# Keys of one group read in bulk: its reads, and each key with what it gives.
Run = tuple[GroupReads, list[FoundKey]]
# The reads of one key of a layout read key by key (Cycle.read_of_key), its option bound
KeyRead = Callable[["Cycle", GroupTally, bytes, KeyMatch], list[Command]]


class Cycle:
    """Everything that lives for one sample cycle: turns each key into commands, handles their
    replies into `samples`, and keeps what the cycle met on the way (groups that lost a
    cluster node, values found; what the next cycle reuses: `learned`). The rounds
    (key_rounds.Transport) send what it gives them and hand the replies back to it."""

    def __init__(
        self,
        now: float,
        tallies: list[GroupTally],
        max_item_bytes: int,
        nodes: ClusterNodes | None,
        before: Learned,
    ) -> None:
        self.now = now
        self.latest = numbers.horizon(now)  # the latest head time an age is made of
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
        self._wrong_typed: set[tuple[int, bytes]] = set()
        # a group of several types' reads of each type (by the group's id and the type)
        self._typed: dict[tuple[int, str], GroupReads] = {}
        # each group read key by key: its read (read_of_key, once a cycle: it doubled the CPU
        # of building a key's commands) and its max_depth, by the group's id
        self._key_reads: dict[int, tuple[KeyRead, int | None]] = {}
        # the bulk loops' values, by the id of the table each goes to (Rows)
        self._rows: dict[int, Rows] = {}

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

    # -- the two layouts read a command and a handler per read ------------------------------

    def commands_for_key(
        self, tally: GroupTally, group: KeyGroup, key: bytes, match: KeyMatch
    ) -> list[Command]:
        """The reads of a key of a group not read in bulk (GroupReads.suits); `group`: the
        tally's, or its view of the key's type."""
        known = self._key_reads.get(id(group))
        if known is None:
            layout = group.of_type(group.key_type)
            read = self.read_of_key(layout)
            if read is None:
                raise TypeError(f"key group {group.pattern!r} is read in bulk (GroupReads)")
            known = self._key_reads[id(group)] = read, layout.max_depth
        read, max_depth = known
        if max_depth is not None:
            self.samples.add_labelled(MAX_DEPTH, match.queue, max_depth)
        return read(self, tally, key, match)

    @staticmethod
    def read_of_key(group: OneTypeGroup) -> KeyRead | None:
        """How a key of the group is read when its layout reads each key on its own: every
        item split by a label (split_by), its members marked (marker), every item's time
        (oldest.end: earliest), a stream consumer group's (stream_group). None: in bulk."""
        match group:
            case OrderedGroup() | HashGroup() if group.split_by is not None:
                return partial(Cycle._split, group=group, split=group.split_by)
            case OrderedGroup() if group.marker is not None:
                return partial(Cycle._marked, group=group, marker=group.marker)
            case OrderedGroup() if group.oldest and group.oldest.end == "earliest":
                return partial(Cycle._earliest, group=group, oldest=group.oldest)
            case StreamGroup() if group.stream_group is not None:
                return partial(Cycle._stream_group, group=group, consumers=group.stream_group)
        return None

    def typed_reads(self, tally: GroupTally, page: list[FoundKey]) -> list[Command]:
        """The keys of a group of several types: each one's TYPE, its reads following as the
        type it holds (KeyGroup.of_type)."""
        return [(("TYPE", found[0]), partial(self._read_as, tally, found), tally) for found in page]

    def _read_as(self, tally: GroupTally, found: FoundKey, reply: Any) -> list[Command]:
        """The reads of a key as the type its TYPE reply names."""
        group, key = tally.group, found[0]
        held = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
        if held == "none":  # gone since, or a queue named and empty: it reads 0
            held = group.types[0]
        key_type = next((name for name in group.types if name == held), None)
        if key_type is None:
            if tally.enumerated:  # a key exists, of another type
                tally.present(key)
            tally.failed(key, "wrong_type", f"a {held}")
            return []
        view = group.of_type(key_type)
        if not GroupReads.suits(view):
            return self.commands_for_key(tally, view, *found)
        reads = self._typed.get((id(tally), key_type))
        if reads is None:
            reads = self._typed[id(tally), key_type] = GroupReads(tally, self, view)
        counts = [self._one_read_of(reads, part, found, False) for part in reads.parts]
        return counts + [self._one_read_of(reads, part, found, True) for part in reads.reads]

    def _split(
        self,
        tally: GroupTally,
        key: bytes,
        match: KeyMatch,
        *,
        group: OrderedGroup | HashGroup,
        split: LabelFromItems,
    ) -> list[Command]:
        """Depth (and head age, due count) per label value read from each item. The key's
        depth comes first, so items beyond max_items still count, under __unread__."""
        labels = match.labels
        depth = 0

        def on_depth(reply: Any) -> None:
            nonlocal depth
            depth = int(reply)
            if depth and tally.enumerated:
                tally.present(key)

        last = split.max_items - 1
        read = {
            "list": script_read("LRANGE", 0, last),
            "zset": script_read("ZRANGE", 0, last, "WITHSCORES"),
            "hash": script_read("HVALS"),
        }[group.type]
        due_count = group.due if isinstance(group, ZsetGroup) else None
        due = None if due_count is None else BY_NAME[due_count.metric]
        due_limit = 0.0 if due_count is None else scores_now(self.now, due_count)
        keep_last = group.oldest is not None and group.oldest.end == "tail"
        keep_all = group.oldest is not None and group.oldest.end == "earliest"
        keeps = Selector(group.select.get(split.label, ["*"]))

        def on_items(reply: Any) -> None:
            items = listed_items(reply, scored=group.type == "zset")
            heads: dict[str, list[tuple[bytes | int, float | None]]] = {}
            unreadable = too_large = 0
            for item, score in items:
                if isinstance(item, int):  # its size: over max_item_bytes, left in Redis
                    too_large += 1
                value = split_value(split, item, score)
                if value is None and isinstance(item, int):
                    value = UNREAD  # counted as too large, not as unreadable
                elif value is None:
                    unreadable += 1
                    value = UNREAD
                elif not keeps(value):
                    continue
                item_labels = labels._replace(**{split.label: value})
                self._add_depth(tally, item_labels, 1.0)
                if due is not None and score is not None:
                    self.samples.add_labelled(
                        due, item_labels.for_metric(due), float(score < due_limit)
                    )
                if keep_all:
                    heads.setdefault(value, []).append((item, score))
                elif keep_last or value not in heads:
                    heads[value] = [(item, score)]
            unread = depth - len(items)
            if unread > 0:
                self._add_depth(tally, labels._replace(**{split.label: UNREAD}), unread)
                tally.failed(key, "items_unread", f"{unread} beyond max_items")
            if unreadable:
                tally.failed(key, "label_unreadable", f"{unreadable} item(s)")
            if too_large:
                tally.failed(key, "item_too_large", f"{too_large} item(s)")
            for name in keeps.names:  # a queue named in the selection reads 0 when it has none
                named = labels._replace(**{split.label: name})
                self._add_depth(tally, named, 0)
                if due is not None:
                    self.samples.add_labelled(due, named.for_metric(due), 0.0)
            new = sorted(value for value in keeps.left_out if value not in tally.unselected)
            tally.left_out(split.label, new)
            oldest = group.oldest
            if oldest is None:
                return
            for value, candidates in heads.items():
                self._earliest_age(
                    tally, key, oldest, labels._replace(**{split.label: value}), candidates
                )

        return [
            ((DEPTH_COMMAND[group.type], key), on_depth, tally),
            ((ITEM_READ, key, bound_each(read)), on_items, tally),
        ]

    def _earliest(
        self,
        tally: GroupTally,
        key: bytes,
        match: KeyMatch,
        *,
        group: OrderedGroup,
        oldest: OldestItem,
    ) -> list[Command]:
        """Depth, then (a key holding items) the earliest time among its first oldest.max_items
        items (oldest.end: earliest): for an order that is not by that time, as RQ's started
        registry, scored by each job's deadline, which its heartbeats move. A time kept where
        the item points (RQ's job hash) is read for each item, in one bounded read; the
        series' age is the largest of them (_ages). Items beyond are counted, not guessed."""
        labels = match.labels
        scored = group.type == "zset"
        last = oldest.max_items - 1
        read = (
            script_read("ZRANGE", 0, last, "WITHSCORES")
            if scored
            else script_read("LRANGE", 0, last)
        )
        depth = 0

        def on_depth(reply: Any) -> Command | None:
            """The items read only when there are some: an idle queue (most of RQ's started
            registries) costs its one count, as in a bulk read."""
            nonlocal depth
            depth = int(reply)
            self._add_depth(tally, labels, depth)
            if not depth:
                return None
            if tally.enumerated:
                tally.present(key)
            return (ITEM_READ, key, bound_each(read)), on_items, tally

        def on_items(reply: Any) -> list[Command]:
            items = listed_items(reply, scored)
            if depth > len(items):
                tally.failed(
                    key, "items_unchecked", f"{depth - len(items)} beyond oldest.max_items"
                )
            if oldest.time_in not in ("hash", "string"):
                self._earliest_age(tally, key, oldest, labels, items)
                return []
            kept: list[tuple[bytes, KeyMatch, Args]] = []
            for item, _ in items:
                try:
                    if isinstance(item, int):  # its size: over max_item_bytes, left in Redis
                        raise ItemError("item_too_large")
                    where = kept_where(oldest, match.captured, item)
                except Exception as error:  # hostile data may raise anything
                    _unreadable(tally, key, error)
                    continue
                kept.append((where[0], match, where[1]))
            if self.nodes is not None:  # each read on its own: handle follows ASK
                return [self.kept_time_read(tally, oldest, labels, *place[::2]) for place in kept]
            return [self._kept_times(tally, oldest, kept)] if kept else []

        return [((DEPTH_COMMAND[group.type], key), on_depth, tally)]

    def _marked(
        self,
        tally: GroupTally,
        key: bytes,
        match: KeyMatch,
        *,
        group: OrderedGroup,
        marker: MemberMarker,
    ) -> list[Command]:
        """Depth per state of a key whose members a key of their own may mark (marker: arq's
        running jobs): its counts (parts_of), its first max_items members, then one EXISTS per
        member's marker key, pipelined. When every reply is in, the marked members count in
        the marker's state and the rest in the group's, whose oldest item is the first
        unmarked member. A read that failed (counted on its key) leaves the key without series
        this cycle: a depth with its marked members left in would be made up."""
        labels = match.labels
        parts = parts_of(group, self.now)
        depth_part = next(part for part in parts if part.spec is DEPTH)
        if group.type == "list":
            read = script_read("LRANGE", 0, marker.max_items - 1)
        elif depth_part.bounds:  # a score window
            low, high = depth_part.bounds
            read = script_read(
                "ZRANGEBYSCORE", low, high, "LIMIT", 0, marker.max_items, "WITHSCORES"
            )
        else:
            read = script_read("ZRANGE", 0, marker.max_items - 1, "WITHSCORES")
        counts: dict[int, int] = {}  # per part (its position)
        members: list[tuple[bytes | int, float | None]] = []
        marked: set[int] = set()  # the positions of the members whose marker key exists
        waiting = len(parts) + 1  # replies still to come: the counts, the members, the EXISTS

        def replied() -> None:
            nonlocal waiting
            waiting -= 1
            if waiting == 0:
                finished()

        def on_count(at: int, reply: Any) -> None:
            counts[at] = int(reply)
            if tally.enumerated and counts[at] and parts[at].command in _TELLS_PRESENCE:
                tally.present(key)
            replied()

        def on_members(reply: Any) -> list[Command]:
            nonlocal waiting
            members.extend(listed_items(reply, scored=group.type == "zset"))
            checks: list[Command] = []
            unchecked = 0
            for at, (item, _) in enumerate(members):
                try:  # an int is its size: over max_item_bytes, left in Redis
                    named = None if isinstance(item, int) else item.decode()
                except UnicodeDecodeError:
                    named = None
                if named is None:  # no marker key can be named: counted in the group's state
                    unchecked += 1
                    continue
                marker_key = fill(marker.key, {**match.captured, "item": named}).encode()
                checks.append((("EXISTS", marker_key), partial(on_exists, at), tally))
            if unchecked:
                tally.failed(key, "items_unchecked", f"{unchecked} too large or not UTF-8")
            waiting += len(checks)
            replied()
            return checks

        def on_exists(at: int, reply: Any) -> None:
            if reply:
                marked.add(at)
            replied()

        def finished() -> None:
            depth = counts[parts.index(depth_part)]
            self._add_depth(tally, labels, max(depth - len(marked), 0))
            self._add_depth(tally, labels._replace(state=marker.state), len(marked))
            for at, part in enumerate(parts):
                if part.spec is not None and part is not depth_part:  # a due count
                    self.samples.add_labelled(part.spec, match.queue, counts[at])
            beyond = depth - len(members)
            if beyond > 0:
                tally.failed(key, "items_unchecked", f"{beyond} beyond marker.max_items")
            oldest = group.oldest
            head = next((m for at, m in enumerate(members) if at not in marked), None)
            if oldest is None or head is None:
                return
            item, score = head
            if isinstance(item, int):  # too large to read (counted): a score tells its time
                if oldest.time_in != "score":
                    return
                item = b""
            try:
                self._age(labels, item_time(oldest, item, score))
            except Exception as error:  # hostile data may raise anything
                tally.failed(key, exception_reason(error))

        commands: list[Command] = [
            ((part.command, key, *part.bounds), partial(on_count, at), tally)
            for at, part in enumerate(parts)
        ]
        return [*commands, ((ITEM_READ, key, bound_each(read)), on_members, tally)]

    def _stream_group(
        self, tally: GroupTally, key: bytes, match: KeyMatch, *, group: StreamGroup, consumers: str
    ) -> list[Command]:
        """A consumer group's lag (depth), pending entries (active) and oldest undelivered
        entry (its first after the group's last delivered id)."""
        wanted, labels = consumers.encode(), match.labels
        oldest = group.oldest

        def on_groups(reply: Any) -> Command | None:
            if tally.enumerated:  # answered: the stream exists
                tally.present(key)
            groups = (as_map(entry) for entry in reply)
            info = next((entry for entry in groups if entry.get(b"name") == wanted), None)
            if info is None:
                raise ItemError("stream_group_missing")
            lag = info.get(b"lag")
            if lag is None:  # Redis cannot tell (an entry XDELed, an id set): no depth made up
                tally.failed(key, "stream_lag_unknown")
            else:
                self._add_depth(tally, labels, float(lag))
            self._add_depth(
                tally, labels._replace(state="active"), float(info.get(b"pending") or 0)
            )
            if oldest is None:
                return None
            after = b"(" + info.get(b"last-delivered-id", b"0-0")
            read = (ITEM_READ, key, script_read("XRANGE", after, "+", "COUNT", 1))
            return read, lambda entries: self._age(labels, stream_head_time(entries)), tally

        return [(("XINFO", "GROUPS", key), on_groups, tally)]

    def _earliest_age(
        self,
        tally: GroupTally,
        key: bytes,
        oldest: OldestItem,
        labels: Labels,
        items: list[tuple[bytes | int, float | None]],
    ) -> None:
        """The age of the earliest of `items`' times; each item's time checked, failing alone
        (counted on its key)."""
        times: list[float] = []
        for item, score in items:
            if isinstance(item, int):  # too large to read (counted): a score tells its time
                if oldest.time_in != "score":
                    continue
                item = b""
            try:
                times.append(checked_time(item_time(oldest, item, score), self.latest))
            except Exception as error:  # hostile data may raise anything
                tally.failed(key, exception_reason(error))
        if times:
            self._add_age(labels, min(times))

    def _add_depth(self, tally: GroupTally, labels: Labels, depth: float) -> None:
        self.samples.table(DEPTH)  # the family's place among the samples, as it was met
        previous = tally.series.get(labels)
        tally.series[labels] = depth if previous is None else DEPTH.combined(previous, depth)

    def _age(self, labels: Labels, item_time: float | None) -> None:
        """The age of a head item's time; a time before 1970 or ahead of `latest` raises
        ItemError time_out_of_range (counted on its key by the caller)."""
        if item_time is not None:
            self._add_age(labels, checked_time(item_time, self.latest))

    def _add_age(self, labels: Labels, checked: float) -> None:
        self.samples.add_labelled(OLDEST_AGE, labels, max(0.0, self.now - checked))

    def kept_time_read(
        self, tally: GroupTally, oldest: OldestItem, labels: Labels, key: bytes, read: Args
    ) -> Command:
        """The read of the time a head item's hash field or string key keeps (the item names
        it, kept_where: RQ's, BullMQ's and Bull's job ids)."""

        def on_time(reply: Any) -> None:
            self._age(labels, kept_time(oldest, reply))

        return (ITEM_READ, key, read), on_time, tally

    def _kept_times(
        self, tally: GroupTally, oldest: OldestItem, reads: list[tuple[bytes, KeyMatch, Args]]
    ) -> Command:
        """One command reading the times a group's head items name (one bounded_reads), and
        its handler: each time an age, each read failing alone as in handle. A bull cycle at
        10k queues cost 1.19-1.28x its floor's CPU this way, 1.26-1.38x with a command and a
        handler per read (docs/benchmarks.md)."""
        keys = [key for key, _, _ in reads]
        args = bounded_reads(keys, [read for _, _, read in reads], self.max_item_bytes)
        time_of = partial(kept_time, oldest)

        def read_again(read: tuple[bytes, KeyMatch, Args]) -> Command:
            return self.kept_time_read(tally, oldest, read[1].labels, read[0], read[2])

        def on_times(replies: Any) -> list[Command]:
            return self._ages(tally, reads, replies, time_of, read_again)

        return args, on_times, tally

    # -- the replies of commands: failures, and what they ask for ---------------------------

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
        self, node: str, commands: list[Command], runs: list[Run], error: redis.RedisError
    ) -> None:
        detail = f"node {node}: {redis_error_reason(error)}"
        for args, _, tally in commands:
            self.lose_group(tally, key_of(args), detail)
        for reads, keys in runs:
            self.lose_group(reads.tally, keys[0][0], detail)

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
                if reason == "wrong_type" and tally.enumerated and args[0] in _TELLS_PRESENCE:
                    tally.present(key_of(args))  # a key of another type exists
                if self.nodes is not None and self.nodes.noticed(reply):
                    # the key is served elsewhere now: its series would be a partial sum
                    self.lose_group(tally, key_of(args), str(reply)[:80], reason)
                elif args[0] == "TYPE" and (id(tally), key_of(args)) in self._wrong_typed:
                    tally.failed(key_of(args), "wrong_type")  # its type not read: unnamed
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
            if isinstance(follow_up, list):  # a batch's (_kept_times, the bulk loops)
                yield from follow_up
            elif follow_up is not None:
                yield follow_up

    def wrong_type(self, tally: GroupTally, key: bytes) -> Iterator[Command]:
        """A key of another type than its group's: its TYPE is read, so that the failure names
        the type found. Read only after a WRONGTYPE reply (rare), once per group and key."""
        if (id(tally), key) in self._wrong_typed:
            return
        self._wrong_typed.add((id(tally), key))

        def on_type(reply: Any) -> None:
            found = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
            tally.failed(key, "wrong_type", "deleted since" if found == "none" else f"a {found}")

        yield ("TYPE", key), on_type, tally

    def _too_large(self, tally: GroupTally, key: bytes, size: int) -> None:
        """An item over max_item_bytes, measured in Redis: its head is probed next cycle."""
        self.learned.large_heads.add(key)
        tally.failed(key, "item_too_large", f"{size} bytes")

    # -- the bulk loops ----------------------------------------------------------------------

    def handle_runs(self, runs: list[Run], direct: list[Any], heads: list[Any]) -> list[Command]:
        """The replies of a round's keys read in bulk, in the order GroupReads.commands sent
        them: a loop per part's counts, then per part's first items.

        Samples go into rows (Rows), a row per key and no call per sample: these loops run
        once per key. Cycle.finish adds them into their tables, combined as their specs say
        (depths add up, ages and limits keep the largest: checked where this module is
        loaded). A reply that gave no value is handed to handle as the one command it is
        (_one_read_of), which names its failure or on a cluster follows its ASK or MOVED."""
        again: list[Command] = []
        for spec in (DEPTH, OLDEST_AGE, MAX_DEPTH):  # each family read in bulk is in
            self.samples.table(spec)  # the samples, empty if no key gave one of it
        at = heads_at = 0
        for reads, run in runs:
            count = len(run)
            for part in reads.parts:
                again += self._counts(reads, part, run, direct[at : at + count])
                at += count
            for part in reads.reads:
                again += self._heads(reads, part, run, heads[heads_at : heads_at + count])
                heads_at += count
        if (at, heads_at) != (len(direct), len(heads)):
            raise RuntimeError(f"{len(direct)} + {len(heads)} replies for {at} + {heads_at} reads")
        return again

    def _one_read_of(self, reads: GroupReads, part: Part, found: FoundKey, head: bool) -> Command:
        """One read of a key read in bulk (a part's count, or its first item's read) as a
        command of its own, for a reply that gave no value: handle names the failure, or
        follows it; the reply that then comes goes through the bulk loop as a run of one key."""
        key = found[0]
        if head:
            read = part.probe if key in self.before.large_heads else part.read
            args: Args = (ITEM_READ, key, read)
        else:
            args = (part.command, key, *part.bounds)
        loop = self._heads if head else self._counts
        return args, lambda reply: loop(reads, part, [found], [reply]), reads.tally

    def _counts(
        self, reads: GroupReads, part: Part, run: list[FoundKey], replies: list[Any]
    ) -> list[Command]:
        """A run's counts of one part into their rows: depths per series (the group's own:
        _add_depths), due counts per (system, queue). A key built from values whose count tells
        it exists (_TELLS_PRESENCE) counts as found. With the first part come the queues'
        limits (max_depth)."""
        tally, spec, priority = reads.tally, part.spec, part.priority
        again: list[Command] = []
        by_series = spec is DEPTH
        if spec is None:  # read to tell presence only: its counts go nowhere
            rows = Rows(DEPTH, {})
        else:
            rows = self._rows_of(spec, tally.series if by_series else self.samples.table(spec))
        if reads.max_depth is not None and part is reads.parts[0]:
            limits = self._rows_of(MAX_DEPTH, self.samples.table(MAX_DEPTH))
            limits.add_each([queue for _, (_, _, queue) in run], reads.max_depth)
        tells = reads.built and part.command in _TELLS_PRESENCE
        row_of, value_of = rows.labels.append, rows.values.append
        for found, count in zip(run, replies, strict=True):
            key, (_, labels, queue) = found
            if type(count) is not int:
                if isinstance(count, redis.ResponseError):
                    again += self.handle([self._one_read_of(reads, part, found, False)], [count])
                else:
                    tally.failed(key, "response_error", type(count).__name__)
                continue
            if priority is not None:
                labels = labels._replace(priority=priority)
            row_of(labels if by_series else queue)  # a due count's
            value_of(count)
            if tells and count:
                tally.present(key)
            elif tells and part.command == "XLEN":  # a stream may exist empty
                again.append(self._exists(tally, key))
        return again

    def _rows_of(self, spec: MetricSpec, table: dict[Any, float]) -> Rows:
        """The rows that go to `table` (of `spec`) once the reads are done."""
        rows = self._rows.get(id(table))
        if rows is None:
            rows = self._rows[id(table)] = Rows(spec, table)
        return rows

    def _exists(self, tally: GroupTally, key: bytes) -> Command:
        def on_exists(reply: Any) -> None:
            if reply:
                tally.present(key)

        return ("EXISTS", key), on_exists, tally

    def _heads(
        self, reads: GroupReads, part: Part, run: list[FoundKey], replies: list[Any]
    ) -> list[Command]:
        """A run's reads of one part's first items: each an age, or (its time kept where the
        item points) the read of that time: all of a run's in one command on one server, a
        read each on a cluster (which follows ASK: handle)."""
        if part.priority is not None:  # a band's series
            run = [
                (key, KeyMatch(captured, labels._replace(priority=part.priority), queue))
                for key, (captured, labels, queue) in run
            ]
        read_again = partial(self._one_read_of, reads, part, head=True)
        tally = reads.tally
        if reads.time_of is not None:
            return self._ages(tally, run, replies, reads.time_of, read_again)
        kept_in = reads.kept_in
        assert kept_in is not None
        again: list[Command] = []
        kept: list[tuple[bytes, KeyMatch, Args]] = []
        known_places, places, on_cluster = reads.places_before, reads.places, self.nodes is not None
        for found, head in zip(run, replies, strict=True):
            if head is None:  # an empty queue
                continue
            key, match = found
            if type(head) is int or isinstance(head, redis.ResponseError):
                again += self.handle([read_again(found)], [head])
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
                again.append(self.kept_time_read(tally, kept_in, match[1], *where))
            else:
                kept.append((where[0], match, where[1]))
        return [*again, self._kept_times(tally, kept_in, kept)] if kept else again

    def _ages(
        self,
        tally: GroupTally,
        reads: Sequence[tuple[Any, ...]],
        replies: list[Any],
        time_of: Callable[[Any], float | None],
        read_again: Callable[[Any], Command],
    ) -> list[Command]:
        """Bounded reads' replies, each the time of an item (`time_of`; None: an empty queue)
        as an age into its rows; a read that gave no value goes to handle on its own
        (`read_again`), hostile data is counted on its key. Each read is (key, KeyMatch, ...)."""
        again: list[Command] = []
        now, latest = self.now, self.latest
        rows = self._rows_of(OLDEST_AGE, self.samples.table(OLDEST_AGE))
        row_of, value_of = rows.labels.append, rows.values.append
        for read, reply in zip(reads, replies, strict=True):
            if type(reply) is int or isinstance(reply, redis.ResponseError):
                again += self.handle([read_again(read)], [reply])
                continue
            try:
                at = time_of(reply)
                if at is not None and not 0.0 <= at <= latest:  # valid times taken inline
                    at = checked_time(at, latest)  # raises: refused, counted on its key
            except Exception as error:  # hostile data may raise anything
                _unreadable(tally, read[0], error)
                continue
            if at is None:  # the queue is empty
                continue
            age = now - at
            row_of(read[1][1])  # its labels
            value_of(age if age > 0.0 else 0.0)  # a time ahead of this clock is no wait
        return again

    def lose_group(
        self, tally: GroupTally, key: bytes, detail: str, reason: str = "node_down"
    ) -> None:
        if id(tally) not in self.lost_groups:
            self.lost_groups.add(id(tally))
            tally.failed(key, reason, detail)

    def finish(self) -> None:
        """Once every read of the cycle is handled: the bulk loops' rows into their tables, the
        groups' depths into the samples, then the series of the groups that lost a cluster node
        withdrawn. Each table's rows go once added (a second call adds nothing twice): kept
        to the end of sample() they held 60-80 MiB more at 1M keys (tracemalloc, a simulated
        cycle of depths, ages and limits)."""
        while self._rows:
            self._rows.popitem()[1].add_into_table()
        self._add_depths()
        self._withdraw_lost_groups()

    def _add_depths(self) -> None:
        """Each group's depths (GroupTally.series) into the depth table, summed where groups
        share a series: per key a group writes its own table only, where it wrote both the
        depth table and its series, one dict write a key less. At 100k keys the cycle's own
        CPU was 1.67x the floor's this way, 1.73x writing both (bench/key_sampling_split.py
        --before, docs/benchmarks.md)."""
        for tally in self.tallies:
            if not tally.series:
                continue
            table = self.samples.table(DEPTH)
            if not table or table.keys().isdisjoint(tally.series):  # no series of another's
                table.update(cast("dict[tuple[str, ...], float]", tally.series))  # one copy, in C
                continue
            for labels, depth in tally.series.items():
                previous = table.get(labels)
                table[labels] = depth if previous is None else DEPTH.combined(previous, depth)

    def _withdraw_lost_groups(self) -> None:
        """A group some of whose keys sat on a cluster node that did not answer: its series
        would be partial sums, so none of them is served this cycle."""
        for tally in (tally for tally in self.tallies if id(tally) in self.lost_groups):
            for spec in (DEPTH, OLDEST_AGE):
                self.samples.discard(spec, tally.series)
            tally.series.clear()


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
