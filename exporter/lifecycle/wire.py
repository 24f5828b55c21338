"""Lifecycle event wire format, version 1: the one implementation of parse, validate and encode.

One Redis stream entry per event, flat string fields (docs/events.md is the spec). The
consumer parses entries as Redis returns them (hiredis's flat lists of bytes, or dicts),
without decoding the whole entry: each field is found by its position in the entry's layout,
numbers are read straight from bytes, only label-bearing fields are decoded.
An invalid entry raises InvalidEvent with a short, bounded reason (the label of
queue_exporter_events_invalid_total); should anything else escape, the consumer refuses that
one entry as `unprocessable` (consumer.py).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from operator import itemgetter
from typing import Any, NamedTuple

from exporter.core import numbers
from exporter.core.numbers import BIG as _BIG
from exporter.core.numbers import DEFAULT_MAX_FUTURE

VERSION = "1"

JOB_EVENTS = (
    "enqueued",
    "dequeued",
    "started",
    "completed",
    "failed",
    "retried",
    "timed_out",
    "dead_lettered",
    "scheduled",
    "requeued",
    "lease_extended",
    "max_retries_exceeded",
    "idempotency_conflict",
    "idempotency_reused",
)
QUEUE_EVENTS = ("dequeue_empty", "dequeue_error", "worker_heartbeat")
SYSTEM_EVENTS = ("backend_op", "reaper_cycle", "scheduler_cycle")
EVENTS = JOB_EVENTS + QUEUE_EVENTS + SYSTEM_EVENTS
ERROR_TYPES = ("retryable", "non_retryable", "timeout", "handler_not_found", "other")

# Events that must carry a duration (the others may).
DURATION_REQUIRED = frozenset({"backend_op", "reaper_cycle", "scheduler_cycle"})
# Events whose queue label is required: every job event and the per-queue ones.
QUEUE_REQUIRED = frozenset(JOB_EVENTS + QUEUE_EVENTS)
# Events that require nothing but their queue.
_QUEUE_ONLY = QUEUE_REQUIRED - DURATION_REQUIRED - {"worker_heartbeat"}

# Limits that keep one hostile entry cheap to refuse.
MAX_FIELDS = 64
MAX_FIELD_BYTES = 1024

INVALID_REASONS = (
    "missing_field",
    "unknown_version",
    "unknown_event",
    "bad_number",
    "bad_value",
    "bad_encoding",
    "negative_duration",
    "future_time",
    "oversized_field",
    "unreadable_activity",  # runnerq: the activity:<id> key cannot be read as a hash
    "wrong_type",  # native readers: a record's key holds another Redis type than the system's
    "over_limit",  # native readers: a record beyond a limit (workers remembered, queues listed)
    "unprocessable",  # an error of the exporter's own, counted instead of crashing
    "bad_traceparent",  # a malformed trace context: only that field is dropped, not the event
)

_EVENT_BY_BYTES = {name.encode(): name for name in EVENTS}
# The fields most events lack (parse looks for them only in an entry that has one).
_RARE = frozenset(
    {b"reason", b"operation", b"error_type", b"started_at", b"scheduled_for", b"delay"}
    | {b"count", b"active", b"capacity", b"ok"}
)
_ERROR_TYPE_BY_BYTES = {name.encode(): name for name in ERROR_TYPES}
# The fields parse reads besides v, event and ts, in the order it reads them.
_FIELDS = (
    "system",
    "queue",
    "job_type",
    "priority",
    "worker",
    "job_id",
    "reason",
    "operation",
    "error_type",
    "enqueued_at",
    "started_at",
    "scheduled_for",
    "duration",
    "delay",
    "attempt",
    "count",
    "active",
    "capacity",
    "ok",
    "traceparent",
)


# An entry that is not a valid v1 event (or a value no event may carry); `reason` is one of
# INVALID_REASONS. One class with numbers.py's refusals: a native reader's refused value and
# a refused stream entry are counted alike.
InvalidEvent = numbers.InvalidValue


class Event:
    """A valid event. Absent optional fields keep the class defaults (labels: "").

    Not a dataclass on purpose: parse() sets only the fields an entry carries, which costs
    a third of assigning all 21 (measured by bench/event_ingest.py).
    """

    system: str | None = None
    queue: str = ""
    job_type: str = ""
    priority: str = ""
    worker: str = ""
    job_id: str = ""
    reason: str = ""
    operation: str = ""
    error_type: str = "other"
    enqueued_at: float | None = None
    started_at: float | None = None
    scheduled_for: float | None = None
    duration: float | None = None
    delay: float | None = None
    attempt: int | None = None
    count: int | None = None
    ok: bool = True
    active: int | None = None
    capacity: int | None = None
    # The job's W3C trace context: the exemplar of its durations and completion or failure.
    trace: TraceContext | None = None
    # (reason, detail) of an optional field dropped as malformed: the event itself is valid;
    # the consumer counts the reason as it counts a refused entry's.
    dropped_field: tuple[str, str] | None = None

    # Set by whoever makes the event: parse(), or of() for one built in code.
    name: str
    ts: float

    @classmethod
    def of(cls, name: str, ts: float, latest: float | None = None, **fields: Any) -> Event:
        """An event built in code (a native reader's, from a system's records): its numbers
        pass the checks parse applies (numbers.py), InvalidEvent naming what is refused.
        `latest`: the latest time it may name (default: now plus DEFAULT_MAX_FUTURE)."""
        latest = numbers.horizon() if latest is None else latest
        event = cls()
        event.name = name
        event.ts = numbers.epoch(ts, latest)
        for key, value in fields.items():
            if not hasattr(cls, key):
                raise TypeError(f"Event has no field {key!r}")
            check = _CHECKS.get(key)
            setattr(event, key, value if value is None or check is None else check(value, latest))
        return event

    def __repr__(self) -> str:
        fields = ", ".join(f"{key}={value!r}" for key, value in vars(self).items())
        return f"Event({fields})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Event) and vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]


def parse(
    fields: Mapping[bytes, bytes], now: float | None = None, max_future: float = DEFAULT_MAX_FUTURE
) -> Event:
    """A stream entry's fields as an Event; raises InvalidEvent naming the reason."""
    names = tuple(fields)
    return _parse(_layouts.get(names) or _learn(names), list(fields.values()), now, max_future)


