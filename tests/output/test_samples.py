"""SampleSet: series added one by one and as columns read alike and combine as their metric says."""

from __future__ import annotations

import pytest

from exporter.output.catalog import BY_NAME
from exporter.output.samples import SampleSet, Series, SeriesColumns, longest_label

pytestmark = pytest.mark.fast  # no server (scripts/test.sh --fast)

DEPTH = BY_NAME["queue_depth"]  # combines by sum
OLDEST = BY_NAME["queue_oldest_age_seconds"]  # combines by max


def _read(samples: SampleSet) -> dict[str, dict[tuple[str, ...], float]]:
    read: dict[str, dict[tuple[str, ...], float]] = {}
    for spec, series in samples.metrics():
        items = list(series.items())
        read[spec.name] = dict(items)
        assert len(items) == len(read[spec.name]) == len(series), "a label set read twice"
    return read


def _depth_columns(queues: tuple[str, ...], state: str, values: list[float]) -> SeriesColumns:
    return SeriesColumns(("app", queues, "", state), values)


def test_columns_read_like_single_series():
    assert DEPTH.labels == ("system", "queue", "priority", "state")
    samples = SampleSet()
    queues = ("a", "b")
    samples.add_columns(DEPTH, _depth_columns(queues, "pending", [1, 2]))
    samples.add_columns(DEPTH, _depth_columns(queues, "active", [3, 4]))  # disjoint: by state
    assert _read(samples)["queue_depth"] == {
        ("app", "a", "", "pending"): 1,
        ("app", "b", "", "pending"): 2,
        ("app", "a", "", "active"): 3,
        ("app", "b", "", "active"): 4,
    }


def test_columns_that_may_meet_combine():
    samples = SampleSet()
    samples.add_columns(DEPTH, _depth_columns(("a", "b"), "pending", [1, 2]))
    samples.add_columns(DEPTH, _depth_columns(("b", "c"), "pending", [10, 20]))
    samples.add_labelled(DEPTH, ("app", "c", "", "pending"), 100)
    samples.add_labelled(OLDEST, ("app", "a", "", "pending"), 7)
    samples.add_columns(OLDEST, SeriesColumns(("app", ("a",), "", "pending"), [5]))
    assert _read(samples) == {
        "queue_depth": {
            ("app", "a", "", "pending"): 1,
            ("app", "b", "", "pending"): 12,
            ("app", "c", "", "pending"): 120,
        },
        "queue_oldest_age_seconds": {("app", "a", "", "pending"): 7},
    }


def test_series_from_two_sources_add_up():
    first = Series(({("app", "a"): 1.0},))
    second = Series((SeriesColumns(("app", ("a", "b")), [2.0, 3.0]),))
    assert dict(first.plus(second).items()) == {("app", "a"): 3.0, ("app", "b"): 3.0}


def test_longest_label_covers_columns_and_single_series():
    long_queue = "q" * 40
    columns = SeriesColumns(("app", ("a", long_queue)), [1.0, 2.0])
    assert longest_label([Series((columns,))]) == 40
    assert longest_label([Series(({("x" * 50, "a"): 1.0},)), Series((columns,))]) == 50
    assert longest_label([Series(({},))]) == 0
