"""BullMQ's own events stream read into the lifecycle families, against real BullMQ 5.x and 6.x
workers: counts equal what the workers did, runtimes land in the right bucket, a restarted
exporter counts nothing twice, and events trimmed before they were read are counted as lost."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers.bullmq import BullmqReader
from exporter.sources.readers.config import BullmqReaderConfig
from exporter.sources.readers.framework import Signals
from tests import claims
from tests.conftest import (
    REDIS_HOST,
    REDIS_PORT,
    Series,
    assert_runtimes_bucketed,
    scrape_series,
    value,
    wait_for,
)
from tests.real_queues import BULLMQ_MAJORS, BullMQ

STREAM = "native:bullmq"


@pytest.fixture(params=BULLMQ_MAJORS, ids=lambda major: f"bullmq{major}")
def bullmq(request: pytest.FixtureRequest, redis_db: int) -> Iterator[BullMQ]:
    driver = BullMQ(request.param, redis_db)
    yield driver
    driver.stop_all()


def _started(run_exporter, redis_url, **native):
    """An exporter with the bullmq preset whose reader has made its first (baseline) read."""
    raw = {"presets": ["bullmq"], "sources": {"redis": {"url": redis_url}}}
    if native:
        raw["sources"]["native"] = {"bullmq": native}
    app = run_exporter(raw)
    wait_for(lambda: app.health.snapshot().get(STREAM) and app.health.snapshot()[STREAM].up)
    return app


def _total(series: Series, name: str, **labels: str) -> float:
    """The sum over every series of `name` whose labels include `labels`."""
    wanted = {("system", "bullmq"), *labels.items()}
    return sum(v for (n, ls), v in series.items() if n == name and wanted <= ls)


def _work(bullmq: BullMQ) -> list[dict[str, Any]]:
    """Jobs with known outcomes and runtimes, run by a real worker to the end; the completed
    ones as BullMQ gave them to the worker (their processedOn and finishedOn)."""
    return bullmq.steps(
        {"op": "add", "queue": "jobs", "name": "slow", "count": 4, "data": {"sleep_ms": 700}},
        {"op": "add", "queue": "jobs", "name": "fast", "count": 3},
        {"op": "add", "queue": "jobs", "name": "broken", "count": 2, "data": {"fail": "always"}},
        # fails once, retried at once, then completes
        {
            "op": "add",
            "queue": "jobs",
            "name": "flaky",
            "data": {"fail": 1},
            "opts": {"attempts": 2},
        },
        # fails, retried after a backoff, fails for good
        {
            "op": "add",
            "queue": "jobs",
            "name": "doomed",
            "data": {"fail": "always"},
            "opts": {"attempts": 2, "backoff": {"type": "fixed", "delay": 100}},
        },
        {
            "op": "work",
            "queue": "jobs",
            "completed": 8,
            "failed": 5,
            "options": {"concurrency": 4},
            "report": True,
        },
        # removed when they complete: their name and start come from the stream alone
        {
            "op": "add",
            "queue": "tidy",
            "name": "tidy",
            "count": 2,
            "data": {"sleep_ms": 700},
            "opts": {"removeOnComplete": True},
        },
        {
            "op": "add",
            "queue": "tidy",
            "name": "brief",
            "count": 5,
            "opts": {"removeOnComplete": True},
        },
        {"op": "work", "queue": "tidy", "completed": 7, "report": True},
    )


def test_counts_and_runtimes_equal_what_the_workers_did(bullmq, redis_url, run_exporter):
    app = _started(run_exporter, redis_url)
    completed = _work(bullmq)
    truth = bullmq.truth(["jobs"])["queues"]["jobs"]["counts"]
    assert (truth["completed"], truth["failed"]) == (8, 3)

    def settled() -> Series | None:
        series = scrape_series(app)
        done = _total(series, "queue_jobs_completed_total", queue="jobs") == truth["completed"]
        done = done and _total(series, "queue_jobs_completed_total", queue="tidy") == 7
        return series if done and _total(series, "queue_jobs_max_retries_exceeded_total") else None

    series = wait_for(settled, timeout=20)
    final = _total(series, "queue_jobs_failed_total", queue="jobs", error_type="non_retryable")
    assert final == truth["failed"]
    assert _total(series, "queue_jobs_failed_total", error_type="retryable") == 2
    assert _total(series, "queue_jobs_retried_total", queue="jobs") == 2
    assert _total(series, "queue_jobs_enqueued_total", queue="jobs") == 11
    assert _total(series, "queue_jobs_started_total", queue="jobs") == 13  # attempts
    assert _total(series, "queue_jobs_completed_total", job_type="slow") == 4
    assert _total(series, "queue_jobs_completed_total", job_type="flaky") == 1

    # Each runtime in the bucket BullMQ's own processedOn and finishedOn put it in (how long a
    # 0.7 s job takes on a loaded host is the host's business), the removed ones' too.
    for job_type in ("slow", "fast", "tidy", "brief"):  # each attempt completed
        runtimes = _runtimes(completed, job_type)
        assert_runtimes_bucketed(series, runtimes, CLOCKS_APART, job_type=job_type)
    assert all(seconds >= 0.7 for seconds in _runtimes(completed, "slow"))
    assert _total(series, "queue_jobs_completed_total", queue="tidy", job_type="tidy") == 2
    # gone before the reader got to them, most of them: times from their own entries
    assert value(series, "queue_job_wait_seconds_count", job_type="tidy") == 2
    assert value(series, "queue_job_wait_seconds_count", job_type="brief") == 5
    assert value(series, "queue_job_execution_seconds_count", job_type="brief") == 5
    assert value(series, "queue_job_wait_seconds_count", job_type="fast") == 3
    assert value(series, "queue_exporter_events_lost_total", stream=STREAM) == 0


# The reader times a job removed when it completed by its events' stream ids (Redis's clock), a
# few ms from the times BullMQ's Node process wrote, more on a loaded host (CI: a 63 ms job by
# BullMQ's times in the reader's 10 ms bucket): a runtime this close to a bucket's bound may
# fall on either side of it.
CLOCKS_APART = 0.2


def _runtimes(completed: list[dict[str, Any]], job_type: str) -> list[float]:
    """Seconds each completed job of `job_type` ran, by BullMQ's own times."""
    return [
        (job["finished_on"] - job["processed_on"]) / 1000.0
        for job in completed
        if job["name"] == job_type
    ]


