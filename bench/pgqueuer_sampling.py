"""The pgqueuer preset's cost per cycle at 1M job rows, as ratios against bare SELECTs that give
the same numbers, measured in the same run, with the plans that say which index each reads.

    .venv/bin/python bench/pgqueuer_sampling.py [--jobs 1000000] [--runs 9] [--admin-dsn DSN]

Creates a database of its own (qe_bench_<random>, dropped at the end) and PgQueuer's schema by
the library itself (Queries.install, through tests/pgqueuer_app/driver.py with the pgqueuer1
venv), then `--jobs` rows in its queue table as a deployment with a backlog keeps them
(PgQueuer deletes finished jobs: 85% queued and due, 5% deferred, 2% waiting for a retry, 3%
picked, 5% failed and kept by on_failure="hold") over 4 entrypoints, and `--jobs` rows in its log
(the finished jobs' history: queued, picked, successful or exception). Timed in turn, median of
--runs after a warm-up, each pair checked to give the same numbers first; the bare SELECTs run
with JIT off, as the exporter's sessions do:
- hot path (every cycle): pgqueuer_jobs through sample() (pooled connection with a check,
  read-only transaction, statement timeout, rows -> samples) against the bare SELECTs of the
  same numbers (no zero for an empty state, no label work) on one open connection;
- pgqueuer_failed (every failed_interval) against its bare SELECT;
- the log reader's read after its baseline (nothing finished since) against the bare SELECT of
  the log rows past the same id.
The load average (os.getloadavg) is printed before and after: the host is shared.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.postgres_presets import nonzero_series  # noqa: E402
from bench.postgres_sampling import (  # noqa: E402
    DEFAULT_ADMIN_DSN,
    Rows,
    bare_fetch,
    interleaved_medians,
    scratch_database,
)
from exporter.config import presets  # noqa: E402
from exporter.config import settings as config_module  # noqa: E402
from exporter.runtime.app import App  # noqa: E402

FILL = """
INSERT INTO pgqueuer (priority, entrypoint, status, attempts, execute_after, updated, payload)
SELECT n % 3, (ARRAY['emails', 'reports', 'slow', 'idle'])[1 + n % 4], s.status,
       CASE WHEN s.kind = 'retry' THEN 1 ELSE 0 END,
       CASE WHEN s.kind IN ('later', 'retry') THEN now() + interval '1 hour'
            ELSE now() - (n % 3600) * interval '1 second' END,
       now() - (n % 600) * interval '1 second', 'x'::bytea
FROM generate_series(1, {jobs}) AS n
CROSS JOIN LATERAL (SELECT CASE
    WHEN n % 100 < 85 THEN 'due' WHEN n % 100 < 90 THEN 'later' WHEN n % 100 < 92 THEN 'retry'
    WHEN n % 100 < 95 THEN 'picked' ELSE 'failed' END AS kind) AS k
CROSS JOIN LATERAL (SELECT k.kind, (CASE k.kind WHEN 'picked' THEN 'picked'
    WHEN 'failed' THEN 'failed' ELSE 'queued' END)::pgqueuer_status AS status) AS s;
INSERT INTO pgqueuer_log (job_id, status, entrypoint, priority, created, aggregated)
SELECT {jobs} + n / 3, (ARRAY['queued', 'picked', CASE WHEN n % 30 = 2 THEN 'exception'
       ELSE 'successful' END])[1 + n % 3]::pgqueuer_status,
       (ARRAY['emails', 'reports', 'slow', 'idle'])[1 + (n / 3) % 4], 0,
       now() - interval '2 hours' + n * interval '1 millisecond', true
FROM generate_series(0, {jobs} - 1) AS n;
"""
# Per entrypoint: due jobs and the earliest execute_after; waiting ones by whether they ran
# before; picked ones and the earliest pick.
BARE_HOT = [
    """
    SELECT entrypoint, count(*), min(execute_after) FROM pgqueuer
    WHERE status = 'queued' AND execute_after <= now() GROUP BY 1
    """,
    """
    SELECT entrypoint, attempts > 0, count(*) FROM pgqueuer
    WHERE status = 'queued' AND execute_after > now() GROUP BY 1, 2
    """,
    "SELECT entrypoint, count(*), min(updated) FROM pgqueuer WHERE status = 'picked' GROUP BY 1",
]
BARE_FAILED = "SELECT entrypoint, count(*) FROM pgqueuer WHERE status = 'failed' GROUP BY 1"
# What the log reader counts at a read past a position, settled for a second.
BARE_LOG = """
SELECT entrypoint, status, count(*) FROM pgqueuer_log
WHERE id > %s AND created < now() - interval '1 second'
  AND status IN ('queued', 'successful', 'exception', 'failed')
