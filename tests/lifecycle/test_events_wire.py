"""Wire format v1 (parse, validate, encode) and hostile input for the parser and the consumer."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.trace import get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from exporter.lifecycle import wire
from exporter.lifecycle.metrics import Tally, apply
from exporter.output.health import HealthBoard
from exporter.output.store import OVERFLOW
from exporter.output.telemetry import Telemetry
from exporter.output.telemetry_config import LimitsConfig
from exporter.sources.readers.runnerq import parse_entry
from tests.conftest import parse_exposition, value

NOW = float(int(time.time()))


def _fields(**values: object) -> dict[bytes, bytes]:
    return {key.encode(): str(item).encode() for key, item in values.items()}


@pytest.mark.fast
def test_encode_then_parse_round_trips():
    entry = wire.encode(
        "completed",
        {"queue": "q", "job_type": "t", "duration": 0.25, "attempt": 2, "ok": True, "x": None},
        ts=NOW - 1,
    )
    assert entry == {
        "v": "1",
        "event": "completed",
        "ts": repr(NOW - 1),
        "queue": "q",
        "job_type": "t",
        "duration": "0.25",
        "attempt": "2",
        "ok": "1",
    }
    event = wire.parse({k.encode(): v.encode() for k, v in entry.items()}, now=NOW)
    assert (event.name, event.ts, event.queue, event.job_type) == ("completed", NOW - 1, "q", "t")
    assert (event.duration, event.attempt, event.ok, event.system) == (0.25, 2, True, None)
    assert event.priority == "" and event.error_type == "other"


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (_fields(event="completed", ts=NOW, queue="q"), "missing_field"),
        (_fields(v=1, ts=NOW, queue="q"), "missing_field"),
        (_fields(v=2, event="completed", ts=NOW, queue="q"), "unknown_version"),
        (_fields(v=1, event="exploded", ts=NOW, queue="q"), "unknown_event"),
        (_fields(v=1, event="completed", ts="yesterday", queue="q"), "bad_number"),
        (_fields(v=1, event="completed", ts="nan", queue="q"), "bad_number"),
        (_fields(v=1, event="completed", ts=NOW, queue="q", duration="inf"), "bad_number"),
        (_fields(v=1, event="completed", ts=NOW, queue="q", duration=-0.5), "negative_duration"),
        (_fields(v=1, event="retried", ts=NOW, queue="q", delay=-3), "negative_duration"),
        (_fields(v=1, event="completed", ts=NOW + 3600, queue="q"), "future_time"),
        (_fields(v=1, event="started", ts=NOW, queue="q", enqueued_at=NOW + 999), "future_time"),
        (_fields(v=1, event="completed", ts=-1, queue="q"), "bad_value"),
        (_fields(v=1, event="completed", ts=NOW, queue="q", attempt=0), "bad_value"),
        (_fields(v=1, event="completed", ts=NOW, queue="q", attempt="1.5"), "bad_number"),
        (_fields(v=1, event="backend_op", ts=NOW, ok="yes", duration=1), "bad_value"),
        (_fields(v=1, event="completed", ts=NOW), "missing_field"),
        (_fields(v=1, event="backend_op", ts=NOW, operation="x"), "missing_field"),
        (_fields(v=1, event="worker_heartbeat", ts=NOW, queue="q", worker="w"), "missing_field"),
        (_fields(v=1, event="completed", ts=NOW, queue="q" * 2000), "oversized_field"),
        ({**_fields(v=1, event="completed", ts=NOW), b"queue": b"\xff\xfe"}, "bad_encoding"),
        ({f"f{n}".encode(): b"1" for n in range(100)}, "oversized_field"),
    ],
)
@pytest.mark.fast
def test_invalid_entries_name_their_reason(fields, reason):
    with pytest.raises(wire.InvalidEvent) as raised:
        wire.parse(fields, now=NOW)
    assert raised.value.reason == reason
    assert reason in wire.INVALID_REASONS


@pytest.mark.fast
def test_unknown_fields_are_ignored_and_unknown_error_types_are_other():
    event = wire.parse(
        _fields(v=1, event="failed", ts=NOW, queue="q", error_type="kaboom", color="red"), NOW
    )
    assert event.error_type == "other"


_KEYS = st.sampled_from(
    [b"v", b"event", b"ts", b"queue", b"job_type", b"duration", b"delay", b"attempt", b"ok",
     b"active", b"capacity", b"worker", b"enqueued_at", b"count", b"error_type", b"system",
     b"traceparent"]
)  # fmt: skip
_VALUES = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"1", b"0", b"-1", b"nan", b"inf", b"1e308", b"", b"completed"]),
    st.sampled_from([name.encode() for name in wire.EVENTS]),
    st.floats(allow_nan=True).map(lambda f: repr(f).encode()),
    st.integers().map(lambda n: str(n).encode()),
)
_FIELD_MAPS = st.dictionaries(st.one_of(_KEYS, st.binary(max_size=10)), _VALUES, max_size=20)


@settings(max_examples=600, deadline=None)
@given(_FIELD_MAPS)
@pytest.mark.fast
def test_parser_and_metrics_survive_arbitrary_field_maps(fields):
    try:
        event = wire.parse(fields, now=NOW)
    except wire.InvalidEvent as error:
        assert error.reason in wire.INVALID_REASONS
        return
    if event.dropped_field is not None:
        assert event.dropped_field[0] in wire.INVALID_REASONS and event.trace is None
    tally = Tally()
    apply(tally, event, "fallback")  # a valid event always maps onto metrics
    for (_, labels), _amount in tally.counts.items():
        assert all(isinstance(label, str) for label in labels)


def _outcome(parse, fields):
    try:
        return parse(fields, now=NOW)
    except wire.InvalidEvent as error:
        return error.reason


@settings(max_examples=600, deadline=None)
@given(st.lists(st.tuples(st.one_of(_KEYS, st.binary(max_size=10)), _VALUES), max_size=20))
def test_a_flat_entry_parses_as_its_dict_does(pairs):
    """hiredis's flat list (read by its layout) and the same entry as a dict give the same
    event or the same refusal, a name given twice included (its last value counts)."""
    flat = [item for pair in pairs for item in pair]
    for _ in range(2):  # the second time through the layout remembered the first time
        expected = _outcome(wire.parse, dict(pairs))
        assert _outcome(wire.parse_flat, flat) == expected
        assert _outcome(wire.parse_flat, [bytes(item) for item in flat]) == expected


@pytest.mark.fast
def test_layouts_are_remembered_within_bounds():
    fields = [b"v", b"1", b"event", b"enqueued", b"ts", b"1", b"queue", b"q"]
    assert wire.parse_flat(fields, now=NOW).queue == "q"
    assert wire._layouts[(b"v", b"event", b"ts", b"queue")].queue == 3
    for n in range(wire.MAX_LAYOUTS + 10):  # a producer naming its fields anew every time
        event = wire.parse_flat([*fields, b"extra-%d" % n, b"x"], now=NOW)
        assert event.queue == "q"
    assert len(wire._layouts) <= wire.MAX_LAYOUTS
    long_name = b"n" * 4096  # used, not kept: hostile names cost no memory
    assert wire.parse_flat([*fields, long_name, b"x"], now=NOW).queue == "q"
    assert not any(long_name in names for names in wire._layouts)
    many = [item for n in range(wire.MAX_FIELDS + 1) for item in (b"f%d" % n, b"1")]
    with pytest.raises(wire.InvalidEvent) as refused:
        wire.parse_flat([*fields, *many], now=NOW)
    assert refused.value.reason == "oversized_field"


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.binary(max_size=8),
        st.one_of(
            st.binary(max_size=60),
            st.recursive(
                st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner),
                max_leaves=8,
            ).map(lambda doc: json.dumps(doc).encode()),
            st.fixed_dictionaries(
                {
                    "activity_id": st.text(max_size=40),
                    "timestamp": st.sampled_from(["2026-01-01T00:00:00Z", "x", ""]),
                    "event_type": st.sampled_from(["Enqueued", "Completed", "Retrying", "Nope"]),
                    "detail": st.none() | st.dictionaries(st.text(max_size=5), st.integers()),
                }
            ).map(lambda doc: json.dumps(doc).encode()),
        ),
        max_size=3,
    )
)
@pytest.mark.fast
def test_runnerq_parser_survives_arbitrary_entries(fields):
    try:
        parse_entry(fields, NOW)
    except wire.InvalidEvent as error:
        assert error.reason in wire.INVALID_REASONS


@pytest.mark.fast
def test_a_flood_of_job_types_cannot_grow_memory_without_bound():
    telemetry = Telemetry(HealthBoard(), LimitsConfig(max_series_per_metric=50))
    for batch in range(20):
        tally = Tally()
        for n in range(1000):
            job_type = f"type-{batch}-{n}" + ("x" * 500 if n == 0 else "")
            event = wire.Event.of("completed", NOW, queue="q", job_type=job_type, duration=0.1)
            apply(tally, event, "bug")
        telemetry.store.apply(tally.counts, tally.observations)
    store = telemetry.store
    assert len(store._counters["queue_jobs_completed_total"]) == 50
    # A histogram series is 18 samples (15 bounds, +Inf, _sum, _count): 50 samples hold the
    # overflow series and one other.
    assert len(store._histograms["queue_job_execution_seconds"]) == 2
    series = parse_exposition(telemetry.render(False).decode())
    overflow = value(series, "queue_jobs_completed_total", job_type=OVERFLOW)
    assert overflow == 20_000 - 49
    refused = value(series, "queue_exporter_series_overflow_total",
                    metric="queue_jobs_completed_total")  # fmt: skip
    assert refused is not None and refused > 0
    long_values = [labels[2] for labels in store._counters["queue_jobs_completed_total"]]
    assert max(len(label) for label in long_values) <= 128  # label values are cut


@pytest.mark.fast
def test_label_values_seen_before_decode_as_the_first_time():
    """Remembered label values (wire._texts) are shared, still checked, and bounded."""
    first = wire.parse(_fields(v=1, event="enqueued", ts=NOW, queue="émails"), now=NOW)
    again = wire.parse(_fields(v=1, event="enqueued", ts=NOW, queue="émails"), now=NOW)
    assert first.queue == again.queue == "émails" and first.queue is again.queue
    for raw, reason in ((b"\xff", "bad_encoding"), (b"q" * 1025, "oversized_field")):
        for _ in range(2):  # refused every time: a refused value is never remembered
            fields = {b"v": b"1", b"event": b"enqueued", b"ts": b"1", b"queue": raw}
            with pytest.raises(wire.InvalidEvent) as refused:
                wire.parse(fields, now=NOW)
            assert refused.value.reason == reason
    for n in range(wire.MAX_TEXTS + 10):
        fields = {b"v": b"1", b"event": b"enqueued", b"ts": b"1", b"queue": b"q%d" % n}
        assert wire.parse(fields, now=NOW).queue == f"q{n}"
    assert len(wire._texts) <= wire.MAX_TEXTS


# -- trace context ------------------------------------------------------------------------------

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"  # the spec's example


def _otel_context(traceparent: bytes):
    """What OpenTelemetry's own W3C propagator makes of a traceparent: the tests' truth."""
    carrier = {"traceparent": traceparent.decode("latin-1")}
    span = get_current_span(TraceContextTextMapPropagator().extract(carrier))
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return wire.TraceContext(
        f"{context.trace_id:032x}", f"{context.span_id:016x}", int(context.trace_flags)
    )


def _our_context(traceparent: bytes):
    try:
        return wire.parse_traceparent(traceparent)
    except wire.InvalidEvent as error:
        assert error.reason == "bad_traceparent"
        return None


@pytest.mark.fast
def test_a_traceparent_round_trips_and_rides_on_the_parsed_event():
    entry = wire.encode("completed", {"queue": "q", "traceparent": TRACEPARENT}, ts=NOW)
    assert entry["traceparent"] == TRACEPARENT
    event = wire.parse({key.encode(): item.encode() for key, item in entry.items()}, NOW)
    assert event.trace == _otel_context(TRACEPARENT.encode())
    assert event.trace == ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 1)
    assert event.dropped_field is None
    flat = [item for pair in entry.items() for item in (pair[0].encode(), pair[1].encode())]
    assert wire.parse_flat(flat, NOW) == event
    assert wire.parse(_fields(v=1, event="completed", ts=NOW, queue="q"), NOW).trace is None


@pytest.mark.parametrize(
    "traceparent",
    [
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # uppercase
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero parent id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff forbidden
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",  # 00 is 55 chars
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",  # flags then not a dash
        "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n",
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" + "-x" * 500,
    ],
)
@pytest.mark.fast
def test_a_malformed_traceparent_costs_that_field_never_the_event(traceparent):
    fields = _fields(v=1, event="completed", ts=NOW, queue="q", duration=0.5)
    fields[b"traceparent"] = traceparent.encode()
    event = wire.parse(fields, NOW)
    assert (event.name, event.queue, event.duration) == ("completed", "q", 0.5)
    assert event.trace is None
    assert event.dropped_field is not None and event.dropped_field[0] == "bad_traceparent"
    assert "bad_traceparent" in wire.INVALID_REASONS
    with pytest.raises(wire.InvalidEvent, match="bad_traceparent"):  # encode says so at once
        wire.encode("completed", {"queue": "q", "traceparent": traceparent})


@pytest.mark.fast
def test_a_later_version_is_read_by_the_forward_compatibility_rule():
    later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-what-comes-next"
    assert wire.parse_traceparent(later.encode()) == _otel_context(later.encode())
    assert wire.parse_traceparent(later.encode()).flags == 3


_TRACE_PIECES = st.sampled_from(
    ["00", "01", "cc", "ff", "-", "0" * 16, "0" * 32, "4bf92f3577b34da6a3ce929d0e0e4736",
     "00f067aa0ba902b7", "01", "A", "g", "x", "-x", "\n", " "]
)  # fmt: skip
_TRACEPARENTS = st.one_of(
    st.lists(_TRACE_PIECES, max_size=9).map("".join),
    st.text(alphabet="0123456789abcdefF-\n ", max_size=70),
    st.tuples(
        st.sampled_from(["00", "01", "fe", "ff", "0g"]),
        st.text(alphabet="0123456789abcdef", min_size=32, max_size=32),
        st.text(alphabet="0123456789abcdef", min_size=16, max_size=16),
        st.text(alphabet="0123456789abcdef", min_size=2, max_size=2),
        st.sampled_from(["", "-", "-more", "x", "-\n"]),
    ).map(lambda parts: "-".join(parts[:4]) + parts[4]),
)


@settings(max_examples=1000, deadline=None)
@given(_TRACEPARENTS)
@pytest.mark.fast
def test_traceparents_are_read_as_opentelemetrys_propagator_reads_them(traceparent):
    raw = traceparent.encode()
    ours = _our_context(raw)
    # OpenTelemetry's propagator lets through the whitespace an HTTP header may carry around
    # its value (and a newline before its end): a stream field carries none, unless within the
    # fields a later version appends after a dash, opaque to this version's reader.
    if any(space in raw for space in (b" ", b"\t", b"\n")):
        assert ours is None or (
            raw[:2] != b"00" and raw[55:56] == b"-" and ours == _our_context(raw[:55])
        )
        return
    assert ours == _otel_context(raw)