def test_a_restarted_exporter_goes_on_where_it_stopped(bullmq, redis_url, serve_process):
    """Nothing counted twice, nothing skipped: what happened while no exporter ran is counted
    by the next one, what the first one counted is not counted again."""

    def exporter():
        process = serve_process(
            "--redis-url", redis_url, "--preset", "bullmq", "--sample-interval", "0.3"
        )
        process.series_when(lambda s: value(s, "queue_exporter_source_up", source=STREAM) == 1)
        return process

    def completed(process, count):
        return process.series_when(
            lambda s: _total(s, "queue_jobs_completed_total") == count, timeout=20
        )

    def work(count):
        bullmq.steps(
            {"op": "add", "queue": "jobs", "count": count},
            {"op": "work", "queue": "jobs", "completed": count},
        )

    first = exporter()
    work(3)
    completed(first, 3)
    first.stop()
    work(2)  # while no exporter runs

    second = exporter()
    completed(second, 2)
    work(4)
    series = completed(second, 6)
    assert _total(series, "queue_jobs_enqueued_total") == 6
    assert value(series, "queue_exporter_events_lost_total", stream=STREAM) == 0


def test_events_trimmed_before_they_were_read_are_counted_as_lost(bullmq, redis_url, run_exporter):
    # a small stream (BullMQ trims it with MAXLEN ~), read every 3 s: most events are gone
    app = _started(run_exporter, redis_url, interval=3)
    events = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=int(redis_url.rsplit("/", 1)[1]))
    small = {"streams": {"events": {"maxLen": 10}}}
    bullmq.steps({"op": "add", "queue": "burst", "count": 400, "queue_options": small})
    added = events.xinfo_stream("bull:burst:events")["entries-added"]
    assert events.xlen("bull:burst:events") < added  # BullMQ did trim

    def accounted() -> Series | None:
        series = scrape_series(app)
        read = value(series, "queue_exporter_events_total", stream=STREAM) or 0
        lost = value(series, "queue_exporter_events_lost_total", stream=STREAM) or 0
        return series if read + lost == added else None

    series = wait_for(accounted, timeout=20)
    assert value(series, "queue_exporter_events_lost_total", stream=STREAM) > 0
    events.close()


def test_the_preset_param_turns_the_reader_off(redis_url, run_exporter):
    app = run_exporter(
        {
            "presets": [{"name": "bullmq", "params": {"native": False}}],
            "sources": {"redis": {"url": redis_url}},
        }
    )
    wait_for(lambda: app.health.snapshot().get("redis") and app.health.snapshot()["redis"].up)
    assert STREAM not in app.health.snapshot()


