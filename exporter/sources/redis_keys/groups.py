"""Key groups: the data that says which Redis keys hold a queue and how to read them.

A key group is a key pattern with named placeholders that become labels
(``orchestrata:queue:{queue}:p{priority}``), the key's type, the state its items are in,
and optionally how to read the time of the item at the head of the queue. ``{{`` and ``}}``
are literal braces, as in Python's format strings: a Redis Cluster hash tag in a pattern
(BullMQ's ``prefix: '{bull}'`` is ``{{bull}}:{queue}:wait``). Presets are
lists of key groups; operators write their own in the same form.

A group is read as the layout of its type (ListGroup, ZsetGroup, SetGroup, HashGroup,
StreamGroup; SeveralTypesGroup for a list of types): each declares the options that apply to
its type, so an option of another type is refused by name, and its validators hold only the
checks between its options.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from exporter.core.item_time import TimeFormat
from exporter.core.models import StrictModel
from exporter.output.catalog import STATES

KeyType = Literal["list", "zset", "set", "hash", "stream"]
State = Literal["pending", "active", "scheduled", "retry", "dead_letter", "completed", "failed"]
if set(STATES) != set(get_args(State)):
    raise RuntimeError(f"key_groups.State {get_args(State)} differ from catalog.STATES {STATES}")

LABEL_PLACEHOLDERS = ("queue", "priority")
# A placeholder, or a doubled brace (a literal one).
_TOKEN = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")
_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


class OldestItem(StrictModel):
    """Where the time of the item at the head of the queue is kept."""

    end: Literal["head", "tail", "earliest"] = Field(
        "head",
        description="lists: head = index 0, tail = index -1 (RPUSH+LPOP producers serve the "
        "head, LPUSH+RPOP ones the tail); zsets: head = lowest score, tail = highest; "
        "earliest: the earliest time among the first max_items items, for an order that is "
        "not by that time (RQ's started registry, scored by deadline; split_by's hash values)",
    )
    time_in: Literal["score", "item", "prefix", "json", "hash", "string", "stream_id", "signed"] = (
        Field(
            description="score: the zset score is the time; item: the item itself is a time; "
            "prefix: the item's first 8 bytes, a big-endian unsigned integer (PriorityRedisHuey's "
            "enqueue time in microseconds: divisor 1000000); "
            "json: a field of the item's JSON; hash: a field of a hash the item names; string: "
            "json_field of the JSON string key the item names; stream_id: the entry id's "
            "millisecond part; signed: the time a Django signing.dumps token (<payload>:<time>:"
            "<signature>, django-q2's queued tasks) was signed, its base-62 seconds read without "
            "the payload"
        )
    )
    field: str | None = Field(None, description="JSON field or hash field holding the time")
    json_after: str | None = Field(
        None, description="the JSON starts after the first occurrence of this separator"
    )
    hash_key: str | None = Field(
        None, description="hash key pattern; {item} is the item, other placeholders the labels"
    )
    string_key: str | None = Field(
        None, description="time_in string: the key pattern; {item} is the item (SAQ's job ids)"
    )
    item_until: str | None = Field(
        None,
        min_length=1,
        description="time_in hash or string: {item} is the item up to this separator (RQ 2+ "
        "keeps <job id>:<execution id> in its started registry, a job id holding no colon)",
    )
    json_field: str | None = Field(
        None,
        description="time_in hash: the hash field's value is JSON and this field of it holds "
        "the time; time_in string: the field of the key's JSON (a.b: field b of object a)",
    )
    format: TimeFormat = Field(
        "auto", description="auto: numbers above 1e11 are ms, else s; strings ISO-8601"
    )
    divisor: float = Field(1.0, gt=0, description="the stored number is divided by this first")
    max_items: int = Field(
        1000,
        ge=1,
        description="end: earliest: items whose time is read per key and cycle (one read "
        "each where the time is kept apart); the rest are counted as items_unchecked",
    )
    on_missing: Literal["count", "skip"] = Field(
        "count",
        description="time_in hash and string: a time absent, null or 0 (not written yet); "
        "count: also counted as an error (reason time_missing); skip: expected, no age from "
        "that item (SAQ writes an active job's `started` once its worker took it)",
    )

    @model_validator(mode="after")
    def _fields_for_source(self) -> OldestItem:
        if self.time_in in ("json", "hash") and not self.field:
            raise ValueError(f"time_in: {self.time_in} needs 'field'")
        if self.time_in == "hash" and not self.hash_key:
            raise ValueError("time_in: hash needs 'hash_key'")
        if self.hash_key and "{item}" not in self.hash_key + (self.field or ""):
            raise ValueError("hash_key or field must contain {item}")
        if self.item_until is not None and self.time_in not in ("hash", "string"):
            raise ValueError("item_until applies to time_in: hash and string only")
        if self.json_field is not None and self.time_in not in ("hash", "string"):
            raise ValueError("json_field applies to time_in: hash and string only")
        if self.time_in == "string" and (not self.string_key or not self.json_field):
            raise ValueError("time_in: string needs 'string_key' and 'json_field'")
        if self.string_key and "{item}" not in self.string_key:
            raise ValueError("string_key must contain {item}")
        if self.on_missing == "skip" and self.time_in not in ("hash", "string"):
            raise ValueError("on_missing: skip applies to time_in: hash and string only")
        return self


class DueCount(StrictModel):
    """Count the zset members whose score (a time) is already past."""

    metric: Literal["queue_leases_expired", "queue_scheduled_due"] = Field(
        description="the gauge the count goes to"
    )
    unit: Literal["s", "ms"] = Field("s", description="the unit of the scores")
    divisor: float = Field(1.0, gt=0, description="scores are divided by this first")


class ScoreWindow(StrictModel):
    """Count only the zset members whose score (a time) is already past, or only those still
    ahead (arq keeps the jobs ready to run and the deferred ones in one zset scored by the time
    each may run)."""

    window: Literal["due", "ahead", "positive"] = Field(
        description="due: scores up to now (inclusive); ahead: scores after now; positive: "
        "scores above 0 (SAQ scores its queued and active jobs 0, scheduled ones by their time)"
    )
    unit: Literal["s", "ms"] = Field("s", description="the unit of the scores")
    divisor: float = Field(1.0, gt=0, description="scores are divided by this first")


class PriorityBands(StrictModel):
    """Split a zset's depth by priority: priority = floor(score / width)."""

    width: float = Field(gt=0, description="score width of one priority band")
    names: dict[int, str] = Field(min_length=1, description="band number -> priority label")


