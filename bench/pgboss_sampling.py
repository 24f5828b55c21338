"""The pgboss preset's cost per cycle at 1M job rows, as ratios against the bare SELECTs that
give the same numbers, measured in the same run.

    .venv/bin/python bench/pgboss_sampling.py [--major 10|12] [--jobs 1000000] [--runs 9]
                                              [--admin-dsn DSN]

Creates a database of its own (qe_bench_<random>, dropped at the end), pg-boss's schema and
queues through pg-boss itself (tests/node/pgboss.cjs seed: tests/node/pgboss<major>, and for 12
the Node 22 of tests/node/node22),
then `--jobs` rows over its 4 queues as a busy pg-boss keeps them: 82% finished (completed,
failed, cancelled), the rest created (due or scheduled), retry and active. Timed in turn, median
of --runs after a warm-up:
- hot path (every cycle): the pgboss_jobs and pgboss_due sources' sample() (pooled connection
  with a check, read-only transaction, statement timeout, rows -> samples), against the two bare
  SELECTs the same numbers need (per queue and waiting state: count and oldest start_after; per
  queue: due) on one open connection;
- active (every active_interval): pgboss_active's sample() against its bare SELECT;
- pg-boss 10, estimate=true (every cycle): pgboss_active_estimate's sample() against its bare
  SELECT (catalogs only), and against the exact active count it replaces;
- for scale: counting every state per queue, the query that reads every finished row.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.postgres_sampling import interleaved_medians  # noqa: E402
from exporter import config as config_module  # noqa: E402
from exporter import presets  # noqa: E402
from exporter.app import App  # noqa: E402
from exporter.sources.postgres import PostgresCollectorSource  # noqa: E402

DEFAULT_ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"

# 82% finished; the unfinished 18%: created and due, created for later, retry, active.
FILL = """
INSERT INTO pgboss.job (name, state, start_after, created_on, started_on, completed_on)
SELECT (ARRAY['emails', 'reports', 'slow', 'idle'])[1 + n % 4], s.state::pgboss.job_state,
       CASE WHEN s.state = 'created' AND n % 18 = 0 THEN now() + interval '1 hour'
            ELSE now() - (n % 3600) * interval '1 second' END,
       now() - (n % 3600) * interval '1 second',
       CASE WHEN s.state NOT IN ('created', 'retry') THEN now() - (n % 600) * interval '1 second' END,
       CASE WHEN s.state IN ('completed', 'failed', 'cancelled') THEN now() END
FROM generate_series(1, {jobs}) AS n
CROSS JOIN LATERAL (SELECT CASE
    WHEN n % 100 < 70 THEN 'completed' WHEN n % 100 < 78 THEN 'failed'
    WHEN n % 100 < 82 THEN 'cancelled' WHEN n % 100 < 96 THEN 'created'
    WHEN n % 100 < 98 THEN 'retry' ELSE 'active' END AS state) AS s;
ANALYZE;
"""

BARE_WAITING = """
SELECT name, state, start_after > now() AS later, count(*), min(start_after)
FROM pgboss.job WHERE state IN ('created', 'retry') GROUP BY 1, 2, 3
"""
BARE_DUE = """
SELECT name, count(*) FROM pgboss.job
WHERE state IN ('created', 'retry') AND state = 'created' AND start_after <= now() AND start_after > created_on
GROUP BY 1
"""
BARE_ACTIVE = (
    "SELECT name, count(*), min(started_on) FROM pgboss.job WHERE state = 'active' GROUP BY 1"
)
EVERY_STATE = "SELECT name, state, count(*) FROM pgboss.job GROUP BY 1, 2"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--major", type=int, choices=(10, 12), default=10)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--admin-dsn", default=DEFAULT_ADMIN_DSN)
    args = parser.parse_args()
    name = f"qe_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(args.admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    dsn = make_conninfo(args.admin_dsn, dbname=name)
    try:
        run(dsn, args)
    finally:
        with psycopg.connect(args.admin_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def create_schema(dsn: str, major: int) -> None:
    """pg-boss's own migrations and createQueue, through its API."""
    parts = conninfo_to_dict(dsn)
    url = f"postgres://{parts['user']}@{parts['host']}:{parts.get('port', 5432)}/{parts['dbname']}"
    script = ROOT / "tests/node/pgboss.cjs"
    node = str(ROOT / "tests/node/node22/node_modules/.bin/node") if major >= 12 else "node"
    subprocess.run(
        [node, str(script), str(major), "seed", url, "pgboss"], check=True, capture_output=True
    )


