"""The attune preset against Attune's real tables, driven as Attune drives them, read over HTTP."""

from __future__ import annotations

import json
import signal
from datetime import timedelta

import pytest

from tests.attune_db import Attune
from tests.conftest import scrape, scrape_series, value, wait_for

SOURCES = ("postgres:attune_queue_stats", "postgres:attune_executions")


@pytest.fixture
def attune(postgres_dsn):
    database = Attune(postgres_dsn).create_schema()
    yield database
    database.close()


def _series_when(app, check, timeout=60.0):
    """Scrape until check(series) holds (sampling runs on its own interval): that scrape."""

    def attempt():
        series = scrape_series(app)
        return series if check(series) else None

    return wait_for(attempt, timeout=timeout)


def _attune(series, name, **labels):
    return value(series, name, system="attune", **labels)


def _errors(series, source, reason):
    return value(series, "queue_exporter_source_errors_total", source=source, reason=reason) or 0


def test_exact_values_per_action(attune, postgres_dsn, run_exporter):
    slack = attune.add_action("slack.post_message")
    echo = attune.add_action("core.echo")
    mail = attune.add_action("email.send")
    now = attune.now()
    attune.upsert_stats(
        slack,
        queue_length=5,
        active_count=2,
        max_concurrent=3,
        oldest_enqueued_at=now - timedelta(seconds=600),
        total_enqueued=150,
        total_completed=145,
    )
    attune.upsert_stats(
        echo, active_count=1, max_concurrent=4, total_enqueued=10, total_completed=9
    )
    attune.upsert_stats(mail, queue_length=1, oldest_enqueued_at=now - timedelta(seconds=30))
    attune.set_last_updated(mail, now - timedelta(seconds=900))  # its executor went quiet
    attune.add_executions(slack, "slack.post_message", "requested", 5)
    attune.add_executions(slack, "slack.post_message", "running", 2)
    attune.add_executions(slack, "slack.post_message", "completed", 100)
    attune.add_executions(echo, "core.echo", "scheduled")
    attune.add_executions(echo, "core.echo", "canceling")
    attune.add_executions(echo, "core.echo", "failed", 20)

    app = run_exporter(postgres_dsn=postgres_dsn, preset=["attune"])
    series = _series_when(
        app,
        lambda s: (
            _attune(s, "queue_depth", queue="core.echo", state="active") is not None
            and _attune(s, "queue_executions", queue="core.echo", status="canceling") is not None
        ),
    )

    assert _attune(series, "queue_depth", queue="slack.post_message", state="pending") == 5
    assert _attune(series, "queue_depth", queue="slack.post_message", state="active") == 2
    assert _attune(series, "queue_depth", queue="core.echo", state="pending") == 0
    assert _attune(series, "queue_depth", queue="core.echo", state="active") == 1
    assert _attune(series, "queue_concurrency_limit", queue="slack.post_message") == 3
    assert _attune(series, "queue_concurrency_limit", queue="core.echo") == 4
    assert _attune(series, "queue_concurrency_limit", queue="email.send") == 1  # the default
    age = _attune(series, "queue_oldest_age_seconds", queue="slack.post_message", state="pending")
    assert age is not None and 600 <= age < 660
    assert _attune(series, "queue_oldest_age_seconds", queue="core.echo") is None  # NULL: absent
    assert _attune(series, "queue_jobs_enqueued_total", queue="slack.post_message") == 150
    assert _attune(series, "queue_jobs_completed_total", queue="slack.post_message") == 145
    assert _attune(series, "queue_jobs_completed_total", queue="core.echo") == 9
    stale = _attune(series, "queue_stats_age_seconds", queue="email.send")
    assert stale is not None and 900 <= stale < 960
    fresh = _attune(series, "queue_stats_age_seconds", queue="slack.post_message")
    assert fresh is not None and 0 <= fresh < 60

    executions = {
        (dict(labels)["queue"], dict(labels)["status"]): v
        for (name, labels), v in series.items()
        if name == "queue_executions"
    }
    assert executions == {
        ("slack.post_message", "requested"): 5,
        ("slack.post_message", "running"): 2,
        ("core.echo", "scheduled"): 1,
        ("core.echo", "canceling"): 1,
    }  # finished executions are not counted

    for source in SOURCES:
        assert value(series, "queue_exporter_source_up", source=source) == 1
    # An empty queue's NULL oldest_enqueued_at is expected, not an error.
    assert _errors(series, "postgres:attune_queue_stats", "null_value") == 0
    assert json.loads(scrape(app.server.port, "/readyz"))["ready"] is True

    text = scrape(app.server.port)
    assert "# TYPE queue_jobs_enqueued_total counter" in text
    assert (
        'queue_depth{system="attune",queue="slack.post_message",priority="",state="pending"} 5\n'
        in text
    )