class SetMembers(StrictModel):
    """Take a placeholder's values from a Redis set (RQ's rq:queues, Sidekiq's queues), or from
    every set whose key matches a pattern (kombu's `_kombu.binding.{_exchange}`, one per
    exchange, whose members name the queues bound to it)."""

    key: str = Field(
        description="the set's key; with {_name} wildcards, every set SCAN finds that matches it"
    )
    member: str = Field(
        "{value}",
        description="member format: {value} is the placeholder value, {_name} a wildcard part "
        "(may be empty); members of another form are not values",
    )
    type: Literal["set", "zset"] = Field(
        "set", description="zset: the members of a sorted set (Dramatiq's worker heartbeats)"
    )

    @model_validator(mode="after")
    def _wildcards_only(self) -> SetMembers:
        if placeholders(self.member).count("value") != 1:
            raise ValueError(f"member {self.member!r} needs exactly one {{value}}")
        for where, pattern in (("key", self.key), ("member", self.member)):
            named = [name for name in placeholders(pattern) if not name.startswith("_")]
            if named and not (where == "member" and named == ["value"]):
                raise ValueError(f"{where} {pattern!r}: only {{_name}} wildcards may appear")
        return self


class LabelFromItems(StrictModel):
    """Split one key's items among label values read from each item (Sidekiq's retry, dead and
    schedule sets hold the jobs of every queue; the queue is a field of each member's JSON), or
    from each zset member's score (PriorityRedisHuey scores a task by its priority, negated)."""

    label: Literal["queue", "priority"] = Field(description="the label the value goes to")
    field: str | None = Field(
        None, min_length=1, description="the JSON field of each item holding the value"
    )
    score: Literal["as_is", "negated"] | None = Field(
        None,
        description="zsets, instead of a field: the value is each member's score (negated: "
        "its sign turned), an integer written without a fraction",
    )
    max_items: int = Field(
        10000,
        ge=1,
        description="items read per key and cycle (Sidekiq keeps at most 10,000 dead jobs); "
        "the rest count under the label value __unread__",
    )

    @model_validator(mode="after")
    def _one_source(self) -> LabelFromItems:
        if (self.field is None) == (self.score is None):
            raise ValueError("split_by takes its value from a field or from the score: one")
        return self


