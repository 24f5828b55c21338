"""The SAQ native reader against real SAQ workers: the counts each worker reports (SAQ's own
Queue.info()) are what we serve as increments, across a worker's restart.

The exporter starts first (its first read is the baseline); a worker completes, fails and
retries jobs, is stopped, and a new worker (a new id, its counts from zero) completes more.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import time
from typing import Any

import pytest

from exporter.output.catalog import BY_NAME
from tests.conftest import scrape_series, stop_process, total, value, wait_for
from tests.saq_app.control import driver
from tests.saq_app.control import worker as start_worker
from tests.tools import missing

DEPTH = BY_NAME["queue_depth"]


@pytest.fixture
def saq_installed() -> None:
    if importlib.util.find_spec("saq") is None:
        missing("saq not installed (pyproject's dev extra has it)")


def _stats(redis_url: str, worker_id: str) -> dict[str, int] | None:
    workers = driver(redis_url, "truth", "work")["queues"]["work"]["workers"]
    stats: dict[str, int] | None = workers.get(worker_id)
    return stats


def _served(app: Any) -> dict[str, float]:
    series = scrape_series(app)
    labels = {"system": "saq", "queue": "work"}
    return {
        "complete": total(series, "queue_jobs_completed_total", **labels),
        "failed": total(series, "queue_jobs_failed_total", error_type="non_retryable", **labels),
        "retried": total(series, "queue_jobs_retried_total", **labels),
        "retryable": total(series, "queue_jobs_failed_total", error_type="retryable", **labels),
    }


def _expected(*stats: dict[str, int]) -> dict[str, float]:
    summed = {
        kind: float(sum(s[kind] for s in stats)) for kind in ("complete", "failed", "retried")
    }
    return {**summed, "retryable": summed["retried"]}


def test_worker_counts_served_as_increments_across_a_restart(
    saq_installed, redis_url, run_exporter
):
    app = run_exporter(
        redis_url=redis_url, preset=[{"name": "saq", "params": {"queues": ["work"]}}]
    )
    wait_for(lambda: value(scrape_series(app), "queue_exporter_source_up", source="native:saq"))
    first, first_id = start_worker(redis_url, "work")
    started: list[Any] = [first]
    try:
        plan = [
            *({"queue": "work", "function": "succeed"} for _ in range(3)),
            *({"queue": "work", "function": "fail"} for _ in range(2)),
            {"queue": "work", "function": "fail", "retries": 2, "retry_delay": 3600},
        ]
        driver(redis_url, "enqueue", json.dumps(plan))
        wanted = {"complete": 3, "failed": 2, "retried": 1}

        def reported() -> dict[str, int] | None:
            stats = _stats(redis_url, first_id)
            return stats if stats and all(stats[k] == n for k, n in wanted.items()) else None

        first_stats = wait_for(reported, timeout=60, interval=0.5)
        wait_for(lambda: _served(app) == _expected(first_stats), timeout=20)

        # a restart: the new worker has a new id and counts from zero
        stop_process(first, signal.SIGTERM)
        second, second_id = start_worker(redis_url, "work")
        started.append(second)
        driver(redis_url, "enqueue", json.dumps([{"queue": "work", "function": "succeed"}] * 2))

        def reported_again() -> dict[str, int] | None:
            stats = _stats(redis_url, second_id)
            return stats if stats and stats["complete"] == 2 else None

        second_stats = wait_for(reported_again, timeout=60, interval=0.5)
        expected = _expected(first_stats, second_stats)
        wait_for(lambda: _served(app) == expected, timeout=20)
        # and it stays so while the workers' records come and go (no worker counted twice)
        for _ in range(5):
            time.sleep(0.5)  # a few reads (sample interval 0.2 s)
            assert _served(app) == expected
    finally:
        for process in started:
            stop_process(process, signal.SIGTERM)


# -- runtimes: each finished job's own times -------------------------------------------------

LEASE = {"enabled": True, "lease_ttl": 2, "renew_interval": 0.5}
FINAL = ("complete", "failed", "aborted")


def _finished_jobs(redis_url: str, keys: list[str]) -> dict[str, dict[str, Any]]:
    """SAQ's own view of the jobs (Queue.job), once every one of them finished."""

    def finished() -> dict[str, dict[str, Any]] | None:
        jobs: dict[str, dict[str, Any]] = driver(redis_url, "jobs", "work", *keys)
        done = len(jobs) == len(keys) and all(job["status"] in FINAL for job in jobs.values())
        return jobs if done else None

    found: dict[str, dict[str, Any]] = wait_for(finished, timeout=60, interval=0.5)
    return found


