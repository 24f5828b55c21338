"""The bull preset against hostile jobs: jobs the real Bull 3.x and 4.x wrote, then broken in
Redis. Every state and age as Bull counts them is checked by the conformance harness
(tests/conformance/); its truth is the one these tests compare with.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from tests.conformance.adapters.node_queues import BullAdapter
from tests.conformance.checks import mismatches as truth_mismatches
from tests.conftest import Series, total, wait_until_served_as_truth
from tests.real_queues import BULL_MAJORS, Bull


@pytest.fixture(params=BULL_MAJORS, ids=lambda major: f"bull{major}")
def bull(request: pytest.FixtureRequest, redis_db: int) -> Iterator[Bull]:
    driver = Bull(request.param, redis_db)
    yield driver
    driver.stop_all()


def test_hostile_jobs_cost_only_their_own_age(bull, redis_client, redis_url, run_exporter):
    """Jobs Bull wrote, then broken in Redis: the next waiting job's hash missing, of another
    type, without its timestamp or with one that is no number. Each costs its queue's age
    only (counted by reason); every depth stays Bull's, and the sound queues keep their age,
    a job with a 1 MB body too (only its timestamp field is read)."""
    now_ms = int(time.time() * 1000)
    hostile = ["missing", "wrongtype", "notime", "notanumber"]
    bull.stop(bull.hold(
        *[{"op": "add", "queue": "good", "opts": {"timestamp": now_ms - s * 1000}} for s in (90, 30)],
        {"op": "add", "queue": "huge", "pad": 1_000_000,
         "opts": {"timestamp": now_ms - 45_000}},
        *[{"op": "add", "queue": queue, "count": 2} for queue in hostile],
    ))  # fmt: skip
    truth = bull.truth(["good", "huge", *hostile])  # before the jobs are broken
    assert truth["version"].split(".")[0] == str(bull.major)
    client: redis.Redis = redis_client
    job = {queue: f"bull:{queue}:{client.lindex(f'bull:{queue}:wait', -1).decode()}"
           for queue in hostile}  # fmt: skip
    client.delete(job["missing"])
    client.delete(job["wrongtype"])
    client.rpush(job["wrongtype"], "not a hash")
    client.hdel(job["notime"], "timestamp")
    client.hset(job["notanumber"], "timestamp", "yesterday")

    # what must be served: Bull's own counts everywhere, no age where the next job is broken
    for queue in hostile:
        truth["queues"][queue]["next_timestamps_ms"] = []
    reasons = ("time_missing", "wrong_type", "time_unparsable")

    def mismatches(series: Series, scraped_ms: float) -> list[str]:
        served_truth = BullAdapter.truth(truth)
        served_truth.sources_up = ("redis",)
        found = truth_mismatches(series, served_truth, scraped_ms / 1000)
        errors = "queue_exporter_source_errors_total"
        found += [
            f"{reason} not counted"
            for reason in reasons
            if total(series, errors, source="redis", reason=reason) < 1
        ]
        return found

    app = run_exporter(
        {"sources": {"redis": {"cycle_timeout": 30}}}, redis_url=redis_url, preset=["bull"]
    )
    wait_until_served_as_truth(app, lambda series, at: mismatches(series, at * 1000))
