"""The oban preset's cost per cycle at 1M job rows, as a ratio against bare SELECTs that give the
same numbers, measured in the same run; and the plans that say no finished row is read but
through an index.

    .venv/bin/python bench/oban_sampling.py [--jobs 1000000] [--runs 9] [--admin-dsn DSN]

Creates a database of its own (qe_bench_<random>, dropped at the end) and Oban's schema by the
library itself (tests/oban_app/driver.py install, the Oban venv of scripts/setup.sh), then
`--jobs` rows as a busy deployment keeps them: 82% finished (70% completed, 8% discarded, 4%
cancelled, as Oban's pruner keeps them for a day), 15% available, 1.5% scheduled, 1.4%
retryable (a tenth of those two due, not yet staged) and 0.1% executing (as many as the slots:
20 live producers, 4 queues on 5 nodes, local_limit 50 each). Timed in turn, median of --runs
after a warm-up, the pair checked to give the same numbers first; the bare SELECTs run with JIT
off, as the exporter's sessions do:
- hot path (every cycle): the preset's collectors, sample() each (pooled connection with a
  check, read-only transaction, statement timeout, rows -> samples), against the bare SELECTs of
  the same numbers (no zero for an empty state, no label work) on one open connection;
- the finished-rows reader's query (a full page of 10,000 rows past a cursor), its plan printed.
The load average (os.getloadavg) is printed before and after: the host is shared.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

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
from exporter.output.samples import SampleSet  # noqa: E402
from exporter.runtime.app import App  # noqa: E402
from exporter.sources.postgres.source import PostgresCollectorSource  # noqa: E402

FILL = """
INSERT INTO oban_producers (uuid, name, node, queue, meta)
SELECT gen_random_uuid(), 'Oban', 'node' || n % 5, (ARRAY['emails', 'reports', 'slow', 'idle'])[1 + n / 5],
       '{{"local_limit": 50, "paused": false}}'
FROM generate_series(0, 19) AS n;
INSERT INTO oban_jobs (state, queue, worker, attempt, max_attempts, inserted_at, scheduled_at,
                       attempted_at, attempted_by, completed_at, discarded_at, cancelled_at)
SELECT s.state, w.queue, 'Worker' || n % 7,
       CASE WHEN s.state IN ('available', 'scheduled') THEN 0 ELSE 1 END, 20, t.at,
       CASE WHEN s.state IN ('scheduled', 'retryable')
            THEN t.now + CASE WHEN n % 10 = 0 THEN interval '-1 minute' ELSE interval '1 hour' END
            ELSE t.at END,
       CASE WHEN s.state NOT IN ('available', 'scheduled', 'cancelled')
            THEN t.at + interval '1 second' END,
       CASE WHEN s.state = 'executing'
            THEN ARRAY[w.node, (SELECT p.uuid::text FROM oban_producers AS p
                                WHERE p.queue = w.queue AND p.node = w.node)]
            ELSE ARRAY[]::text[] END,
       CASE WHEN s.state = 'completed' THEN t.at + interval '2 seconds' END,
       CASE WHEN s.state = 'discarded' THEN t.at + interval '2 seconds' END,
       CASE WHEN s.state = 'cancelled' THEN t.at + interval '2 seconds' END
FROM generate_series(1, {jobs}) AS n
-- the queue turns with each thousand rows too, and the node with each four thousand: the
-- executing rows (one a thousand) spread over the 20 producers, 50 each at 1M rows
CROSS JOIN LATERAL (SELECT (ARRAY['emails', 'reports', 'slow', 'idle'])[1 + (n + n / 1000) % 4] AS queue,
                           'node' || (n / 4000) % 5 AS node) AS w
CROSS JOIN LATERAL (SELECT timezone('UTC', now()) AS now,
                           timezone('UTC', now()) - (n % 86400) * interval '1 second' AS at) AS t
CROSS JOIN LATERAL (SELECT (CASE
    WHEN n % 1000 < 700 THEN 'completed' WHEN n % 1000 < 780 THEN 'discarded'
    WHEN n % 1000 < 820 THEN 'cancelled' WHEN n % 1000 < 970 THEN 'available'
    WHEN n % 1000 < 985 THEN 'scheduled' WHEN n % 1000 < 999 THEN 'retryable'
    ELSE 'executing' END)::oban_job_state AS state) AS s;
