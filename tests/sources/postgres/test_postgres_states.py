"""The PostgreSQL presets' states, fresh: every state an index covers read every cycle, ages that
move on between the reads of a costlier collector, failed jobs kept in a table served as a
state, pg-boss's own queues left out.

The truth is the real library's: pg-boss's getJobById of every job (tests/node/pgboss.cjs
through tests/test_preset_pgboss.PgBoss), and pg-boss's own scheduler queue as PgBoss.start()
creates it.
"""

from __future__ import annotations

import json
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

from exporter.sources.postgres import source as postgres
from exporter.sources.postgres.config import PostgresSourceConfig
from tests.config.test_preset_pgboss import NODE, PgBoss, pg_time
from tests.conftest import (
    Series,
    scrape,
    scrape_series,
    stop_process,
    value,
    wait_for,
    wait_until_served_as_truth,
)

QUEUES = ("emails", "reports", "slow", "idle")
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(params=[10, 12])
def pgboss(request: pytest.FixtureRequest, postgres_dsn: str, tmp_path: Path) -> Iterator[PgBoss]:
    boss = PgBoss(request.param, postgres_dsn, tmp_path)
    yield boss
    boss.release.touch()


def _served(series: Series, name: str) -> dict[tuple[str, str], float]:
    return {
        (labels["queue"], labels.get("state", "")): number
        for (metric, label_set), number in series.items()
        if metric == name and (labels := dict(label_set)).get("system") == "pgboss"
    }


def _live_states(truth: dict[str, Any]) -> dict[tuple[str, str], float]:
    """Active and failed jobs per queue, from getJobById of every job."""
    counts: Counter[tuple[str, str]] = Counter(
        {(queue, state): 0 for queue in QUEUES for state in ("active", "failed")}
    )
    for job in truth["jobs"]:
        if job["state"] in ("active", "failed"):
            counts[job["queue"], job["state"]] += 1
    return {key: float(n) for key, n in counts.items()}


def _settled(boss: PgBoss) -> dict[str, Any]:
    """pg-boss's truth once its worker completed and failed the emails and holds the slow job."""

    def done() -> dict[str, Any] | None:
        truth = boss.truth()
        states = Counter((job["queue"], job["state"]) for job in truth["jobs"])
        ready = states["emails", "failed"] == 2 and states["slow", "active"] == 1
        return truth if ready and states["emails", "completed"] == 4 else None

    result: dict[str, Any] = wait_for(done, timeout=60)
    return result


def _started(truth: dict[str, Any], queue: str) -> float:
    """When pg-boss started the queue's one active job (its startedOn)."""
    running = [
        pg_time(job["startedOn"])
        for job in truth["jobs"]
        if job["queue"] == queue and job["state"] == "active"
    ]
    assert len(running) == 1 and running[0] is not None, running
    return running[0]


