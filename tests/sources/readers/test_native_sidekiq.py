"""Sidekiq's own counters and process records read into the lifecycle families, against a real
`sidekiq` worker (Debian's ruby-sidekiq): completed and failed equal Sidekiq's own Stats, and its
live processes are the workers, busy and idle as its ProcessSet says."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import Series, scrape_series, value, wait_for
from tests.real_queues import Sidekiq

STREAM = "native:sidekiq"


@pytest.fixture
def sidekiq(redis_db: int) -> Iterator[Sidekiq]:
    driver = Sidekiq(redis_db)
    yield driver
    driver.stop_all()


def _started(run_exporter, redis_url):
    """An exporter with the sidekiq preset whose reader has made its first (baseline) read."""
    app = run_exporter(redis_url=redis_url, preset=["sidekiq"])
    wait_for(lambda: app.health.snapshot().get(STREAM) and app.health.snapshot()[STREAM].up)
    return app


def _sidekiq(series: Series, name: str, **labels: str) -> float | None:
    return value(series, name, system="sidekiq", **labels)


def test_counts_equal_sidekiqs_stats_and_processes_are_workers(sidekiq, redis_url, run_exporter):
    sidekiq.push({"queue": "default", "count": 3, "args": [600_000]})  # three busy for a while
    app = _started(run_exporter, redis_url)
    sidekiq.push(
        {"queue": "default", "count": 5},
        {"queue": "default", "class": "DoomedJob", "args": [0, "always"], "count": 2},
        {"queue": "default", "args": [0, 1]},  # fails once, retried a second later, completes
    )
    worker = sidekiq.worker(["default", "low"], concurrency=4)

    def stats_flushed() -> dict | None:
        truth = sidekiq.truth()  # the heartbeat flushes the counts every 5 s
        return truth if (truth["processed"], truth["failed"]) == (9, 3) else None

    truth = wait_for(stats_flushed, timeout=40, interval=0.5)
    (process,) = truth["processes"]
    assert (process["busy"], process["concurrency"]) == (3, 4)

    def counted() -> Series | None:
        series = scrape_series(app)
        completed = _sidekiq(series, "queue_jobs_completed_total", queue="")
        return series if completed == truth["processed"] - truth["failed"] else None

    series = wait_for(counted, timeout=20)
    assert _sidekiq(series, "queue_jobs_failed_total", queue="") == truth["failed"]
    for queue in ("default", "low"):  # the process serves both: one busy worker of each
        assert _sidekiq(series, "queue_workers", queue=queue, state="busy") == 1
        assert _sidekiq(series, "queue_worker_slots", queue=queue, state="busy") == 3
        assert _sidekiq(series, "queue_worker_slots", queue=queue, state="free") == 1

    sidekiq.stop(worker)  # a stopped process leaves the processes set at once

    def gone() -> bool:
        series = scrape_series(app)
        return not _sidekiq(series, "queue_workers", queue="default", state="busy")

    wait_for(gone, timeout=20)