"""
NOW = "timezone('UTC', now())"
LIVE = f"p.updated_at > {NOW} - interval '60 seconds'"
# Per queue and state: count, the oldest available job's scheduled_at, the oldest executing
# job's attempted_at; the due ones; each live producer's executing jobs and local_limit.
BARE = [
    """
    SELECT queue, state, count(*),
           min(scheduled_at) FILTER (WHERE state = 'available'),
           min(attempted_at) FILTER (WHERE state = 'executing')
    FROM oban_jobs
    WHERE state IN ('available', 'scheduled', 'suspended', 'executing', 'retryable', 'discarded')
    GROUP BY 1, 2
    """,
    f"""
    SELECT queue, count(*) FROM oban_jobs
    WHERE state IN ('scheduled', 'retryable') AND scheduled_at <= {NOW} GROUP BY 1
    """,
    f"""
    SELECT p.queue, (p.meta ->> 'local_limit')::int, count(j.id)
    FROM oban_producers AS p
    LEFT JOIN oban_jobs AS j
      ON j.state = 'executing' AND j.queue = p.queue AND j.attempted_by[2] = p.uuid::text
    WHERE {LIVE}
    GROUP BY p.uuid
    """,
]
# The first full page of the finished-rows reader past a cursor a day back.
FINISHED_AFTER = {"after": 0, "after_id": "NULL", "limit": 10_000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--admin-dsn", default=DEFAULT_ADMIN_DSN)
    args = parser.parse_args()
    with scratch_database(args.admin_dsn) as dsn:
        run(dsn, args)


def run(dsn: str, args: argparse.Namespace) -> None:
    started = time.perf_counter()
    oban = ROOT / ".venv/tools/oban/bin/python"
    subprocess.run([oban, ROOT / "tests/oban_app/driver.py", "install", dsn], check=True)
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(FILL.format(jobs=args.jobs).encode())
        connection.execute("VACUUM ANALYZE")  # the visibility map, as autovacuum keeps it
    print(f"oban schema and {args.jobs} job rows in {time.perf_counter() - started:.1f}s")
    app = App(
        config_module.from_dict(
            {
                "listen_address": "127.0.0.1:0",
                "sample_interval": 3600,
                "presets": [{"name": "oban", "params": {"native": False}}],
                "sources": {"postgres": {"dsn": dsn, "statement_timeout": 60}},
            }
        )
    )
    hot = [r.source for r in app.runners if isinstance(r.source, PostgresCollectorSource)]
    finished = presets.expand("oban")["sources"]["postgres"]["finished"][0]["query"]
    finished = finished.replace('"${schema}"', "public").format(**FINISHED_AFTER)
    load_before = os.getloadavg()
    with psycopg.connect(dsn) as bare:
        fetch = bare_fetch(bare)

        def hot_cycle() -> list[SampleSet]:
            return [source.sample().samples for source in hot]

        same(hot_cycle(), fetch(*BARE))
        for name, query in [("hot path", q) for q in BARE] + [("finished page", finished)]:
            plan = fetch(f"EXPLAIN (COSTS OFF) {query}")[0]
            print(f"\n{name} plan:\n" + "\n".join(row[0] for row in plan))
        for source in hot:
            plan = fetch(f"EXPLAIN (COSTS OFF) {source.collector.query}")[0]
            print(f"\n{source.name} plan:\n" + "\n".join(row[0] for row in plan))
        bare_time, exporter_time, page_time = interleaved_medians(
            [lambda: fetch(*BARE), hot_cycle, lambda: fetch(finished)], args.runs
        )
    load = "/".join(f"{part:.1f}" for part in (*load_before, *os.getloadavg()))
    print(f"\nmedians of {args.runs}; load average (1/5/15 min, before/after) {load}")
    print(f"  hot path ({', '.join(s.name for s in hot)})")
    print(f"    bare SELECTs      {bare_time * 1000:8.1f} ms")
    print(
        f"    exporter sources  {exporter_time * 1000:8.1f} ms   "
        f"ratio {exporter_time / bare_time:.2f}x (target <= 1.2x)"
    )
    print(f"  finished-rows page of 10,000 rows  {page_time * 1000:8.1f} ms")
    app.shutdown()


def same(exporter: list[SampleSet], bare: list[Rows]) -> None:
    """The exporter's numbers are the bare SELECTs'."""
    names = {"available": "pending", "executing": "active", "retryable": "retry"}
    names |= {"discarded": "failed", "scheduled": "scheduled", "suspended": "scheduled"}
    rows = [(queue, names[bytes(state).decode()], *rest) for queue, state, *rest in bare[0]]
    depths: dict[tuple[str, ...], float] = {}
    for queue, state, count, _, _ in rows:
        depths[queue, state] = depths.get((queue, state), 0) + count
    assert nonzero_series(exporter, "queue_depth") == depths, (
        nonzero_series(exporter, "queue_depth"),
        depths,
    )
    ages = set(nonzero_series(exporter, "queue_oldest_age_seconds"))
    assert ages == {(q, s) for q, s, _, available, executing in rows if available or executing}
    due = {(queue, ""): float(count) for queue, count in bare[1]}
    assert nonzero_series(exporter, "queue_scheduled_due") == due
    busy: dict[tuple[str, ...], float] = {}
    for queue, limit, running in bare[2]:
        for key, n in (("busy", running), ("free", limit - running)):
            busy[queue, key] = busy.get((queue, key), 0) + n
    served = nonzero_series(exporter, "queue_worker_slots")
    assert served == {k: v for k, v in busy.items() if v}, (served, busy)


if __name__ == "__main__":
    main()
