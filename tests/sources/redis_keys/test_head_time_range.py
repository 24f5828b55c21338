"""A head item's time before 1970 or far ahead gives no age: refused and counted (issue 40).

Jobs are written by the real libraries (Bull, Bee-Queue and Dramatiq take a job's creation
time through their own API); where a library cannot be told such a time (SAQ's `queued`,
arq's score) the job it wrote is changed in place, in the layout it wrote. Before, a head time of -5000 ms was served as a 57-year
`queue_oldest_age_seconds` (1,796,533,361 s), an arq score of -1e300 as 1e297 s, and a time a
day ahead as an age of 0. Now each is refused by the rule every time a sample is made of
passes (numbers.epoch, as for v1 events): counted as `time_out_of_range` on its key group,
the queue's depth kept, every sound queue's age served.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest
import redis

from tests.conformance.adapters.base import ROOT, require, run_json
from tests.conformance.adapters.python_queues import ARQ_PYTHON, DRAMATIQ_PYTHONS, Dramatiq
from tests.conftest import Series, scrape_series, value, wait_for
from tests.real_queues import BeeQueue, Bull
from tests.saq_app.control import driver as saq_driver

BEFORE_1970_MS = -5_000
DAY_MS = 86_400_000


def _config(redis_url: str, preset: str, **params: object) -> dict[str, object]:
    return {
        "presets": [{"name": preset, "params": params}],
        "sources": {"redis": {"url": redis_url, "cycle_timeout": 30}},
    }


def _errors(series: Series, system: str) -> float:
    wanted = {("source", "redis"), ("reason", "time_out_of_range"), ("system", system)}
    return sum(
        v
        for (name, labels), v in series.items()
        if name == "queue_exporter_source_errors_total" and wanted <= labels
    )


def _served(app, system: str, refused: int) -> Series:
    """A scrape of a published cycle that refused `refused` head times of `system`."""

    def ready() -> Series | None:
        series = scrape_series(app)
        up = value(series, "queue_exporter_source_up", source="redis") == 1
        return series if up and _errors(series, system) >= refused else None

    return wait_for(ready)


def _check(series: Series, system: str, good: dict[str, float], refused: list[str]) -> None:
    """Each `good` queue's age at least its job's; each `refused` queue's depth, no age."""
    for queue, age in good.items():
        served = value(series, "queue_oldest_age_seconds", system=system, queue=queue)
        assert served is not None and age <= served < age + 600, (queue, served)
    for queue in refused:
        assert value(series, "queue_depth", system=system, queue=queue, state="pending") == 1
        assert value(series, "queue_oldest_age_seconds", system=system, queue=queue) is None


@pytest.fixture
def bull(redis_db: int) -> Iterator[Bull]:
    driver = Bull(4, redis_db)
    yield driver
    driver.stop_all()


@pytest.fixture
def bee_queue(redis_db: int) -> Iterator[BeeQueue]:
    driver = BeeQueue(2, redis_db)
    yield driver
    driver.stop_all()


@pytest.mark.parametrize("system", ["bull", "bee_queue"])
def test_node_queues_created_before_1970_or_a_day_ahead(
    system, bull, bee_queue, redis_url, run_exporter
):
    now_ms = int(time.time() * 1000)
    created = {"good": now_ms - 60_000, "early": BEFORE_1970_MS, "ahead": now_ms + DAY_MS}
    driver: Bull | BeeQueue = bull if system == "bull" else bee_queue
    driver.steps(
        *({"op": "add", "queue": queue, "opts": {"timestamp": ms}} for queue, ms in created.items())
    )
    truth = driver.truth(list(created))["queues"]
    if system == "bull":  # the library's own view: the times it was given, kept as given
        assert {q: truth[q]["next_timestamps_ms"] for q in created} == {
            q: [ms] for q, ms in created.items()
        }
    else:
        assert {q: truth[q]["next_timestamp_ms"] for q in created} == created
    params = {"native": False} if system == "bull" else {}
    app = run_exporter(_config(redis_url, system, **params))
    _check(_served(app, system, 2), system, {"good": 60}, ["early", "ahead"])


@pytest.mark.parametrize("major", sorted(DRAMATIQ_PYTHONS))
def test_dramatiq_messages_created_before_1970(major, tmp_path, run_exporter, redis_url):
    python = require(DRAMATIQ_PYTHONS[major], "dramatiq", f"dramatiq{major}")
    driver = Dramatiq(python, redis_url, tmp_path / "events.jsonl")
    driver.enqueue(
        {"actor": "report", "age": 60},  # queue "reports"
        {"actor": "succeed", "age": time.time() - BEFORE_1970_MS / 1000},  # queue "default"
    )
    app = run_exporter(_config(redis_url, "dramatiq", queues=["default", "reports"]))
    _check(_served(app, "dramatiq", 1), "dramatiq", {"reports": 60}, ["default"])


def test_saq_jobs_queued_before_1970(redis_client, redis_url, run_exporter):
    saq_driver(
        redis_url,
        "enqueue",
        json.dumps(
            [{"queue": "good", "function": "succeed"}, {"queue": "early", "function": "succeed"}]
        ),
    )
    client: redis.Redis = redis_client
    job_key = client.lindex("saq:early:queued", 0)  # the job SAQ wrote, its queued time changed
    job = json.loads(client.get(job_key))
    job["queued"] = BEFORE_1970_MS
    client.set(job_key, json.dumps(job))
    app = run_exporter(_config(redis_url, "saq", queues=["good", "early"], native=False))
    _check(_served(app, "saq", 1), "saq", {"good": 0}, ["early"])


def test_arq_jobs_scored_before_1970(redis_client, redis_url, run_exporter):
    """arq refuses to defer a job to before 1970 (its job key's expiry would be negative):
    the jobs it wrote are scored so in its zset instead, -5000 ms and -1e300."""
    python = require(ARQ_PYTHON, "arq", "arq")
    jobs = [
        {"queue": f"arq:{queue}", "function": "succeed", "defer_until": -60}
        for queue in ("good", "early", "huge")
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ARQ_REDIS_URL": redis_url}
    run_json([python, "-m", "tests.arq_app.driver", redis_url, "enqueue", json.dumps(jobs)], env)
    client: redis.Redis = redis_client
    for queue, score in (("early", BEFORE_1970_MS), ("huge", -1e300)):
        member = client.zrange(f"arq:{queue}", 0, 0)[0]
        assert client.zadd(f"arq:{queue}", {member: score}, xx=True, ch=True) == 1
    queues = ["arq:good", "arq:early", "arq:huge"]
    app = run_exporter(_config(redis_url, "arq", queues=queues))
    _check(_served(app, "arq", 2), "arq", {"arq:good": 60}, ["arq:early", "arq:huge"])