class MemberMarker(StrictModel):
    """Members whose own key exists are in another state than the group's: arq keeps a running
    job in its queue's zset and marks it with an `arq:in-progress:<job id>` key."""

    key: str = Field(
        min_length=1,
        description="the marker key's pattern: {item} is the member, other placeholders the "
        "key's labels (as hash_key)",
    )
    state: State = Field(description="the state of the members whose marker key exists")
    max_items: int = Field(
        1000,
        ge=1,
        description="members checked per key and cycle, one EXISTS each (pipelined), from the "
        "head (a zset's lowest scores: arq's workers take those first, so its running jobs "
        "are there); the rest count in the group's state, counted as items_unchecked",
    )


class LookAlikes(StrictModel):
    """Keys the group's values leave out that look like its queues, named (never counted): of
    its type and pattern, their first member naming a key that exists (arq's job ids, each
    with an arq:job:<id> key). Looking so does not make a key a queue (arq's own arq:abort
    holds job ids too; an app may keep some in a zset), so each is named for listing, as
    unlisted_queue, on the status page and by check-config."""

    member_key: str = Field(
        min_length=1, description="the key a queue's first member names: {member} is the member"
    )
    exclude: list[str] = Field(
        default_factory=list, description="keys that look like queues and are not (arq:abort)"
    )
    max_keys: int = Field(
        100,
        ge=1,
        description="keys left out checked per cycle (a first member read and an EXISTS each, "
        "pipelined); the rest are counted as look_alikes_unchecked",
    )

    @model_validator(mode="after")
    def _member_placeholder(self) -> LookAlikes:
        if placeholders(self.member_key) != ["member"]:
            raise ValueError("member_key needs exactly one {member} and no other placeholder")
        return self


class TypeReads(StrictModel):
    """How a key group of several types reads its keys of one type: the options that apply to
    that type alone (PriorityRedisHuey's zset members carry their enqueue time, RedisHuey's
    list items do not)."""

    oldest: OldestItem | None = None
    due: DueCount | None = None
    scores: ScoreWindow | None = None
    priority_bands: PriorityBands | None = None
    split_by: LabelFromItems | None = None
    stream_group: str | None = None


# The reading options, as each layout below that takes one declares it: a layout leaves out
# the options that cannot apply to its type, and the model refuses them by name.
SplitBy = Annotated[
    LabelFromItems | None,
    Field(description="read every item and split the depth by a label value inside it"),
]
Oldest = Annotated[OldestItem | None, Field(description="the age of the oldest item")]
Due = Annotated[DueCount | None, Field(description="a count of the members already due")]
Scores = Annotated[
    ScoreWindow | None,
    Field(description="depth (and head) of the members due by now, or still ahead"),
]
Bands = Annotated[PriorityBands | None, Field(description="the depth split by score bands")]
Marker = Annotated[
    MemberMarker | None,
    Field(
        description="members marked by a key of their own count in the marker's state; the "
        "oldest item is the first unmarked one"
    ),
]
LookAlikesRule = Annotated[
    LookAlikes | None,
    Field(
        description="groups whose keys are built from values: name the keys of its type and "
        "pattern they leave out whose first member names a member_key (one SCAN ... TYPE a "
        "cycle)"
    ),
]