def run(dsn: str, args: argparse.Namespace) -> None:
    started = time.perf_counter()
    create_schema(dsn, args.major)
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(FILL.format(jobs=args.jobs).encode())
    print(
        f"pg-boss {args.major} schema and {args.jobs} job rows in {time.perf_counter() - started:.1f}s"
    )

    app = _app(dsn, {})
    sources = {runner.source.name: runner.source for runner in app.runners}
    jobs, due, active = (sources[f"postgres:pgboss_{name}"] for name in ("jobs", "due", "active"))
    assert all(isinstance(s, PostgresCollectorSource) for s in (jobs, due, active))

    with psycopg.connect(dsn) as bare:

        def fetch(*queries: str) -> object:
            rows = []
            with bare.cursor(binary=True) as cursor:
                for query in queries:
                    cursor.execute(query)
                    rows.append(cursor.fetchall())
            bare.rollback()
            return rows

        def hot_cycle() -> object:
            return jobs.sample(), due.sample()

        bare_hot, exporter_hot, bare_active, exporter_active, every = interleaved_medians(
            [
                lambda: fetch(BARE_WAITING, BARE_DUE),
                hot_cycle,
                lambda: fetch(BARE_ACTIVE),
                active.sample,
                lambda: fetch(EVERY_STATE),
            ],
            args.runs,
        )

    print(f"\nmedians of {args.runs}")
    print(f"  hot path: bare SELECTs      {bare_hot * 1000:8.1f} ms")
    print(
        f"  hot path: exporter sources  {exporter_hot * 1000:8.1f} ms   "
        f"ratio {exporter_hot / bare_hot:.2f}x (target <= 1.5x)"
    )
    print(f"  active:   bare SELECT       {bare_active * 1000:8.1f} ms")
    print(
        f"  active:   exporter source   {exporter_active * 1000:8.1f} ms   "
        f"ratio {exporter_active / bare_active:.2f}x (every active_interval, default 30 s)"
    )
    print(f"  for scale: every state per queue (reads every finished row) {every * 1000:8.1f} ms")
    app.shutdown()
    if args.major < 12:
        estimate(dsn, args.runs, exporter_active)


def _app(dsn: str, params: dict[str, object]) -> App:
    config = config_module.from_dict(
        {
            "listen_address": "127.0.0.1:0",
            "sample_interval": 3600,
            "presets": [{"name": "pgboss", "params": params}],
            "sources": {"postgres": {"dsn": dsn, "statement_timeout": 30}},
        }
    )
    return App(config)


def estimate(dsn: str, runs: int, exact: float) -> None:
    """pg-boss 10 with estimate=true: the planner's estimate of the active jobs."""
    app = _app(dsn, {"estimate": True})
    source = next(
        r.source for r in app.runners if r.source.name == "postgres:pgboss_active_estimate"
    )
    assert isinstance(source, PostgresCollectorSource)
    collectors = presets.expand("pgboss", {"estimate": True})["sources"]["postgres"]["collectors"]
    query = next(c["query"] for c in collectors if c["name"] == "pgboss_active_estimate")
    with psycopg.connect(dsn) as bare:

        def fetch() -> object:
            with bare.cursor(binary=True) as cursor:
                cursor.execute(query)
                rows = cursor.fetchall()
            bare.rollback()
            return rows

        bare_estimate, exporter_estimate = interleaved_medians([fetch, source.sample], runs)
    print(f"  estimate: bare SELECT       {bare_estimate * 1000:8.1f} ms")
    print(
        f"  estimate: exporter source   {exporter_estimate * 1000:8.1f} ms   "
        f"ratio {exporter_estimate / bare_estimate:.2f}x; "
        f"{exact / exporter_estimate:.0f}x cheaper than the exact active count"
    )
    app.shutdown()


if __name__ == "__main__":
    main()