def _runtimes_of(jobs: dict[str, dict[str, Any]]) -> dict[tuple[str, str], list[float]]:
    """(histogram, function) -> seconds, as SAQ's Job.duration gives them: every attempt's
    end that started ("process"), and the wait of a job that ran once ("start")."""
    times: dict[tuple[str, str], list[float]] = {}
    for job in jobs.values():
        if job["process"] is not None:
            key = ("queue_job_execution_seconds", job["function"])
            times.setdefault(key, []).append(job["process"] / 1000)
        if job["attempts"] == 1 and job["start"] is not None:
            times.setdefault(("queue_job_wait_seconds", job["function"]), []).append(
                job["start"] / 1000
            )
    return times


def _served_runtimes(app: Any, wanted: dict[tuple[str, str], list[float]]) -> dict[Any, Any]:
    series = scrape_series(app)
    served = {}
    for metric, function in wanted:
        labels = {"system": "saq", "queue": "work", "job_type": function}
        served[metric, function] = (
            total(series, f"{metric}_count", **labels),
            total(series, f"{metric}_sum", **labels),
        )
    return served


def _matches(served: dict[Any, Any], wanted: dict[tuple[str, str], list[float]]) -> bool:
    return all(
        served[key][0] == len(times) and served[key][1] == pytest.approx(sum(times), rel=1e-9)
        for key, times in wanted.items()
    )


def _read_since(app: Any, moment: float) -> None:
    """Wait for a read of the app's SAQ reader that succeeded after `moment`."""

    def read() -> bool:
        series = scrape_series(app)
        last = value(series, "queue_exporter_source_last_success_timestamp_seconds",
                     source="native:saq")  # fmt: skip
        return last is not None and last > moment

    wait_for(read, timeout=120)


def _leader(*apps: Any) -> Any:
    leaders = [app for app in apps if app.leadership.is_leader()]
    return leaders[0] if len(leaders) == 1 else None