def test_every_live_state_is_read_every_cycle_with_ages_that_move_on(
    pgboss: PgBoss, postgres_dsn: str, run_exporter: Any
) -> None:
    """With the preset's defaults (active_interval 30 s): active and failed depths equal
    pg-boss's jobs. pg-boss 12 reads them every cycle through job_i14 (pgboss_jobs, nothing
    from pgboss_active); pg-boss 10 reads them every 30 s, and between two reads the age of the
    job it holds running moves on with the clock: it grows from scrape to scrape, never ahead of
    the time since the job's startedOn, never a number frozen at the read."""
    pgboss.seed()
    worker = pgboss.worker()
    try:
        truth = _settled(pgboss)
        started = _started(truth, "slow")
        exporter = run_exporter(postgres_dsn=postgres_dsn, preset=["pgboss"])
        live = _live_states(truth)

        def mismatches(series: Series, scraped_at: float) -> list[str]:
            served = {
                key: n
                for key, n in _served(series, "queue_depth").items()
                if key[1] in ("active", "failed")
            }
            return [] if served == live else [f"served {served}, pg-boss says {live}"]

        wait_until_served_as_truth(exporter, mismatches)
        ages: list[float] = []
        for _ in range(4):  # about 2 s: well inside one active_interval on pg-boss 10
            before = time.time()
            age = _served(scrape_series(exporter), "queue_oldest_age_seconds")[("slow", "active")]
            after = time.time()
            # never ahead of the clock (pg-boss's times are in ms); behind it by the cycles a
            # loaded host delays, far less than the 30 s a frozen age would lag
            assert before - started - 5 <= age <= after - started + 0.001, (age, before - started)
            ages.append(age)
            time.sleep(0.6)
        assert ages == sorted(ages) and ages[-1] > ages[0], ages
        series = scrape_series(exporter)
        up = {
            name: number
            for (metric, label_set), number in series.items()
            if metric == "queue_exporter_source_up"
            for name in [dict(label_set)["source"]]
            if name.startswith("postgres:pgboss")
        }
        assert up.get("postgres:pgboss_jobs") == 1 and up.get("postgres:pgboss_active") == 1, up
        if pgboss.major >= 12:  # served by pgboss_jobs; pgboss_active returns no row
            with psycopg.connect(postgres_dsn) as connection:
                plan = "\n".join(
                    row[0]
                    for row in connection.execute(
                        "EXPLAIN SELECT count(*) FROM pgboss.job "
                        "WHERE name = 'emails' AND state IN ('active', 'failed')"
                    )
                )
            assert "job_common_i14" in plan, plan
    finally:
        pgboss.release.touch()
        stop_process(worker, 15)


