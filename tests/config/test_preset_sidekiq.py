"""The sidekiq preset's queues param against the real Sidekiq (Debian's ruby-sidekiq).

Every set split per queue as Sidekiq counts it is checked by the conformance harness
(tests/conformance/adapters/sidekiq.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.conformance.checks import served_value
from tests.conftest import Series, scrape, wait_for, wait_until_served_as_truth
from tests.real_queues import Sidekiq


@pytest.fixture
def sidekiq(redis_db: int) -> Iterator[Sidekiq]:
    driver = Sidekiq(redis_db)
    yield driver
    driver.stop_all()


def _value(series: Series, name: str, **labels: str) -> float | None:
    return served_value(series, "sidekiq", name, **labels)


def _queues(series: Series, state: str) -> set[str]:
    return {
        dict(labels)["queue"]
        for name, labels in series
        if name == "queue_depth" and {("system", "sidekiq"), ("state", state)} <= labels
    }


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
