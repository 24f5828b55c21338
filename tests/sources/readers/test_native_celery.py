"""The celery preset against real Celery: tasks published by Celery on kombu's Redis transport,
run by real `celery worker -E` processes; the truth is kombu's own message counts and what the
workers say they run and hold."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.celery_app import control
from tests.conftest import (
    Series,
    assert_runtimes_bucketed,
    scrape,
    scrape_series,
    total,
    value,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[3]
SLEEP = 0.3  # seconds each completing task sleeps: more than the 0.25 bucket
# The reads' interval (and deadline) with real workers. A read cut off beside busy loops loses
# no event (tests/sources/readers/test_native_celery_reads.py): the next read counts what it left.
INTERVAL = 1.0


def _runtimes(log: Path, task: str) -> list[float]:
    """The runtimes the worker logged for `task`'s successes ("Task <name>[<id>] succeeded in
    <seconds>s: <result>"), the same Celery sends in its task-succeeded events."""
    pattern = re.compile(rf"Task {re.escape(task)}\[[^\]]+\] succeeded in ([0-9.e+-]+)s")
    return [float(found) for found in pattern.findall(log.read_text())]


PLAN = [
    *({"task": "sleep_for", "seconds": SLEEP} for _ in range(4)),
    *({"task": "fail_after", "seconds": 0} for _ in range(2)),
    {"task": "retry_once", "seconds": 0.1},  # one retryable attempt, then a final failure
    {"task": "sleep_for", "seconds": 5, "soft_time_limit": 1},  # a timeout
]


def test_error_types_runtimes_waits_and_attempts(redis_url, run_exporter, tmp_path):
    """What tests/conformance does not check of a real worker's tasks: each failure's error
    type (a timeout too), the runtimes in their buckets as Celery logged them, the waits, and
    the attempts of the tasks that ended for good. (Queues, depths, workers, slots and the
    counts per routed queue are the harness's: tests/conformance/adapters/celery.py.)"""
    if not control.CELERY.exists():
        pytest.fail("celery is in the dev extra: scripts/setup.sh installs it")
    env = control.env(redis_url)
    config = {"presets": ["celery"], "sample_interval": INTERVAL}
    app = run_exporter(config, redis_url=redis_url)
    # subscribed to the events before any worker or task exists
    wait_for(lambda: value(scrape_series(app), "queue_exporter_source_up", source="native:celery"))
    log = tmp_path / "worker.log"
    worker = control.worker(env, "celery", 2, log)
    try:
        control.driver(env, "publish", json.dumps(PLAN))

        def finished() -> Series | None:
            series = scrape_series(app)
            done = total(series, "queue_jobs_completed_total", system="celery", queue="celery")
            failed = total(series, "queue_jobs_failed_total", system="celery", queue="celery")
            return series if done == 4 and failed == 5 else None

        series = wait_for(finished, timeout=60)

        def failed(error_type: str) -> float:
            return total(series, "queue_jobs_failed_total", queue="celery", error_type=error_type)

        assert failed("non_retryable") == 3
        assert failed("retryable") == 1
        assert failed("timeout") == 1
        assert total(series, "queue_jobs_retried_total", queue="celery") == 1
        assert total(series, "queue_jobs_started_total", queue="celery") == 9  # 8 tasks, 1 retry
        bucket = {"queue": "celery", "job_type": "tests.sleep_for"}
        # Each run in the bucket of the runtime Celery logged; the bounds below the task that
        # hit its 1 s soft limit, whose runtime Celery does not give.
        runtimes = _runtimes(log, "tests.sleep_for")
        assert len(runtimes) == 4 and min(runtimes) >= SLEEP
        assert_runtimes_bucketed(series, runtimes, below=1.0, **bucket)
        assert total(series, "queue_job_wait_seconds_count", **bucket) == 5
        # attempts of the jobs that ended for good (a timeout may be retried: not final)
        assert total(series, "queue_job_attempts_count", queue="celery") == 7
        assert total(series, "queue_job_attempts_sum", queue="celery") == 8  # one took two
    finally:
        control.stop(worker)


