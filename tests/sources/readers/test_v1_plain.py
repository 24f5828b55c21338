"""The v1 decoder's plain-entry path (readers/v1.tally_plain) against parse() and apply().

decode_v1 tallies the plain entries of the frequent job events straight from hiredis's flat
lists; any entry it does not take goes through wire.parse_flat and metrics.apply, the one
place entries are refused. Whatever the entries, both must record the same: the same counter
and histogram series in a store of their own (the plain path's events are recorded straight
into their series, the others through the tally's dicts), the same refusals by reason. Each
batch runs twice through decode_v1 (labels never seen, then seen: the path's cache filled).
"""

from __future__ import annotations

import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.lifecycle import wire
from exporter.lifecycle.metrics import EventMetrics, Tally, apply
from exporter.lifecycle.refusals import Refusals
from exporter.output.health import HealthBoard
from exporter.output.store import HistogramFamily
from exporter.output.telemetry import Telemetry
from exporter.output.telemetry_config import LimitsConfig
from exporter.sources.readers.v1 import Frequent, decode_v1

pytestmark = pytest.mark.fast

NOW = float(int(time.time()))
MAX_FUTURE = 300.0
SYSTEM = "default-system"

_NAMES = [
    b"v",
    b"event",
    b"ts",
    b"system",
    b"queue",
    b"job_type",
    b"priority",
    b"worker",
    b"job_id",
    b"enqueued_at",
    b"duration",
    b"attempt",
    b"error_type",
    b"traceparent",
    b"extra",
]
_EVENTS = [b"enqueued", b"dequeued", b"started", b"completed", b"failed", b"retried", b"nope"]
_NUMBERS = [
    repr(NOW - 5).encode(),
    repr(NOW + 10_000).encode(),
    b"0.25",
    b"0",
    b"-1",
    b"1",
    b"3",
    b" 2 ",
    b"1_0",
    b"nan",
    b"inf",
    b"1e400",
    b"99999999999999999999999",
    b"2000000000",
    b"x",
    b"",
]
_TRACE = b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"  # a valid traceparent: exemplars
_LABELS = [b"q1", b"q2", b"t", b"", b"\xff\xfe", "é".encode(), b"w" * 1100, b"w" * 300, _TRACE]
_value = st.one_of(
    st.sampled_from(_NUMBERS), st.sampled_from(_LABELS), st.sampled_from(_EVENTS), st.binary()
)


_NUMBER_FIELDS = {b"ts", b"enqueued_at", b"duration", b"attempt"}


def _value_of(name: bytes) -> st.SearchStrategy[bytes]:
    """A value of the field's kind (a number, a label), now and then anything."""
    usual = st.sampled_from(_NUMBERS if name in _NUMBER_FIELDS else _LABELS)
    return st.one_of(usual, usual, usual, _value)


@st.composite
def _entry(draw: st.DrawFn) -> list[bytes]:
    """Mostly a plain event of a few labels and numbers, sometimes anything at all."""
    fields = {
        b"v": draw(st.sampled_from([b"1", b"1", b"1", b"2"])),
        b"event": draw(st.sampled_from(_EVENTS[:4] * 3 + _EVENTS[4:])),
        b"ts": draw(st.sampled_from([_NUMBERS[0]] * 8 + _NUMBERS[1:])),
        b"queue": draw(st.sampled_from(_LABELS[:4])),
    }
    for name in draw(st.lists(st.sampled_from(_NAMES), max_size=6)):
        fields[name] = draw(_value_of(name))
    flat = [part for pair in fields.items() for part in pair]
    if draw(st.integers(0, 4)) == 0:  # a name given twice: its last value counts
        name = draw(st.sampled_from(_NAMES))
        flat += [name, draw(_value_of(name))]
    if draw(st.integers(0, 19)) == 0:
        flat = draw(st.lists(st.sampled_from(_NAMES) | st.binary(max_size=8), max_size=12))
    return flat


def _reference(entries: list[tuple[bytes, list[bytes]]]) -> Tally:
    """Every entry parsed into an Event and applied (the path of any entry)."""
    tally, refusals = Tally(), Refusals("s")
    for entry_id, flat in entries:
        try:
            event = wire.parse_flat(flat, NOW, MAX_FUTURE)
        except wire.InvalidEvent as error:
            refusals.refuse(tally, entry_id, error.reason, error.detail)
            continue
        if event.dropped_field is not None:
            refusals.drop_field(tally, entry_id, *event.dropped_field)
        apply(tally, event, SYSTEM)
    tally.consumed = len(entries)
    return tally


def _decoded(entries: list[tuple[bytes, list[bytes]]], frequent: Frequent) -> Tally:
    tally = Tally()
    fresh = [(entry_id, [bytes(part) for part in flat]) for entry_id, flat in entries]
    decode_v1(fresh, SYSTEM, NOW, MAX_FUTURE, tally, Refusals("s"), frequent)
    return tally