class KeyGroup(StrictModel):
    """What every key group has: its keys (a pattern, the values of its placeholders), their
    type, the state and labels of their items. A group is one of the layouts below, told
    apart by its type (AnyKeyGroup): each adds the reading options that apply to it."""

    system: str = Field(min_length=1, description="the system label")
    pattern: str = Field(
        min_length=1,
        description="key pattern; {queue} and {priority} become labels, {_name} is a wildcard, "
        "{{ and }} are literal braces (a hash tag: {{bull}}:{queue}:wait)",
    )
    type: KeyType | list[KeyType] = Field(
        description="the Redis type of the keys; a list: keys of any of those types, each read "
        "as the type it holds (its TYPE asked first: one more command per key, one more round "
        "trip per cycle), as Huey's queue is a list under RedisHuey and a zset under "
        "PriorityRedisHuey"
    )
    state: State = Field(description="the state label of the items the keys hold")
    labels: dict[str, str] = Field(default_factory=dict, description="static queue/priority labels")
    values: dict[str, list[str]] = Field(
        default_factory=dict,
        description="enumerate a placeholder instead of scanning for it; given with "
        "values_from_set or values_from_keys too, the placeholder takes the values of all",
    )
    values_from_set: dict[str, SetMembers] = Field(
        default_factory=dict,
        description="take a placeholder's values from a Redis set: {key, member}; key may hold "
        "{_name} wildcards (every set SCAN finds, as kombu's _kombu.binding.{_exchange}), member "
        "is each member's form with {value} and {_name} parts "
        "({_routing_key}\\x06\\x16{_pattern}\\x06\\x16{value})",
    )
    values_from_keys: dict[str, str | list[str]] = Field(
        default_factory=dict,
        description="take a placeholder's values from the keys matching a pattern with {value} "
        "(BullMQ's <prefix>:<queue>:meta) and any {_name} wildcards (django-q2's "
        "django_q:<queue>:cluster:{_cluster}), or any of a list of patterns: a queue whose job "
        "keys are all gone still reads 0",
    )
    values_exclude: dict[str, str] = Field(
        default_factory=dict,
        description="a regular expression per placeholder: values it matches whole are not "
        "taken (Dramatiq's <queue>.DQ and <queue>.XQ beside each queue)",
    )
    select: dict[str, list[str]] = Field(
        default_factory=dict,
        description="narrow or add to a placeholder's values found (values_from_set, "
        "values_from_keys) or to split_by's label values read from the items: a name is taken "
        "whether found or not (it reads 0), a glob (*, ?, [...]) keeps the values found that "
        "match it (['*']: every one); found values left out are reported, their items not counted",
    )
    max_depth: int | None = Field(
        None, ge=0, description="backpressure limit, exported as queue_max_depth"
    )

    @model_validator(mode="before")
    @classmethod
    def _options_of_its_layout(cls, data: Any) -> Any:
        """An option another layout takes and this one does not is refused by name (not as an
        unknown setting); one given as null (by_type: {}) is as if not given."""
        if not isinstance(data, dict):
            return data
        not_taken = [name for name in data if name in TAKEN_BY and name not in cls.model_fields]
        for name in not_taken:
            if data[name] is not None and data[name] != {}:
                raise ValueError(_not_taken(name, data.get("type")))
        return {name: value for name, value in data.items() if name not in not_taken}

    @model_validator(mode="after")
    def _placeholders_fit(self) -> KeyGroup:
        names = placeholders(self.pattern)
        for name in names:
            if name not in LABEL_PLACEHOLDERS and not name.startswith("_"):
                raise ValueError(
                    f"pattern placeholder {{{name}}} is not a label "
                    f"({', '.join(LABEL_PLACEHOLDERS)}) nor a wildcard ({{_name}})"
                )
        if len(set(names)) != len(names):
            raise ValueError("pattern repeats a placeholder")
        for label in self.labels:
            if label not in LABEL_PLACEHOLDERS:
                raise ValueError(f"labels: {label!r} is not one of {', '.join(LABEL_PLACEHOLDERS)}")
            if label in names:
                raise ValueError(f"labels: {label!r} is already a pattern placeholder")
        for name in (*self.values, *self.values_from_set, *self.values_from_keys):
            if name not in names:
                raise ValueError(f"values: {{{name}}} is not a placeholder of the pattern")
        found = {*self.values_from_set, *self.values_from_keys}
        split = self.split_label()
        for name in self.select:
            if name not in found and name != split:
                raise ValueError(
                    f"select: {{{name}}} takes no values from a set, keys or split_by to narrow"
                )
        for name, regex in self.values_exclude.items():
            if name not in names:
                raise ValueError(f"values_exclude: {{{name}}} is not a placeholder of the pattern")
            try:
                re.compile(regex)
            except re.error as error:
                raise ValueError(f"values_exclude.{name}: {error}") from None
        for name, keys in self.values_from_keys.items():
            for pattern in [keys] if isinstance(keys, str) else keys:
                named = placeholders(pattern)
                if named.count("value") != 1 or any(
                    part != "value" and not part.startswith("_") for part in named
                ):
                    raise ValueError(
                        f"values_from_keys.{name}: the pattern needs exactly one {{value}}, "
                        "its other placeholders {_name} wildcards"
                    )
        return self

    def split_label(self) -> str | None:
        """The label split_by reads from each item, in a layout that takes split_by."""
        return None

    @property
    def types(self) -> tuple[KeyType, ...]:
        """The Redis types its keys may hold."""
        return tuple(self.type) if isinstance(self.type, list) else (self.type,)

    @property
    def key_type(self) -> KeyType:
        """The type of a group of one type (as of_type's views are)."""
        if isinstance(self.type, list):
            raise TypeError(f"key group {self.pattern!r} holds several types: read of_type's")
        return self.type

    @property
    def type_name(self) -> str:
        """Its type in words: "list", or "list or zset"."""
        return " or ".join(self.types)

    def of_type(self, key_type: KeyType) -> OneTypeGroup:
        """The group as its keys of one type are read: itself, for a group of one type."""
        if not isinstance(self, OneTypeGroup):
            raise TypeError(f"key group {self.pattern!r}: a layout has its own of_type")
        return self

    def views(self) -> list[OneTypeGroup]:
        """How each of its types is read (of_type): itself alone for a group of one type."""
        return [self.of_type(key_type) for key_type in self.types]

    @property
    def enumerated(self) -> bool:
        """True when every placeholder's values are known, so keys are built, not scanned."""
        known = set(self.values) | set(self.values_from_set) | set(self.values_from_keys)
        return all(name in known for name in placeholders(self.pattern))


