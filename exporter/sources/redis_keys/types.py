"""The types every part of the key sampler shares, at the bottom of its imports: a queue
series' labels, what a key gives, a command and its reply handler, and a key group's tally of
one cycle. The commands (sources/redis_keys/commands.py), the rounds that send them (sources/redis_keys/rounds.py) and the
sampler (sources/redis_keys/sampler.py) import these; this module imports none of them.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

from exporter.core.logs import LogLimiter
from exporter.output.catalog import QUEUE_LABELS, MetricSpec
from exporter.output.health import KeyGroupReport
from exporter.sources.redis_keys.groups import KeyGroup
from exporter.sources.source import SourceReport

# How many matched keys and series a KeyGroupReport names as examples.
EXAMPLES = 5

# What each error reason means, for the log and the status page.
REASON_WORDS = {
    "wrong_type": "holds another Redis type than the group's",
    "response_error": "Redis refused the read",
    "item_not_json": "the head item is not JSON",
    "time_missing": "the head item carries no time",
    "time_unparsable": "the head item's time does not parse",
    "time_out_of_range": "the head item's time lies before 1970 or ahead of this clock by more "
    "than the skew tolerated (300 s): no age is made of it",
    "item_not_utf8": "the head item names a hash but is not UTF-8",
    "item_too_deep": "the head item is nested too deep to read",
    "item_unreadable": "reading the head item failed",
    "item_too_large": "the head item is larger than max_item_bytes, its time is not read",
    "stream_missing": "the stream does not exist",
    "stream_group_missing": "the stream has no such consumer group",
    "stream_lag_unknown": "Redis cannot tell the consumer group's lag (an entry deleted with "
    "XDEL, or its last id set by XGROUP SETID): its waiting depth is not served",
    "items_unread": "holds more items than split_by.max_items; the rest count as __unread__",
    "items_unchecked": "holds members whose marker key was not checked (beyond "
    "marker.max_items, too large or not UTF-8): they count in the group's state",
    "unlisted_queue": "looks like a queue of the group (its first member names a look_alikes "
    "member_key that exists) but is none of its queues: not counted; list it (the preset's "
    "queues param) if it is one",
    "look_alikes_unchecked": "keys left out beyond look_alikes.max_keys, not checked",
    "look_alikes_unread": "the look for keys that look like the group's queues failed",
    "label_unreadable": "items without the split_by field count as __unread__",
    "slot_moved": "its cluster slot moved or is not served (MOVED, CLUSTERDOWN, TRYAGAIN, or ASK "
    "to an unknown node): "
    "the group's series are withdrawn this cycle and the slot map is read again",
    "node_down": "the cluster node holding it did not answer: the group's series are withdrawn "
    "this cycle",
    "too_many_keys": "the key groups together found more keys than max_keys: this group read "
    "its part (all it found up to a level even for the groups that found more), not the rest",
    "too_many_members": "the set names more queues than max_keys: its other members are not "
    "read (raise max_keys together with the memory limit, docs/security.md)",
    "too_many_values": "more keys name the group's queues than max_keys: the others are not "
    "taken (raise max_keys together with the memory limit, docs/security.md)",
}


class Labels(NamedTuple):
    """A queue series' labels, in catalog.QUEUE_LABELS order (so the tuple is the series key)."""

    system: str
    queue: str
    priority: str
    state: str

    def for_metric(self, spec: MetricSpec) -> tuple[str, ...]:
        return self if spec.labels == QUEUE_LABELS else (self.system, self.queue)


# Labels doubles as the series key, and for_metric() knows only the queue's two label sets.
if Labels._fields != QUEUE_LABELS:
    raise RuntimeError(f"key_types.Labels {Labels._fields} differ from catalog {QUEUE_LABELS}")


class KeyMatch(NamedTuple):
    """What a key gives: its placeholders' values, its series' labels, and its queue (system,
    queue: the labels of its due count and limit, made once, not per key and cycle)."""

    captured: dict[str, str]
    labels: Labels
    queue: tuple[str, str]


# A key a group found (scanned, or built from values), and what it gives.
FoundKey = tuple[bytes, KeyMatch]
# The key groups (positions among a SCAN's groups) that take a key, and what it gives each.
Route = tuple[tuple[int, FoundKey], ...]


def key_match(group: KeyGroup, captured: dict[str, str]) -> KeyMatch:
    """What a key of the group gives, from its placeholders' values."""
    queue = captured.get("queue") or group.labels.get("queue", "")
    priority = captured.get("priority") or group.labels.get("priority", "")
    return KeyMatch(
        captured, Labels(group.system, queue, priority, group.state), (group.system, queue)
    )


