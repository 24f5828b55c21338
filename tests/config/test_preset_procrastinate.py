"""The procrastinate preset against real Procrastinate: its schema, its defer, its worker, its API.

The schema is Procrastinate's own (SchemaManager.apply_schema); jobs are deferred through its
tasks and run by a real `procrastinate worker` process (tests/procrastinate_app): they succeed,
fail, fail into an hour-long retry wait, wait for a schedule, are cancelled, and one keeps
running. The truth is JobManager.list_jobs / list_queues (status, scheduled_at, attempts of each
job) and the times this test saw around each defer and start.

Depths, due jobs and ages as Procrastinate says them are checked by the conformance harness
(tests/conformance/adapters/postgres_queues.py), with these drivers; here: the rest.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import procrastinate
import psycopg
import pytest

from exporter.config import presets
from tests.conftest import Series, value, wait_for, wait_until_served_as_truth

ROOT = Path(__file__).resolve().parents[2]
WORKED_QUEUES = ("emails", "reports", "slow")
SOURCES = ("postgres:procrastinate_jobs", "postgres:procrastinate_due")


@pytest.fixture
def procrastinate_app(postgres_dsn: str) -> Iterator[procrastinate.App]:
    from tests.procrastinate_app.tasks import app

    connector = procrastinate.PsycopgConnector(conninfo=postgres_dsn)
    with app.replace_connector(connector) as bound, bound.open():
        bound.schema_manager.apply_schema()
        yield bound


def _worker(dsn: str, queues: tuple[str, ...]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PROCRASTINATE_DSN": dsn}
    return subprocess.Popen(
        [sys.executable, "-m", "procrastinate", "--app", "tests.procrastinate_app.tasks.app",
         "worker", "--queues", ",".join(queues), "--concurrency", "3"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


def procrastinate_state(job: Any, now: float) -> str | None:
    """The preset's state of a job, from what Procrastinate's own API says of it."""
    if job.status == "doing":
        return "active"
    if job.status == "failed":  # kept until someone deletes or retries it
        return "failed"
    if job.status != "todo":
        return None
    if job.scheduled_at is not None and job.scheduled_at.timestamp() > now:
        return "retry" if job.attempts > 0 else "scheduled"
    return "pending"


def _preset_collectors() -> list[dict[str, Any]]:
    collectors: list[dict[str, Any]] = presets.expand("procrastinate")["sources"]["postgres"][
        "collectors"
    ]
    return collectors


def test_hot_path_reads_procrastinates_indexes_not_the_finished_rows(
    procrastinate_app: procrastinate.App, postgres_dsn: str
) -> None:
    """200k finished rows (600k events) and a few unfinished ones, as a busy Procrastinate
    keeps them: every query of the preset that runs every cycle reaches its rows through
    Procrastinate's own indexes. The one that cannot, the failed jobs' count (no index holds
    them apart), runs on its own longer interval, stated with why, and reads the job table
    only: no event."""
    app = procrastinate_app
    for n in range(20):
        app.tasks["send_email"].configure(queue=f"q{n % 4}").defer(to="x")
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        # The finished history (its shape only matters to the planner): written in bulk.
        connection.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, status, attempts) "
            "SELECT 'q' || (n % 4), 'send_email', "
            "(CASE WHEN n % 10 = 0 THEN 'failed' ELSE 'succeeded' END)::procrastinate_job_status, 1 "
            "FROM generate_series(1, 200000) AS n"
        )
        connection.execute(
            "INSERT INTO procrastinate_events (job_id, type, at) "
            "SELECT id, event, now() FROM procrastinate_jobs, "
            "unnest('{deferred,started,succeeded}'::procrastinate_job_event_type[]) AS event"
        )
        connection.execute("ANALYZE")
        # the finished-rows reader, one interval after its baseline (max id): by the primary key
        finished = presets.expand("procrastinate")["sources"]["postgres"]["finished"][0]
        row = connection.execute(finished["baseline"]).fetchone()
        assert row is not None
        after = row[0] - 100
        read = finished["query"].replace("{after}", str(after)).replace("{limit}", "10000")
        every_cycle = []
        for collector in _preset_collectors():
            if collector["name"] != "procrastinate_failed":
                every_cycle.append(collector["query"])
                continue
            assert collector["interval"] >= 10 and collector["interval_reason"], collector
            plan = "\n".join(r[0] for r in connection.execute(f"EXPLAIN {collector['query']}"))
            assert "Seq Scan on procrastinate_events" not in plan, plan
        for query in [*every_cycle, finished["baseline"], read]:
            plan = "\n".join(row[0] for row in connection.execute(f"EXPLAIN {query}").fetchall())
            assert "Seq Scan on procrastinate_jobs" not in plan, plan
            assert "Seq Scan on procrastinate_events" not in plan, plan
        assert len(every_cycle) == len(_preset_collectors()) - 1  # procrastinate_failed apart


def test_a_renamed_column_costs_only_the_collector_that_reads_it(
    procrastinate_app: procrastinate.App, postgres_dsn: str, run_exporter: Any
) -> None:
    """After an upgrade that renamed procrastinate_events.at, the collector reading it fails
    with missing_column; the due and failed counts, which never read it, are still served."""
    app = procrastinate_app
    app.tasks["send_email"].configure(queue="idle", schedule_in={"seconds": 0}).defer(to="x")
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute("ALTER TABLE procrastinate_events RENAME COLUMN at TO happened_at")
    exporter = run_exporter(postgres_dsn=postgres_dsn, preset=["procrastinate"])

    def reported(series: Series, _: float) -> list[str]:
        found = []
        errors = value(
            series,
            "queue_exporter_source_errors_total",
            source="postgres:procrastinate_jobs",
            reason="missing_column",
        )
        if not errors:
            found.append(f"procrastinate_jobs errors (missing_column): {errors}")
        if value(series, "queue_exporter_source_up", source="postgres:procrastinate_jobs") != 0:
            found.append("procrastinate_jobs is not down")
        for state in ("pending", "scheduled", "retry", "active"):
            served = value(series, "queue_depth", system="procrastinate", queue="idle", state=state)
            if served is not None:
                found.append(f"the failing collector's {state} depth is still served: {served}")
        # procrastinate_failed never reads the column either
        failed = value(series, "queue_depth", system="procrastinate", queue="idle", state="failed")
        if failed != len(app.job_manager.list_jobs(queue="idle", status="failed")):
            found.append(f"failed {failed}: Procrastinate has no failed job")
        due = value(series, "queue_scheduled_due", system="procrastinate", queue="idle")
        if due != len(app.job_manager.list_jobs(status="todo")):
            found.append(f"due {due}: Procrastinate has 1 todo job, due")
        return found

    wait_until_served_as_truth(exporter, reported)


def _family(series: Series, name: str, **labels: str) -> float:
    wanted = {"system": "procrastinate", **labels}
    return sum(
        number
        for (metric, label_set), number in series.items()
        if metric == name and wanted.items() <= dict(label_set).items()
    )


def test_native_counts_what_finished_once_and_survives_procrastinates_clean_up(
    procrastinate_app: procrastinate.App, postgres_dsn: str, run_exporter: Any, tmp_path: Path
) -> None:
    """Completed, failed and retried attempts and their execution and wait times, from the rows
    Procrastinate writes as jobs finish: what finished before the reader's first read is not
    counted, what finished after is counted once, and deleting the old jobs
    (JobManager.delete_old_jobs) takes nothing back."""
    app = procrastinate_app
    app.tasks["send_email"].configure(queue="emails").defer(to="before")  # before the baseline
    run_once = [sys.executable, "-m", "procrastinate", "--app", "tests.procrastinate_app.tasks.app",
                "worker", "--queues", "emails,reports", "--one-shot"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PROCRASTINATE_DSN": postgres_dsn}
    subprocess.run(run_once, env=env, check=True, timeout=60, capture_output=True)
    exporter = run_exporter(postgres_dsn=postgres_dsn, preset=["procrastinate"])
    wait_for(
        lambda: (
            value(_scrape(exporter), "queue_exporter_source_up", source="native:procrastinate") == 1
        )
    )

    for n in range(5):
        app.tasks["send_email"].configure(queue="emails").defer(to=f"user{n}")
    for _ in range(2):
        app.tasks["explode"].configure(queue="emails").defer()
    app.tasks["flaky"].configure(queue="reports").defer()
    subprocess.run(run_once, env=env, check=True, timeout=60, capture_output=True)

    def truth() -> dict[tuple[str, str, str], float]:
        """What Procrastinate says finished since the baseline: its jobs' statuses and attempts
        (the job deferred before the exporter started left out)."""
        counts: Counter[tuple[str, str, str]] = Counter()
        for job in app.job_manager.list_jobs():
            if job.task_kwargs.get("to") == "before":
                continue
            if job.status == "succeeded":
                counts["queue_jobs_completed_total", job.queue, job.task_name] += 1
            elif job.status == "failed":
                counts["queue_jobs_failed_total", job.queue, job.task_name] += 1
            elif job.status == "todo" and job.attempts:
                counts["queue_jobs_retried_total", job.queue, job.task_name] += job.attempts
                counts["queue_jobs_failed_total", job.queue, job.task_name] += job.attempts
        return counts

    expected = truth()
    assert expected == {
        ("queue_jobs_completed_total", "emails", "send_email"): 5,
        ("queue_jobs_failed_total", "emails", "explode"): 2,
        ("queue_jobs_failed_total", "reports", "flaky"): 1,
        ("queue_jobs_retried_total", "reports", "flaky"): 1,
    }  # what the workers were given: Procrastinate agrees

    def mismatches(series: Series, _: float) -> list[str]:
        found = []
        for (metric, queue, task), number in expected.items():
            served = _family(series, metric, queue=queue, job_type=task)
            if served != number:
                found.append(
                    f"{metric}{{{queue}, {task}}}: served {served}, Procrastinate {number}"
                )
        attempts = sum(expected[key] for key in expected if key[0] != "queue_jobs_retried_total")
        for histogram in ("queue_job_execution_seconds_count", "queue_job_wait_seconds_count"):
            served = _family(series, histogram)
            if served != attempts:
                found.append(f"{histogram}: served {served}, attempts {attempts}")
        return found

    wait_until_served_as_truth(exporter, mismatches)
    asyncio.run(_delete_old_jobs(postgres_dsn))
    assert app.job_manager.list_jobs(status="succeeded") == []
    for _ in range(3):  # later reads: nothing counted twice, nothing taken back
        wait_until_served_as_truth(exporter, mismatches)
        time.sleep(0.5)
    app.tasks["send_email"].configure(queue="emails").defer(to="after")
    subprocess.run(run_once, env=env, check=True, timeout=60, capture_output=True)
    expected["queue_jobs_completed_total", "emails", "send_email"] += 1
    wait_until_served_as_truth(exporter, mismatches)


async def _delete_old_jobs(dsn: str) -> None:
    """Procrastinate's own clean-up of finished jobs (their events go with them)."""
    from tests.procrastinate_app.tasks import app

    connector = procrastinate.PsycopgConnector(conninfo=dsn)
    with app.replace_connector(connector) as bound:
        async with bound.open_async():
            await bound.job_manager.delete_old_jobs(nb_hours=0, include_failed=True)


