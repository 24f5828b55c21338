"""The attune preset's sampling cost, as a ratio against a bare psycopg fetch in the same run.

    .venv/bin/python bench/postgres_sampling.py [--actions 10000] [--executions 1000000]
                                               [--runs 5] [--admin-dsn DSN]

Creates a database of its own (qe_bench_<random>, dropped at the end) with Attune's tables,
`--actions` actions each with a queue_stats row (half of them with a waiting execution) and
`--executions` executions (1% unfinished). Timed, median of --runs after one warm-up (bare and exporter in turn):
- bare: psycopg on one open connection, execute + fetchall of the preset's queue_stats query;
- exporter cycle: what the postgres:attune_queue_stats source does per interval (pooled
  connection with a check, read-only transaction, statement timeout, rows -> samples, samples
  published to telemetry); the ratio to the bare fetch is the figure the target is set on;
- of which: the sample alone (the cycle without the publish);
- executions: one cycle of postgres:attune_executions, and its EXPLAIN ANALYZE;
- scrape: GET /metrics of an exporter serving the result.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.config import settings as config_module
from exporter.runtime.app import App
from exporter.sources.postgres.source import PostgresCollectorSource
from exporter.sources.runner import apply_report
from tests.attune_db import schema_ddl

DEFAULT_ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
Rows = list[tuple[Any, ...]]


def bare_fetch(bare: psycopg.Connection[Any]) -> Callable[..., list[Rows]]:
    """The bare loop every PostgreSQL preset bench times the exporter against: each query's
    rows, in one transaction on `bare`, JIT off as the exporter's sessions run, rolled back."""

    def fetch(*queries: str) -> list[Rows]:
        results = []
        with bare.cursor(binary=True) as cursor:
            cursor.execute("SET LOCAL jit = off")
            for query in queries:
                cursor.execute(query.encode())
                results.append(cursor.fetchall())
        bare.rollback()
        return results

    return fetch


FILL = """
SET search_path TO attune, public;
INSERT INTO pack (ref, label) SELECT 'pack' || p, 'Pack ' || p FROM generate_series(0, 99) p;
INSERT INTO action (ref, pack, pack_ref, label, entrypoint)
SELECT 'pack' || (i % 100) || '.action_' || i, (i % 100) + 1, 'pack' || (i % 100),
       'Action ' || i, 'run.py'
FROM generate_series(1, {actions}) i;
INSERT INTO queue_stats (action_id, queue_length, active_count, max_concurrent,
                         oldest_enqueued_at, total_enqueued, total_completed, last_updated)
SELECT id, id % 7, id % 3, 1 + id % 4,
       CASE WHEN id % 2 = 0 THEN now() - (id % 600) * interval '1 second' END,
       1000 + id, 990 + id, now() - (id % 60) * interval '1 second'
FROM action;
INSERT INTO execution (action, action_ref, status)
SELECT a.id, a.ref,
       CASE WHEN i % 100 = 0 THEN (ARRAY['requested', 'scheduling', 'scheduled', 'running',
                                         'canceling'])[1 + (i / 100) % 5]
            WHEN i % 10 = 1 THEN 'failed' ELSE 'completed' END::execution_status_enum
FROM generate_series(1, {executions}) i
JOIN action a ON a.id = 1 + (i / 100 + i) % {actions};
ANALYZE;
"""


def median_seconds(action: Callable[[], object], runs: int) -> float:
    action()  # warm-up: connections, prepared plans, caches
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        result = action()
        timings.append(time.perf_counter() - started)
        del result  # freed outside the timing (the exporter frees a sample when it replaces it)
    return statistics.median(timings)


def interleaved_medians(actions: list[Callable[[], object]], runs: int) -> list[float]:
    """Medians of actions timed in turn, so that a noisy moment hits them all alike."""
    timings: list[list[float]] = [[] for _ in actions]
    for action in actions:
        action()  # warm-up
    for _ in range(runs):
        for index, action in enumerate(actions):
            started = time.perf_counter()
            result = action()
            timings[index].append(time.perf_counter() - started)
            del result
    return [statistics.median(series) for series in timings]


