"""The pgqueuer preset against PgQueuer's own schema (Queries.install, through
tests/pgqueuer_app/driver.py): what runs every cycle reads no kept failed job and no log row
except through an index, and check-config reads its tables and names what it does not record.

Depths, ages and counters as PgQueuer says them are checked by the conformance harness
(tests/conformance/adapters/pgqueuer.py) with a real worker; here: the plans.
"""

from __future__ import annotations

import json
import re

import psycopg

from exporter.config import presets
from exporter.config import settings as config_module
from tests.commands.test_check_config import run_cli
from tests.pgqueuer_app.control import driver

# A sequential scan of the queue table or of its log (not of pgqueuer_schedules: a row per
# schedule), as EXPLAIN names it, with or without an alias.
SEQ_SCAN = re.compile(r"Seq Scan on (pgqueuer|pgqueuer_log)(\s|$)")


def test_every_cycle_reads_pgqueuers_indexes_not_its_finished_rows(postgres_dsn: str) -> None:
    """200k log rows (the finished jobs' history) and 20k failed jobs kept, beside a backlog
    of 300k queued jobs (due, deferred, retrying) and a few picked ones, as a PgQueuer with on_failure="hold"
    keeps them: the hot path's query reaches its rows through PgQueuer's partial indexes, the
    log reader's baseline and read through the log's primary key (and each ended job's pick
    through its job_id index). The count of kept failed jobs, which no index holds apart, runs
    on its own longer interval, stated with why."""
    driver(postgres_dsn, "install")
    plan = [{"entrypoint": f"q{n % 4}", "execute_after": 3600 * (n % 3)} for n in range(20)]
    driver(postgres_dsn, "enqueue", json.dumps(plan))
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        # the history's shape only matters to the planner: written in bulk
        connection.execute(
            "INSERT INTO pgqueuer (priority, entrypoint, status, attempts, payload) "
            "SELECT 0, 'q' || (n % 4), 'failed', 1, 'x' FROM generate_series(1, 20000) AS n"
        )
        # a backlog, 10% of it waiting for later: at this size a GROUP BY of the waiting rows
        # over the whole table is planned as a sequential scan, kept failed jobs included
        connection.execute(
            "INSERT INTO pgqueuer (priority, entrypoint, status, attempts, execute_after) "
            "SELECT 0, 'q' || (n % 4), 'queued', n % 20 / 19, "
            "now() + CASE WHEN n % 10 = 0 THEN interval '1 hour' ELSE interval '0' END "
            "FROM generate_series(1, 300000) AS n"
        )
        connection.execute("UPDATE pgqueuer SET status = 'picked' WHERE id IN (1, 2)")
        connection.execute("UPDATE pgqueuer SET attempts = 1 WHERE id IN (4, 5)")
        connection.execute(
            "INSERT INTO pgqueuer_log (job_id, status, entrypoint, priority, created) "
            "SELECT 100000 + n / 4, (ARRAY['queued', 'picked', 'successful', 'exception'])"
            "[1 + n % 4]::pgqueuer_status, 'q' || (n % 4), 0, now() - interval '1 hour' "
            "FROM generate_series(0, 199999) AS n"
        )
        connection.execute("VACUUM ANALYZE")
        expanded = presets.expand("pgqueuer")["sources"]["postgres"]
        finished = expanded["finished"][0]
        row = connection.execute(finished["baseline"]).fetchone()
        assert row is not None and row[0] is not None
        read = finished["query"].replace("{after}", str(row[0] - 100))
        every_cycle = [finished["baseline"], read.replace("{limit}", "10000")]
        for collector in expanded["collectors"]:
            if collector["name"] == "pgqueuer_failed":
                assert collector["interval"] >= 10 and collector["interval_reason"], collector
            else:
                every_cycle.append(collector["query"])
        assert len(every_cycle) == 3  # pgqueuer_jobs, the log's baseline and read
        for query in every_cycle:
            explained = "\n".join(r[0] for r in connection.execute(f"EXPLAIN {query}").fetchall())
            assert not SEQ_SCAN.search(explained), explained


def test_check_config_reads_pgqueuers_tables_and_names_what_it_does_not_record(
    postgres_dsn: str,
) -> None:
    """`check-config --connect` on PgQueuer's own schema with jobs of three entrypoints (one
    due, one for later): each collector reads them (a row per entrypoint and state, one per
    entrypoint for the failed count), and what PgQueuer does not record is named."""
    driver(postgres_dsn, "install")
    plan = [
        {"entrypoint": "emails"},
        {"entrypoint": "reports", "execute_after": 3600},
        {"entrypoint": "idle"},
    ]
    driver(postgres_dsn, "enqueue", json.dumps(plan))
    result = run_cli("check-config", "--postgres-dsn", postgres_dsn, "--preset", "pgqueuer",
                     "--connect")  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "postgres:pgqueuer_jobs: 12 row(s)" in result.stdout, result.stdout
    assert "postgres:pgqueuer_failed: 3 row(s)" in result.stdout, result.stdout
    not_recorded = config_module.from_dict({"presets": ["pgqueuer"]}).not_recorded["pgqueuer"]
    assert set(not_recorded) == {"workers", "slots"}
    for signal, why in not_recorded.items():
        assert f"# not recorded by pgqueuer {signal}: {why}" in result.stdout