class SetGroup(KeyGroup):
    """A set's members, counted (SCARD): no order, so no item is the oldest."""

    type: Literal["set"]


class HashGroup(KeyGroup):
    """A hash's fields, counted (HLEN); or its values read and split by a label inside each
    (split_by), with the earliest time among them (Sidekiq's workers hash)."""

    type: Literal["hash"]
    split_by: SplitBy = None
    oldest: Oldest = None

    def split_label(self) -> str | None:
        return None if self.split_by is None else self.split_by.label

    @model_validator(mode="after")
    def _reads_fit(self) -> HashGroup:
        _split_fits(self, self.split_by, self.oldest)
        # its values have no order: only the earliest time among those split_by reads is one
        earliest = self.oldest is not None and self.oldest.end == "earliest"
        _time_fits(self.oldest, "hash", {"json"} if self.split_by and earliest else set())
        return self


class StreamGroup(KeyGroup):
    """A stream's entries (XLEN) and its first one's id time; or a consumer group's lag,
    pending entries and first undelivered entry (stream_group)."""

    type: Literal["stream"]
    oldest: Oldest = None
    stream_group: str | None = Field(
        None, description="depth is this consumer group's lag, active its pending"
    )

    @model_validator(mode="after")
    def _reads_fit(self) -> StreamGroup:
        if self.oldest is not None and self.oldest.end == "earliest":
            raise ValueError("oldest.end: earliest applies to list, zset and hash keys, not stream")
        _time_fits(self.oldest, "stream", {"stream_id"})
        return self


# time_in a list's items and a zset's members may keep their time by (a zset's score too)
_ITEM_TIMES = {"item", "prefix", "json", "hash", "string", "signed"}


class OrderedGroup(KeyGroup):
    """Keys whose members keep an order, lists and zsets (the layouts ListGroup and
    ZsetGroup): the time of the item at either end; or every item read (split_by,
    oldest.end: earliest), or its items marked by a key of their own (marker); and, built from
    values, the keys left out that look like queues (look_alikes)."""

    type: Literal["list", "zset"]
    split_by: SplitBy = None
    oldest: Oldest = None
    marker: Marker = None
    look_alikes: LookAlikesRule = None

    def split_label(self) -> str | None:
        return None if self.split_by is None else self.split_by.label


