"""Custom SQL collectors from the config file: labels, several values, NULLs, bad config."""

from __future__ import annotations

import logging

import psycopg
import pytest

from exporter.config import settings as config_module
from exporter.config.effective import effective_yaml
from exporter.core.logs import mask_connection_string as mask_dsn
from exporter.sources.postgres.collectors import QueryShapeError, RowConverter, SqlCollector
from exporter.sources.postgres.config import PostgresSourceConfig
from tests.conftest import scrape, scrape_series, value, wait_for

JOBS_DDL = """
CREATE TABLE jobs (id bigserial PRIMARY KEY, queue text NOT NULL, tenant text,
                   state text NOT NULL, attempts int NOT NULL DEFAULT 0,
                   enqueued_at timestamptz NOT NULL DEFAULT now(), finished bigint);
"""
JOBS_COLLECTOR = {
    "name": "jobs",
    "query": """
        SELECT queue, state, count(*) AS jobs, max(attempts) AS max_attempts,
               sum(finished) AS finished
        FROM jobs GROUP BY queue, state""",
    "labels": ["queue", "state"],
    "static_labels": {"system": "billing", "team": "payments"},
    "values": [
        {"column": "jobs", "metric": "billing_jobs", "help": "Jobs by queue and state."},
        {"column": "max_attempts", "metric": "billing_job_max_attempts"},
        {"column": "finished", "metric": "billing_jobs_finished_total", "type": "counter"},
    ],
}


@pytest.fixture
def jobs_db(postgres_dsn):
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute(JOBS_DDL)
        yield connection


def _when(app, check, timeout=15.0):
    def attempt():
        series = scrape_series(app)
        return series if check(series) else None

    return wait_for(attempt, timeout=timeout)


def _postgres(dsn, *collectors, **settings):
    return {"sources": {"postgres": {"dsn": dsn, "collectors": list(collectors), **settings}}}


def test_labels_values_types_and_nulls(jobs_db, postgres_dsn, run_exporter):
    jobs_db.execute(
        """INSERT INTO jobs (queue, state, attempts, finished) VALUES
           ('invoices', 'pending', 0, NULL), ('invoices', 'pending', 2, NULL),
           ('invoices', 'done', 1, 7), ('refunds', 'pending', 5, NULL)"""
    )
    app = run_exporter(_postgres(postgres_dsn, JOBS_COLLECTOR))
    series = _when(app, lambda s: value(s, "billing_jobs", queue="refunds") == 1)

    def jobs(**labels):
        return value(series, "billing_jobs", system="billing", team="payments", **labels)

    assert jobs(queue="invoices", state="pending") == 2
    assert jobs(queue="invoices", state="done") == 1
    assert value(series, "billing_job_max_attempts", queue="invoices", state="pending") == 2
    assert value(series, "billing_job_max_attempts", queue="refunds", state="pending") == 5
    assert value(series, "billing_jobs_finished_total", queue="invoices", state="done") == 7
    # sum(finished) is NULL for the two pending groups: skipped, never 0, and counted.
    assert value(series, "billing_jobs_finished_total", state="pending") is None
    nulls = value(
        series, "queue_exporter_source_errors_total", source="postgres:jobs", reason="null_value"
    )
    assert nulls is not None and nulls >= 2
    text = scrape(app.server.port)
    assert "# HELP billing_jobs Jobs by queue and state." in text
    assert "# TYPE billing_jobs gauge" in text
    assert "# TYPE billing_jobs_finished_total counter" in text
    assert "# HELP billing_job_max_attempts billing_job_max_attempts, from SQL collector jobs." in (
        text
    )

    jobs_db.execute("DELETE FROM jobs WHERE queue = 'refunds'")  # a row gone: its series gone
    series = _when(app, lambda s: value(s, "billing_jobs", queue="refunds") is None)
    assert value(series, "billing_jobs", queue="invoices", state="pending") == 2


