"""The oban preset's plans against Oban's own schema (`oban install` through
tests/oban_app/driver.py): no finished row read but through an index.

Depths, due jobs, ages, workers and counters as Oban says them are checked by the conformance
harness (tests/conformance/adapters/oban.py); here: the plans.
"""

from __future__ import annotations

import psycopg

from exporter.config import presets
from tests.conformance.adapters.oban import oban_driver

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
