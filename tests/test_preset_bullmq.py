"""The bullmq preset against the real BullMQ 5.x and 6.x: what the library says is what we serve.

Jobs are added, paused, chained in flows, delayed, rate-limited, completed, failed, retried and
kept active by BullMQ itself (tests/node/bullmq.cjs); the truth is its own getJobCounts() and
the next job of each waiting state.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import Series, wait_until_served_as_truth
from tests.real_queues import BULLMQ_MAJORS, BullMQ

# BullMQ's states -> ours. Waiting (also a 5.x paused queue's list) and prioritized jobs are
# pending; flow parents waiting for their children are scheduled like delayed jobs: not runnable
# yet, and not through anything a worker could do.
STATES = {
    "wait": "pending",
    "paused": "pending",
    "prioritized": "pending",
    "active": "active",
    "delayed": "scheduled",
    "waiting-children": "scheduled",
    "completed": "completed",
    "failed": "failed",
}
WAITING = ("wait", "paused", "prioritized")


@pytest.fixture(params=BULLMQ_MAJORS, ids=lambda major: f"bullmq{major}")
def bullmq(request: pytest.FixtureRequest, redis_db: int) -> Iterator[BullMQ]:
    driver = BullMQ(request.param, redis_db)
    yield driver
    driver.stop_all()


def _mismatches(series: Series, truth: dict[str, Any], scraped_ms: float) -> list[str]:
    """Every difference between the served series and the library's own view."""
    found: list[str] = []
    served_queues = {
        dict(labels)["queue"]
        for name, labels in series
        if name == "queue_depth" and ("system", "bullmq") in labels
    }
    if served_queues != set(truth["queues"]):
        found.append(f"queues {sorted(served_queues)} != {sorted(truth['queues'])}")
    for queue, view in truth["queues"].items():
        expected: dict[str, int] = {}
        for state, count in view["counts"].items():
            expected[STATES[state]] = expected.get(STATES[state], 0) + count
        for state, count in expected.items():
            served = _value(series, "queue_depth", queue=queue, state=state)
            if served != count:
                found.append(f"{queue} {state}: served {served}, BullMQ {count}")
        due = _value(series, "queue_scheduled_due", queue=queue)
        if due != view["due"]:
            found.append(f"{queue} due: served {due}, BullMQ {view['due']}")
        found += _age_mismatch(series, queue, view, truth["now_ms"], scraped_ms)
    return found


def _age_mismatch(
    series: Series, queue: str, view: dict[str, Any], truth_ms: int, scraped_ms: float
) -> list[str]:
    """The age of the oldest next job among the waiting states, from BullMQ's timestamp (ms):
    sampled between the truth and the scrape, so between the ages at those two moments."""
    stamps = [view["next_timestamp_ms"][state] for state in WAITING]
    stamps = [stamp for stamp in stamps if stamp is not None]
    served = _value(series, "queue_oldest_age_seconds", queue=queue, state="pending")
    if not stamps:
        return [] if served is None else [f"{queue}: age {served} served for no waiting job"]
    earliest, latest = (truth_ms - min(stamps)) / 1000, (scraped_ms - min(stamps)) / 1000
    if served is None or not earliest - 0.5 <= served <= latest + 0.5:
        return [f"{queue} age: served {served}, BullMQ {earliest:.1f} to {latest:.1f}"]
    return []


def _value(series: Series, name: str, **labels: str) -> float | None:
    wanted = {("system", "bullmq"), *labels.items()}
    values = [v for (n, ls), v in series.items() if n == name and wanted <= ls]
    return values[0] if len(values) == 1 else None


def _served_as_bullmq_says(app: Any, bullmq: BullMQ, queues: list[str]) -> None:
    truth = bullmq.truth(queues)
    wait_until_served_as_truth(app, lambda series, at: _mismatches(series, truth, at * 1000))


def test_every_state_and_age_as_bullmq_counts_them(bullmq, redis_url, run_exporter):
    now_ms = int(time.time() * 1000)
    held = bullmq.hold(
        # plain waiting jobs, created a while ago (the timestamp option is BullMQ's own)
        *[
            {"op": "add", "queue": "emails", "opts": {"timestamp": now_ms - age_s * 1000}}
            for age_s in (90, 60, 30)
        ],
        # a queue holding only prioritized jobs: its age comes from the next job's hash
        *[
            {
                "op": "add",
                "queue": "reports",
                "opts": {"priority": p, "timestamp": now_ms - s * 1000},
            }
            for p, s in ((3, 200), (1, 50), (2, 100))
        ],
        # a paused queue: 5.x renames wait to paused, 6.x keeps wait and flags meta
        {"op": "add", "queue": "exports", "count": 2, "opts": {"timestamp": now_ms - 40_000}},
        {"op": "pause", "queue": "exports"},
        # a flow: the parent waits for its children in another queue
        {"op": "flow", "queue": "invoices", "children": ["renders", "renders"]},
        # delayed: one already due (no worker promotes it), one in an hour
        {"op": "add", "queue": "emails", "opts": {"delay": 50}},
        {"op": "add", "queue": "emails", "opts": {"delay": 3_600_000}},
        {"op": "sleep", "ms": 200},
        # a worker completes three, fails two for good and one that is retried in an hour
        {"op": "add", "queue": "work", "count": 3},
        {"op": "add", "queue": "work", "count": 2, "data": {"fail": "always"}},
        {
            "op": "add",
            "queue": "work",
            "data": {"fail": "always"},
            "opts": {"attempts": 2, "backoff": {"type": "fixed", "delay": 3_600_000}},
        },
        {"op": "work", "queue": "work", "completed": 3, "failed": 3},
        # rate-limited: one job an hour, so two stay waiting behind the limiter
        {"op": "add", "queue": "limited", "count": 3},
        {
            "op": "work",
            "queue": "limited",
            "completed": 1,
            "options": {"limiter": {"max": 1, "duration": 3_600_000}},
        },
        # a queue whose only job completed and was removed: no job key is left
        {"op": "add", "queue": "drained", "opts": {"removeOnComplete": True}},
        {"op": "work", "queue": "drained", "completed": 1},
        # one job kept active by a worker until the end of the test
        {"op": "add", "queue": "busy", "data": {"sleep_ms": 600_000}},
        {"op": "hold", "queue": "busy"},
    )
    app = run_exporter(redis_url=redis_url, preset=["bullmq"])
    queues = ["emails", "reports", "exports", "invoices", "renders", "work", "limited"]
    _served_as_bullmq_says(app, bullmq, [*queues, "drained", "busy"])
    bullmq.stop(held)