def test_no_events_is_reported_without_going_down(redis_url, run_exporter):
    """No worker (or none with -E): said on the status page and in a self-metric, the active
    depth left out, and the exporter ready all the same."""
    app = run_exporter(
        {"presets": ["celery"], "sources": {"native": {"celery": {"events_timeout": 1}}}},
        redis_url=redis_url,
    )
    series = wait_for(
        lambda: (
            s
            if value(
                s := scrape_series(app), "queue_exporter_native_silent", stream="native:celery"
            )
            else None
        )
    )
    assert value(series, "queue_exporter_source_up", source="native:celery") == 1
    assert not [
        labels for name, labels in series if name == "queue_depth" and ("state", "active") in labels
    ]
    assert app.health.ready()
    status = app.health.snapshot()["native:celery"]
    assert status.up and status.silent is not None and "-E" in status.silent


def test_tasks_held_by_a_late_ack_worker(redis_url, run_exporter):
    """Under late ack a running task's message stays in kombu's unacked hash beside the one
    held for its countdown: active, pending and scheduled each count a task once, as the
    worker reports."""
    env = {**control.env(redis_url), "QE_CELERY_ACKS_LATE": "1"}
    presets = [{"name": "celery", "params": {"queues": ["late"]}}]
    app = run_exporter({"presets": presets, "sample_interval": INTERVAL}, redis_url=redis_url)
    wait_for(lambda: value(scrape_series(app), "queue_exporter_source_up", source="native:celery"))
    worker = control.worker(env, "late", 1)
    try:
        # first the countdown task, which the worker takes and holds, then three long ones
        countdown = {"task": "sleep_for", "seconds": 0, "queue": "late", "countdown": 3600}
        control.driver(env, "publish", json.dumps([countdown]))
        wait_for(lambda: control.driver(env, "truth", "late")["scheduled"].get("late") == 1)
        plan = [{"task": "sleep_for", "seconds": 30, "queue": "late"} for _ in range(3)]
        control.driver(env, "publish", json.dumps(plan))

        def held() -> dict | None:
            truth = control.driver(env, "truth", "late")
            assert isinstance(truth, dict)
            held = {key: truth[key].get("late", 0) for key in ("active", "reserved", "scheduled")}
            if held["active"] != 1 or held["scheduled"] != 1:
                return None
            series = scrape_series(app)
            expected = {
                "active": 1,
                "pending": truth["waiting"]["late"] + held["reserved"],
                "scheduled": 1,
            }
            depths = {
                state: total(series, "queue_depth", system="celery", queue="late", state=state)
                for state in expected
            }
            return truth if depths == expected else None

        truth = wait_for(held, timeout=40)
        assert truth["waiting"]["late"] + truth["reserved"].get("late", 0) == 2
    finally:
        control.stop(worker)


def test_no_events_is_not_reported_where_workers_may_scale_to_zero(redis_url, run_exporter):
    native = {"celery": {"events_timeout": 0.5, "report_no_events": False}}
    preset = {"name": "celery", "params": {"queues": ["celery", "*"]}}  # celery: read even unseen
    app = run_exporter({"presets": [preset], "sources": {"native": native}}, redis_url=redis_url)
    wait_for(lambda: app.health.snapshot()["native:celery"].ever_succeeded)
    quiet_since = time.monotonic()

    def up_after_three_timeouts() -> Series | None:
        # up at a scrape past three timeouts without any event (a read cut off at its deadline
        # on a loaded host is down for its own reason, counted as timeout: not this test's)
        series = scrape_series(app)
        up = value(series, "queue_exporter_source_up", source="native:celery") == 1
        return series if up and time.monotonic() - quiet_since > 1.5 else None

    series = wait_for(up_after_three_timeouts)
    assert not value(
        series, "queue_exporter_source_errors_total", source="native:celery", reason="no_events"
    )
    assert value(series, "queue_depth", system="celery", queue="celery", state="active") == 0