def test_builtin_metrics_and_per_collector_intervals(jobs_db, postgres_dsn, run_exporter):
    jobs_db.execute("INSERT INTO jobs (queue, state) VALUES ('a', 'pending'), ('a', 'pending')")
    depth = {
        "name": "depth",
        "query": "SELECT queue, count(*) AS pending, 100 AS cap FROM jobs GROUP BY queue",
        "labels": ["queue"],
        "static_labels": {"system": "homegrown"},
        "values": [
            {"column": "pending", "metric": "queue_depth", "labels": {"state": "pending"}},
            {"column": "cap", "metric": "queue_max_depth"},
        ],
    }
    hourly = {
        "name": "hourly",
        "query": "SELECT count(*) AS n FROM jobs",
        "interval": 3600,
        "values": [{"column": "n", "metric": "homegrown_jobs_seen"}],
    }
    app = run_exporter(_postgres(postgres_dsn, depth, hourly, application_name="qe-test-app"))
    series = _when(app, lambda s: value(s, "homegrown_jobs_seen") == 2)
    assert value(series, "queue_depth", system="homegrown", queue="a", state="pending") == 2
    assert value(series, "queue_max_depth", system="homegrown", queue="a") == 100

    jobs_db.execute("INSERT INTO jobs (queue, state) VALUES ('a', 'pending')")
    series = _when(app, lambda s: value(s, "queue_depth", queue="a") == 3)
    assert value(series, "homegrown_jobs_seen") == 2  # its hour has not come yet

    sessions = jobs_db.execute(
        "SELECT state FROM pg_stat_activity WHERE application_name = 'qe-test-app'"
    ).fetchall()
    assert sessions, "application_name shows the exporter to DBAs"
    assert all(state != "idle in transaction" for (state,) in sessions)


def test_rows_sharing_labels_combine_and_sources_add_up(jobs_db, postgres_dsn, run_exporter):
    jobs_db.execute(
        """INSERT INTO jobs (queue, tenant, state, attempts) VALUES
           ('a', 't1', 'pending', 3), ('a', 't2', 'pending', 5), ('a', 't2', 'pending', 1),
           ('b', 't1', 'pending', 2)"""
    )
    per_tenant = {  # one row per (queue, tenant), but only queue is a label: rows meet
        "name": "per_tenant",
        "query": """SELECT queue, count(*) AS pending, max(attempts)::float8 AS oldest
                    FROM jobs GROUP BY queue, tenant""",
        "labels": ["queue"],
        "static_labels": {"system": "homegrown"},
        "values": [
            {"column": "pending", "metric": "queue_depth", "labels": {"state": "pending"}},
            {"column": "oldest", "metric": "queue_oldest_age_seconds"},
        ],
    }
    elsewhere = {  # a second source with a series of the same label set
        "name": "elsewhere",
        "query": "SELECT 'a'::text AS queue, 10 AS pending",
        "labels": ["queue"],
        "static_labels": {"system": "homegrown"},
        "values": [{"column": "pending", "metric": "queue_depth", "labels": {"state": "pending"}}],
    }
    app = run_exporter(_postgres(postgres_dsn, per_tenant, elsewhere))
    series = _when(app, lambda s: value(s, "queue_depth", queue="a", state="pending") == 13)
    assert value(series, "queue_depth", queue="b", state="pending") == 1
    # queue_depth adds up (1 + 2 rows, + 10 from the other collector); oldest age takes the max.
    assert value(series, "queue_oldest_age_seconds", queue="a") == 5
    assert value(series, "queue_oldest_age_seconds", queue="b") == 2


def test_sql_series_are_capped_and_cut(jobs_db, postgres_dsn, run_exporter):
    jobs_db.execute(
        "INSERT INTO jobs (queue, state) SELECT 'queue-' || i || repeat('x', 200), 'pending' "
        "FROM generate_series(1, 10) i"
    )
    depth = {
        "name": "depth",
        "query": "SELECT queue, count(*) AS pending FROM jobs GROUP BY queue",
        "labels": ["queue"],
        "static_labels": {"system": "homegrown"},
        "values": [{"column": "pending", "metric": "queue_depth", "labels": {"state": "pending"}}],
    }
    app = run_exporter(
        {
            **_postgres(postgres_dsn, depth),
            "limits": {"max_series_per_metric": 5, "label_value_max_length": 32},
        }
    )
    series = _when(app, lambda s: value(s, "queue_depth", queue="__overflow__") is not None)
    depths = {dict(ls)["queue"]: v for (name, ls), v in series.items() if name == "queue_depth"}
    assert len(depths) == 5 and depths["__overflow__"] == 6  # 4 kept, 6 folded
    assert sum(depths.values()) == 10  # nothing lost
    assert all(len(queue) <= 32 for queue in depths)
    assert value(series, "queue_exporter_series_overflow_total", metric="queue_depth") >= 6


def test_writes_are_refused(jobs_db, postgres_dsn, run_exporter):
    writer = {
        "name": "writer",
        "query": "WITH gone AS (DELETE FROM jobs RETURNING id) SELECT count(*) AS n FROM gone",
        "values": [{"column": "n", "metric": "deleted_jobs"}],
    }
    jobs_db.execute("INSERT INTO jobs (queue, state) VALUES ('a', 'pending')")
    app = run_exporter(_postgres(postgres_dsn, writer))
    source, reason = "postgres:writer", "read_only"
    series = _when(
        app, lambda s: value(s, "queue_exporter_source_errors_total", source=source, reason=reason)
    )
    assert value(series, "queue_exporter_source_up", source=source) == 0
    assert jobs_db.execute("SELECT count(*) FROM jobs").fetchone() == (1,)


