"""The pgboss preset's cost per cycle at 1M job rows, as ratios against the bare SELECTs that
give the same numbers, measured in the same run.

    .venv/bin/python bench/pgboss_sampling.py [--major 10|12] [--jobs 1000000] [--runs 9]
                                              [--admin-dsn DSN]

Creates a database of its own (qe_bench_<random>, dropped at the end), pg-boss's schema and
queues through pg-boss itself (tests/node/pgboss.cjs seed: tests/node/pgboss<major>, and for 12
the Node 22 of tests/node/node22),
then `--jobs` rows over its 4 queues as a busy pg-boss keeps them: 82% finished (completed,
failed, cancelled), the rest created (due or scheduled), retry and active. Timed in turn, median
of --runs after a warm-up, each pair checked to give the same numbers first; the exporter's
sessions run with JIT off (exporter/sources/postgres/source.py), and so do the bare SELECTs':
- hot path (every cycle): the pgboss_jobs and pgboss_due sources' sample() (pooled connection
  with a check, read-only transaction, statement timeout, rows -> samples), against the bare
  SELECTs the same numbers need on one open connection: per queue and waiting state, count
  and oldest start_after; per queue, due; and on pg-boss 12 (job_i14 covers them) per queue the
  active and failed counts and the oldest active started_on;
- pg-boss 10's active and failed (every active_interval): pgboss_active's sample() against its
  bare SELECT;
- pg-boss 10, estimate=true (every cycle): pgboss_active_estimate's sample() against its bare
  SELECT (catalogs only), and against the exact active count it replaces;
- for scale: counting every state per queue, the query that reads every finished row.
The load average (os.getloadavg) is printed before and after: the host is shared.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.postgres_sampling import (  # noqa: E402
    DEFAULT_ADMIN_DSN,
    bare_fetch,
    interleaved_medians,
    scratch_database,
)
from exporter.config import presets  # noqa: E402
from exporter.config import settings as config_module  # noqa: E402
from exporter.output.samples import SampleSet  # noqa: E402
from exporter.runtime.app import App  # noqa: E402
from exporter.sources.postgres.source import PostgresCollectorSource  # noqa: E402

# 82% finished; the unfinished 18%: created and due, created for later, retry, active. The
# finished rows end 2 s ago: the native reader counts only rows settled for a second, and a
# small fill is read within that second.
FILL = """
INSERT INTO pgboss.job (name, state, start_after, created_on, started_on, completed_on)
SELECT (ARRAY['emails', 'reports', 'slow', 'idle'])[1 + n % 4], s.state::pgboss.job_state,
       CASE WHEN s.state = 'created' AND n % 18 = 0 THEN now() + interval '1 hour'
            ELSE now() - (n % 3600) * interval '1 second' END,
       now() - (n % 3600) * interval '1 second',
       CASE WHEN s.state NOT IN ('created', 'retry')
            THEN now() - (2 + n % 600) * interval '1 second' END,
       CASE WHEN s.state IN ('completed', 'failed', 'cancelled') THEN now() - interval '2 seconds' END
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
BARE_ACTIVE = """
SELECT name, state, count(*), min(started_on) FILTER (WHERE state = 'active')
FROM pgboss.job WHERE state IN ('active', 'failed') GROUP BY 1, 2
"""
# pg-boss 12: active and failed counts from job_i14's entries, then the oldest active
# started_on of each queue from its active rows
BARE_LIVE = (
    "SELECT name, state, count(*) FROM pgboss.job WHERE state IN ('active', 'failed') GROUP BY 1, 2"
)
BARE_STARTED = "SELECT name, min(started_on) FROM pgboss.job WHERE state = 'active' GROUP BY 1"
EVERY_STATE = "SELECT name, state, count(*) FROM pgboss.job GROUP BY 1, 2"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--major", type=int, choices=(10, 12), default=10)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--admin-dsn", default=DEFAULT_ADMIN_DSN)
    args = parser.parse_args()
    with scratch_database(args.admin_dsn) as dsn:
        run(dsn, args)


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
    hot_bare = [BARE_WAITING, BARE_DUE] + ([BARE_LIVE, BARE_STARTED] if args.major >= 12 else [])
    load_before = os.getloadavg()

    with psycopg.connect(dsn) as bare:
        fetch = bare_fetch(bare)

        def hot_cycle() -> tuple[SampleSet, SampleSet]:
            return jobs.sample().samples, due.sample().samples

        same_numbers(hot_cycle(), fetch(*hot_bare), args.major)
        if args.major < 12:
            same_unindexed(active.sample().samples, fetch(BARE_ACTIVE)[0])
        bare_hot, exporter_hot, bare_active, exporter_active, every = interleaved_medians(
            [
                lambda: fetch(*hot_bare),
                hot_cycle,
                lambda: fetch(BARE_ACTIVE),
                active.sample,
                lambda: fetch(EVERY_STATE),
            ],
            args.runs,
        )

    print(
        f"\nmedians of {args.runs}; load average {_load(load_before)} -> {_load(os.getloadavg())}"
    )
    print(f"  hot path: bare SELECTs      {bare_hot * 1000:8.1f} ms")
    print(
        f"  hot path: exporter sources  {exporter_hot * 1000:8.1f} ms   "
        f"ratio {exporter_hot / bare_hot:.2f}x (target <= 1.2x)"
    )
    if args.major < 12:
        print(f"  active+failed: bare SELECT  {bare_active * 1000:8.1f} ms")
        print(
            f"  active+failed: exporter     {exporter_active * 1000:8.1f} ms   "
            f"ratio {exporter_active / bare_active:.2f}x (every active_interval, default 30 s)"
        )
    else:
        print(f"  pgboss_active (returns no row on 12)  {exporter_active * 1000:8.1f} ms")
    print(f"  for scale: every state per queue (reads every finished row) {every * 1000:8.1f} ms")
    app.shutdown()
    if args.major < 12:
        estimate(dsn, args.runs, exporter_active)
    else:
        native(dsn, args.runs)


