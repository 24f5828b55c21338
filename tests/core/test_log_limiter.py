"""LogLimiter: a repeated warning is logged once per key and period, with the count held back."""

from __future__ import annotations

import logging

import pytest

from exporter.core.logs import LogLimiter

pytestmark = pytest.mark.fast  # no server (scripts/test.sh --fast)


def test_first_occurrence_logged_then_held_back_then_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limiter = LogLimiter(logging.getLogger("qe.test.limiter"), period=0.2)
    with caplog.at_level(logging.WARNING, logger="qe.test.limiter"):
        assert limiter.warning(("group-a", "not_json"), "group %s: %s", "group-a", "not_json")
        for _ in range(5):
            assert not limiter.warning(("group-a", "not_json"), "group %s", "group-a")
        assert limiter.warning(("group-b", "not_json"), "group %s", "group-b")
    assert [r.getMessage() for r in caplog.records] == ["group group-a: not_json", "group group-b"]

    limiter._seen[("group-a", "not_json")] = (0.0, 5)  # as if the period had passed
    with caplog.at_level(logging.WARNING, logger="qe.test.limiter"):
        assert limiter.warning(("group-a", "not_json"), "group %s", "group-a")
    assert caplog.records[-1].getMessage() == "group group-a (5 more like it since the last report)"


def test_remembers_a_bounded_number_of_keys() -> None:
    limiter = LogLimiter(logging.getLogger("qe.test.limiter"), period=3600, max_keys=10)
    for key in range(100):
        limiter.warning(key, "key %s", key)
    assert len(limiter._seen) == 10
    assert limiter.warning(0, "key %s", 0)  # forgotten, so logged again