def test_query_shape_errors_are_clear(jobs_db, postgres_dsn, run_exporter, caplog):
    missing = {
        "name": "missing",
        "query": "SELECT queue, count(*) AS jobs FROM jobs GROUP BY queue",
        "labels": ["queue"],
        "values": [{"column": "job_count", "metric": "my_jobs"}],
    }
    text = {
        "name": "text",
        "query": "SELECT 'a' AS queue, 'many' AS jobs",
        "labels": ["queue"],
        "values": [{"column": "jobs", "metric": "my_text_jobs"}],
    }
    caplog.set_level(logging.WARNING, logger="exporter.sources.runner")
    app = run_exporter(_postgres(postgres_dsn, missing, text))

    def shape_errors(series):
        return all(
            value(series, "queue_exporter_source_errors_total", source=source, reason="query_shape")
            for source in ("postgres:missing", "postgres:text")
        )

    _when(app, shape_errors)
    logged = caplog.text
    assert (
        "collector missing: the query returns no column 'job_count' (it returns queue, jobs)"
        in (logged)
    )
    assert "collector text: value column 'jobs' is not numeric" in logged


def test_row_converter_checks_columns_before_rows():
    collector = SqlCollector.model_validate(JOBS_COLLECTOR)
    with pytest.raises(QueryShapeError, match="no column 'max_attempts'"):
        RowConverter(collector, [("queue", 25), ("state", 25), ("jobs", 20), ("finished", 1700)])
    with pytest.raises(QueryShapeError, match="'finished' is not numeric"):
        RowConverter(
            collector,
            [("queue", 25), ("state", 25), ("jobs", 20), ("max_attempts", 23), ("finished", 25)],
        )


def _config_error(collectors, **settings):
    raw = {"sources": {"postgres": {"collectors": collectors, **settings}}}
    with pytest.raises(config_module.ConfigError) as caught:
        config_module.from_dict(raw)
    return str(caught.value)


def _collector(*values, **fields):
    return {"name": "c", "query": "SELECT 1", "values": list(values), **fields}


@pytest.mark.parametrize(
    ("collectors", "expected"),
    [
        (
            [
                _collector({"column": "a", "metric": "x_jobs"}),
                {**_collector({"column": "b", "metric": "x_jobs"}), "name": "d"},
            ],
            "duplicate metric name 'x_jobs': defined by collectors 'c' and 'd'",
        ),
        (
            [_collector({"column": "a", "metric": "x"}, {"column": "b", "metric": "x"})],
            "duplicate metric name 'x' with the same labels",
        ),
        (
            [_collector({"column": "a", "metric": "queue_depth", "type": "counter"})],
            "name clash with the built-in metric 'queue_depth', a gauge",
        ),
        (
            [_collector({"column": "a", "metric": "queue_depth"}, labels=["tenant"])],
            "its labels are system, queue, priority, state; tenant is not one of them",
        ),
        (
            [_collector({"column": "a", "metric": "queue_exporter_source_up"})],
            "name clash with the built-in metric 'queue_exporter_source_up', which a collector",
        ),
        (
            [_collector({"column": "a", "metric": "queue_depth", "help": "mine"})],
            "whose help text is fixed",
        ),
        (
            [_collector({"column": "a", "metric": "x_done", "type": "counter"})],
            "a counter's name must end in _total",
        ),
        (
            [_collector({"column": "a", "metric": "x"}, labels=["a"])],
            "column 'a' is also a label column",
        ),
        (
            [_collector({"column": "a", "metric": "x", "type": "histogram"})],
            "sources.postgres.collectors[0].values[0].type",
        ),
        ([_collector()], "sources.postgres.collectors[0].values: List should have at least 1"),
        (
            [_collector({"column": "a", "metric": "bad-name"})],
            "'bad-name' is not a valid metric name",
        ),
        (
            [_collector({"column": "a", "metric": "x", "labels": {"__x": "1"}})],
            "not valid label names: '__x'",
        ),
        (
            [
                _collector({"column": "a", "metric": "x"}),
                _collector({"column": "a", "metric": "y"}),
            ],
            "two collectors are named 'c'",
        ),
    ],
)
def test_bad_collector_config_is_refused_at_start(collectors, expected):
    message = _config_error(collectors)
    assert expected in message
    assert "sources.postgres" in message