def _load(load: tuple[float, float, float]) -> str:
    return "/".join(f"{part:.1f}" for part in load)


def _series(samples: SampleSet, metric: str) -> dict[tuple[str, ...], float]:
    """The metric's series as {(queue, state): value} (state "" where it has none)."""
    for spec, series in samples.metrics():
        if spec.name == metric:
            queue, state = (
                spec.labels.index("queue"),
                spec.labels.index("state") if "state" in spec.labels else None,
            )
            return {
                (labels[queue], labels[state] if state is not None else ""): value
                for labels, value in series.items()
            }
    return {}


def _text(value: str | bytes) -> str:
    """An enum label as text (a binary fetch has no loader for pg-boss's job_state)."""
    return value.decode() if isinstance(value, bytes) else value


def same_numbers(
    exporter: tuple[SampleSet, SampleSet], bare: list[list[tuple[Any, ...]]], major: int
) -> None:
    """The exporter's depths, due counts and ages are the bare SELECTs' (ages: the same oldest
    time, read a moment apart)."""
    now = time.time()
    depths = {key: n for key, n in _series(exporter[0], "queue_depth").items() if n}
    ages = _series(exporter[0], "queue_oldest_age_seconds")
    expected: dict[tuple[str, ...], float] = {}
    oldest: dict[tuple[str, ...], float] = {}
    for name, state, later, count, since in bare[0]:
        shown = "retry" if _text(state) == "retry" else "scheduled" if later else "pending"
        expected[name, shown] = expected.get((name, shown), 0) + count
        if shown == "pending" and since is not None:
            oldest[name, "pending"] = since.timestamp()
    if major >= 12:
        for name, state, count in bare[2]:
            expected[name, _text(state)] = count
        for name, since in bare[3]:
            oldest[name, "active"] = since.timestamp()
    assert depths == expected, (depths, expected)
    assert set(ages) == set(oldest), (ages, oldest)
    for key, since in oldest.items():
        assert abs(ages[key] - (now - since)) < 60, (key, ages[key], now - since)
    due = {queue: n for (queue, _), n in _series(exporter[1], "queue_scheduled_due").items()}
    assert due == dict(bare[1]), (due, bare[1])


def same_unindexed(exporter: SampleSet, bare: list[tuple[Any, ...]]) -> None:
    depths = {key: n for key, n in _series(exporter, "queue_depth").items() if n}
    expected = {(name, _text(state)): count for name, state, count, _ in bare}
    assert depths == expected, (depths, expected)


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


# What the native reader counts at a read: completed and failed jobs per queue since the last
# position, settled for a second (none here once the baseline is taken: the steady read).
BARE_FINISHED = """
SELECT name, state, count(*) FROM pgboss.job
WHERE completed_on > 'epoch'::timestamptz + %s * interval '1 microsecond'
  AND completed_on < now() - interval '1 second' AND state IN ('completed', 'failed')
GROUP BY 1, 2
"""


def native(dsn: str, runs: int) -> None:
    """pg-boss 12, native=true (the default): a read of the finished-rows reader after its
    baseline, against the bare SELECT of the same counts."""
    app = _app(dsn, {})
    source = next(r.source for r in app.runners if r.source.name == "native:pgboss")
    source.sample()  # the baseline
    finished = presets.expand("pgboss")["sources"]["postgres"]["finished"][0]
    with psycopg.connect(dsn) as bare:
        row = bare.execute(finished["baseline"]).fetchone()
        assert row is not None and row[0] is not None
        query = BARE_FINISHED % int(row[0])
        fetch = functools.partial(bare_fetch(bare), query)
        assert fetch() == [[]]  # nothing finished since: the reader counts nothing either
        bare_read, exporter_read = interleaved_medians([fetch, source.sample], runs)
    print(f"  native: bare SELECT         {bare_read * 1000:8.1f} ms")
    print(
        f"  native: exporter reader     {exporter_read * 1000:8.1f} ms   "
        f"ratio {exporter_read / bare_read:.2f}x (a read after the baseline, every cycle)"
    )
    app.shutdown()


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