def parse_flat(
    flat: list[bytes],
    now: float | None = None,
    max_future: float = DEFAULT_MAX_FUTURE,
    layout: Layout | None = None,
) -> Event:
    """parse() of an entry as hiredis reads it, names and values alternating, without making
    it a dict: the entry's Layout says where each field is (`layout`, when the caller has
    looked it up already: layout_of its names)."""
    if layout is None:
        layout = layout_of(tuple(flat[0::2]))
    return _parse(layout, flat[1::2], now, max_future)


class Layout:
    """Where each known field sits in the entries of one sequence of field names.

    The entries of one producer's event share theirs, so parse finds each field by a position
    learned once instead of making every entry a dict and looking each field up by name (0.7
    µs less per event, bench/event_decode.py). A name given twice counts once, with its last
    value, as in a dict. A field the layout lacks is None; `required` (v, event and ts) is None
    for a layout no values can make valid, which `refusal` names.
    """

    __slots__ = (*_FIELDS, "rare", "required", "refusal", "plain")

    system: int | None
    queue: int | None
    job_type: int | None
    priority: int | None
    worker: int | None
    job_id: int | None
    reason: int | None
    operation: int | None
    error_type: int | None
    enqueued_at: int | None
    started_at: int | None
    scheduled_for: int | None
    duration: int | None
    delay: int | None
    attempt: int | None
    count: int | None
    active: int | None
    capacity: int | None
    ok: int | None
    traceparent: int | None

    def __init__(self, names: tuple[bytes, ...]) -> None:
        position = {name: index for index, name in enumerate(names)}
        for field in _FIELDS:
            setattr(self, field, position.get(field.encode()))
        # Most entries carry none of the rare fields: parse skips them all at once.
        self.rare = not _RARE.isdisjoint(position)
        version, event, ts = position.get(b"v"), position.get(b"event"), position.get(b"ts")
        self.required = None
        self.refusal = ("missing_field", "v, event and ts are required")
        if len(position) > MAX_FIELDS:
            self.refusal = ("oversized_field", f"{len(position)} fields")
        elif version is not None and event is not None and ts is not None:
            self.required = (version, event, ts)
        self.plain = PlainLayout(self) if PlainLayout.fits(self) else None