@pytest.mark.parametrize(
    ("inspect", "queues", "counted_on"),
    [(True, "emails,reports", "reports"), (False, "reports", "(unknown)")],
    ids=["inspected", "heartbeat-only"],
)
def test_a_task_running_before_the_exporter_started_is_active(
    inspect, queues, counted_on, redis_url, run_exporter, tmp_path
):
    """A rolling update: the task started before the reader subscribed, so no task-started
    reaches it, and the producer sent no task-sent (Celery's default). Celery's inspection
    names it, with its queue and its start (the longest running task's age); without
    inspection its worker's heartbeat (`active`) says it runs, on no queue it can tell, and
    when it started, which it does not tell (no made-up queue nor age)."""
    env = control.env(redis_url)
    worker = control.worker(env, queues, 2)
    release = tmp_path / "release"  # the task runs until then (a fixed 30 s ran out under load)
    try:
        task = {"task": "held", "seconds": 600, "release": str(release), "queue": "reports"}
        control.driver(env, "publish", json.dumps([task]), "--no-sent-event")

        def running() -> int | None:
            truth = control.driver(env, "truth", "reports")
            assert isinstance(truth, dict)
            return truth["active"].get("reports")

        wait_for(lambda: running() == 1, timeout=120)
        started = control.driver(env, "truth", "reports")["started"]["reports"]  # time_start
        native = {"celery": {"inspect": inspect}}
        config = {"presets": ["celery"], "sample_interval": INTERVAL, "sources": {"native": native}}
        exporter_started = time.time()
        app = run_exporter(config, redis_url=redis_url)

        def active() -> float | None:
            series = scrape_series(app)
            return value(series, "queue_depth", system="celery", queue=counted_on, state="active")

        wait_for(lambda: active() == 1, timeout=120)
        assert running() == 1 == active()
        series = scrape_series(app)
        scraped_at = time.time()
        assert not total(series, "queue_depth", system="celery", queue="celery", state="active")
        age = value(series, "queue_oldest_age_seconds", queue=counted_on, state="active")
        if inspect:  # read after the exporter started, before the scrape
            assert age is not None and exporter_started - started <= age <= scraped_at - started
        else:
            assert age is None
        if inspect:
            # a -c 2 worker of emails and reports running one task of reports: its slots as
            # Celery's stats() says (max-concurrency 2), busy on the queue whose task it runs
            slots = control.driver(env, "workers")
            assert isinstance(slots, dict) and slots["reports"]["slots"] == 2
            labels = {"system": "celery", "queue": "reports"}
            assert value(series, "queue_worker_slots", state="busy", **labels) == 1
            assert value(series, "queue_worker_slots", state="free", **labels) == 1
            assert value(series, "queue_worker_utilization_ratio", **labels) == 0.5
            assert value(series, "queue_workers", state="busy", **labels) == 1
            emails = {"system": "celery", "queue": "emails"}
            assert value(series, "queue_worker_utilization_ratio", **emails) == 0
            assert value(series, "queue_workers", state="idle", **emails) == 1
        # it ends unseen-started: no longer active, as the worker says
        release.touch()
        wait_for(lambda: running() is None, timeout=120)
        wait_for(lambda: active() == 0, timeout=60)
    finally:
        release.touch()
        control.stop(worker)