def test_rows_updated_and_deleted_as_attune_does(postgres_dsn, run_exporter):
    attune = Attune(postgres_dsn, schema="ops").create_schema()  # a non-default schema
    try:
        _drive_changes(attune, postgres_dsn, run_exporter)
    finally:
        attune.close()


def _drive_changes(attune, postgres_dsn, run_exporter):
    build = attune.add_action("ci.build")
    deploy = attune.add_action("ci.deploy")
    attune.upsert_stats(
        build,
        queue_length=1,
        active_count=1,
        max_concurrent=1,
        total_enqueued=2,
        total_completed=0,
        oldest_enqueued_at=attune.now(),
    )
    attune.upsert_stats(deploy, active_count=1, total_enqueued=1)
    attune.add_executions(build, "ci.build", "running", 1)
    attune.add_executions(build, "ci.build", "requested", 1)
    attune.add_executions(deploy, "ci.deploy", "running", 1)

    preset = {"name": "attune", "params": {"schema": "ops"}}
    app = run_exporter({"presets": [preset]}, postgres_dsn=postgres_dsn)
    _series_when(app, lambda s: _attune(s, "queue_depth", queue="ci.deploy", state="active") == 1)

    # The running build completes, the queued one starts: the oldest wait goes NULL.
    attune.upsert_stats(
        build,
        queue_length=0,
        active_count=1,
        max_concurrent=1,
        total_enqueued=2,
        total_completed=1,
        oldest_enqueued_at=None,
    )
    attune.set_status(build, "running", "completed", 1)
    attune.set_status(build, "requested", "running", 1)
    series = _series_when(
        app, lambda s: _attune(s, "queue_jobs_completed_total", queue="ci.build") == 1
    )
    assert _attune(series, "queue_depth", queue="ci.build", state="pending") == 0
    assert _attune(series, "queue_oldest_age_seconds", queue="ci.build") is None
    assert _attune(series, "queue_jobs_enqueued_total", queue="ci.build") == 2
    series = _series_when(
        app, lambda s: _attune(s, "queue_executions", queue="ci.build", status="requested") is None
    )
    assert _attune(series, "queue_executions", queue="ci.build", status="running") == 1

    # Three more arrive while one runs: totals grow, the oldest wait is set again.
    attune.upsert_stats(
        build,
        queue_length=3,
        active_count=1,
        max_concurrent=1,
        total_enqueued=5,
        total_completed=1,
        oldest_enqueued_at=attune.now() - timedelta(seconds=45),
    )
    series = _series_when(
        app, lambda s: _attune(s, "queue_jobs_enqueued_total", queue="ci.build") == 5
    )
    assert _attune(series, "queue_depth", queue="ci.build", state="pending") == 3
    age = _attune(series, "queue_oldest_age_seconds", queue="ci.build", state="pending")
    assert age is not None and 45 <= age < 105

    # The deploy queue drains (row deleted), then the build action is deleted (cascade).
    attune.delete_stats(deploy)
    attune.set_status(deploy, "running", "completed", 1)
    # Two collectors on their own intervals: wait until each has sampled since the change.
    series = _series_when(
        app,
        lambda s: (
            _attune(s, "queue_depth", queue="ci.deploy", state="active") is None
            and _attune(s, "queue_executions", queue="ci.deploy", status="running") is None
        ),
    )
    assert not [key for key in series if ("queue", "ci.deploy") in key[1]]
    attune.delete_action(build)
    # Both collectors again: wait until each has sampled since the delete (its queue_stats row
    # and its executions both gone); a series left behind fails the wait.
    series = _series_when(app, lambda s: not [key for key in s if ("system", "attune") in key[1]])
    for source in SOURCES:
        assert value(series, "queue_exporter_source_up", source=source) == 1


def test_serve_command_with_dsn_flag_and_preset(attune, postgres_dsn, serve_process):
    action = attune.add_action("slack.post_message")
    attune.upsert_stats(action, queue_length=7, active_count=3, max_concurrent=3)
    exporter = serve_process(
        "--postgres-dsn", postgres_dsn, "--preset", "attune", "--sample-interval", "1"
    )
    series = exporter.series_when(lambda s: _attune(s, "queue_depth", state="pending"))
    assert _attune(series, "queue_depth", queue="slack.post_message", state="pending") == 7
    assert _attune(series, "queue_depth", queue="slack.post_message", state="active") == 3
    assert _attune(series, "queue_concurrency_limit", queue="slack.post_message") == 3
    exporter.process.send_signal(signal.SIGTERM)
    assert exporter.process.wait(timeout=15) == 0