def test_a_worker_killed_under_its_job_stalls_it_then_fails_it(bullmq, redis_url, run_exporter):
    app = _started(run_exporter, redis_url)
    # a short lock, checked often, and no stall allowed: the second stall check fails the job
    stalls = {"lockDuration": 1000, "stalledInterval": 500, "maxStalledCount": 0}
    bullmq.steps({"op": "add", "queue": "fragile", "data": {"sleep_ms": 600_000}})
    doomed = bullmq.worker("fragile", **stalls)
    wait_for(lambda: bullmq.truth(["fragile"])["queues"]["fragile"]["counts"]["active"] == 1)
    os.kill(doomed.pid, signal.SIGKILL)
    bullmq.worker("fragile", **stalls)
    wait_for(lambda: bullmq.truth(["fragile"])["queues"]["fragile"]["counts"]["failed"] == 1)

    def counted() -> Series | None:
        series = scrape_series(app)
        return series if _total(series, "queue_jobs_failed_total", queue="fragile") else None

    series = wait_for(counted, timeout=20)
    assert _total(series, "queue_jobs_failed_total", error_type="other") == 1
    assert _total(series, "queue_jobs_failed_total") == 1  # the move back was no retry
    assert _total(series, "queue_jobs_retried_total") == 0
    assert _total(series, "queue_jobs_requeued_total", reason="stalled") == 1
    assert _total(series, "queue_jobs_requeued_total", reason="rate_limited") == 0
    assert _total(series, "queue_jobs_started_total", queue="fragile") == 2  # two attempts