def test_without_inspection_no_slot_is_made_up(redis_url, run_exporter):
    """inspect: false (a read-only deployment): workers are known from their heartbeats alone,
    under "(unknown)", with no slot series; tasks whose queue cannot be learned are counted
    under "(unknown)", never "celery", and the status page says what would tell it."""
    env = control.env(redis_url)
    native = {"celery": {"inspect": False}}
    config = {"presets": ["celery"], "sample_interval": INTERVAL, "sources": {"native": native}}
    app = run_exporter(config, redis_url=redis_url)
    worker = control.worker(env, "emails,reports", 3)
    try:
        plan = [{"task": "to_emails", "seconds": 0} for _ in range(6)]
        control.driver(env, "publish", json.dumps(plan), "--no-sent-event")

        def counted() -> Series | None:
            series = scrape_series(app)
            done = total(series, "queue_jobs_completed_total", system="celery")
            return series if done == 6 else None

        series = wait_for(counted, timeout=120)
        unknown = total(series, "queue_jobs_completed_total", queue="(unknown)")
        # a name seen in kombu's unacked hash is learned: those count on their own queue
        assert unknown + total(series, "queue_jobs_completed_total", queue="emails") == 6
        assert value(series, "queue_workers", queue="(unknown)", state="idle") == 1
        assert not [name for name, _ in series if name == "queue_worker_slots"]
        assert not [name for name, _ in series if name == "queue_worker_utilization_ratio"]
        status = json.loads(scrape(app.server.port, "/status.json"))
        warnings = " ".join(status["view"]["warnings"])
        assert ("task_send_sent_event" in warnings) == (unknown > 0)
    finally:
        control.stop(worker)


def test_a_worker_without_task_events_is_named(redis_url, run_exporter, caplog):
    """A worker started without -E heartbeats but sends no task event: once it has processed
    tasks it is named, with the fix, in the log, on the status page and in
    queue_exporter_native_silent; the exporter stays ready."""
    env = control.env(redis_url)
    app = run_exporter({"presets": ["celery"], "sample_interval": INTERVAL}, redis_url=redis_url)
    worker = control.worker(env, "plain", 1, events=False)
    try:
        plan = [{"task": "sleep_for", "seconds": 0, "queue": "plain"} for _ in range(3)]
        control.driver(env, "publish", json.dumps(plan), "--no-sent-event")

        def named() -> Series | None:
            series = scrape_series(app)
            silent = value(series, "queue_exporter_native_silent", stream="native:celery")
            return series if silent == 1 else None

        with caplog.at_level(logging.WARNING):
            series = wait_for(named, timeout=120)
        assert not total(series, "queue_jobs_completed_total", system="celery")
        assert app.health.ready()
        status = json.loads(scrape(app.server.port, "/status.json"))
        warning = next(w for w in status["view"]["warnings"] if "without -E" in w)
        assert "plain@" in warning and "worker_send_task_events" in warning
        assert "plain@" in caplog.text and "without -E" in caplog.text
    finally:
        control.stop(worker)


# -- every signal on the queue Celery routed its task to, under Celery's defaults -----------------

# Three workers as a deployment runs them: one queue alone, and two serving two queues each.
WORKERS = (("ingest", 1), ("emails,reports", 4), ("billing,thumbs", 2))
# Per routed queue (task_routes by name): tasks that succeed, fail, retry once then succeed.
OUTCOMES = {
    "ingest": (3, 1, 0),
    "emails": (4, 0, 1),
    "reports": (2, 2, 0),
    "billing": (5, 1, 1),
    "thumbs": (1, 0, 0),
}
_LOGGED = re.compile(r"Task tests\.to_(\w+)\[[^\]]+\] (succeeded in|raised unexpected|retry)")


def _logged_outcomes(logs: list[Path]) -> dict[str, Counter[str]]:
    """Per queue, what the workers logged of its tasks (`tests.to_<queue>` is routed to
    <queue> by task_routes): succeeded, failed (raised) and retried."""
    kinds = {"succeeded in": "succeeded", "raised unexpected": "failed", "retry": "retried"}
    found: dict[str, Counter[str]] = {}
    for log in logs:
        for queue, kind in _LOGGED.findall(log.read_text()):
            found.setdefault(queue, Counter())[kinds[kind]] += 1
    return found