def _recorded(tally: Tally) -> dict[str, dict[tuple[str, ...], object]]:
    """What the tally records into a store of its own: each family's series by labels (a
    histogram's as its buckets, count and sum)."""
    telemetry = Telemetry(HealthBoard())
    metrics = EventMetrics(telemetry, {})
    metrics.record("s", tally, metrics.worker_registry(60.0, 100))
    recorded: dict[str, dict[tuple[str, ...], object]] = {}
    for family in telemetry.store.families():
        if isinstance(family, HistogramFamily):
            points = family.series.items()
            series = {
                labels: (buckets, count, pytest.approx(total, rel=1e-12))
                for labels, (buckets, total, count) in points
            }
            recorded[family.spec.name] = series
        else:
            recorded[family.spec.name] = dict(family.series.items())
    return recorded


def _same(ours: Tally, theirs: Tally) -> None:
    # The plain path's values are added one by one, the tally's a batch's sum at once: a
    # histogram's sum may differ in its last bits, nothing else.
    assert _recorded(ours) == _recorded(theirs)
    assert ours.exemplars == theirs.exemplars
    assert ours.invalid == theirs.invalid
    assert ours.heartbeats == theirs.heartbeats
    assert (ours.consumed, ours.lost) == (theirs.consumed, theirs.lost)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_entry(), max_size=20))
def test_plain_path_tallies_as_parse_and_apply(flats):
    entries = [(b"%d-0" % n, flat) for n, flat in enumerate(flats)]
    frequent: Frequent = {}
    cold = _decoded(entries, frequent)  # labels not seen before: some go through parse()
    warm = _decoded(entries, frequent)  # seen: the plain path takes them
    reference = _reference(entries)
    _same(cold, reference)
    _same(warm, reference)


def test_plain_path_takes_the_common_entries():
    """The frequent events of a realistic mix go the plain way once their labels are known:
    the path the benchmark measures is the one taken."""
    # Labels no other test decodes: wire.py remembers decoded labels process-wide, and a test
    # before this one on the same worker may have taught it "app" or "q".
    unique = uuid.uuid4().hex.encode()
    app, queue, job_type = (b"%s-%s" % (name, unique) for name in (b"app", b"q", b"t"))
    common = [b"v", b"1", b"system", app, b"queue", queue, b"job_type", job_type]
    entries = [
        (b"1-0", [*common, b"event", b"enqueued", b"ts", repr(NOW).encode()]),
        (b"2-0", [*common, b"event", b"started", b"ts", repr(NOW).encode(), b"enqueued_at", b"1"]),
        (b"3-0", [*common, b"event", b"completed", b"ts", repr(NOW).encode(), b"duration", b"2"]),
    ]
    frequent: Frequent = {}
    _decoded(entries, frequent)  # the first entry's labels are new: parse() reads it
    assert len(frequent) == 2
    _decoded(entries, frequent)
    assert len(frequent) == 3
    for event in frequent.values():
        assert event.count[1] == (app.decode(), queue.decode(), job_type.decode(), "")


@pytest.mark.parametrize("name", sorted(_NUMBER_FIELDS | {b"worker", b"job_id", b"system"}))
def test_plain_path_refuses_as_parse_does(name):
    """Each field a plain entry may carry, with every edge value, in each frequent event."""
    entries = []
    for event in _EVENTS[:4]:
        for raw in _NUMBERS + _LABELS:
            fields = {b"v": b"1", b"event": event, b"ts": _NUMBERS[0], b"queue": b"q1", name: raw}
            entries.append((b"%d-0" % len(entries), [p for pair in fields.items() for p in pair]))
    frequent: Frequent = {}
    _same(_decoded(entries, frequent), _reference(entries))
    _same(_decoded(entries, frequent), _reference(entries))
    assert frequent  # the plain path took some of them


def test_plain_path_counts_refused_label_sets_as_apply_does():
    """Beyond a metric's room both paths fold the same label sets into the overflow series,
    and count each refused label set once a batch, not once an event."""
    entries = [
        (b"%d-0" % n, [b"v", b"1", b"event", b"enqueued", b"ts", repr(NOW).encode(), b"queue"])
        for n in range(100)
    ]
    for n, (_, flat) in enumerate(entries):
        flat.append(b"q%d" % (n % 10))
    frequent: Frequent = {}
    _decoded(entries, frequent)  # labels learned: the plain path takes the entries from now on
    assert len(_decoded(entries, frequent).plain) == len(entries)

    def recorded(tally_of) -> list[str]:
        # 4 samples: 3 counter label sets and the overflow's (store.SeriesGuard)
        telemetry = Telemetry(HealthBoard(), LimitsConfig(max_series_per_metric=4))
        metrics = EventMetrics(telemetry, {})
        workers = metrics.worker_registry(60.0, 100)
        for _ in range(3):
            metrics.record("s", tally_of(), workers)
        text = telemetry.render(False).decode()
        telemetry.shutdown()
        wanted = ("queue_jobs_enqueued_total{", "queue_exporter_series_overflow_total{")
        return sorted(line for line in text.splitlines() if line.startswith(wanted))

    plain = recorded(lambda: _decoded(entries, frequent))
    assert plain == recorded(lambda: _reference(entries))
    overflow = [line for line in plain if "overflow_total" in line]
    assert overflow == [
        'queue_exporter_series_overflow_total{metric="queue_jobs_enqueued_total"} 21.0'
    ]  # 7 queues refused, in each of 3 batches