def _start_with_scheduler(boss: PgBoss) -> None:
    """PgBoss.start() with pg-boss's defaults (its scheduler on): it creates its own queue."""
    script = (
        "const path = require('node:path');"
        f"const m = require(path.join({str(NODE)!r}, 'pgboss{boss.major}', 'node_modules', 'pg-boss'));"
        "const PgBoss = m.PgBoss || m;"
        f"const b = new PgBoss({{ connectionString: {boss.url!r}, schema: 'pgboss' }});"
        "b.on('error', (e) => console.error(e));"
        "b.start().then(async () => {"
        "  const q = b.getQueues ? await b.getQueues() : [];"
        "  console.log(JSON.stringify(q.map((x) => x.name)));"
        "  await b.stop({ graceful: false, wait: true }); })"
    )
    done = subprocess.run(
        [boss.node, "-e", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_pgboss_own_queues_are_left_out_unless_asked_for(
    pgboss: PgBoss, postgres_dsn: str, run_exporter: Any
) -> None:
    """pg-boss's scheduler queue (__pgboss__send-it, made by PgBoss.start() with its defaults)
    is not served as an application's queue; own_queues=true serves it like the others."""
    pgboss.seed()
    _start_with_scheduler(pgboss)
    with psycopg.connect(postgres_dsn) as connection:
        own = [
            row[0]
            for row in connection.execute(
                "SELECT name FROM pgboss.queue WHERE starts_with(name, '__pgboss__')"
            )
        ]
    assert own == ["__pgboss__send-it"], own  # pg-boss made it, not the test
    exporter = run_exporter(postgres_dsn=postgres_dsn, preset=["pgboss"])

    def queues(app: Any) -> set[str]:
        return {queue for queue, _ in _served(scrape_series(app), "queue_depth")}

    wait_for(lambda: set(QUEUES) <= queues(exporter))
    assert queues(exporter) == set(QUEUES)
    exporter.shutdown()
    with_own = run_exporter(
        postgres_dsn=postgres_dsn, preset=[{"name": "pgboss", "params": {"own_queues": True}}]
    )
    wait_for(lambda: queues(with_own) == {*QUEUES, "__pgboss__send-it"})


def test_an_age_served_between_reads_grows_with_the_clock(
    postgres_dsn: str, run_exporter: Any, tmp_path: Path
) -> None:
    """A collector read every 60 s with `age: true` on its age value, sampled every 0.3 s: the
    age it serves grows between its reads as the time since the row's recorded time, and its
    count stays the one read. Its interval and the reason given for it are on the status page
    and in check-config's answer."""
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE held (since timestamptz NOT NULL)")
        connection.execute("INSERT INTO held VALUES (now() - interval '100 seconds')")
        since = connection.execute("SELECT extract(epoch FROM since) FROM held").fetchone()
    assert since is not None
    recorded = float(since[0])
    collector = {
        "name": "held",
        "interval": 60,
        "interval_reason": "a full scan of held",
        "query": "SELECT count(*) AS jobs, "
        "extract(epoch FROM now() - min(since))::float8 AS age FROM held",
        "static_labels": {"system": "custom", "queue": "held", "state": "active"},
        "values": [
            {"column": "jobs", "metric": "queue_depth"},
            {"column": "age", "metric": "queue_oldest_age_seconds", "age": True},
        ],
    }
    config = {
        "sample_interval": 0.3,
        "sources": {"postgres": {"dsn": postgres_dsn, "collectors": [collector]}},
    }
    exporter = run_exporter(config)

    def age() -> float | None:
        return _metric(scrape_series(exporter), "queue_oldest_age_seconds")

    first = wait_for(age)
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute("INSERT INTO held VALUES (now())")  # not read until the next read
    seen = [first]
    for _ in range(4):
        time.sleep(0.4)
        before = time.time()
        current = age()
        after = time.time()
        assert current is not None
        assert before - recorded - 5 <= current <= after - recorded + 0.001
        seen.append(current)
    assert seen == sorted(seen) and seen[-1] - seen[0] >= 1.0, seen
    assert _metric(scrape_series(exporter), "queue_depth") == 1  # as read, 60 s apart
    said = "reads every 60s (its ages move on between reads): a full scan of held"
    status = json.loads(scrape(exporter.server.port, "/status.json"))
    row = next(s for s in status["sources"] if s["name"] == "postgres:held")
    assert row["reads"] == said, row
    cells = next(t for t in status["view"]["tables"] if t["id"] == "sources")["rows"]
    assert ["postgres:held", f"up; {said}"] in [r[:2] for r in cells], cells
    path = tmp_path / "config.json"  # JSON is YAML
    path.write_text(json.dumps(config))
    checked = subprocess.run(
        [sys.executable, "-m", "exporter", "check-config", str(path), "--connect"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "postgres:held: 1 row(s); series: queue_depth 1, " in checked.stdout
    assert f"; {said}" in checked.stdout, checked.stdout
    assert f"SQL collector held ({said})" in checked.stdout  # also without --connect
    offline = subprocess.run(
        [sys.executable, "-m", "exporter", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert f"SQL collector held ({said})" in offline.stdout, offline.stdout


def _metric(series: Series, name: str) -> float | None:
    return next((number for (metric, label_set), number in series.items() if metric == name), None)


@pytest.fixture
def procrastinate_app(postgres_dsn: str) -> Iterator[procrastinate.App]:
    from tests.procrastinate_app.tasks import app

    connector = procrastinate.PsycopgConnector(conninfo=postgres_dsn)
    with app.replace_connector(connector) as bound, bound.open():
        bound.schema_manager.apply_schema()
        yield bound


def _procrastinate_worker(dsn: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PROCRASTINATE_DSN": dsn}
    return subprocess.Popen(
        [sys.executable, "-m", "procrastinate", "--app", "tests.procrastinate_app.tasks.app",
         "worker", "--queues", "emails,slow", "--concurrency", "3"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _by_labels(series: Series, name: str, label: str) -> dict[str, float]:
    return {
        dict(label_set).get(label, ""): number
        for (metric, label_set), number in series.items()
        if metric == name and dict(label_set).get("system") == "procrastinate"
    }


def test_procrastinate_enqueues_workers_and_failed_jobs(
    procrastinate_app: procrastinate.App, postgres_dsn: str, run_exporter: Any, tmp_path: Path
) -> None:
    """Procrastinate's defaults and the preset's (failed_interval shortened to 1 s): every
    defer() after the exporter started is counted once in queue_jobs_enqueued_total, per queue
    and task, as Procrastinate lists its jobs; the live worker is served busy while it runs the
    held job, then idle, then gone once it stopped (its row deleted); failed jobs are served
    as queue_depth{state="failed"} per queue as Procrastinate lists them."""
    app = procrastinate_app
    release = tmp_path / "release"
    app.tasks["send_email"].configure(queue="emails").defer(to="before@example.com")
    exporter = run_exporter(
        postgres_dsn=postgres_dsn,
        preset=[{"name": "procrastinate", "params": {"failed_interval": 1}}],
    )
    # the enqueue counter starts from what is there: wait for its first read's baseline
    wait_for(
        lambda: (
            value(
                scrape_series(exporter), "queue_exporter_source_up", source="native:procrastinate"
            )
            == 1
        )
    )
    before = {job.id for job in app.job_manager.list_jobs()}
    for n in range(3):
        app.tasks["send_email"].configure(queue="emails").defer(to=f"user{n}@example.com")
    for _ in range(2):
        app.tasks["explode"].configure(queue="emails").defer()
    app.tasks["hold"].configure(queue="slow").defer(release=str(release))
    worker = _procrastinate_worker(postgres_dsn)
    try:

        def truth() -> tuple[Counter[tuple[str, str]], Counter[str]]:
            jobs = app.job_manager.list_jobs()
            enqueued = Counter((job.queue, job.task_name) for job in jobs if job.id not in before)
            failed = Counter(job.queue for job in jobs if job.status == "failed")
            return enqueued, failed

        def mismatches(series: Series, scraped_at: float) -> list[str]:
            enqueued, failed = truth()
            served_enqueued = {
                (labels["queue"], labels["job_type"]): number
                for (metric, label_set), number in series.items()
                if metric == "queue_jobs_enqueued_total"
                and (labels := dict(label_set))["system"] == "procrastinate"
            }
            found = []
            if served_enqueued != {key: float(n) for key, n in enqueued.items()}:
                found.append(f"enqueued: served {served_enqueued}, Procrastinate {enqueued}")
            served_failed = {
                queue: number
                for (queue, state), number in _procrastinate_depths(series).items()
                if state == "failed"
            }
            expected = {"emails": float(failed["emails"]), "slow": float(failed["slow"])}
            if served_failed != expected:
                found.append(f"failed: served {served_failed}, Procrastinate {expected}")
            if failed["emails"] != 2:
                found.append(f"Procrastinate lists {failed['emails']} failed emails so far")
            workers = _by_labels(series, "queue_workers", "state")
            if workers != {"busy": 1.0, "idle": 0.0}:
                found.append(f"workers {workers} while the worker holds a job")
            return found

        wait_until_served_as_truth(exporter, mismatches, timeout=60)
        status = json.loads(scrape(exporter.server.port, "/status.json"))
        row = next(s for s in status["sources"] if s["name"] == "postgres:procrastinate_failed")
        assert row["reads"] == (
            "reads every 1s: Procrastinate has no index on failed jobs: counting them reads "
            "every row of procrastinate_jobs"
        ), row
        release.touch()

        def idle() -> bool:
            return _by_labels(scrape_series(exporter), "queue_workers", "state") == {
                "busy": 0.0,
                "idle": 1.0,
            }

        wait_for(idle, timeout=60)
    finally:
        release.touch()
        stop_process(worker, 15)
    assert worker.returncode == 0  # a clean stop: Procrastinate deletes its worker row
    wait_for(
        lambda: (
            _by_labels(scrape_series(exporter), "queue_workers", "state")
            == {"busy": 0.0, "idle": 0.0}
        ),
        timeout=30,
    )


def _procrastinate_depths(series: Series) -> dict[tuple[str, str], float]:
    return {
        (labels["queue"], labels["state"]): number
        for (metric, label_set), number in series.items()
        if metric == "queue_depth" and (labels := dict(label_set))["system"] == "procrastinate"
    }


def test_pgboss_throughput_and_failures_are_counted_by_default(
    pgboss: PgBoss, postgres_dsn: str, run_exporter: Any
) -> None:
    """The preset with no params: on pg-boss 12 the jobs its worker completes and fails are
    counted once each, as getJobById says they ended; on pg-boss 10, which has no index on
    completed_on, the reader counts nothing, stays up, and says why on the status page."""
    pgboss.seed()
    exporter = run_exporter(postgres_dsn=postgres_dsn, preset=["pgboss"])
    source = "native:pgboss"
    wait_for(lambda: value(scrape_series(exporter), "queue_exporter_source_up", source=source) == 1)
    worker = pgboss.worker()
    try:
        truth = _settled(pgboss)
        ended = Counter(
            (job["queue"], job["state"])
            for job in truth["jobs"]
            if job["state"] in ("completed", "failed")
        )
        assert ended == {("emails", "completed"): 4, ("emails", "failed"): 2}, ended

        def counted() -> dict[tuple[str, str], float]:
            series = scrape_series(exporter)
            found: dict[tuple[str, str], float] = {}
            for metric, outcome in (
                ("queue_jobs_completed_total", "completed"),
                ("queue_jobs_failed_total", "failed"),
            ):
                for (name, label_set), number in series.items():
                    labels = dict(label_set)
                    if name == metric and labels.get("system") == "pgboss":
                        key = (labels["queue"], outcome)
                        found[key] = found.get(key, 0.0) + number
            return found

        if pgboss.major >= 12:
            wait_for(lambda: counted() == {key: float(n) for key, n in ended.items()}, timeout=30)
            return
        status = json.loads(scrape(exporter.server.port, "/status.json"))
        row = next(s for s in status["sources"] if s["name"] == source)
        assert row["up"] is True, row
        assert "pg-boss schema version 24 has no index on completed_on" in row["silent"], row
        assert counted() == {}
    finally:
        pgboss.release.touch()
        stop_process(worker, 15)


def test_a_failed_costly_read_is_tried_again_on_its_interval_not_every_cycle(
    postgres_dsn: str,
) -> None:
    """A collector read every 2 s with an age among its values is sampled every 0.2 s. Its
    first read fails (the table is missing); the table then appears, yet the samples within
    the read interval still fail with the same error, for no query is run again before the
    interval; the first sample after it reads the table."""
    config = PostgresSourceConfig.model_validate(
        {
            "dsn": postgres_dsn,
            "collectors": [
                {
                    "name": "late",
                    "interval": 2,
                    "query": "SELECT count(*) AS jobs, 1.0::float8 AS age FROM late",
                    "static_labels": {"system": "custom", "queue": "late", "state": "active"},
                    "values": [
                        {"column": "jobs", "metric": "queue_depth"},
                        {"column": "age", "metric": "queue_oldest_age_seconds", "age": True},
                    ],
                }
            ],
        }
    )
    (source,) = postgres.build_sources(config, 0.2)
    try:
        assert source.interval == 0.2 and source.read_interval == 2
        failed_at = time.monotonic()
        with pytest.raises(psycopg.errors.UndefinedTable):
            source.sample()
        with psycopg.connect(postgres_dsn, autocommit=True) as connection:
            connection.execute("CREATE TABLE late (n int)")
        while time.monotonic() - failed_at < 1.5:  # before the read interval's last half cycle
            with pytest.raises(psycopg.errors.UndefinedTable):
                source.sample()
            time.sleep(0.2)
        time.sleep(max(0.0, failed_at + 2 - time.monotonic()))
        assert len(source.sample().samples) == 2  # read: a depth and an age
    finally:
        source.close()