def test_each_task_counts_on_its_routed_queue_with_task_sent_events(
    redis_url, run_exporter, tmp_path
):
    """Five queues routed by task_routes, three workers (one of one queue, two of two), the
    producer sending task-sent events (task_send_sent_event = True; Celery's default, off, is
    tests/conformance's): every enqueue, start, completion, failure and retry on the queue
    Celery routed its task to; workers and slots per queue as Celery's inspection says;
    nothing under a queue that does not exist."""
    env = control.env(redis_url)
    config = {"presets": ["celery"], "sample_interval": INTERVAL}
    app = run_exporter(config, redis_url=redis_url)
    logs = [tmp_path / f"worker{number}.log" for number in range(len(WORKERS))]
    workers = [
        control.worker(env, queues, concurrency, log)
        for (queues, concurrency), log in zip(WORKERS, logs, strict=True)
    ]
    try:
        truth = wait_for(
            lambda: t if len(t := control.driver(env, "workers")) == 5 else None, timeout=120
        )
        assert isinstance(truth, dict)

        def workers_per_queue() -> Series | None:
            series = scrape_series(app)
            for queue, expected in truth.items():
                labels = {"system": "celery", "queue": queue}
                if total(series, "queue_workers", **labels) != expected["workers"]:
                    return None
                if total(series, "queue_worker_slots", **labels) != expected["slots"]:
                    return None
            return series

        series = wait_for(workers_per_queue, timeout=120)
        # no worker under a queue that does not exist, however it was first seen
        queues = {dict(labels)["queue"] for name, labels in series if name == "queue_workers"}
        assert queues == set(OUTCOMES)

        plan = [
            {"task": f"to_{queue}", "seconds": 0.05, "outcome": outcome}
            for queue, (ok, fail, retry) in OUTCOMES.items()
            for outcome, times in (("ok", ok), ("fail", fail), ("retry", retry))
            for _ in range(times)
        ]
        control.driver(env, "publish", json.dumps(plan))
        runs = sum(ok + fail + 2 * retry for ok, fail, retry in OUTCOMES.values())

        def all_counted() -> Series | None:
            """Every run started and ended (a success, a failure or a retry's failure, each
            with its execution time): a run's end is read after its start."""
            series = scrape_series(app)
            counts = [
                total(series, name, system="celery")
                for name in ("queue_jobs_started_total", "queue_job_execution_seconds_count")
            ]
            ends = total(series, "queue_jobs_completed_total", system="celery") + total(
                series, "queue_jobs_failed_total", system="celery"
            )
            return series if counts == [runs, runs] and ends == runs else None

        series = wait_for(all_counted, timeout=120)

        def all_logged() -> dict[str, Counter[str]] | None:
            found = _logged_outcomes(logs)
            return found if sum(sum(c.values()) for c in found.values()) == runs else None

        logged = wait_for(all_logged)
        for queue, (ok, fail, retry) in OUTCOMES.items():
            assert (
                logged.get(queue, Counter())
                == Counter({"succeeded": ok + retry, "failed": fail, "retried": retry}) - Counter()
            )
            labels = {"system": "celery", "queue": queue}
            counted = (
                total(series, "queue_jobs_completed_total", **labels),
                total(series, "queue_jobs_failed_total", error_type="non_retryable", **labels),
                total(series, "queue_jobs_failed_total", error_type="retryable", **labels),
                total(series, "queue_jobs_retried_total", **labels),
                total(series, "queue_jobs_started_total", **labels),
                total(series, "queue_job_execution_seconds_count", **labels),
            )
            runs_here = ok + fail + 2 * retry
            assert counted == (ok + retry, fail, retry, retry, runs_here, runs_here), queue
        on_queues = {
            dict(labels)["queue"]
            for name, labels in series
            if name.startswith("queue_jobs_") and name.endswith("_total")
        }
        assert on_queues <= set(OUTCOMES)  # nothing on "celery" nor "(unknown)"
        # the producer's task-sent events (a worker's retry is sent by the worker, which keeps
        # Celery's default)
        assert total(series, "queue_jobs_enqueued_total", system="celery") == len(plan)
    finally:
        for worker in workers:
            control.stop(worker)


