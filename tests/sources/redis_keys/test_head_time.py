"""key_items.head_time, the bulk path's reader of a head's time, reads a list's JSON item
the short way when it can: whatever the item, it gives what head_item and item_time give, the
same time or an error of the same reason (hostile items from tests/sources/redis_keys/test_item_fuzz.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from exporter.sources.redis_keys.groups import OldestItem
from exporter.sources.redis_keys.items import exception_reason, head_time, item_time
from tests.sources.redis_keys.test_item_fuzz import divisors, formats, items, times

pytestmark = pytest.mark.fast  # no server (scripts/test.sh --fast)

ORCHESTRATA = json.dumps({"packet": {"n": 1}, "queued_at": "2026-11-29T18:00:00+00:00"}).encode()


def _outcome(read: Callable[[], float | None]) -> tuple[str, object]:
    try:
        return "time", read()
    except Exception as error:
        return "error", exception_reason(error)


@given(
    item=st.one_of(items, times.map(lambda value: json.dumps({"t": value}).encode())),
    time_format=formats,
    divisor=divisors,
)
@example(item=ORCHESTRATA.replace(b"queued_at", b"t"), time_format="iso", divisor=1.0)
@example(item=b'{"t": "2026-11-29T18:00:00"}', time_format="iso", divisor=1.0)  # naive: UTC
@example(item=b'{"t": "2026-11-29T18:00:00Z"} ', time_format="iso", divisor=1.0)  # space after
@example(item=b'{"t": "2026-11-29T18:00:00Z"}{}', time_format="iso", divisor=1.0)  # not JSON
@example(item=b'{"t": 1764439200123}', time_format="auto", divisor=1.0)  # milliseconds
@example(item=b'{"t": true}', time_format="epoch_s", divisor=1.0)
@example(item=b"\xff{}", time_format="iso", divisor=1.0)  # not UTF-8
@settings(max_examples=400, deadline=None)
def test_head_time_reads_as_item_time(item: bytes, time_format: str, divisor: float) -> None:
    oldest = OldestItem.model_validate(
        {"time_in": "json", "field": "t", "format": time_format, "divisor": divisor}
    )
    expected = _outcome(lambda: item_time(oldest, item, None))
    assert _outcome(lambda: head_time(oldest)(item)) == expected


def test_head_time_of_an_orchestrata_item() -> None:
    oldest = OldestItem.model_validate({"time_in": "json", "field": "queued_at", "format": "iso"})
    assert head_time(oldest)(ORCHESTRATA) == datetime(2026, 11, 29, 18, tzinfo=UTC).timestamp()
    assert head_time(oldest)(None) is None  # an empty list's LINDEX
