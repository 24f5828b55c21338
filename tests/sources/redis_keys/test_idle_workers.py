"""Readiness means "can answer truthfully", not "workers are busy": with the Celery and BullMQ
workers stopped for three times the Celery reader's events timeout, /readyz stays 200 the whole
time, the gap shows (queue_exporter_native_silent, the workers gone from queue_workers), and the
numbers resume when the workers return."""

from __future__ import annotations

import json
import time

import pytest

from tests.celery_app import control
from tests.conftest import is_ready, scrape_series, total, value, wait_for
from tests.real_queues import BullMQ

EVENTS_TIMEOUT = 2.0  # seconds without a Celery event before the reader says it hears none


@pytest.fixture
def bullmq(redis_db):
    driver = BullMQ(6, redis_db)
    yield driver
    driver.stop_all()


def _workers(app) -> dict[str, float]:
    series = scrape_series(app)
    return {
        system: total(series, "queue_workers", system=system) for system in ("celery", "bullmq")
    }


def test_stopped_workers_leave_the_exporter_ready(redis_url, bullmq, run_exporter):
    env = control.env(redis_url)
    native = {"celery": {"events_timeout": EVENTS_TIMEOUT}}
    # cycles of a second: a loaded host's slow cycle must not pass its deadline (the exporter
    # would then rightly be unready: a backend that does not answer in time)
    raw = {"presets": ["celery", "bullmq"], "sources": {"native": native}, "sample_interval": 1.0}
    app = run_exporter(raw, redis_url=redis_url)
    bullmq.steps({"op": "add", "queue": "mail"})  # the queue exists: its meta hash

    def start() -> tuple:
        return control.worker(env, "celery", 1), bullmq.worker("mail")

    celery, mail = start()
    wait_for(lambda: all(_workers(app).values()), timeout=60)
    wait_for(lambda: is_ready(app.server.port))

    control.stop(celery)
    bullmq.stop(mail)
    # three timeouts without a worker (and the time the stops took): ready at every look
    stopped_at, looks = time.monotonic(), 0
    silent = gone = False
    while time.monotonic() - stopped_at < 3 * EVENTS_TIMEOUT or not (silent and gone):
        assert is_ready(app.server.port), app.health.snapshot()
        looks += 1
        series = scrape_series(app)
        silent = (
            silent or value(series, "queue_exporter_native_silent", stream="native:celery") == 1
        )
        gone = gone or total(series, "queue_workers", system="bullmq") == 0
        assert time.monotonic() - stopped_at < 60, "the gap never showed"
        time.sleep(0.1)
    assert looks >= 10
    assert app.health.snapshot()["native:celery"].silent is not None  # on the status page too
    series = scrape_series(app)
    assert value(series, "queue_exporter_source_up", source="native:celery") == 1
    assert value(series, "queue_exporter_source_up", source="native:bullmq") == 1

    celery, mail = start()
    try:
        wait_for(lambda: all(_workers(app).values()), timeout=60)
        wait_for(
            lambda: (
                value(scrape_series(app), "queue_exporter_native_silent", stream="native:celery")
                == 0
            )
        )
        assert app.health.snapshot()["native:celery"].silent is None
        control.driver(env, "publish", json.dumps([{"task": "sleep_for", "seconds": 0}]))
        bullmq.steps({"op": "add", "queue": "mail"})

        def resumed() -> bool:
            series = scrape_series(app)
            done = total(series, "queue_jobs_completed_total", system="celery")
            return done == 1 and total(series, "queue_jobs_completed_total", system="bullmq") >= 1

        wait_for(resumed, timeout=60)
        assert is_ready(app.server.port)
    finally:
        control.stop(celery)
        bullmq.stop(mail)