class PlainLayout:
    """Where the fields of a plain entry sit in the flat list hiredis reads (names and values
    alternating): no rare field, no trace context, a queue. Most events are such entries;
    readers/v1.py tallies them without making an Event (bench/event_ingest.py)."""

    __slots__ = (
        "_present",
        "attempt",
        "duration",
        "enqueued_at",
        "job",
        "job_id",
        "ts",
        "version",
        "worker",
    )

    def __init__(self, layout: Layout) -> None:
        assert layout.required is not None and layout.queue is not None
        self.version, event, self.ts = (2 * at + 1 for at in layout.required)
        labels = (layout.system, layout.queue, layout.job_type, layout.priority)
        self._present = tuple(at is not None for at in labels)
        # The raw event name and (system, queue, job_type, priority) present, in one C call.
        self.job = itemgetter(event, *(2 * at + 1 for at in labels if at is not None))
        self.worker = _flat(layout.worker)
        self.job_id = _flat(layout.job_id)
        self.enqueued_at = _flat(layout.enqueued_at)
        self.duration = _flat(layout.duration)
        self.attempt = _flat(layout.attempt)

    @staticmethod
    def fits(layout: Layout) -> bool:
        return (
            layout.required is not None
            and not layout.rare
            and layout.traceparent is None
            and layout.queue is not None
        )

    def labels(self, job: tuple[bytes, ...]) -> tuple[bytes, bytes, bytes, bytes]:
        """job's raw (system, queue, job_type, priority), b"" for those absent."""
        values = iter(job[1:])
        system, queue, job_type, priority = (
            next(values) if present else b"" for present in self._present
        )
        return system, queue, job_type, priority


def _flat(at: int | None) -> int | None:
    return None if at is None else 2 * at + 1


def layout_of(names: tuple[bytes, ...]) -> Layout:
    """The layout of an entry's field names (learned once, bounded)."""
    return _layouts.get(names) or _learn(names)


# Layouts by field names. Bounded like _texts: emptied when full; a layout of long names (no
# producer's) is used once and not kept, so hostile names cost little memory.
_layouts: dict[tuple[bytes, ...], Layout] = {}
MAX_LAYOUTS = 1_000
_MAX_LAYOUT_BYTES = 2048


# The layout of names learned before, else None: the bound lookup itself, so a caller per entry
# (readers/v1.py) pays no call of ours on a hit (0.1 µs per event, bench/event_decode.py).
# Valid for good: _layouts is only ever emptied, never replaced.
known_layout = _layouts.get


def _learn(names: tuple[bytes, ...]) -> Layout:
    """The layout of names not seen before, remembered unless they are many or long."""
    layout = Layout(names)
    if len(names) <= MAX_FIELDS and sum(map(len, names)) <= _MAX_LAYOUT_BYTES:
        if len(_layouts) >= MAX_LAYOUTS:
            _layouts.clear()
        _layouts[names] = layout
    return layout


def _parse(layout: Layout, values: list[bytes], now: float | None, max_future: float) -> Event:
    required = layout.required
    if required is None:
        raise InvalidEvent(*layout.refusal)
    version, name_raw, ts_raw = values[required[0]], values[required[1]], values[required[2]]
    if version != b"1":
        raise InvalidEvent("unknown_version", repr(version[:16]))
    name = _EVENT_BY_BYTES.get(name_raw)
    if name is None:
        raise InvalidEvent("unknown_event", repr(name_raw[:32]))
    horizon = (time.time() if now is None else now) + max_future
    # One try for the whole entry: float(), int() and decode() raise ValueError subclasses.
    try:
        # Valid times are taken inline: only a refusal calls _epoch or _seconds.
        ts = float(ts_raw)
        event = Event()
        event.name = name
        event.ts = ts if 0 <= ts <= horizon else _epoch(ts_raw, horizon)
        _labels(event, layout, values)
        _numbers(event, layout, values, horizon)
        at = layout.traceparent
        if at is not None:
            _trace(event, values[at])
    except InvalidEvent:
        raise
    except UnicodeDecodeError:
        raise InvalidEvent("bad_encoding") from None
    except (ValueError, OverflowError):
        raise InvalidEvent("bad_number") from None
    if not event.queue or name not in _QUEUE_ONLY:  # the common case needs no call
        _check_required(event)
    return event


# Fields are read in one order, whatever the entry's, so an entry with several invalid fields
# is always refused for the same one.