_BULLMQ_EVENTS = [
    b"added", b"active", b"completed", b"failed", b"delayed", b"waiting", b"stalled",
    b"retries-exhausted", b"progress", b"removed", b"drained", b"paused", b"resumed",
]  # fmt: skip
_HOSTILE = st.one_of(
    st.binary(max_size=30),
    st.sampled_from([b"", b"nan", b"-1", b"1e400", b"9" * 40, b"\xff\xfe", b"active", b"1"]),
)
_ENTRY = st.builds(
    lambda kind, rest: {b"event": kind, **rest},
    st.one_of(st.sampled_from(_BULLMQ_EVENTS), st.binary(max_size=10)),
    st.dictionaries(
        st.sampled_from([b"jobId", b"prev", b"delay", b"name", b"failedReason", b"x"]),
        _HOSTILE,
        max_size=5,
    ),
)
_JOB_HASH = st.dictionaries(
    st.sampled_from([b"name", b"timestamp", b"delay", b"processedOn", b"finishedOn", b"atm"]),
    _HOSTILE,
    max_size=6,
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(entries=st.lists(_ENTRY, min_size=1, max_size=12), job=_JOB_HASH)
def test_hostile_entries_cost_only_themselves(redis_client, redis_url, entries, job):
    """Any fields in BullMQ's stream and its job hash: the read never fails, every entry is
    read once, and a valid completion written after them counts."""
    claims.flush_keeping_claim(redis_client)
    redis_client.hset("bull:q:meta", "opts.maxLenEvents", 10000)
    if job:
        redis_client.hset("bull:q:1", mapping=job)
    connection = RedisConnectionConfig(url=redis_url)
    reader = BullmqReader(BullmqReaderConfig(), connection)
    try:
        reader.read(Signals())  # the baseline
        for fields in entries:
            redis_client.xadd("bull:q:events", fields)
        redis_client.xadd(
            "bull:q:events", {"event": "completed", "jobId": "none", "prev": "active"}
        )
        signals = Signals()
        reader.read(signals)
        assert signals.tally.consumed == len(entries) + 1
        completed = sum(
            count
            for (metric, _), count in signals.tally.counts.items()
            if metric == "queue_jobs_completed_total"
        )
        assert completed >= 1
        again = Signals()
        reader.read(again)  # nothing is read twice
        assert again.tally.consumed == 0
    finally:
        reader.close()


def _workers(app, queue: str) -> dict[str, float]:
    series = scrape_series(app)
    return {
        state: _total(series, "queue_workers", queue=queue, state=state)
        for state in ("busy", "idle")
    }


def test_workers_counted_as_bullmq_counts_them(bullmq, redis_url, run_exporter):
    """Per queue, the workers Queue.getWorkers() lists (their named connections in CLIENT
    LIST), named or not, busy or idle; a stopped worker leaves the count."""
    bullmq.steps({"op": "add", "queue": "mail"}, {"op": "add", "queue": "video"})
    app = _started(run_exporter, redis_url)
    idle = [bullmq.worker("mail"), bullmq.worker("mail", name="mailer-2")]
    busy = bullmq.hold(
        {"op": "add", "queue": "video", "data": {"sleep_ms": 600_000}},
        {"op": "hold", "queue": "video"},
    )

    # video's one slot holds the long job; both mail workers wait for a job, once one of them
    # has run mail's first job (beside busy loops that can take a while: waited for, not slept)
    settled = {"video": {"busy": 1, "idle": 0}, "mail": {"busy": 0, "idle": 2}}

    def as_bullmq_counts() -> dict | None:
        truth = {q: s["workers"] for q, s in bullmq.truth(["mail", "video"])["queues"].items()}
        counted = {queue: _workers(app, queue) for queue in truth}
        if truth != {"mail": 2, "video": 1}:
            return None
        same = all(sum(counted[queue].values()) == truth[queue] for queue in truth)
        return counted if same and counted == settled else None

    wait_for(as_bullmq_counts, timeout=120)
    # CLIENT LIST does not tell a worker's concurrency: no slots, none made up
    made_up = {"queue_worker_slots", "queue_worker_utilization_ratio"}
    assert not [name for name, _ in scrape_series(app) if name in made_up]

    for worker in idle:
        bullmq.stop(worker)
    wait_for(lambda: bullmq.truth(["mail"])["queues"]["mail"]["workers"] == 0)
    wait_for(lambda: _workers(app, "mail") == {"busy": 0, "idle": 0})
    assert _workers(app, "video") == {"busy": 1, "idle": 0}
    bullmq.stop(busy)


def test_a_queues_param_narrows_the_queues_found(bullmq, redis_url, run_exporter):
    """queues: [mail, extra]: mail (found) and extra (named, not found) are served, video
    (found, not named) is left out of the depths, the reader and its workers, and reported."""
    bullmq.steps(
        {"op": "add", "queue": "mail", "count": 2}, {"op": "add", "queue": "video", "count": 3}
    )
    preset = {"name": "bullmq", "params": {"queues": ["mail", "extra"]}}
    app = run_exporter({"presets": [preset], "sources": {"redis": {"url": redis_url}}})
    bullmq.worker("video")

    def depths() -> dict[str, float] | None:
        series = scrape_series(app)
        found = {dict(ls)["queue"] for n, ls in series if n == "queue_depth"}
        pending = {q: _total(series, "queue_depth", queue=q, state="pending") for q in found}
        return pending if found else None

    wait_for(lambda: depths() == {"mail": 2, "extra": 0})
    wait_for(lambda: app.health.snapshot()[STREAM].up)
    reports = [report for report in app.health.key_groups() if report.unselected]
    assert reports and all(report.unselected == ("video",) for report in reports)
    wait_for(lambda: bullmq.truth(["video"])["queues"]["video"]["counts"]["completed"] == 3)
    assert bullmq.truth(["video"])["queues"]["video"]["workers"] == 1
    time.sleep(1.0)  # five reads of the reader since
    series = scrape_series(app)
    assert _total(series, "queue_workers", queue="video") == 0  # not a queue served
    assert _total(series, "queue_jobs_completed_total", queue="video") == 0


def test_workers_cost_one_client_list_per_read(tmp_path):
    """However many queues and workers: one CLIENT LIST per read (Redis's own command stats)."""
    from tests.private_redis import PrivateRedis

    server = PrivateRedis(tmp_path).start()
    driver = BullMQ(6, 0, port=server.port)
    try:
        driver.steps(*({"op": "add", "queue": f"q{number}"} for number in range(5)))
        for number in range(3):
            driver.worker(f"q{number}")
        reader = BullmqReader(BullmqReaderConfig(), RedisConnectionConfig(url=server.url))
        admin = server.client()

        def calls() -> int:
            stats = admin.info("commandstats").get("cmdstat_client|list", {})
            return int(stats.get("calls", 0))

        before = calls()
        reads = 4
        heartbeats = 0
        for _ in range(reads):
            signals = Signals()
            reader.read(signals)
            heartbeats = len(signals.tally.heartbeats)
        assert calls() - before == reads
        assert heartbeats == 3  # every worker of every queue, from that one call
        reader.close()
    finally:
        driver.stop_all()
        server.stop()
