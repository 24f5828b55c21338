"""Stored times in every format the layouts use; anything else is a TimeParseError."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.core.item_time import TimeParseError, parse_time

pytestmark = pytest.mark.fast  # no server (scripts/test.sh --fast)

MOMENT = datetime(2026, 11, 29, 18, 30, 15, 250000, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("raw", "fmt", "divisor"),
    [
        ("2026-11-29T18:30:15.250000+00:00", "iso", 1),  # Python isoformat (Orchestrata)
        ("2026-11-29T18:30:15.250000Z", "iso", 1),  # RQ's %Y-%m-%dT%H:%M:%S.%fZ
        ("2026-11-29T18:30:15.250000123+00:00", "iso", 1),  # chrono RFC 3339, nanoseconds
        ("2026-11-29T18:30:15.25", "iso", 1),  # naive: UTC
        (b"2026-11-29T18:30:15.250000Z", "auto", 1),
        (MOMENT, "epoch_s", 1),
        (str(MOMENT), "auto", 1),  # Sidekiq 6: float seconds
        (int(MOMENT * 1000), "auto", 1),  # Sidekiq 7: integer milliseconds
        (str(int(MOMENT * 1000)), "epoch_ms", 1),  # BullMQ timestamp
        (int(MOMENT * 1000) * 4096, "epoch_ms", 4096),  # BullMQ delayed score
    ],
)
def test_formats(raw, fmt, divisor):
    assert parse_time(raw, fmt, divisor) == pytest.approx(MOMENT, abs=0.001)


@pytest.mark.parametrize(
    ("raw", "fmt"),
    [
        ("yesterday", "auto"),
        ("", "iso"),
        ("nan", "epoch_s"),
        ("inf", "auto"),
        ("12:00", "iso"),
        ("1e400", "epoch_s"),
        (True, "epoch_s"),
    ],
)
def test_rejects(raw, fmt):
    with pytest.raises(TimeParseError):
        parse_time(raw, fmt)


@given(
    st.one_of(
        st.text(max_size=64),
        st.binary(max_size=64),
        st.floats(),
        st.integers(),
        st.integers(min_value=-(10**400), max_value=10**400),  # beyond any float
    ),
    st.sampled_from(["auto", "iso", "epoch_s", "epoch_ms"]),
    st.one_of(st.just(1.0), st.floats(min_value=1e-300, max_value=1e300)),
)
def test_never_raises_anything_else(raw, fmt, divisor):
    try:
        result = parse_time(raw, fmt, divisor)
    except TimeParseError:
        return
    assert isinstance(result, float) and math.isfinite(result)