@contextmanager
def scratch_database(admin_dsn: str) -> Iterator[str]:
    """A database of the bench's own, dropped afterwards: its DSN."""
    name = f"qe_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_conninfo(admin_dsn, dbname=name)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actions", type=int, default=10_000)
    parser.add_argument("--executions", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--admin-dsn", default=DEFAULT_ADMIN_DSN)
    args = parser.parse_args()

    with scratch_database(args.admin_dsn) as dsn:
        run(dsn, args)


def run(dsn: str, args: argparse.Namespace) -> None:
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(schema_ddl())
        fill = FILL.format(actions=args.actions, executions=args.executions)
        connection.execute(fill.encode())
    print(
        f"filled {args.actions} actions, {args.executions} executions in "
        f"{time.perf_counter() - started:.1f}s"
    )

    config = config_module.from_dict(
        {
            "listen_address": "127.0.0.1:0",
            "sample_interval": 3600,  # the served exporter samples once, at start
            "presets": ["attune"],
            "limits": {"max_series_per_metric": 100_000},
            "sources": {"postgres": {"dsn": dsn, "statement_timeout": 30}},
        }
    )
    app = App(config)
    sources = {runner.source.name: runner.source for runner in app.runners}
    stats = sources["postgres:attune_queue_stats"]
    executions = sources["postgres:attune_executions"]
    assert isinstance(stats, PostgresCollectorSource)
    assert isinstance(executions, PostgresCollectorSource)

    with psycopg.connect(dsn) as bare:

        def bare_fetch() -> object:
            with bare.cursor() as cursor:
                cursor.execute(stats.collector.query)
                rows = cursor.fetchall()
            bare.rollback()
            return rows

        def bare_binary_fetch() -> object:
            with bare.cursor(binary=True) as cursor:
                cursor.execute(stats.collector.query)
                rows = cursor.fetchall()
            bare.rollback()
            return rows

        def exporter_cycle() -> None:
            apply_report(app.telemetry, None, stats.name, stats.sample())

        rows = len(bare_fetch())
        series = len(stats.sample().samples)
        bare_time, binary_time, exporter_time, sample_time = interleaved_medians(
            [bare_fetch, bare_binary_fetch, exporter_cycle, stats.sample], args.runs
        )
        executions_time = median_seconds(executions.sample, args.runs)
        execution_series = len(executions.sample().samples)
        plan = bare.execute("EXPLAIN (ANALYZE, BUFFERS) " + executions.collector.query).fetchall()
        bare.rollback()

    print(f"\nqueue_stats: {rows} rows -> {series} series, median of {args.runs}")
    print(f"  bare psycopg fetch   {bare_time * 1000:8.1f} ms")
    print(
        f"  exporter cycle       {exporter_time * 1000:8.1f} ms   "
        f"ratio {exporter_time / bare_time:.2f}x (target <= 1.5x)"
    )
    print(f"    of which sample    {sample_time * 1000:8.1f} ms   (fetch and rows -> samples)")
    print(f"  (bare binary fetch   {binary_time * 1000:8.1f} ms; the exporter fetches in binary)")
    print(f"executions: {args.executions} rows -> {execution_series} series")
    print(f"  exporter sample      {executions_time * 1000:8.1f} ms")
    print("  EXPLAIN ANALYZE of the preset's executions query:")
    for (line,) in plan:
        print(f"    {line}")

    app.start()
    try:
        port = app.server.port
        deadline = time.monotonic() + 60
        while not app.health.ready() and time.monotonic() < deadline:
            time.sleep(0.05)

        def scrape() -> bytes:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as reply:
                body: bytes = reply.read()
            return body

        body = scrape()
        scrape_time = median_seconds(scrape, args.runs)
        lines = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        print(f"\n/metrics: {lines} samples, {len(body) / 1e6:.1f} MB")
        print(
            f"  scrape               {scrape_time * 1000:8.1f} ms   "
            f"ratio to the cycle {scrape_time / exporter_time:.1f}x"
        )
    finally:
        app.shutdown()


if __name__ == "__main__":
    main()
