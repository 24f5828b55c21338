"""The sidekiq preset against the real Sidekiq (Debian's ruby-sidekiq): what it says is what we serve.

Jobs are pushed, scheduled, killed, failed into the retry and dead sets and kept busy by Sidekiq
itself (tests/ruby/); the truth is its own API: Queue#size and #latency, ScheduledSet, RetrySet,
DeadSet and Workers, per queue.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import Series, scrape, wait_for, wait_until_served_as_truth
from tests.real_queues import Sidekiq


@pytest.fixture
def sidekiq(redis_db: int) -> Iterator[Sidekiq]:
    driver = Sidekiq(redis_db)
    yield driver
    driver.stop_all()


def _value(series: Series, name: str, **labels: str) -> float | None:
    wanted = {("system", "sidekiq"), *labels.items()}
    values = [v for (n, ls), v in series.items() if n == name and wanted <= ls]
    return values[0] if len(values) == 1 else None


def _queues(series: Series, state: str) -> set[str]:
    return {
        dict(labels)["queue"]
        for name, labels in series
        if name == "queue_depth" and {("system", "sidekiq"), ("state", state)} <= labels
    }


def _mismatches(series: Series, truth: dict[str, Any], scraped_at: float) -> list[str]:
    found: list[str] = []
    if _queues(series, "pending") != set(truth["queues"]):
        found.append(f"queues {sorted(_queues(series, 'pending'))} != {sorted(truth['queues'])}")
    for queue, view in truth["queues"].items():
        served = _value(series, "queue_depth", queue=queue, state="pending")
        if served != view["size"]:
            found.append(f"{queue} pending: served {served}, Sidekiq {view['size']}")
        age = _value(series, "queue_oldest_age_seconds", queue=queue, state="pending")
        if view["size"] == 0:
            if age is not None:
                found.append(f"{queue}: age {age} served for an empty queue")
        # sampled between the truth and the scrape
        elif age is None or not view["latency"] - 0.5 <= age <= view["latency"] + (
            scraped_at - truth["now"] + 0.5
        ):
            found.append(f"{queue} age: served {age}, Sidekiq latency {view['latency']:.1f}")
    for state, sidekiq_set in (
        ("scheduled", "scheduled"),
        ("retry", "retry"),
        ("dead_letter", "dead"),
        ("active", "busy"),
    ):
        if _queues(series, state) != set(truth[sidekiq_set]):
            found.append(f"{state} queues {_queues(series, state)} != {set(truth[sidekiq_set])}")
        for queue, count in truth[sidekiq_set].items():
            served = _value(series, "queue_depth", queue=queue, state=state)
            if served != count:
                found.append(f"{queue} {state}: served {served}, Sidekiq {count}")
    for queue in truth["scheduled"]:
        due = _value(series, "queue_scheduled_due", queue=queue)
        if due != truth["scheduled_due"].get(queue, 0):
            found.append(f"{queue} due: served {due}, Sidekiq {truth['scheduled_due']}")
    for queue, died_at in truth["dead_oldest"].items():
        age = _value(series, "queue_oldest_age_seconds", queue=queue, state="dead_letter")
        expected = truth["now"] - died_at
        if age is None or not expected - 0.5 <= age <= expected + scraped_at - truth["now"] + 0.5:
            found.append(f"{queue} dead age: served {age}, Sidekiq {expected:.1f}")
    return found


def _served_as_sidekiq_says(app: Any, truth: dict[str, Any]) -> None:
    wait_until_served_as_truth(app, lambda series, at: _mismatches(series, truth, at))


def test_every_set_split_per_queue_as_sidekiq_counts_them(sidekiq, redis_url, run_exporter):
    sidekiq.push(
        {"queue": "default", "count": 3},
        {"queue": "critical"},
        {"queue": "default", "in": 600},
        {"queue": "mailers", "in": 1},  # soon due, and no scheduler running to move it
        {"queue": "default", "dead": True},
        {"queue": "mailers", "dead": True, "count": 2},
        # for the worker: one to the dead set, one to the retry set, one kept busy
        {"queue": "work", "class": "DoomedJob", "args": [0, "always"]},
        {"queue": "work", "class": "PatientJob", "args": [0, "always"]},
        {"queue": "busy", "args": [600_000]},
    )
    worker = sidekiq.worker(["work", "busy"], scheduler=False)  # the due job stays put

    def settled() -> dict[str, Any] | None:
        truth = sidekiq.truth()
        due = truth["scheduled_due"].get("mailers")
        done = truth["retry"].get("work") and truth["dead"].get("work") and truth["busy"] and due
        return truth if done else None

    truth = wait_for(settled, timeout=30, interval=0.5)
    app = run_exporter(redis_url=redis_url, preset=["sidekiq"])
    _served_as_sidekiq_says(app, truth)
    sidekiq.stop(worker)


def test_a_queues_param_narrows_every_group_and_reports_what_it_leaves_out(
    sidekiq, redis_url, run_exporter
):
    """queues: [default, extra]: default (found) and extra (named, found nowhere) are served in
    every state, read from the queue lists and from the sets split by each job's queue; the
    queues found and not named (critical, busy) are left out of them all, of the workers too,
    and reported by each group that found them."""
    sidekiq.push(
        {"queue": "default", "count": 2},
        {"queue": "critical", "count": 3},
        {"queue": "default", "in": 600},
        {"queue": "critical", "in": 600, "count": 2},
        {"queue": "default", "dead": True},
        {"queue": "critical", "dead": True},
        {"queue": "busy", "args": [600_000]},
    )
    worker = sidekiq.worker(["busy", "extra"], scheduler=False)
    truth = wait_for(lambda: (t := sidekiq.truth())["busy"].get("busy") and t, timeout=120)
    selected = {"default", "extra"}
    preset = {"name": "sidekiq", "params": {"queues": sorted(selected)}}
    app = run_exporter({"presets": [preset], "sources": {"redis": {"url": redis_url}}})
    sets = {
        "pending": {q: view["size"] for q, view in truth["queues"].items()},
        "scheduled": truth["scheduled"],
        "retry": truth["retry"],
        "dead_letter": truth["dead"],
        "active": truth["busy"],
    }

    def mismatches(series: Series, _at: float) -> list[str]:
        found = []
        for state, counts in sets.items():
            if _queues(series, state) != selected:
                found.append(f"{state}: queues {sorted(_queues(series, state))}")
            for queue in selected:
                served = _value(series, "queue_depth", queue=queue, state=state)
                if served != counts.get(queue, 0):
                    found.append(f"{queue} {state}: served {served}, Sidekiq {counts.get(queue)}")
        workers = {
            dict(ls)["queue"]
            for n, ls in series
            if n == "queue_workers" and ("system", "sidekiq") in ls
        }
        if workers != {"extra"}:
            found.append(f"workers of {sorted(workers)}")
        return found

    wait_until_served_as_truth(app, mismatches)
    assert truth["queues"]["critical"]["size"] == 3 and truth["scheduled"]["critical"] == 2
    unselected = {report.pattern: report.unselected for report in app.health.key_groups()}
    left_out = set(truth["queues"]) - selected
    assert unselected["queue:{queue}"] == tuple(sorted(left_out))  # critical and busy
    assert unselected["schedule"] == unselected["dead"] == ("critical",)
    assert unselected["retry"] == ()
    assert unselected["{_process}:workers"] == ("busy",)
    status = json.loads(scrape(app.server.port, "/status.json"))
    reported = {g["pattern"]: g["unselected"] for g in status["key_groups"] if g["unselected"]}
    assert reported == {p: list(v) for p, v in unselected.items() if v}
    sidekiq.stop(worker)