class ListGroup(OrderedGroup):
    """A list's items (LLEN) and the time of its head or tail item, or as OrderedGroup says."""

    type: Literal["list"]

    @model_validator(mode="after")
    def _reads_fit(self) -> ListGroup:
        _split_fits(self, self.split_by, self.oldest)
        _members_fit(self)
        _time_fits(self.oldest, "list", _ITEM_TIMES)
        return self


class ZsetGroup(OrderedGroup):
    """A zset's members (ZCARD), or those of each priority band or score window (ZCOUNT), the
    time of the first of each, a count of those due; or as OrderedGroup says."""

    type: Literal["zset"]
    due: Due = None
    scores: Scores = None
    priority_bands: Bands = None

    @model_validator(mode="after")
    def _reads_fit(self) -> ZsetGroup:
        _split_fits(self, self.split_by, self.oldest)
        if self.split_by is not None and self.priority_bands is not None:
            raise ValueError("split_by and priority_bands exclude each other")
        if self.scores is not None and (self.split_by or self.priority_bands):
            raise ValueError("scores excludes split_by and priority_bands")
        if self.scores is not None and self.oldest is not None and self.oldest.end != "head":
            raise ValueError("scores: the oldest item is the head (lowest score) of the window")
        _members_fit(self)
        names = placeholders(self.pattern)
        if self.priority_bands and ("priority" in names or "priority" in self.labels):
            raise ValueError("priority_bands and a priority label exclude each other")
        _time_fits(self.oldest, "zset", {"score", *_ITEM_TIMES})
        return self


# A group of one type: a list or a zset (OrderedGroup), a set, a hash or a stream
OneTypeGroup = OrderedGroup | SetGroup | HashGroup | StreamGroup


def oldest_of(group: OneTypeGroup) -> OldestItem | None:
    """The time of the oldest item a group of one type reads (a set's members: none)."""
    return None if isinstance(group, SetGroup) else group.oldest


# The layout of each type
LAYOUTS: dict[str, type[OneTypeGroup]] = {
    "list": ListGroup,
    "zset": ZsetGroup,
    "set": SetGroup,
    "hash": HashGroup,
    "stream": StreamGroup,
}


class SeveralTypesGroup(KeyGroup):
    """Keys of any of several types (Huey's queue: a list under RedisHuey, a zset under
    PriorityRedisHuey), each read as the type it holds: as the layout of that type made of the
    group's own options and that type's by_type ones (of_type), which must hold."""

    by_type: dict[KeyType, TypeReads] = Field(
        default_factory=dict,
        description="options for its keys of one type alone ({zset: {oldest: ...}}); the "
        "group's own options apply to every type",
    )
    split_by: SplitBy = None
    oldest: Oldest = None
    due: Due = None
    scores: Scores = None
    priority_bands: Bands = None
    marker: Marker = None
    _views: dict[str, OneTypeGroup] = PrivateAttr(default_factory=dict)  # of_type's

    def split_label(self) -> str | None:
        return None if self.split_by is None else self.split_by.label

    @model_validator(mode="after")
    def _each_type_fits(self) -> SeveralTypesGroup:
        types = self.types
        if not isinstance(self.type, list) or len(set(types)) != len(types) or len(types) < 2:
            raise ValueError("type: a list names two types or more, each once")
        for key_type in self.by_type:
            if key_type not in types:
                raise ValueError(f"by_type: {key_type} is not one of the group's types")
        for key_type in types:
            try:
                self.of_type(key_type)
            except ValidationError as error:
                problems = "; ".join(p["msg"].removeprefix("Value error, ") for p in error.errors())
                raise ValueError(f"its {key_type} keys: {problems}") from None
        return self

    def of_type(self, key_type: KeyType) -> OneTypeGroup:
        """The group as its keys of one type are read: its own options and that type's
        by_type ones, as the layout of that type. Made once per type and kept: the readers
        key what they learn by it."""
        views = self._views
        if key_type not in views:
            fields = self.model_dump(exclude={"type", "by_type"}, exclude_defaults=True)
            own = self.by_type.get(key_type)
            extra = {} if own is None else own.model_dump(exclude_none=True)
            layout = LAYOUTS[key_type]
            views[key_type] = layout.model_validate({**fields, **extra, "type": key_type})
        return views[key_type]