def _labels(event: Event, layout: Layout, values: list[bytes]) -> None:
    # Decoding only what is present: most entries carry four or five of these. Unknown
    # fields are never looked at, so only these are checked for size. Label values come from
    # _texts when seen before (a dict lookup instead of a check and a decode).
    texts = _texts
    at = layout.system
    if at is not None and (raw := values[at]):
        event.system = texts.get(raw) or _text(raw)
    at = layout.queue
    if at is not None:
        raw = values[at]
        event.queue = texts.get(raw) or _text(raw)
    at = layout.job_type
    if at is not None:
        raw = values[at]
        event.job_type = texts.get(raw) or _text(raw)
    at = layout.priority
    if at is not None:
        raw = values[at]
        event.priority = texts.get(raw) or _text(raw)
    at = layout.worker
    if at is not None:
        raw = values[at]
        event.worker = texts.get(raw) or _text(raw)
    at = layout.job_id
    if at is not None:  # one per job: never worth remembering
        raw = values[at]
        event.job_id = _oversized(raw) if len(raw) > MAX_FIELD_BYTES else raw.decode()
    if layout.rare:
        _rare_labels(event, layout, values)


def _rare_labels(event: Event, layout: Layout, values: list[bytes]) -> None:
    texts = _texts
    at = layout.reason
    if at is not None:
        raw = values[at]
        event.reason = texts.get(raw) or _text(raw)
    at = layout.operation
    if at is not None:
        raw = values[at]
        event.operation = texts.get(raw) or _text(raw)
    at = layout.error_type
    if at is not None:
        # An unknown class is still a failure: it is counted as "other", never as a new label.
        event.error_type = _ERROR_TYPE_BY_BYTES.get(values[at], "other")


# Label values decoded before, by their bytes. Every event of a label set then shares one str
# object: its hash is computed once, and the tallies and the store compare it by identity
# instead of by content: with the dict lookup replacing a check and a decode, 1 µs less per
# event (bench/event_ingest.py). Emptied when full; values longer than a label may be are not
# kept, so hostile values cost at most MAX_TEXTS short strings (a few MiB).
_texts: dict[bytes, str] = {}
MAX_TEXTS = 10_000
_MAX_TEXT_BYTES = 256

# The label value of raw bytes decoded and checked before, else None: the bound lookup itself,
# as known_layout, so readers/v1.py's plain path pays no call of ours per label it checks.
# Valid for good: _texts is only ever emptied, never replaced.
remembered = _texts.get


def _text(raw: bytes) -> str:
    """A label field decoded (UnicodeDecodeError for bad UTF-8), remembered in _texts."""
    if len(raw) > MAX_FIELD_BYTES:
        _oversized(raw)
    text = raw.decode()
    if len(raw) <= _MAX_TEXT_BYTES:
        if len(_texts) >= MAX_TEXTS:
            _texts.clear()
        _texts[raw] = text
    return text


def _oversized(raw: bytes) -> str:
    raise InvalidEvent("oversized_field", f"a field of {len(raw)} bytes")


def _numbers(event: Event, layout: Layout, values: list[bytes], horizon: float) -> None:
    rare = layout.rare
    at = layout.enqueued_at
    if at is not None:
        raw = values[at]
        value = float(raw)
        event.enqueued_at = value if 0 <= value <= horizon else _epoch(raw, horizon)
    if rare:
        _rare_times(event, layout, values, horizon)
    at = layout.duration
    if at is not None:
        raw = values[at]
        value = float(raw)
        event.duration = value if 0 <= value < _BIG else _seconds(raw)
    if rare and (at := layout.delay) is not None:
        event.delay = _seconds(values[at])
    at = layout.attempt
    if at is not None:
        event.attempt = _count(values[at], 1)
    if rare:
        _rare_numbers(event, layout, values)


def _rare_times(event: Event, layout: Layout, values: list[bytes], horizon: float) -> None:
    at = layout.started_at
    if at is not None:
        event.started_at = _epoch(values[at], horizon)
    at = layout.scheduled_for
    if at is not None:
        event.scheduled_for = numbers.due(values[at])  # in the future by design


def _rare_numbers(event: Event, layout: Layout, values: list[bytes]) -> None:
    at = layout.count
    if at is not None:
        event.count = _count(values[at], 0)
    at = layout.active
    if at is not None:
        event.active = _count(values[at], 0)
    at = layout.capacity
    if at is not None:
        event.capacity = _count(values[at], 0)
    at = layout.ok
    if at is not None:
        raw = values[at]
        if raw != b"1" and raw != b"0":
            raise InvalidEvent("bad_value", "ok must be 0 or 1")
        event.ok = raw == b"1"


class TraceContext(NamedTuple):
    """A W3C trace context (https://www.w3.org/TR/trace-context/#traceparent-header)."""

    trace_id: str  # 32 lowercase hex digits, not all zeros
    span_id: str  # the parent-id: 16 lowercase hex digits, not all zeros
    flags: int  # trace-flags; bit 0 is `sampled`