class GroupTally:
    """What one key group met during one cycle; becomes its KeyGroupReport and the errors it
    counts in the cycle's SourceReport."""

    def __init__(self, group: KeyGroup, source: str, warnings: LogLimiter):
        self.group = group
        self.source = source
        self.warnings = warnings
        self.keys = 0  # keys found: scanned, or built from values and present
        self.named = 0  # keys built from values, present or not (their queues read 0 if not)
        self.enumerated = group.enumerated  # its keys built from values: asked once a cycle
        self.example_keys: list[bytes] = []
        self.failed_keys: list[tuple[str, bytes]] = []  # the first few (reason, key)
        # its series and their depths summed, added into the cycle's samples once it is done
        # (Cycle.finish); a dict: the first ones found are the examples
        self.series: dict[Labels, float] = {}
        self.errors: Counter[str] = Counter()  # by reason: keys, or keys not read
        # queue_exporter_source_errors_total's increments by reason: a key each, but once a
        # cycle for too_many_keys (however many keys went unread)
        self.counted: Counter[str] = Counter()
        self.last_warning: str | None = None
        self.unselected: list[str] = []  # values found in Redis that `select` left out
        self._failed: set[tuple[bytes, str]] = set()

    def matched(self, page: list[FoundKey]) -> None:
        """Count a page of keys the group matched; the first ones are its examples."""
        if self.keys < EXAMPLES:
            self.example_keys += [key for key, _ in page[: EXAMPLES - self.keys]]
        self.keys += len(page)

    def built(self, page: list[FoundKey]) -> None:
        """Count a page of keys built from known values: which exist, their reads tell."""
        self.named += len(page)

    def present(self, key: bytes) -> None:
        """A key built from known values exists (a read of it said so): a key found."""
        if self.keys < EXAMPLES:
            self.example_keys.append(key)
        self.keys += 1

    def failed(self, key: bytes, reason: str, detail: str = "") -> None:
        """Count and name a key the group could not read (rate-limited per group and reason).

        Once per key and reason in a cycle: a zset in a list group fails both its LLEN and its
        LINDEX, and that is one key of the wrong type."""
        if (key, reason) in self._failed:
            return
        self._failed.add((key, reason))
        self.errors[reason] += 1
        if len(self.failed_keys) < EXAMPLES:
            self.failed_keys.append((reason, key))
        self.counted[reason] += 1
        words = REASON_WORDS.get(reason, reason) + (f" ({detail})" if detail else "")
        self.warn(reason, f"key {text(key)[:200]!r}: {words}")

    def over_limit(self, unread: int, limit: int) -> None:
        """Count (once a cycle) and name the keys the group did not read: the groups together
        found more than the source's max_keys, `limit` (sources/redis_keys/room.py)."""
        self.errors["too_many_keys"] += unread
        self.counted["too_many_keys"] += 1
        self.warn(
            "too_many_keys",
            f"{unread} key(s) not read: the key groups found more than max_keys ({limit}) "
            "together, this one read its part (raise max_keys together with the memory limit, "
            "docs/security.md)",
        )

    def left_out(self, name: str, values: list[str]) -> None:
        """Values of placeholder `name` found in Redis that the group's `select` leaves out:
        queues that exist and are not counted, said rather than silently missed."""
        if not values:
            return
        self.unselected += values
        shown = ", ".join(repr(value[:100]) for value in values[:EXAMPLES])
        more = f" and {len(values) - EXAMPLES} more" if len(values) > EXAMPLES else ""
        self.warn(
            "not_selected",
            f"{name} values found in Redis but not selected, not counted: {shown}{more} (add "
            "them to the selection, e.g. the preset's queues param, or '*' for every one found)",
        )

    def warn(self, reason: str, problem: str) -> None:
        group = self.group
        self.last_warning = problem
        self.warnings.warning(
            (group.pattern, reason),
            "key group %r (system %s, %s): %s [%s]",
            group.pattern,
            group.system,
            group.type_name,
            problem,
            reason,
        )

    def count_into(self, report: SourceReport) -> None:
        """Add the errors the group counted this cycle to the cycle's report."""
        group = self.group
        for reason, count in self.counted.items():
            report.count_error(reason, count, group.system, group.pattern)

    def report(self) -> KeyGroupReport:
        group = self.group
        return KeyGroupReport(
            source=self.source,
            system=group.system,
            pattern=group.pattern,
            type=group.type_name,
            keys_matched=self.keys,
            keys_named=self.named,
            queues=len({labels.queue for labels in self.series}),
            series=len(self.series),
            errors=dict(self.errors),
            last_warning=self.last_warning,
            example_keys=tuple(text(key) for key in self.example_keys),
            failed_keys=tuple((reason, text(key)) for reason, key in self.failed_keys),
            unselected=tuple(self.unselected),
            example_series=tuple(itertools.islice(self.series, EXAMPLES)),
        )


OnReply = Callable[[Any], "Command | list[Command] | None"]  # a list: a batch's
# A command to pipeline, what its reply means (possibly a follow-up command) and the key group
# it reads for: a follow-up, or a read of split_by's and consumer groups' keys (the others are
# read in bulk: key_commands.GroupReads). A plain tuple: on a cluster a head item's time is
# read one command per key.
Command = tuple[tuple[Any, ...], OnReply, GroupTally]

# Marks a command sent again to the node an ASK reply named: (ASKED, (node name, client), args).
ASKED = object()

# Marks a read whose reply is one queue item (a head item, the hash field it names, a stream
# entry): its arguments are (ITEM_READ, key, script_read(...)). Item reads travel in one
# bounded_reads per round, so an item over max_item_bytes stays in Redis.
ITEM_READ = object()


def key_of(args: tuple[Any, ...]) -> bytes:
    """The key a command reads (XINFO GROUPS names it second, a one-key EVAL_RO third; a
    command sent after an ASK wraps the command)."""
    if args[0] is ASKED:
        return key_of(args[2])
    key = args[2] if args[0] == "XINFO" else args[3] if args[0] == "EVAL_RO" else args[1]
    return key if isinstance(key, bytes) else str(key).encode()


def text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