def _layout_of(data: Any) -> str | None:
    """The layout a key group's settings are read as: its type's; a list of types (or a type
    neither form takes, refused there by the messages of both) SeveralTypesGroup."""
    if isinstance(data, KeyGroup):
        return type(data).__name__
    if not isinstance(data, dict):
        return None
    key_type = data.get("type")
    layout = LAYOUTS.get(key_type) if isinstance(key_type, str) else None
    return (layout or SeveralTypesGroup).__name__


AnyKeyGroup = Annotated[
    Annotated[ListGroup, Tag("ListGroup")]
    | Annotated[ZsetGroup, Tag("ZsetGroup")]
    | Annotated[SetGroup, Tag("SetGroup")]
    | Annotated[HashGroup, Tag("HashGroup")]
    | Annotated[StreamGroup, Tag("StreamGroup")]
    | Annotated[SeveralTypesGroup, Tag("SeveralTypesGroup")],
    Discriminator(
        _layout_of,
        custom_error_type="key_group_type",
        custom_error_message="Input should be a valid dictionary (a key group)",
    ),
]


def key_group(settings: Any) -> OneTypeGroup | SeveralTypesGroup:
    """A key group read from its settings, as the layout its type says."""
    return _any_key_group().validate_python(settings)


@functools.cache
def _any_key_group() -> TypeAdapter[AnyKeyGroup]:
    """Built at its first use, as the models are (core.models: start-up time)."""
    return TypeAdapter(AnyKeyGroup)


# Each reading option: the layouts of one type that take it (in LAYOUTS' order)
TAKEN_BY: dict[str, list[str]] = {}
for _key_type, _layout in LAYOUTS.items():
    for _name in _layout.model_fields.keys() - KeyGroup.model_fields.keys():
        TAKEN_BY.setdefault(_name, []).append(_key_type)
TAKEN_BY["by_type"] = []


def _not_taken(name: str, key_type: Any) -> str:
    """Why an option is refused by the layout of `key_type` (of its settings, unvalidated)."""
    several = isinstance(key_type, list)
    if name == "by_type":
        return "by_type applies to a group of several types (type: [list, zset])"
    if name == "look_alikes" and several:  # a look-alike is told by its one type
        return "look_alikes applies to a group of one type"
    types = TAKEN_BY[name]
    where = (
        f"{types[0]} keys only"
        if len(types) == 1
        else f"{', '.join(types[:-1])} and {types[-1]} keys"
    )
    held = " or ".join(map(str, key_type)) if several else key_type
    return f"{name} applies to {where}, not {held}"


def _split_fits(group: KeyGroup, split: LabelFromItems | None, oldest: OldestItem | None) -> None:
    """split_by: a label of its own, read from every item (a score: a zset's members')."""
    if split is None:
        return
    if split.label in placeholders(group.pattern) or split.label in group.labels:
        raise ValueError(f"split_by: {split.label!r} is already a pattern placeholder or label")
    if split.score is not None and group.type != "zset":
        raise ValueError(f"split_by.score applies to zset keys only, not {group.type}")
    if oldest is not None and oldest.time_in in ("hash", "string"):
        raise ValueError(f"split_by: oldest.time_in {oldest.time_in} is not supported")


def _members_fit(group: OrderedGroup) -> None:
    """The reads of a list's or zset's members on their own (earliest, marker), and the keys
    look_alikes compares with."""
    if group.oldest is not None and group.oldest.end == "earliest":
        _earliest_fits(group)
    if group.marker is not None:
        _marker_fits(group, group.marker)
    if group.look_alikes is not None and not group.enumerated:
        raise ValueError("look_alikes applies to list and zset keys built from values")


def _earliest_fits(group: OrderedGroup) -> None:
    """end: earliest reads a key's items on their own, for its depth and their times."""
    others: dict[str, object] = {"marker": group.marker}
    if isinstance(group, ZsetGroup):
        others = {
            "scores": group.scores,
            "due": group.due,
            "priority_bands": group.priority_bands,
            **others,
        }
    excluded = [name for name, value in others.items() if value is not None]
    if excluded:
        raise ValueError(f"oldest.end: earliest excludes {', '.join(excluded)}")


