"""The bull preset against the real Bull 3.x and 4.x: what the library says is what we serve.

Jobs are added (plain, prioritized, backdated), paused, delayed, completed, failed, retried
with backoff and kept active by Bull itself (tests/node/bull.cjs); the truth is its own
getJobCounts(), the next waiting jobs (getWaiting) and the due delayed ones (getDelayed).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.conftest import Series, wait_until_served_as_truth
from tests.real_queues import BULL_MAJORS, Bull

# Bull's counts -> our states
STATES = {
    "waiting": "pending",
    "paused": "pending",
    "active": "active",
    "delayed": "scheduled",
    "completed": "completed",
    "failed": "failed",
}


@pytest.fixture(params=BULL_MAJORS, ids=lambda major: f"bull{major}")
def bull(request: pytest.FixtureRequest, redis_db: int) -> Iterator[Bull]:
    driver = Bull(request.param, redis_db)
    yield driver
    driver.stop_all()


def _mismatches(series: Series, truth: dict[str, Any], scraped_ms: float) -> list[str]:
    found: list[str] = []
    served = {
        dict(labels)["queue"]
        for name, labels in series
        if name == "queue_depth" and ("system", "bull") in labels
    }
    if served != set(truth["queues"]):
        found.append(f"queues {sorted(served)} != {sorted(truth['queues'])}")
    for queue, view in truth["queues"].items():
        expected: dict[str, int] = {}
        for kind, count in view["counts"].items():
            expected[STATES[kind]] = expected.get(STATES[kind], 0) + count
        for state, count in expected.items():
            depth = _value(series, "queue_depth", queue=queue, state=state)
            if depth != count:
                found.append(f"{queue} {state}: served {depth}, Bull {count}")
        due = _value(series, "queue_scheduled_due", queue=queue)
        if due != view["due"]:
            found.append(f"{queue} due: served {due}, Bull {view['due']}")
        age = _value(series, "queue_oldest_age_seconds", queue=queue, state="pending")
        stamps = view["next_timestamps_ms"]
        if not stamps:
            if age is not None:
                found.append(f"{queue}: age {age} served for no waiting job")
            continue
        earliest = (truth["now_ms"] - min(stamps)) / 1000
        latest = (scraped_ms - min(stamps)) / 1000
        if age is None or not earliest - 0.5 <= age <= latest + 0.5:
            found.append(f"{queue} age: served {age}, Bull {earliest:.1f} to {latest:.1f}")
    return found


def _value(series: Series, name: str, **labels: str) -> float | None:
    wanted = {("system", "bull"), *labels.items()}
    values = [v for (n, ls), v in series.items() if n == name and wanted <= ls]
    return values[0] if len(values) == 1 else None


def test_every_state_and_age_as_bull_counts_them(bull, redis_url, run_exporter):
    now_ms = int(time.time() * 1000)
    held = bull.hold(
        # waiting jobs created a while ago (Bull's own timestamp option), FIFO
        *[
            {"op": "add", "queue": "emails", "opts": {"timestamp": now_ms - age_s * 1000}}
            for age_s in (90, 60, 30)
        ],
        # prioritized jobs: Bull inserts each at its place in the wait list
        *[
            {
                "op": "add",
                "queue": "reports",
                "opts": {"priority": p, "timestamp": now_ms - s * 1000},
            }
            for p, s in ((3, 200), (1, 50), (2, 100))
        ],
        # a paused queue: its jobs wait in the paused list
        {"op": "pause", "queue": "exports"},
        {"op": "add", "queue": "exports", "count": 2, "opts": {"timestamp": now_ms - 40_000}},
        # delayed: one in an hour, one already due (no processor of its queue promotes it)
        {"op": "add", "queue": "later", "opts": {"delay": 3_600_000}},
        {"op": "add", "queue": "later", "opts": {"delay": 50}},
        {"op": "sleep", "ms": 200},
        # a processor completes three, fails two for good and one retried in an hour
        {"op": "add", "queue": "work", "count": 3},
        {"op": "add", "queue": "work", "count": 2, "data": {"fail": "always"}},
        {
            "op": "add",
            "queue": "work",
            "data": {"fail": "always"},
            "opts": {"attempts": 2, "backoff": {"type": "fixed", "delay": 3_600_000}},
        },
        {"op": "work", "queue": "work", "completed": 3, "failed": 3},
        # a queue whose only job completed and was removed: only its id counter is left
        {"op": "add", "queue": "drained", "opts": {"removeOnComplete": True}},
        {"op": "work", "queue": "drained", "completed": 1},
        # one job kept active by a processor until the end of the test
        {"op": "add", "queue": "busy", "data": {"sleep_ms": 600_000}},
        {"op": "hold", "queue": "busy"},
    )
    queues = ["emails", "reports", "exports", "later", "work", "drained", "busy"]
    truth = bull.truth(queues)
    assert truth["version"].split(".")[0] == str(bull.major)
    assert truth["queues"]["later"]["due"] == 1 and truth["queues"]["busy"]["counts"]["active"] == 1
    app = run_exporter(redis_url=redis_url, preset=["bull"])
    wait_until_served_as_truth(app, lambda series, at: _mismatches(series, truth, at * 1000))
    bull.stop(held)


def _errors(series: Series, reason: str) -> float:
    wanted = {("source", "redis"), ("reason", reason)}
    return sum(
        v
        for (name, labels), v in series.items()
        if name == "queue_exporter_source_errors_total" and wanted <= labels
    )


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
        found = _mismatches(series, truth, scraped_ms)
        found += [f"{reason} not counted" for reason in reasons if _errors(series, reason) < 1]
        up = [
            v
            for (n, ls), v in series.items()
            if n == "queue_exporter_source_up" and ("source", "redis") in ls
        ]
        return found + ([] if up == [1] else [f"source_up {up}"])

    app = run_exporter(
        {"sources": {"redis": {"cycle_timeout": 30}}}, redis_url=redis_url, preset=["bull"]
    )
    wait_until_served_as_truth(app, lambda series, at: mismatches(series, at * 1000))
