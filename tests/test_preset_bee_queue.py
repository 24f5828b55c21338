"""The bee_queue preset against the real Bee-Queue: what the library says is what we serve.

Jobs are created (backdated through their options.timestamp), delayed, completed, failed,
retried with a backoff and kept active by Bee-Queue itself (tests/node/bee-queue.cjs); the
truth is its own checkHealth(), the next waiting job and the due delayed ones (getJobs).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.conftest import Series, wait_until_served_as_truth
from tests.real_queues import BEE_QUEUE_MAJORS, BeeQueue

# checkHealth()'s counts -> our states
STATES = {
    "waiting": "pending",
    "active": "active",
    "delayed": "scheduled",
    "succeeded": "completed",
    "failed": "failed",
}


@pytest.fixture(params=BEE_QUEUE_MAJORS, ids=lambda major: f"beequeue{major}")
def bee_queue(request: pytest.FixtureRequest, redis_db: int) -> Iterator[BeeQueue]:
    driver = BeeQueue(request.param, redis_db)
    yield driver
    driver.stop_all()


def _mismatches(series: Series, truth: dict[str, Any], scraped_ms: float) -> list[str]:
    found: list[str] = []
    served = {
        dict(labels)["queue"]
        for name, labels in series
        if name == "queue_depth" and ("system", "bee_queue") in labels
    }
    if served != set(truth["queues"]):
        found.append(f"queues {sorted(served)} != {sorted(truth['queues'])}")
    for queue, view in truth["queues"].items():
        for kind, count in view["counts"].items():
            depth = _value(series, "queue_depth", queue=queue, state=STATES[kind])
            if depth != count:
                found.append(f"{queue} {STATES[kind]}: served {depth}, Bee-Queue {count}")
        due = _value(series, "queue_scheduled_due", queue=queue)
        if due != view["due"]:
            found.append(f"{queue} due: served {due}, Bee-Queue {view['due']}")
        age = _value(series, "queue_oldest_age_seconds", queue=queue, state="pending")
        stamp = view["next_timestamp_ms"]
        if stamp is None:
            if age is not None:
                found.append(f"{queue}: age {age} served for no waiting job")
            continue
        earliest, latest = (truth["now_ms"] - stamp) / 1000, (scraped_ms - stamp) / 1000
        if age is None or not earliest - 0.5 <= age <= latest + 0.5:
            found.append(f"{queue} age: served {age}, Bee-Queue {earliest:.1f} to {latest:.1f}")
    return found


def _value(series: Series, name: str, **labels: str) -> float | None:
    wanted = {("system", "bee_queue"), *labels.items()}
    values = [v for (n, ls), v in series.items() if n == name and wanted <= ls]
    return values[0] if len(values) == 1 else None


def test_every_state_and_age_as_bee_queue_counts_them(bee_queue, redis_url, run_exporter):
    now_ms = int(time.time() * 1000)
    held = bee_queue.hold(
        # waiting jobs created a while ago, the oldest served first
        *[
            {"op": "add", "queue": "emails", "opts": {"timestamp": now_ms - age_s * 1000}}
            for age_s in (90, 60, 30)
        ],
        # delayed: one in an hour, one already due (no worker activates delayed jobs)
        {"op": "add", "queue": "later", "opts": {"delay": 3_600_000}},
        {"op": "add", "queue": "later", "opts": {"delay": 50}},
        {"op": "sleep", "ms": 200},
        # a processor: three succeed, two fail for good, one fails and retries in an hour
        {"op": "add", "queue": "work", "count": 3},
        {"op": "add", "queue": "work", "count": 2, "data": {"fail": "always"}},
        {
            "op": "add",
            "queue": "work",
            "data": {"fail": "always"},
            "opts": {"retries": 1, "backoff": 3_600_000},
        },
        {"op": "work", "queue": "work", "succeeded": 3, "failed": 2, "retrying": 1},
        # one job kept active by a processor until the end of the test
        {"op": "add", "queue": "busy", "data": {"sleep_ms": 600_000}},
        {"op": "hold", "queue": "busy"},
    )
    truth = bee_queue.truth(["emails", "later", "work", "busy"])
    assert truth["version"].split(".")[0] == str(bee_queue.major)
    assert truth["queues"]["later"]["due"] == 1 and truth["queues"]["busy"]["counts"]["active"] == 1
    assert truth["queues"]["work"]["counts"]["delayed"] == 1
    app = run_exporter(redis_url=redis_url, preset=["bee_queue"])
    wait_until_served_as_truth(app, lambda series, at: _mismatches(series, truth, at * 1000))
    bee_queue.stop(held)


def _errors(series: Series, reason: str) -> float:
    wanted = {("source", "redis"), ("reason", reason)}
    return sum(
        v
        for (name, labels), v in series.items()
        if name == "queue_exporter_source_errors_total" and wanted <= labels
    )


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
        found = _mismatches(series, truth, scraped_ms)
        found += [f"{reason} not counted" for reason in reasons if _errors(series, reason) < 1]
        up = [
            v
            for (n, ls), v in series.items()
            if n == "queue_exporter_source_up" and ("source", "redis") in ls
        ]
        return found + ([] if up == [1] else [f"source_up {up}"])

    app = run_exporter(
        {"sources": {"redis": {"cycle_timeout": 30}}}, redis_url=redis_url, preset=["bee_queue"]
    )
    wait_until_served_as_truth(app, lambda series, at: mismatches(series, at * 1000))
