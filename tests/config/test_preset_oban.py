"""The oban preset's plans against Oban's own schema (`oban install` through
tests/oban_app/driver.py): no finished row read but through an index, and the finished-rows
reader's pages through rows sharing a finish time.

Depths, due jobs, ages, workers and counters as Oban says them are checked by the conformance
harness (tests/conformance/adapters/oban.py); here: the plans.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

import psycopg

from exporter.config import presets
from exporter.sources.postgres.config import PostgresSourceConfig
from exporter.sources.postgres.finished_config import FinishedRowsConfig
from exporter.sources.postgres.source import PostgresConnector
from exporter.sources.readers.finished_rows import FinishedRowsReader
from tests.conformance.adapters.oban import oban_driver
from tests.conftest import wait_for
from tests.sources.readers.test_finished_rows import _read

# 200k rows as a busy deployment keeps them for the pruner's day (bench/oban_sampling.py at a
# fifth of its size): 82% finished, 18% available, scheduled, retryable or executing. At that
# share a plain GROUP BY of the unfinished states is planned as a sequential scan.
FILL = """
INSERT INTO oban_jobs (state, queue, worker, attempt, scheduled_at, attempted_at,
                       completed_at, discarded_at, cancelled_at)
SELECT s.state, 'q' || n % 4, 'Worker', 1, t.at, t.at,
       CASE WHEN s.state = 'completed' THEN t.at END,
       CASE WHEN s.state = 'discarded' THEN t.at END,
       CASE WHEN s.state = 'cancelled' THEN t.at END
FROM generate_series(1, 200000) AS n
CROSS JOIN LATERAL (SELECT timezone('UTC', now()) - (n % 86400) * interval '1 second' AS at) AS t
CROSS JOIN LATERAL (SELECT (CASE
    WHEN n % 1000 < 700 THEN 'completed' WHEN n % 1000 < 780 THEN 'discarded'
    WHEN n % 1000 < 820 THEN 'cancelled' WHEN n % 1000 < 970 THEN 'available'
    WHEN n % 1000 < 985 THEN 'scheduled' WHEN n % 1000 < 999 THEN 'retryable'
    ELSE 'executing' END)::oban_job_state AS state) AS s
"""


def test_no_finished_row_is_read_but_through_an_index(postgres_dsn: str) -> None:
    """Every collector (all run every cycle), the finished-rows reader's baseline and a page of
    its read: no sequential scan of oban_jobs, parallel or not."""
    oban_driver(postgres_dsn)("install")
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute(FILL)
        connection.execute("VACUUM ANALYZE oban_jobs")
        postgres = presets.expand("oban")["sources"]["postgres"]
        finished = postgres["finished"][0]
        read = finished["query"].format(after=0, after_id="NULL", limit=10_000)
        queries = [c["query"] for c in postgres["collectors"]] + [finished["baseline"], read]
        for query in queries:
            plan = "\n".join(row[0] for row in connection.execute(f"EXPLAIN {query}").fetchall())
            assert "Seq Scan on oban_jobs" not in plan, plan
        # the check can fail: the bare GROUP BY of the same counts and ages reads every row
        bare = (
            "EXPLAIN SELECT queue, state, count(*), min(scheduled_at), min(attempted_at) "
            "FROM oban_jobs WHERE state IN "
            "('available', 'scheduled', 'executing', 'retryable', 'discarded') GROUP BY 1, 2"
        )
        assert "Seq Scan on oban_jobs" in "\n".join(r[0] for r in connection.execute(bare))


MAX_ROWS = 100
# In finish order: 30 completed jobs a millisecond apart, then a run of 170 completed and 170
# discarded ones sharing one time (Oban acks a batch in one transaction: one now()), then 5
# completed a millisecond later. Pages of 100 end inside the run, in both of its states.
_FINISHED = """
INSERT INTO oban_jobs (state, queue, worker, attempt, scheduled_at, attempted_at,
                       completed_at, discarded_at)
SELECT %(state)s::oban_job_state, %(queue)s, 'Worker', 1, t.at - interval '3 seconds',
       t.at - interval '2 seconds',
       CASE WHEN %(state)s = 'completed' THEN t.at END,
       CASE WHEN %(state)s = 'discarded' THEN t.at END
FROM generate_series(1, %(count)s) AS n
CROSS JOIN LATERAL (SELECT %(at)s + %(step)s * (n - %(count)s - 1) * interval '1 millisecond'
                    AS at) AS t
"""


def test_jobs_sharing_a_finish_time_are_each_counted_once_page_by_page(
    postgres_dsn: str,
) -> None:
    """The preset's finished-rows reader with reads of at most 100 rows: each completed and
    discarded row counted once, in the queue and outcome the table says, the backlog drained
    over the next reads."""
    oban_driver(postgres_dsn)("install")
    finished = presets.expand("oban")["sources"]["postgres"]["finished"][0]
    config = FinishedRowsConfig.model_validate({**finished, "max_rows": MAX_ROWS})
    connector = PostgresConnector(PostgresSourceConfig(dsn=postgres_dsn))
    connector.acquire()
    try:
        reader = FinishedRowsReader(config, connector, timeout=30)
        assert _read(reader, 1) == (Counter(), [0])  # the baseline
        with psycopg.connect(postgres_dsn, autocommit=True) as connection:
            row = connection.execute(
                "SELECT timezone('UTC', clock_timestamp()) - interval '0.9 seconds'"
            ).fetchone()
            assert row is not None
            at: datetime = row[0]
            for state, queue, count, step, when in (
                ("completed", "emails", 30, 1, at),
                ("completed", "emails", 170, 0, at),
                ("discarded", "reports", 170, 0, at),
                ("completed", "idle", 5, 0, at + timedelta(milliseconds=1)),
            ):
                parameters = {"state": state, "queue": queue, "count": count, "step": step}
                connection.execute(_FINISHED, {**parameters, "at": when})
            settled = (
                "SELECT max(completed_at) < timezone('UTC', now()) - interval '1 second' "
                "FROM oban_jobs"
            )
            wait_for(lambda: connection.execute(settled).fetchone() == (True,))
            rows = connection.execute(
                "SELECT queue, CASE state WHEN 'completed' THEN 'completed' ELSE 'failed' END, "
                "count(*) FROM oban_jobs GROUP BY 1, 2"
            ).fetchall()
        truth = Counter({(queue, outcome): count for queue, outcome, count in rows})
        counted, sizes = _read(reader, 6)
        assert counted == truth, (counted, truth)
        assert sizes == [MAX_ROWS, MAX_ROWS, MAX_ROWS, 375 - 3 * MAX_ROWS, 0, 0], sizes
    finally:
        connector.release()
