"""The waits between attempts at a failing backend (exporter/sources/backoff.py)."""

from __future__ import annotations

import pytest

from exporter.sources.backoff import Backoff

pytestmark = pytest.mark.fast  # no server (scripts/test.sh --fast)


def test_waits_double_up_to_the_ceiling_and_start_over_after_a_success():
    backoff = Backoff(ceiling=5.0)
    assert [backoff.failed() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    backoff.succeeded()
    assert [backoff.failed() for _ in range(2)] == [0.5, 1.0]


def test_a_ceiling_below_the_first_wait_bounds_every_wait():
    backoff = Backoff(ceiling=0.2)  # a sampling interval shorter than the first wait
    assert [backoff.failed() for _ in range(3)] == [0.2, 0.2, 0.2]
