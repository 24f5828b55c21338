"""The bee_queue preset against hostile jobs: jobs the real Bee-Queue wrote, then broken in
Redis. Every state and age as Bee-Queue counts them is checked by the conformance harness
(tests/conformance/); its truth is the one these tests compare with.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import redis

from tests.conformance.adapters.node_queues import BeeQueueAdapter
from tests.conformance.checks import mismatches as truth_mismatches
from tests.conftest import Series, total, wait_until_served_as_truth
from tests.real_queues import BEE_QUEUE_MAJORS, BeeQueue


@pytest.fixture(params=BEE_QUEUE_MAJORS, ids=lambda major: f"beequeue{major}")
def bee_queue(request: pytest.FixtureRequest, redis_db: int) -> Iterator[BeeQueue]:
    driver = BeeQueue(request.param, redis_db)
    yield driver
    driver.stop_all()


def test_hostile_jobs_cost_only_their_own_age(bee_queue, redis_client, redis_url, run_exporter):
    """Jobs Bee-Queue wrote, then broken in Redis: the next waiting job's JSON missing from the
    jobs hash, not JSON, without options.timestamp, a jobs hash of another type, and a job of
    1 MB (over max_item_bytes, never read). Each costs its queue's age only (counted by
    reason); every depth stays checkHealth()'s and the sound queue keeps its age."""
    now_ms = int(time.time() * 1000)
    hostile = ["missing", "notjson", "notime", "wrongtype", "huge"]
    bee_queue.stop(bee_queue.hold(
        *[{"op": "add", "queue": "good", "opts": {"timestamp": now_ms - s * 1000}} for s in (90, 30)],
        *[{"op": "add", "queue": queue, "count": 2} for queue in hostile if queue != "huge"],
        {"op": "add", "queue": "huge", "pad": 1_000_000},
    ))  # fmt: skip
    truth = bee_queue.truth(["good", *hostile])  # before the jobs are broken
    assert truth["version"].split(".")[0] == str(bee_queue.major)
    client: redis.Redis = redis_client
    jobs = {queue: f"bq:{queue}:jobs" for queue in hostile}
    next_id = {queue: client.lindex(f"bq:{queue}:waiting", -1) for queue in hostile}
    client.hdel(jobs["missing"], next_id["missing"])
    client.hset(jobs["notjson"], next_id["notjson"], b"{not json")
    job = json.loads(client.hget(jobs["notime"], next_id["notime"]))
    del job["options"]["timestamp"]
    client.hset(jobs["notime"], next_id["notime"], json.dumps(job))
    client.delete(jobs["wrongtype"])
    client.set(jobs["wrongtype"], "not a hash")

    # what must be served: checkHealth()'s counts everywhere, no age where the next job is broken
    for queue in hostile:
        truth["queues"][queue]["next_timestamp_ms"] = None
    reasons = ("time_missing", "item_not_json", "wrong_type", "item_too_large")

    def mismatches(series: Series, scraped_ms: float) -> list[str]:
        served_truth = BeeQueueAdapter.truth(truth)
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
        {"sources": {"redis": {"cycle_timeout": 30}}}, redis_url=redis_url, preset=["bee_queue"]
    )
    wait_until_served_as_truth(app, lambda series, at: mismatches(series, at * 1000))