def _marker_fits(group: OrderedGroup, marker: MemberMarker) -> None:
    bands = group.priority_bands if isinstance(group, ZsetGroup) else None
    if group.split_by is not None or bands is not None:
        raise ValueError("marker excludes split_by and priority_bands")
    if marker.state == group.state:
        raise ValueError(f"marker.state is the group's own state {group.state!r}")
    named = placeholders(marker.key)
    if "item" not in named:
        raise ValueError("marker.key must contain {item}")
    names = placeholders(group.pattern)
    for name in named:
        if name != "item" and name not in names:
            raise ValueError(f"marker.key: {{{name}}} is not a placeholder of the pattern")
    oldest = group.oldest
    if oldest is not None and (oldest.end != "head" or oldest.time_in in ("hash", "string")):
        raise ValueError("marker: the oldest item's time is read from the head's members")


def _time_fits(oldest: OldestItem | None, key_type: KeyType, allowed: set[str]) -> None:
    if oldest is not None and oldest.time_in not in allowed:
        raise ValueError(f"oldest.time_in: {oldest.time_in} does not apply to {key_type} keys")


def literal(text: str) -> str:
    """`text` as a pattern that matches it alone (its braces doubled)."""
    return text.replace("{", "{{").replace("}", "}}")


@functools.lru_cache(maxsize=1024)
def pattern_parts(pattern: str) -> tuple[str, ...]:
    """Literal text and placeholder names, alternating (literal first, literal last), with
    each doubled brace made one. Cached: fill() runs per item read, on a few patterns."""
    parts: list[str] = []
    text, at = "", 0
    for match in _TOKEN.finditer(pattern):
        text += pattern[at : match.start()]
        at = match.end()
        if match.group(1) is None:
            text += match.group(0)[0]
        else:
            parts += [text, match.group(1)]
            text = ""
    return (*parts, text + pattern[at:])


def placeholders(pattern: str) -> list[str]:
    return list(pattern_parts(pattern)[1::2])


def rebuilt(pattern: str, text: Callable[[str], str], placeholder: Callable[[str], str]) -> str:
    """The pattern with its literal parts made `text`, its placeholders `placeholder` (by name)."""
    parts = enumerate(pattern_parts(pattern))
    return "".join(placeholder(part) if index % 2 else text(part) for index, part in parts)


def scan_glob(pattern: str) -> str:
    """The SCAN MATCH glob: literal parts escaped, each placeholder a '*'."""
    return rebuilt(pattern, _glob_literal, lambda _: "*")


def shared_glob(patterns: list[str]) -> str:
    """A SCAN MATCH glob every key of the patterns matches: their common literal prefix (the
    text before each one's first placeholder), escaped, then '*'."""
    prefixes = [literal_prefix(pattern) for pattern in patterns]
    first, last = min(prefixes), max(prefixes)  # the common prefix of all is theirs
    size = next(
        (at for at, (a, b) in enumerate(zip(first, last, strict=False)) if a != b), len(first)
    )
    return _glob_literal(first[:size]) + "*"


def literal_prefix(pattern: str) -> str:
    """The text every key of the pattern starts with: what comes before its first placeholder."""
    return pattern_parts(pattern)[0]


def _glob_literal(text: str) -> str:
    """`text` as a glob that matches it alone (glob metacharacters escaped)."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def key_regex(pattern: str) -> re.Pattern[str]:
    """A regex that matches a key of the pattern and captures each placeholder by name."""
    body = rebuilt(pattern, re.escape, lambda name: f"(?P<{name}>.+)")
    return re.compile(f"^{body}$", re.DOTALL)


def fill(pattern: str, values: dict[str, str]) -> str:
    """Substitute placeholders; used for enumerated keys and hash_key patterns."""
    return _template(pattern).format_map(values)


@functools.lru_cache(maxsize=1024)
def _template(pattern: str) -> str:
    """The pattern as a str.format template (its text literal, its placeholders fields): a
    hash key is filled per head item read, and format_map does it several times faster."""
    return rebuilt(pattern, literal, lambda name: f"{{{name}}}")