def _check_config(redis_url: str, tmp_path: Path) -> str:
    """What `check-config --connect` prints for the celery preset (it watches the reader for
    CELERY_WATCH seconds)."""
    config = tmp_path / "celery.json"
    config.write_text(json.dumps({"presets": ["celery"]}))
    checked = subprocess.run(
        [str(ROOT / ".venv/bin/queue-exporter"), "check-config", str(config), "--connect"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("QUEUE_EXPORTER_")}}
        | {"QUEUE_EXPORTER_REDIS_URL": redis_url},
    )
    return checked.stdout


def _warnings(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("WARNING:")]


def test_check_config_names_a_worker_without_task_events(redis_url, tmp_path):
    """check-config --connect watches the Celery reader for two heartbeats: the workers its
    inspection found, with their queues and slots, and a WARNING for a worker that processes
    tasks without sending task events, with the fix."""
    env = control.env(redis_url)
    worker = control.worker(env, "plain", 1, events=False)
    try:
        wait_for(lambda: "plain" in control.driver(env, "workers"), timeout=120)
        # busy for longer than check-config watches: its heartbeats' processed count rises
        plan = [{"task": "sleep_for", "seconds": 0.2, "queue": "plain"} for _ in range(60)]
        control.driver(env, "publish", json.dumps(plan), "--no-sent-event")
        out = _check_config(redis_url, tmp_path)
        assert re.search(r"celery worker plain@\S+: queues plain; slots 1", out), out
        assert any("plain@" in w and "without -E" in w for w in _warnings(out)), out
    finally:
        control.stop(worker)


# -- a task whose queue cannot be learned: under unknown_queue, and named ---------------------------

# Tasks of one name with no route (task_routes send it to the default queue, which the worker
# does not consume), each sent with a queue= of its own to a worker of both queues, under
# Celery's default task_send_sent_event = False: those to emails succeed, those to reports fail.
OWN_QUEUES = {"emails": "ok", "reports": "fail"}
OWN_QUEUE_TASKS = 10  # per queue