GROUP BY 1, 2
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--admin-dsn", default=DEFAULT_ADMIN_DSN)
    args = parser.parse_args()
    with scratch_database(args.admin_dsn) as dsn:
        run(dsn, args)


def install(dsn: str) -> None:
    """PgQueuer's own schema, by the library (Queries.install)."""
    from tests.pgqueuer_app.control import driver

    driver(dsn, "install")


def run(dsn: str, args: argparse.Namespace) -> None:
    started = time.perf_counter()
    install(dsn)
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(FILL.format(jobs=args.jobs).encode())
        connection.execute("VACUUM ANALYZE")  # the visibility map, as autovacuum keeps it
    print(f"pgqueuer schema, {args.jobs} job and log rows in {time.perf_counter() - started:.1f}s")
    app = App(
        config_module.from_dict(
            {
                "listen_address": "127.0.0.1:0",
                "sample_interval": 3600,
                "presets": ["pgqueuer"],
                "sources": {"postgres": {"dsn": dsn, "statement_timeout": 60}},
            }
        )
    )
    sources = {runner.source.name: runner.source for runner in app.runners}
    hot, slow, native = (
        sources["postgres:pgqueuer_jobs"],
        sources["postgres:pgqueuer_failed"],
        sources["native:pgqueuer"],
    )
    explain(dsn)
    load_before = os.getloadavg()
    with psycopg.connect(dsn) as bare:
        fetch = bare_fetch(bare)

        same_hot(hot.sample().samples, fetch(*BARE_HOT))
        failed = {(q, "failed"): float(n) for q, n in fetch(BARE_FAILED)[0]}
        assert nonzero_series([slow.sample().samples], "queue_depth") == failed
        native.sample()  # the baseline
        finished = presets.expand("pgqueuer")["sources"]["postgres"]["finished"][0]
        row = bare.execute(finished["baseline"]).fetchone()
        bare.rollback()
        assert row is not None and row[0] is not None
        bare_log = BARE_LOG % int(row[0])
        assert fetch(bare_log) == [[]]  # nothing finished since: the reader counts nothing
        timed = interleaved_medians(
            [
                lambda: fetch(*BARE_HOT),
                hot.sample,
                lambda: fetch(BARE_FAILED),
                slow.sample,
                lambda: fetch(bare_log),
                native.sample,
            ],
            args.runs,
        )
    bare_hot, exporter_hot, bare_slow, exporter_slow, bare_read, exporter_read = timed
    load = "/".join(f"{part:.1f}" for part in (*load_before, *os.getloadavg()))
    print(f"\nmedians of {args.runs}; load average (1/5/15 min, before/after) {load}")
    for name, bare_time, exporter_time in (
        ("hot path (pgqueuer_jobs)", bare_hot, exporter_hot),
        (f"pgqueuer_failed (every {slow.read_interval:g} s)", bare_slow, exporter_slow),
        ("native: a read after the baseline", bare_read, exporter_read),
    ):
        print(f"  {name}")
        print(f"    bare SELECTs      {bare_time * 1000:8.1f} ms")
        print(
            f"    exporter          {exporter_time * 1000:8.1f} ms   "
            f"ratio {exporter_time / bare_time:.2f}x"
        )
    app.shutdown()


def explain(dsn: str) -> None:
    """The plans of the hot path's query and of a log read: which index each reads."""
    expanded = presets.expand("pgqueuer")["sources"]["postgres"]
    hot = next(c for c in expanded["collectors"] if c["name"] == "pgqueuer_jobs")["query"]
    finished = expanded["finished"][0]
    log = finished["query"].replace("{after}", "0").replace("{limit}", "10000")
    with psycopg.connect(dsn) as connection:
        connection.execute("SET jit = off")
        for name, query in (("pgqueuer_jobs", hot), ("native:pgqueuer (from id 0)", log)):
            plan = connection.execute(f"EXPLAIN (COSTS OFF) {query}").fetchall()
            print(f"\nEXPLAIN {name}:")
            print("\n".join(f"  {line}" for (line,) in plan))


def same_hot(exporter: Any, bare: list[Rows]) -> None:
    depths: dict[tuple[str, ...], float] = {}
    for queue, count, _ in bare[0]:
        depths[queue, "pending"] = float(count)
    for queue, retried, count in bare[1]:
        depths[queue, "retry" if retried else "scheduled"] = float(count)
    for queue, count, _ in bare[2]:
        depths[queue, "active"] = float(count)
    served = nonzero_series([exporter], "queue_depth")
    assert served == depths, (served, depths)
    ages = set(nonzero_series([exporter], "queue_oldest_age_seconds"))
    assert ages == {(q, "pending") for q, _, _ in bare[0]} | {(q, "active") for q, _, _ in bare[2]}


if __name__ == "__main__":
    main()
