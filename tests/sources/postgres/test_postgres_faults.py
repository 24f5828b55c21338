"""Faults of the PostgreSQL source: outage, statement timeout, permission denied, missing table.

In every case only the failing collector's series go, its source_up is 0 and its error is
counted by reason; the other sources keep serving, and it recovers on its own.
"""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.attune_db import Attune
from tests.conftest import POSTGRES_ADMIN_DSN, scrape, scrape_series, value, wait_for
from tests.tcp_proxy import TcpProxy

STATS = "postgres:attune_queue_stats"


def _when(app, check, timeout=20.0):
    def attempt():
        series = scrape_series(app)
        return series if check(series) else None

    return wait_for(attempt, timeout=timeout)


def _up(series, source):
    return value(series, "queue_exporter_source_up", source=source)


def _errors(series, source, reason):
    return value(series, "queue_exporter_source_errors_total", source=source, reason=reason) or 0


def _depth(series, queue="slack.post_message"):
    return value(series, "queue_depth", system="attune", queue=queue, state="pending")


@pytest.fixture
def attune(postgres_dsn):
    database = Attune(postgres_dsn).create_schema()
    action = database.add_action("slack.post_message")
    database.upsert_stats(action, queue_length=4, active_count=1, max_concurrent=2)
    yield database
    database.close()


@pytest.fixture
def proxy():
    target = conninfo_to_dict(POSTGRES_ADMIN_DSN)
    tcp_proxy = TcpProxy(str(target.get("host", "127.0.0.1")), int(target.get("port", 5432)))
    yield tcp_proxy
    tcp_proxy.cut()


def test_unreachable_at_start_then_outage_and_recovery(
    attune, postgres_dsn, proxy, redis_client, redis_url, run_exporter
):
    redis_client.rpush("orchestrata:queue:billing:p1", '{"queued_at": "2026-01-01T00:00:00Z"}')
    via_proxy = make_conninfo(postgres_dsn, host="127.0.0.1", port=proxy.port)
    config = {"sources": {"postgres": {"connect_timeout": 1}}}
    # The database is unreachable when the exporter starts: it starts all the same.
    app = run_exporter(
        config, postgres_dsn=via_proxy, redis_url=redis_url, preset=["attune", "orchestrata"]
    )
    series = _when(app, lambda s: _errors(s, STATS, "connection") >= 1 and _up(s, "redis") == 1)
    assert _up(series, STATS) == 0
    assert _depth(series) is None
    assert value(series, "queue_depth", system="orchestrata", queue="billing") == 1
    assert scrape(app.server.port, "/healthz")  # alive
    with pytest.raises(Exception, match="503"):
        scrape(app.server.port, "/readyz")  # not ready before every source succeeded once

    executions = "postgres:attune_executions"  # on an interval of its own: wait for it too
    proxy.start()
    series = _when(app, lambda s: _up(s, STATS) == 1 and _depth(s) == 4 and _up(s, executions))
    assert json.loads(scrape(app.server.port, "/readyz"))["ready"] is True

    proxy.cut()  # open connections break, new ones are refused
    series = _when(app, lambda s: _up(s, STATS) == 0)
    assert _depth(series) is None  # dropped, not served stale
    assert value(series, "queue_executions") is None
    assert value(series, "queue_depth", system="orchestrata", queue="billing") == 1
    assert _up(series, "redis") == 1

    attune.upsert_stats(1, queue_length=9, active_count=1, max_concurrent=2)
    proxy.start()
    series = _when(app, lambda s: _up(s, STATS) == 1 and _depth(s) == 9 and _up(s, executions))
    assert _up(series, executions) == 1


def test_statement_timeout_fails_only_that_collector(postgres_dsn, run_exporter):
    collectors = [
        {
            "name": "slow",
            "query": "SELECT 1 AS v FROM pg_sleep(3)",
            "timeout": 0.2,
            "values": [{"column": "v", "metric": "slow_value"}],
        },
        {
            "name": "quick",
            "query": "SELECT 2 AS v",
            "values": [{"column": "v", "metric": "quick_value"}],
        },
    ]
    config = {"sources": {"postgres": {"dsn": postgres_dsn, "collectors": collectors}}}
    app = run_exporter(config)
    series = _when(
        app, lambda s: _errors(s, "postgres:slow", "timeout") >= 1 and _up(s, "postgres:quick")
    )
    assert _up(series, "postgres:slow") == 0
    assert value(series, "slow_value") is None
    assert value(series, "quick_value") == 2


@pytest.fixture
def reader_role(postgres_dsn):
    """A login role without SELECT on Attune's tables; dropped afterwards."""
    role = f"qe_test_reader_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
    yield role
    with psycopg.connect(postgres_dsn, autocommit=True) as database:
        database.execute(f'DROP OWNED BY "{role}"')  # its grants in the test database
    with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP ROLE "{role}"')


def test_permission_denied_then_granted(attune, postgres_dsn, reader_role, run_exporter):
    attune.connection.execute(f'GRANT USAGE ON SCHEMA attune TO "{reader_role}"')
    config = {"sources": {"postgres": {"dsn": postgres_dsn, "user": reader_role}}}
    app = run_exporter(config, preset=["attune"])
    series = _when(app, lambda s: _errors(s, STATS, "permission") >= 1)
    assert _up(series, STATS) == 0
    assert _depth(series) is None

    attune.connection.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA attune TO "{reader_role}"')
    executions = "postgres:attune_executions"  # on an interval of its own: wait for it too
    series = _when(app, lambda s: _up(s, STATS) == 1 and _depth(s) == 4 and _up(s, executions) == 1)
    assert _up(series, executions) == 1
    with psycopg.connect(postgres_dsn) as database:  # the reader never holds a transaction
        states = database.execute(
            "SELECT state FROM pg_stat_activity WHERE usename = %s", (reader_role,)
        ).fetchall()
    assert states and all(state != "idle in transaction" for (state,) in states)


def test_missing_tables_then_created(postgres_dsn, run_exporter):
    app = run_exporter(postgres_dsn=postgres_dsn, preset=["attune"])
    series = _when(app, lambda s: _errors(s, STATS, "missing_table") >= 1)
    assert _up(series, STATS) == 0
    assert _errors(series, "postgres:attune_executions", "missing_table") >= 1

    attune = Attune(postgres_dsn).create_schema()
    try:
        action = attune.add_action("slack.post_message")
        attune.upsert_stats(action, queue_length=4)
        series = _when(app, lambda s: _up(s, STATS) == 1 and _depth(s) == 4)
    finally:
        attune.close()