def test_a_task_whose_queue_cannot_be_learned_counts_under_unknown(redis_url, run_exporter, caplog):
    """No event names such a task's queue, nor do its worker's queues or its name's route,
    nor another task of its name seen on one queue: it is counted under "(unknown)", never
    under "celery" nor under the other queue, and the log and the status page say what would
    tell it. (A task the reader saw held in kombu's unacked hash or in an inspection's answer
    is learned exactly: on its own queue.)"""
    env = control.env(redis_url)
    app = run_exporter({"presets": ["celery"], "sample_interval": INTERVAL}, redis_url=redis_url)
    worker = control.worker(env, ",".join(OWN_QUEUES), 2)
    try:
        wait_for(lambda: "emails" in control.driver(env, "workers"), timeout=120)
        # the exporter's inspection read the worker's queues and routes before any task came
        wait_for(
            lambda: value(scrape_series(app), "queue_workers", queue="emails", state="idle"),
            timeout=120,
        )
        # one of them seen running on emails: the name was seen routed there, which tells
        # nothing of the next one's queue (its caller names it)
        long = {"task": "unrouted", "seconds": 60, "queue": "emails"}
        control.driver(env, "publish", json.dumps([long]), "--no-sent-event")
        wait_for(
            lambda: value(scrape_series(app), "queue_depth", queue="emails", state="active") == 1,
            timeout=120,
        )
        plan = [
            {"task": "unrouted", "seconds": 0, "queue": queue, "outcome": outcome}
            for _ in range(OWN_QUEUE_TASKS)
            for queue, outcome in OWN_QUEUES.items()
        ]
        with caplog.at_level(logging.WARNING):
            control.driver(env, "publish", json.dumps(plan), "--no-sent-event")

            def counted() -> Series | None:
                series = scrape_series(app)
                done = total(series, "queue_jobs_completed_total", system="celery")
                failed = total(series, "queue_jobs_failed_total", system="celery")
                return series if done == failed == OWN_QUEUE_TASKS else None

            series = wait_for(counted, timeout=120)
            status = json.loads(scrape(app.server.port, "/status.json"))

        def on(name: str) -> dict[str, float]:
            found: Counter[str] = Counter()
            for (metric, labels), count in series.items():
                if metric == name and ("system", "celery") in labels:
                    found[dict(labels)["queue"]] += count
            return {queue: count for queue, count in found.items() if count}

        # the successes were sent to emails, the failures to reports: each on its own queue
        # when learned, else under (unknown), and nothing anywhere else
        assert set(on("queue_jobs_completed_total")) <= {"(unknown)", "emails"}
        assert set(on("queue_jobs_failed_total")) <= {"(unknown)", "reports"}
        started = on("queue_jobs_started_total")
        assert set(started) <= {"(unknown)", "emails", "reports"}
        assert sum(started.values()) == 2 * OWN_QUEUE_TASKS + 1
        unknown = on("queue_jobs_completed_total").get("(unknown)", 0)
        unknown += on("queue_jobs_failed_total").get("(unknown)", 0)
        assert unknown > 0  # tasks of no time at all: most run between two reads, unseen
        said = "task_send_sent_event = True"
        warning = next(w for w in status["view"]["warnings"] if 'queue="(unknown)"' in w)
        assert said in warning
        assert 'queue="(unknown)"' in caplog.text and said in caplog.text
    finally:
        control.stop(worker)


def test_check_config_names_tasks_whose_queue_cannot_be_learned(redis_url, tmp_path):
    """Tasks sent with a queue= of their own to a worker of two queues, without task-sent
    events, while check-config --connect watches: a WARNING that they count under
    "(unknown)", naming what would tell their queue; the worker's routes (a map) are read,
    so no warning about them."""
    env = control.env(redis_url)
    worker = control.worker(env, ",".join(OWN_QUEUES), 2)
    try:
        wait_for(lambda: "emails" in control.driver(env, "workers"), timeout=120)
        # busy for longer than check-config watches, on both queues
        plan = [
            {"task": "unrouted", "seconds": 0.2, "queue": queue, "outcome": outcome}
            for _ in range(30)
            for queue, outcome in OWN_QUEUES.items()
        ]
        control.driver(env, "publish", json.dumps(plan), "--no-sent-event")
        out = _check_config(redis_url, tmp_path)
        assert re.search(r"celery worker emails,reports@\S+: queues emails, reports; slots 2", out)
        warning = next(w for w in _warnings(out) if 'queue="(unknown)"' in w)
        assert "task_send_sent_event = True" in warning, out
        assert not [w for w in _warnings(out) if "task_routes cannot be read" in w], out
    finally:
        control.stop(worker)


@pytest.mark.parametrize("router", ["function", "class"])
def test_check_config_names_a_worker_whose_routes_cannot_be_read(router, redis_url, tmp_path):
    """A worker of two queues whose task_routes are a router function or class (Celery's
    `conf` reply gives their repr or path, not where each name goes): check-config --connect
    warns that its tasks' queue is told only by task-sent events, else "(unknown)"."""
    env = {**control.env(redis_url), "QE_CELERY_ROUTER": router}
    worker = control.worker(env, "emails,reports", 2)
    try:
        wait_for(lambda: "emails" in control.driver(env, "workers"), timeout=120)
        out = _check_config(redis_url, tmp_path)
        warning = next(w for w in _warnings(out) if "task_routes cannot be read" in w)
        assert "celery worker emails,reports@" in warning, out
        assert "task_send_sent_event = True" in warning and 'queue="(unknown)"' in warning
    finally:
        control.stop(worker)