def _scrape(exporter: Any) -> Series:
    from tests.conftest import scrape_series

    return scrape_series(exporter)


def test_a_hostile_finished_row_costs_only_itself(
    procrastinate_app: procrastinate.App, postgres_dsn: str, run_exporter: Any
) -> None:
    """A job whose events say it ended before it started (a clock gone wrong, a hand-made row)
    is refused alone, counted as negative_duration; the jobs around it are counted. A job
    started before its deferral (a retry's `now()` later than the next attempt's start, which
    a retry at once can give) is counted, its wait as 0 s, as a v1 event's."""
    app = procrastinate_app
    exporter = run_exporter(postgres_dsn=postgres_dsn, preset=["procrastinate"])
    source = "native:procrastinate"
    wait_for(lambda: value(_scrape(exporter), "queue_exporter_source_up", source=source) == 1)
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        row = connection.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, status, attempts) "
            "VALUES ('emails', 'send_email', 'succeeded', 1) RETURNING id"
        ).fetchone()
        assert row is not None
        connection.execute(
            "INSERT INTO procrastinate_events (job_id, type, at) VALUES "
            "(%(id)s, 'started', now() - interval '10 seconds'), "
            "(%(id)s, 'succeeded', now() - interval '20 seconds')",
            {"id": row[0]},
        )
        row = connection.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, status, attempts) "
            "VALUES ('emails', 'early_start', 'succeeded', 1) RETURNING id"
        ).fetchone()
        assert row is not None
        connection.execute(
            "INSERT INTO procrastinate_events (job_id, type, at) VALUES "
            "(%(id)s, 'deferred', now() - interval '9 seconds'), "
            "(%(id)s, 'started', now() - interval '10 seconds'), "
            "(%(id)s, 'succeeded', now() - interval '8 seconds')",
            {"id": row[0]},
        )
    for n in range(3):
        app.tasks["send_email"].configure(queue="emails").defer(to=f"user{n}")
    run_once = [sys.executable, "-m", "procrastinate", "--app", "tests.procrastinate_app.tasks.app",
                "worker", "--queues", "emails", "--one-shot"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PROCRASTINATE_DSN": postgres_dsn}
    subprocess.run(run_once, env=env, check=True, timeout=60, capture_output=True)
    succeeded = len(app.job_manager.list_jobs(status="succeeded", task="send_email"))
    assert succeeded == 4  # the three the worker ran, and the hostile one
    assert len(app.job_manager.list_jobs(status="succeeded", task="early_start")) == 1

    def mismatches(series: Series, _: float) -> list[str]:
        found = []
        refused = value(
            series, "queue_exporter_events_invalid_total", stream=source, reason="negative_duration"
        )
        if refused != 1:
            found.append(f"refused rows: {refused}")
        emails = {"queue": "emails", "job_type": "send_email"}
        completed = _family(series, "queue_jobs_completed_total", **emails)
        if completed != succeeded - 1:
            found.append(f"completed {completed}: Procrastinate says {succeeded}, one hostile")
        early = {"queue": "emails", "job_type": "early_start"}
        counted = (
            _family(series, "queue_jobs_completed_total", **early),
            _family(series, "queue_job_wait_seconds_count", **early),
            _family(series, "queue_job_wait_seconds_sum", **early),
        )
        if counted != (1, 1, 0):
            found.append(f"early start: completed, waits, wait sum {counted}, truth (1, 1, 0)")
        if value(series, "queue_exporter_source_up", source=source) != 1:
            found.append(f"{source} is not up")
        return found

    wait_until_served_as_truth(exporter, mismatches)


def test_a_hung_postgresql_costs_only_its_sources(
    procrastinate_app: procrastinate.App, postgres_dsn: str, redis_url: str, run_exporter: Any
) -> None:
    """Procrastinate's PostgreSQL frozen behind a proxy (sockets open, nothing answered): its
    collectors and its native reader are withdrawn within two intervals (timeout, or no
    connection left in the pool), procrastinate_failed too, though it reads only every 60 s
    (its last read is not served as current while the database does not answer), while a
    Redis source of the same exporter keeps answering; thawed, they all come back."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from tests.tcp_proxy import TcpProxy
    from tests.timing import wake_up_lag

    app = procrastinate_app
    app.tasks["send_email"].configure(queue="emails").defer(to="x")
    target = conninfo_to_dict(postgres_dsn)
    proxy = TcpProxy(str(target.get("host", "127.0.0.1")), int(target.get("port", 5432))).start()
    try:
        interval = 2.5
        via_proxy = make_conninfo(postgres_dsn, host="127.0.0.1", port=proxy.port)
        exporter = run_exporter(
            {
                "sample_interval": interval,
                "presets": ["procrastinate", "rq"],
                "sources": {
                    "postgres": {"dsn": via_proxy, "connect_timeout": 1, "statement_timeout": 0.5},
                    "redis": {"url": redis_url},
                },
            }
        )
        # every collector, those reading on a longer interval (procrastinate_failed) too
        collectors = [f"postgres:{collector['name']}" for collector in _preset_collectors()]
        assert "postgres:procrastinate_failed" in collectors
        ours = (*collectors, "native:procrastinate")
        redis_sources = [
            dict(labels)["source"]
            for name, labels in _scrape(exporter)
            if name == "queue_exporter_source_up"
            and not dict(labels)["source"].startswith(("postgres:", "native:procrastinate"))
        ]
        assert redis_sources

        def up(series: Series, source: str) -> float | None:
            return value(series, "queue_exporter_source_up", source=source)

        def withdrawn() -> Series | None:
            series = _scrape(exporter)
            return series if all(up(series, source) == 0 for source in ours) else None

        def all_up(series: Series) -> bool:
            return all(up(series, source) == 1 for source in (*ours, *redis_sources))

        wait_for(lambda: all_up(_scrape(exporter)), timeout=30)
        lag = wake_up_lag()
        proxy.freeze()
        series = wait_for(withdrawn, timeout=2 * interval + 5 * lag + 2)
        assert value(series, "queue_depth", system="procrastinate", queue="emails") is None
        for source in ours:
            reasons = {
                dict(labels)["reason"]
                for name, labels in series
                if name == "queue_exporter_source_errors_total" and dict(labels)["source"] == source
            }
            # its own query timed out, or it found the pool's connections all stuck in those
            assert reasons and reasons <= {"timeout", "connection"}, (source, reasons)
        assert all(up(series, source) == 1 for source in redis_sources), redis_sources
        proxy.thaw()
        wait_for(lambda: all_up(_scrape(exporter)), timeout=30)
    finally:
        proxy.cut()
