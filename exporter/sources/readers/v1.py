"""The v1 event stream (docs/events.md): each entry one event, parsed by lifecycle/wire.py."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from exporter.core.numbers import BIG, MAX_COUNT
from exporter.lifecycle.metrics import FREQUENT_JOB_EVENTS, FrequentEvent, Tally, apply
from exporter.lifecycle.refusals import Refusals
from exporter.lifecycle.wire import (
    MAX_FIELD_BYTES,
    InvalidEvent,
    PlainLayout,
    known_layout,
    layout_of,
    parse,
    parse_flat,
    remembered,
)
from exporter.sources.readers.entries import Fields

if TYPE_CHECKING:
    import redis

# A plain entry's frequent event by its layout and raw event name and labels (FrequentEvents).
Frequent = dict[tuple[PlainLayout, tuple[bytes, ...]], FrequentEvent]
# Emptied when full, like wire.py's label texts. A realistic stream holds a few label sets per
# queue and event (bench/event_ingest.py's: 1,600); hostile labels (at most 256 bytes each, as
# wire.py remembers them) cost at most ~2 KiB an entry.
MAX_FREQUENT = 5_000
_FREQUENT_BY_BYTES = {name.encode(): name for name in FREQUENT_JOB_EVENTS}


class V1Decoder:
    """The entries of one v1 stream; `system` labels the events that carry none."""

    def __init__(self, system: str, max_future: float) -> None:
        self.system = system
        self.max_future = max_future
        self._frequent: Frequent = {}

    def decode(
        self,
        client: redis.Redis,
        entries: list[tuple[bytes, Fields]],
        now: float,
        tally: Tally,
        refusals: Refusals,
    ) -> None:
        decode_v1(entries, self.system, now, self.max_future, tally, refusals, self._frequent)

    def interrupt(self) -> None:
        """Nothing of its own to interrupt: it reads no key."""

    def close(self) -> None:
        """No connection of its own."""


def decode_v1(
    entries: Iterable[tuple[bytes, Fields]],
    system: str,
    now: float,
    max_future: float,
    tally: Tally,
    refusals: Refusals,
    frequent: Frequent | None = None,
) -> None:
    """Parse and apply v1 entries; invalid ones are refused by reason, never raised.

    A plain entry of a frequent job event (most of a stream) is tallied straight from its
    flat list (tally_plain); any other, and any that path does not take, is parsed into an
    Event and applied: the one place entries are refused."""
    frequent = {} if frequent is None else frequent
    horizon = now + max_future
    consumed = 0
    for entry_id, fields in entries:
        consumed += 1
        layout = None
        if type(fields) is list:
            names = tuple(fields[0::2])
            layout = known_layout(names) or layout_of(names)
            plain = layout.plain
            if plain is not None and tally_plain(plain, fields, system, horizon, tally, frequent):
                continue
        try:
            # hiredis's flat lists are read as they are (never made dicts), redis-py's dicts
            # as dicts: the same parse, field by field (wire.Layout), the layout found once.
            event = (
                parse(fields, now, max_future)
                if isinstance(fields, dict)
                else parse_flat(fields, now, max_future, layout)
            )
        except InvalidEvent as error:
            refusals.refuse(tally, entry_id, error.reason, error.detail)
            continue
        if event.dropped_field is not None:  # a malformed optional field: counted, event kept
            refusals.drop_field(tally, entry_id, *event.dropped_field)
        apply(tally, event, system)
    tally.consumed += consumed


def tally_plain(
    plain: PlainLayout,
    flat: list[bytes],
    system: str,
    horizon: float,
    tally: Tally,
    frequent: Frequent,
) -> bool:
    """Tally a plain entry of a frequent job event as parse() and apply() would, and say so;
    False, having changed nothing, for an entry it does not take (another event, a label not
    seen before, a number out of the common range, anything invalid): parse() reads it.
    The batch path (decode, tallies, store) went from 2.07-2.21x the floor's decode to
    1.41-1.57x (bench/event_decode.py), the consumer end to end from 0.60-0.74x of the bare
    loop's CPU to 0.74-0.87x (bench/event_ingest.py; docs/benchmarks.md)."""
    job = plain.job(flat)
    event = frequent.get((plain, job))
    if event is None:
        found = _frequent_event(plain, job, system)
        if found is None:
            return False
        if len(frequent) >= MAX_FREQUENT:
            frequent.clear()
        event = frequent[(plain, job)] = found
    if flat[plain.version] != b"1":
        return False
    at = plain.worker
    if at is not None and remembered(flat[at]) is None:
        return False
    at = plain.job_id
    if at is not None and (len(flat[at]) > MAX_FIELD_BYTES or not flat[at].isascii()):
        return False
    try:
        ts = float(flat[plain.ts])
        enqueued_at = duration = attempt = None
        if (at := plain.enqueued_at) is not None:
            enqueued_at = float(flat[at])
            if not 0 <= enqueued_at <= horizon:
                return False
        if (at := plain.duration) is not None:
            duration = float(flat[at])
            if not 0 <= duration < BIG:
                return False
        if (at := plain.attempt) is not None:
            raw = flat[at]
            attempt = int(raw) if len(raw) <= 20 else 0
            if not 1 <= attempt <= MAX_COUNT:
                return False
    except (ValueError, OverflowError):
        return False
    if not 0 <= ts <= horizon:
        return False
    tally.plain.append((event, ts, enqueued_at, duration, attempt))  # FrequentEvent.record
    return True


def _frequent_event(
    plain: PlainLayout, job: tuple[bytes, ...], system: str
) -> FrequentEvent | None:
    """The frequent event of a raw name and labels decoded and checked before (wire.py
    remembers them), else None: parse() then reads the entry, and remembers its labels."""
    name = _FREQUENT_BY_BYTES.get(job[0])
    if name is None:
        return None
    labels: list[str] = []
    for raw in plain.labels(job):
        text = remembered(raw) if raw else ""
        if text is None:
            return None
        labels.append(text)
    if not labels[1]:  # no queue: refused by parse()
        return None
    return FrequentEvent(name, (labels[0] or system, labels[1], labels[2], labels[3]))