def test_connection_settings_validation_and_masking(tmp_path):
    assert "set dsn or dsn_file, not both" in _config_error(
        [], dsn="postgresql://localhost/x", dsn_file=str(tmp_path / "dsn")
    )
    assert "not a valid PostgreSQL connection string" in _config_error([], dsn="host=a =b")
    assert "hunter2" not in _config_error([], dsn="password=hunter2 host='x")

    assert mask_dsn("postgresql://me:hunter2@db:5432/app?sslmode=require") == (
        "postgresql://me:****@db:5432/app?sslmode=require"
    )
    assert mask_dsn("postgresql://db/app?password=hunter2&user=me") == (
        "postgresql://db/app?password=****&user=me"
    )
    assert mask_dsn("host=db password='hun ter2' user=me") == "host=db password=**** user=me"
    config = config_module.from_dict(
        {"sources": {"postgres": {"dsn": "postgresql://me:hunter2@db/app", "password": "x2"}}}
    )
    effective = effective_yaml(config)
    assert "hunter2" not in effective and "x2" not in effective
    assert "postgresql://me:****@db/app" in effective

    secret = tmp_path / "password"
    secret.write_text("from-file\n")
    settings = PostgresSourceConfig(
        host="db",
        sslmode="verify-full",
        sslrootcert=tmp_path / "ca.pem",
        sslcert=tmp_path / "c.pem",
        sslkey=tmp_path / "c.key",
        password_file=secret,
    )
    kwargs = settings.connect_kwargs()
    assert kwargs["password"] == "from-file"
    assert kwargs["application_name"] == "queue-exporter"
    assert kwargs["sslmode"] == "verify-full" and kwargs["sslkey"].endswith("c.key")
    secret.write_text("rotated\n")  # read at each connect
    assert settings.connect_kwargs()["password"] == "rotated"


def test_password_file_is_used(postgres_dsn, run_exporter, tmp_path):
    secret = tmp_path / "password"
    secret.write_text("whatever\n")  # trust auth accepts any; a missing file is a failure
    collector = _collector({"column": "v", "metric": "one"}, query="SELECT 1 AS v")
    missing = tmp_path / "absent"
    app = run_exporter(_postgres(postgres_dsn, collector, password_file=str(missing)))
    series = _when(
        app,
        lambda s: value(
            s, "queue_exporter_source_errors_total", source="postgres:c", reason="connection"
        ),
    )
    assert value(series, "one") is None
    app = run_exporter(_postgres(postgres_dsn, collector, password_file=str(secret)))
    _when(app, lambda s: value(s, "one") == 1)


def test_refuse_when_stops_a_collector_that_does_not_apply(postgres_dsn, run_exporter, caplog):
    """refuse_when runs before the first read and after a failed one: a `refusal` that is not
    NULL fails the run with its text (reason refused, every run while it stands), NULL lets
    the query run, a check without a `refusal` column is a query_shape error."""

    def collector(name, refuse_when, query="SELECT 1 AS n"):
        values = [{"column": "n", "metric": f"my_{name}"}]
        return {"name": name, "refuse_when": refuse_when, "query": query, "values": values}

    refused = collector("refused", "SELECT 'this database is not the one it reads' AS refusal")
    allowed = collector("allowed", "SELECT NULL::text AS refusal")
    shapeless = collector("shapeless", "SELECT 1 AS other")
    # fails (no table gate_rows) and so has its refuse_when asked again each run, which
    # refuses once a table `gate` exists
    gated = collector(
        "gated",
        "SELECT CASE WHEN to_regclass('gate') IS NOT NULL THEN 'gate is here' END AS refusal",
        "SELECT count(*) AS n FROM gate_rows",
    )
    caplog.set_level(logging.WARNING, logger="exporter.sources.runner")
    app = run_exporter(_postgres(postgres_dsn, refused, allowed, shapeless, gated))

    def errors(series, source, reason):
        found = value(series, "queue_exporter_source_errors_total", source=source, reason=reason)
        return found or 0

    series = _when(
        app,
        lambda s: (
            errors(s, "postgres:refused", "refused") >= 2
            and errors(s, "postgres:shapeless", "query_shape") >= 1
            and errors(s, "postgres:gated", "missing_table") >= 1
            and value(s, "my_allowed") == 1
        ),
    )
    assert value(series, "queue_exporter_source_up", source="postgres:allowed") == 1
    assert value(series, "queue_exporter_source_up", source="postgres:refused") == 0
    assert value(series, "my_refused") is None
    assert errors(series, "postgres:gated", "refused") == 0
    logged = caplog.text
    assert "CollectorRefused: this database is not the one it reads" in logged
    assert "collector shapeless: refuse_when returns no column 'refusal' (it returns other)" in (
        logged
    )
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE gate ()")
    _when(app, lambda s: errors(s, "postgres:gated", "refused") >= 1)
    assert "CollectorRefused: gate is here" in caplog.text