def test_runtimes_are_saqs_own_job_times_once_across_replicas_and_a_handover(
    saq_installed, redis_url, run_exporter
):
    """Two replicas under a lease; a real worker runs jobs that sleep known amounts, fail,
    retry, are kept for ever (ttl 0) or not at all (ttl -1). The leader serves each finished
    job's execution and wait time as SAQ's Job.duration gives them, once; the follower none.
    The leader stops: the other takes over with a baseline, and counts only what finishes
    after, once, a key enqueued again once more."""
    raw = {
        "presets": [{"name": "saq", "params": {"queues": ["work"]}}],
        "leader_election": LEASE,
    }
    apps = [run_exporter(raw, redis_url=redis_url) for _ in range(2)]
    leader = wait_for(lambda: _leader(*apps), timeout=30)
    follower = next(app for app in apps if app is not leader)
    _read_since(leader, time.time())  # its baseline, before the first job
    process, _ = start_worker(redis_url, "work")
    try:
        plan = [
            *({"function": "sleep_for", "kwargs": {"seconds": s}, "key": f"sleep-{s}"}
              for s in (0.2, 0.4, 0.6)),
            {"function": "sleep_for", "kwargs": {"seconds": 0.3}, "key": "kept", "ttl": 0},
            {"function": "fail", "key": "failed-once"},
            {"function": "fail", "key": "failed-twice", "retries": 2},
            {"function": "succeed", "key": "no-record", "ttl": -1},
        ]  # fmt: skip
        driver(redis_url, "enqueue", json.dumps([{"queue": "work", **step} for step in plan]))
        keys = [step["key"] for step in plan if step["key"] != "no-record"]
        jobs = _finished_jobs(redis_url, keys)
        assert jobs["failed-twice"]["attempts"] == 2  # retried: its wait is not observed
        wanted = _runtimes_of(jobs)
        assert ("queue_job_wait_seconds", "fail") in wanted
        wait_for(lambda: _matches(_served_runtimes(leader, wanted), wanted), timeout=20)
        for _ in range(4):  # a few reads later: still once, and none on the follower
            time.sleep(0.5)
            assert _matches(_served_runtimes(leader, wanted), wanted)
            assert all(n == 0 for n, _ in _served_runtimes(follower, wanted).values())
        served = scrape_series(leader)  # a job of ttl -1 leaves no record to read
        assert value(served, "queue_job_execution_seconds_count", job_type="succeed") is None

        # the leader stops: the follower leads, its first read a baseline of all that finished
        leader.shutdown()
        wait_for(lambda: follower.leadership.is_leader(), timeout=30)
        _read_since(follower, time.time())  # its baseline as leader, before the next jobs
        after = [{"queue": "work", "function": "sleep_for", "kwargs": {"seconds": 0.1},
                  "key": f"after-{n}"} for n in range(2)]  # fmt: skip
        driver(redis_url, "enqueue", json.dumps(after))
        first_runs = _finished_jobs(redis_url, ["after-0", "after-1"])
        wanted_after = _runtimes_of(first_runs)
        wait_for(lambda: _matches(_served_runtimes(follower, wanted_after), wanted_after))
        # a key enqueued again once it finished (as SAQ's unique cron jobs are) runs again
        driver(redis_url, "enqueue", json.dumps(after[:1]))
        again = _finished_jobs(redis_url, ["after-0"])
        assert again["after-0"]["completed"] > first_runs["after-0"]["completed"]
        for key, times in _runtimes_of(again).items():
            wanted_after[key] = wanted_after.get(key, []) + times
        wait_for(lambda: _matches(_served_runtimes(follower, wanted_after), wanted_after))
        for _ in range(4):
            time.sleep(0.5)
            assert _matches(_served_runtimes(follower, wanted_after), wanted_after)
    finally:
        stop_process(process, signal.SIGTERM)


def _info(complete: int) -> str:
    """A worker's info as SAQ's Queue.worker_info writes it."""
    stats = {"complete": complete, "failed": 0, "retried": 0, "aborted": 0, "uptime": 1}
    return json.dumps({"stats": stats, "queue_key": "work", "metadata": None})


@pytest.mark.parametrize(
    "hostile",
    [
        pytest.param(lambda c, key: c.rpush(key, "x"), id="wrong-type"),
        pytest.param(lambda c, key: c.set(key, "not json"), id="not-json"),
        pytest.param(lambda c, key: c.set(key, json.dumps({"stats": []})), id="stats-not-object"),
        pytest.param(lambda c, key: c.set(key, "x" * (2 << 20)), id="huge"),
        pytest.param(lambda c, key: c.set(key, _info(-5)), id="negative-count"),
    ],
)
def test_a_hostile_worker_record_costs_itself_only(redis_client, redis_url, hostile):
    """One live worker's record is hostile: refused by reason at every read, and the other
    worker's completions are counted all the same."""
    from exporter.redis.connection import RedisConnectionConfig
    from exporter.sources.readers.config import SaqReaderConfig
    from exporter.sources.readers.framework import Signals
    from exporter.sources.readers.saq import SaqReader

    expires = int(time.time() * 1000) + 600_000
    good, bad = "saq:work:worker_info:good", "saq:work:worker_info:bad"
    redis_client.zadd("saq:work:stats", {good: expires, bad: expires})
    redis_client.set(good, _info(3))
    hostile(redis_client, bad)
    reader = SaqReader(SaqReaderConfig(queues=["work"]), RedisConnectionConfig(url=redis_url))
    try:
        baseline = Signals()
        reader.read(baseline)
        assert sum(baseline.tally.invalid.values()) == 1
        redis_client.set(good, _info(5))
        signals = Signals()
        reader.read(signals)
        assert sum(signals.tally.invalid.values()) == 1
        completed = signals.tally.counts[("queue_jobs_completed_total", ("saq", "work", "", ""))]
        assert completed == 2
    finally:
        reader.close()