# version-trace_id-parent_id-flags, lowercase hex. Version 00 is exactly this; a later version
# may append fields after a dash (the spec's forward-compatibility rule), read as version 00.
_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?", re.S)
_ZERO_TRACE_ID = b"0" * 32
_ZERO_SPAN_ID = b"0" * 16
MAX_TRACEPARENT_BYTES = 512  # the spec's propagators may refuse longer headers


def parse_traceparent(raw: bytes) -> TraceContext:
    """A traceparent value as a TraceContext; InvalidEvent("bad_traceparent") names what
    breaks the spec: version ff, version 00 with anything after its flags, a later version
    whose flags are followed by anything but a dash, non-hex or uppercase digits, an
    all-zero trace id or parent id."""
    if len(raw) > MAX_TRACEPARENT_BYTES:
        raise InvalidEvent("bad_traceparent", f"{len(raw)} bytes")
    match = _TRACEPARENT.fullmatch(raw)
    if match is None:
        raise InvalidEvent("bad_traceparent", f"not version-traceid-parentid-flags: {raw[:64]!r}")
    version, trace_id, span_id, flags, rest = match.groups()
    if version == b"ff":
        raise InvalidEvent("bad_traceparent", "version ff is forbidden")
    if version == b"00" and rest is not None:
        raise InvalidEvent("bad_traceparent", "version 00 has nothing after its flags")
    if trace_id == _ZERO_TRACE_ID:
        raise InvalidEvent("bad_traceparent", "all-zero trace id")
    if span_id == _ZERO_SPAN_ID:
        raise InvalidEvent("bad_traceparent", "all-zero parent id")
    return TraceContext(trace_id.decode(), span_id.decode(), int(flags, 16))


def _trace(event: Event, raw: bytes) -> None:
    """The event's trace context, or the field dropped and named: never the event refused."""
    try:
        event.trace = parse_traceparent(raw)
    except InvalidEvent as error:
        event.dropped_field = (error.reason, f"traceparent dropped: {error.detail}")


# The check of each numeric field of an event built in code (Event.of), given its horizon.
_CHECKS: dict[str, Any] = {
    "enqueued_at": numbers.epoch,
    "started_at": numbers.epoch,
    "scheduled_for": lambda value, _: numbers.due(value),
    "duration": lambda value, _: numbers.seconds(value),
    "delay": lambda value, _: numbers.seconds(value),
    "attempt": lambda value, _: numbers.count(value, 1),
    "count": lambda value, _: numbers.count(value),
    "active": lambda value, _: numbers.count(value),
    "capacity": lambda value, _: numbers.count(value),
}


def _check_required(event: Event) -> None:
    name = event.name
    if name in QUEUE_REQUIRED and not event.queue:
        raise InvalidEvent("missing_field", f"{name} needs queue")
    if name in DURATION_REQUIRED and event.duration is None:
        raise InvalidEvent("missing_field", f"{name} needs duration")
    if name == "worker_heartbeat" and (
        not event.worker or event.active is None or event.capacity is None
    ):
        raise InvalidEvent("missing_field", "worker_heartbeat needs worker, active, capacity")


# The checks themselves live in numbers.py, shared by every path a value takes to a sample;
# parse calls them for what its inline comparisons do not take at once.
_epoch = numbers.epoch
_seconds = numbers.seconds
_count = numbers.count


# -- encoding ---------------------------------------------------------------------------------

FieldValue = str | int | float | bool | None


def encode(
    event: str,
    fields: Mapping[str, FieldValue] | None = None,
    ts: float | None = None,
    validate: bool = True,
) -> dict[str, str]:
    """The stream entry for an event: v, event, ts and the given fields as strings.

    None values are left out; booleans become 1/0; floats keep full precision. With
    `validate` the result goes through parse() (raising InvalidEvent), so a caller learns
    at once what the consumer would refuse; the producer's hot path skips it.
    """
    entry: dict[str, str] = {
        "v": VERSION,
        "event": event,
        "ts": _format(time.time() if ts is None else ts),
    }
    for key, value in (fields or {}).items():
        if value is None or key in ("v", "event"):
            continue
        entry[key] = _format(value)
    if validate:
        parsed = parse({key.encode(): value.encode() for key, value in entry.items()})
        if parsed.dropped_field is not None:  # the consumer would drop it: say so now
            raise InvalidEvent(*parsed.dropped_field)
    return entry


def _format(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return repr(value)
    return str(value)