def test_a_job_taken_before_its_start_is_written_has_no_running_age(
    saq_installed, redis_client, redis_url, run_exporter
):
    """SAQ's dequeue moves a job to the active list (BLMOVE) and its worker writes `started`
    a moment later: until then the longest running age has no time to come from, and is not
    served (no age of 56 years from a start of 0), nor counted as an error. Once the start is
    written, the age is the job's, as SAQ's Job.duration("running") tells it."""
    driver(redis_url, "enqueue", json.dumps([{"queue": "work", "function": "succeed"}]))
    job_key = redis_client.lmove("saq:work:queued", "saq:work:active", "LEFT", "RIGHT")
    assert "started" not in json.loads(redis_client.get(job_key))  # SAQ leaves out a 0
    config = {"presets": [{"name": "saq", "params": {"queues": ["work"], "native": False}}]}
    app = run_exporter({**config, "sources": {"redis": {"url": redis_url}}})

    def read() -> Any:
        series = scrape_series(app)
        active = value(series, "queue_depth", system="saq", queue="work", state="active")
        return series if active == 1 else None

    series = wait_for(read)
    labels = {"system": "saq", "queue": "work", "state": "active"}
    assert value(series, "queue_oldest_age_seconds", **labels) is None
    assert total(series, "queue_exporter_source_errors_total", source="redis") == 0
    started_ms = int(time.time() * 1000) - 30_000  # as the worker's update writes it
    job = json.loads(redis_client.get(job_key))
    redis_client.set(job_key, json.dumps({**job, "started": started_ms, "status": "active"}))
    running = driver(redis_url, "jobs", "work", job["key"])[job["key"]]
    assert running["started"] == started_ms
    age = wait_for(lambda: value(scrape_series(app), "queue_oldest_age_seconds", **labels))
    assert 30 <= age < 30 + 60


def _workers_read(redis_url: str) -> tuple[dict[str, int], str | None]:
    """One read of a new SAQ reader: live workers of `work` by state, and its caveat."""
    from exporter.redis.connection import RedisConnectionConfig
    from exporter.sources.readers.config import SaqReaderConfig
    from exporter.sources.readers.framework import Signals
    from exporter.sources.readers.saq import SaqReader

    reader = SaqReader(SaqReaderConfig(queues=["work"]), RedisConnectionConfig(url=redis_url))
    try:
        signals = Signals()
        reader.read(signals)
    finally:
        reader.close()
    assert signals.tally.invalid == {}
    states = {"busy": 0, "idle": 0}
    for beat in signals.tally.heartbeats:
        assert (beat.system, beat.queue, beat.capacity) == ("saq", "work", None)
        states["busy" if beat.active else "idle"] += 1
    return states, signals.caveat


def test_live_workers_busy_while_an_active_job_names_them(saq_installed, redis_client, redis_url):
    """Two real workers, one running a long job: SAQ's Queue.info() lists both, the job's
    record names the one running it; served one busy, one idle. An active job that names no
    worker (as SAQ before 0.26.1 writes it) leaves the queue's workers unserved, and says so."""
    first, first_id = start_worker(redis_url, "work")
    second, second_id = start_worker(redis_url, "work")
    try:
        long_job = {"queue": "work", "function": "sleep_for", "kwargs": {"seconds": 600}}
        driver(redis_url, "enqueue", json.dumps([long_job]))

        def busy() -> dict[str, Any] | None:
            view = driver(redis_url, "truth", "work")["queues"]["work"]
            return view if view["busy"] and len(view["workers"]) == 2 else None

        view = wait_for(busy, timeout=60, interval=0.3)
        assert sorted(view["workers"]) == sorted([first_id, second_id])
        assert _workers_read(redis_url) == ({"busy": 1, "idle": 1}, None)
        job_key = redis_client.lindex("saq:work:active", 0)
        job = json.loads(redis_client.get(job_key))
        del job["worker_id"]
        redis_client.set(job_key, json.dumps(job))
        states, caveat = _workers_read(redis_url)
        assert states == {"busy": 0, "idle": 0}
        assert caveat is not None and "before 0.26.1" in caveat
    finally:
        stop_process(first, signal.SIGTERM)
        stop_process(second, signal.SIGTERM)
