"""The procrastinate, graphile_worker and django_tasks presets' cost per cycle at 1M job rows, as ratios
against bare SELECTs that give the same numbers, measured in the same run.

    .venv/bin/python bench/postgres_presets.py --system procrastinate|graphile_worker|django_tasks
                                               [--jobs 1000000] [--runs 9] [--admin-dsn DSN]

Creates a database of its own (qe_bench_<random>, dropped at the end) and the system's schema
by the library itself (Procrastinate's SchemaManager.apply_schema; graphile-worker's migrate,
tests/node/graphile_worker.cjs seed with 0.18 on tests/node/node22; django-tasks-db's migrations,
tests/django_tasks_app in the djangotasks venv), then `--jobs` rows as a busy
deployment keeps them: Procrastinate 82% finished (succeeded, failed, cancelled) with a deferred
event per job and a started one per running job, 10 live workers; graphile-worker (which
deletes completed jobs) 60% permanently failed, the rest available (due, later, retrying) or
locked; Django's tasks 78% finished (SUCCESSFUL, FAILED: kept until pruned), 20% READY (at once,
due, later), 2% RUNNING. Timed in turn, median of --runs after a warm-up, each pair checked to give the same
numbers first; the bare SELECTs run with JIT off, as the exporter's sessions do:
- hot path (every cycle): the preset's collectors that run every cycle, sample() each
  (pooled connection with a check, read-only transaction, statement timeout, rows -> samples),
  against the bare SELECTs of the same numbers (no zero for an empty state, no label work) on
  one open connection;
- the collector on a longer interval (procrastinate_failed, graphile_worker_locked,
  django_tasks_kept) against its bare SELECT;
- django_tasks: its native reader once the operator's index on finished_at is made
  (docs/native.md), a read after its baseline, against the bare SELECT of the same counts.
The load average (os.getloadavg) is printed before and after: the host is shared.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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

PROCRASTINATE_FILL = """
INSERT INTO procrastinate_workers (last_heartbeat)
SELECT now() FROM generate_series(1, 10);
INSERT INTO procrastinate_jobs (queue_name, task_name, status, attempts, scheduled_at, worker_id)
SELECT (ARRAY['emails', 'reports', 'slow', 'idle'])[1 + n % 4], 'task' || n % 7, s.status,
       CASE WHEN n % 100 = 97 THEN 1 ELSE 0 END,
       CASE WHEN s.status = 'todo' AND n % 100 >= 95 THEN now() + interval '1 hour'
            WHEN s.status = 'todo' AND n % 10 = 0 THEN now() - interval '1 minute' END,
       CASE WHEN s.status = 'doing' THEN (SELECT min(id) FROM procrastinate_workers) + n % 10 END
FROM generate_series(1, {jobs}) AS n
CROSS JOIN LATERAL (SELECT (CASE
    WHEN n % 100 < 70 THEN 'succeeded' WHEN n % 100 < 78 THEN 'failed'
    WHEN n % 100 < 82 THEN 'cancelled' WHEN n % 100 < 98 THEN 'todo'
    ELSE 'doing' END)::procrastinate_job_status AS status) AS s;
INSERT INTO procrastinate_events (job_id, type, at)
SELECT id, 'deferred', now() - (id % 3600) * interval '1 second' FROM procrastinate_jobs;
INSERT INTO procrastinate_events (job_id, type, at)
SELECT id, 'started', now() - (id % 600) * interval '1 second'
FROM procrastinate_jobs WHERE status = 'doing';
"""
# Per queue and state: count, the first unscheduled job, the earliest scheduled_at; the first
# unscheduled job's deferral; each running job's latest start; due; live workers, busy or not.
PROCRASTINATE_BARE = [
    """
    SELECT queue_name, status, scheduled_at > now(), attempts > 0, count(*),
           min(id) FILTER (WHERE scheduled_at IS NULL), min(scheduled_at)
    FROM procrastinate_jobs WHERE status IN ('todo', 'doing') GROUP BY 1, 2, 3, 4
    """,
    """
    SELECT f.queue_name, min(e.at)
    FROM (SELECT queue_name, min(id) AS id FROM procrastinate_jobs
          WHERE status = 'todo' AND scheduled_at IS NULL GROUP BY 1) AS f
    JOIN procrastinate_events AS e ON e.job_id = f.id AND e.type = 'deferred'
    GROUP BY 1
    """,
    """
    SELECT j.queue_name, min(s.at)
    FROM procrastinate_jobs AS j
    CROSS JOIN LATERAL (SELECT max(e.at) AS at FROM procrastinate_events AS e
                        WHERE e.job_id = j.id AND e.type = 'started') AS s
    WHERE j.status = 'doing' GROUP BY 1
    """,
    """
    SELECT queue_name, count(*) FROM procrastinate_jobs
    WHERE status = 'todo' AND scheduled_at <= now() GROUP BY 1
    """,
    """
    SELECT EXISTS (SELECT FROM procrastinate_jobs AS j
                   WHERE j.worker_id = w.id AND j.status = 'doing'), count(*)
    FROM procrastinate_workers AS w
    WHERE w.last_heartbeat > now() - interval '30 seconds' GROUP BY 1
    """,
]
PROCRASTINATE_FAILED = (
    "SELECT queue_name, count(*) FROM procrastinate_jobs WHERE status = 'failed' GROUP BY 1"
)

GRAPHILE_FILL = """
INSERT INTO graphile_worker._private_jobs
  (task_id, job_queue_id, attempts, max_attempts, run_at, locked_at, locked_by)
SELECT t.id, CASE WHEN n % 10 = 0 THEN (SELECT min(id) FROM graphile_worker._private_job_queues) END,
       s.attempts, 25 - CASE WHEN s.kind = 'failed' THEN 25 - s.attempts ELSE 0 END,
       CASE WHEN s.kind = 'later' THEN now() + interval '1 hour'
            ELSE now() - (n % 3600) * interval '1 second' END,
       CASE WHEN s.kind = 'locked' THEN now() - (n % 600) * interval '1 second' END,
       CASE WHEN s.kind = 'locked' THEN 'worker-' || n % 10 END
FROM generate_series(1, {jobs}) AS n
CROSS JOIN LATERAL (SELECT CASE
    WHEN n % 100 < 60 THEN 'failed' WHEN n % 100 < 90 THEN 'due'
    WHEN n % 100 < 95 THEN 'later' WHEN n % 100 < 97 THEN 'retrying'
    ELSE 'locked' END AS kind) AS k
CROSS JOIN LATERAL (SELECT k.kind,
    CASE k.kind WHEN 'failed' THEN 3 WHEN 'retrying' THEN 1 ELSE 0 END AS attempts) AS s
CROSS JOIN LATERAL (SELECT id FROM graphile_worker._private_tasks
                    ORDER BY id OFFSET n % 3 LIMIT 1) AS t;
UPDATE graphile_worker._private_jobs SET run_at = now() + interval '1 hour'
WHERE attempts = 1 AND max_attempts = 25;
"""
_GRAPHILE_FROM = """
    FROM graphile_worker._private_jobs AS j
    JOIN graphile_worker._private_tasks AS t ON t.id = j.task_id
    LEFT JOIN graphile_worker._private_job_queues AS q ON q.id = j.job_queue_id
"""
GRAPHILE_BARE = [
    f"""
    SELECT COALESCE(q.queue_name, t.identifier), j.run_at > now(), j.attempts > 0, count(*),
           min(j.run_at) FILTER (WHERE j.run_at <= now())
    {_GRAPHILE_FROM} WHERE j.is_available GROUP BY 1, 2, 3
    """,
    f"""
    SELECT COALESCE(q.queue_name, t.identifier), count(*)
    {_GRAPHILE_FROM} WHERE j.is_available AND j.run_at <= now() AND j.run_at > j.created_at
    GROUP BY 1
    """,
]
GRAPHILE_LOCKED = f"""
    SELECT COALESCE(q.queue_name, t.identifier), j.locked_at IS NOT NULL, count(*),
           min(j.locked_at)
    {_GRAPHILE_FROM} WHERE NOT j.is_available GROUP BY 1, 2
"""

DJANGO_TASKS_TABLE = "django_tasks_database_dbtaskresult"
DJANGO_TASKS_FILL = f"""
INSERT INTO {DJANGO_TASKS_TABLE}
  (id, status, args_kwargs, priority, task_path, queue_name, backend_name, run_after,
   enqueued_at, started_at, finished_at, exception_class_path, traceback, worker_ids)
SELECT gen_random_uuid(), s.status, jsonb_build_object('args', jsonb_build_array(), 'kwargs', jsonb_build_object()), 0, 'app.tasks.task' || n % 7,
       (ARRAY['emails', 'reports', 'slow', 'idle'])[1 + n % 4], 'default',
       CASE WHEN s.status = 'READY' AND n % 100 >= 95 THEN now() + interval '1 hour'
            WHEN s.status = 'READY' AND n % 10 = 0 THEN now() - interval '1 minute'
            ELSE timestamptz '9999-01-01 00:00+00' END,
       now() - interval '2 hours' - (n % 3600) * interval '1 second',
       CASE WHEN s.status <> 'READY' THEN f.at - (n % 600) * interval '1 second' END,
       CASE WHEN s.status IN ('SUCCESSFUL', 'FAILED') THEN f.at END,
       '', '', '[]'
FROM generate_series(1, {{jobs}}) AS n
CROSS JOIN LATERAL (SELECT CASE
    WHEN n % 100 < 70 THEN 'SUCCESSFUL' WHEN n % 100 < 78 THEN 'FAILED'
    WHEN n % 100 < 98 THEN 'READY' ELSE 'RUNNING' END AS status) AS s
-- each task finished at its own time, as db_worker saves them one by one (a running one: now)
CROSS JOIN LATERAL (SELECT CASE WHEN s.status = 'RUNNING' THEN now()
                                ELSE now() - interval '10 seconds' - n * interval '1 millisecond'
                           END AS at) AS f;
"""
# Per queue, READY later or not: count, the earliest time each became claimable; due.
DJANGO_TASKS_BARE = [
    f"""
    SELECT queue_name, run_after > now() AND run_after < timestamptz '9998-12-31 00:00+00',
           count(*),
           min(CASE WHEN run_after >= timestamptz '9998-12-31 00:00+00' THEN enqueued_at
                    ELSE GREATEST(run_after, enqueued_at) END)
    FROM {DJANGO_TASKS_TABLE} WHERE status = 'READY' GROUP BY 1, 2
    """,
    f"""
    SELECT queue_name, count(*) FROM {DJANGO_TASKS_TABLE}
    WHERE status = 'READY' AND run_after <= now() GROUP BY 1
    """,
]
DJANGO_TASKS_KEPT = f"""
    SELECT queue_name, status, count(*), min(started_at) FROM {DJANGO_TASKS_TABLE}
    WHERE status IN ('RUNNING', 'FAILED', 'SUCCESSFUL') GROUP BY 1, 2
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--system", choices=("procrastinate", "graphile_worker", "django_tasks"), required=True
    )
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--admin-dsn", default=DEFAULT_ADMIN_DSN)
    args = parser.parse_args()
    with scratch_database(args.admin_dsn) as dsn:
        run(dsn, args)


def create_procrastinate(dsn: str) -> None:
    import procrastinate

    with procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn)).open() as app:
        app.schema_manager.apply_schema()


def create_graphile_worker(dsn: str) -> None:
    """graphile-worker's migrations and its tasks and a named queue, through its own API."""
    parts = conninfo_to_dict(dsn)
    url = f"postgres://{parts['user']}@{parts['host']}:{parts.get('port', 5432)}/{parts['dbname']}"
    node = str(ROOT / "tests/node/node22/node_modules/.bin/node")
    script = str(ROOT / "tests/node/graphile_worker.cjs")
    subprocess.run(
        [node, script, "018", "seed", url, "graphile_worker"], check=True, capture_output=True
    )


def create_django_tasks(dsn: str) -> None:
    """django-tasks-db's migrations, by Django itself in the djangotasks venv."""
    python = ROOT / ".venv/tools/djangotasks/bin/python"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_TASKS_DSN": dsn}
    argv = [str(python), "-m", "tests.django_tasks_app.driver", "migrate"]
    subprocess.run(argv, check=True, capture_output=True, env=env)


# per system: its schema, its rows, its collector on a longer interval, the bare SELECTs of the
# hot path and of that collector, and the checks that both give the same numbers
SYSTEMS: dict[str, tuple[Callable[[str], None], str, str, list[str], str, Any]] = {}


def run(dsn: str, args: argparse.Namespace) -> None:
    create, fill, slow_name, bare_hot, bare_slow, check = SYSTEMS[args.system]
    started = time.perf_counter()
    create(dsn)
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(fill.format(jobs=args.jobs).encode())
        connection.execute("VACUUM ANALYZE")  # the visibility map, as autovacuum keeps it
    print(f"{args.system} schema and {args.jobs} job rows in {time.perf_counter() - started:.1f}s")
    app = App(
        config_module.from_dict(
            {
                "listen_address": "127.0.0.1:0",
                "sample_interval": 3600,
                "presets": [args.system],
                "sources": {"postgres": {"dsn": dsn, "statement_timeout": 60}},
            }
        )
    )
    sources = {
        runner.source.name: runner.source
        for runner in app.runners
        if isinstance(runner.source, PostgresCollectorSource)
    }
    slow = sources.pop(f"postgres:{slow_name}")
    hot = list(sources.values())
    load_before = os.getloadavg()
    with psycopg.connect(dsn) as bare:
        fetch = bare_fetch(bare)

        def hot_cycle() -> list[SampleSet]:
            return [source.sample().samples for source in hot]

        same_hot, same_slow = check
        same_hot(hot_cycle(), fetch(*bare_hot))
        same_slow(slow.sample().samples, fetch(bare_slow)[0])
        timed = interleaved_medians(
            [lambda: fetch(*bare_hot), hot_cycle, lambda: fetch(bare_slow), slow.sample],
            args.runs,
        )
    bare_hot_time, exporter_hot, bare_slow_time, exporter_slow = timed
    load = "/".join(f"{part:.1f}" for part in (*load_before, *os.getloadavg()))
    print(f"\nmedians of {args.runs}; load average (1/5/15 min, before/after) {load}")
    print(f"  hot path ({', '.join(s.name for s in hot)})")
    print(f"    bare SELECTs      {bare_hot_time * 1000:8.1f} ms")
    print(
        f"    exporter sources  {exporter_hot * 1000:8.1f} ms   "
        f"ratio {exporter_hot / bare_hot_time:.2f}x (target <= 1.2x)"
    )
    print(f"  {slow_name} (every {slow.read_interval:g} s)")
    print(f"    bare SELECT       {bare_slow_time * 1000:8.1f} ms")
    print(
        f"    exporter source   {exporter_slow * 1000:8.1f} ms   "
        f"ratio {exporter_slow / bare_slow_time:.2f}x"
    )
    if args.system == "django_tasks":
        django_tasks_native(dsn, app, args.runs)
    app.shutdown()


# What the django_tasks reader counts at a read: finished tasks per queue since the last
# position, settled for finished_margin (none here once the baseline is taken: the steady read).
DJANGO_TASKS_FINISHED = f"""
SELECT queue_name, status, count(*) FROM {DJANGO_TASKS_TABLE}
WHERE finished_at > 'epoch'::timestamptz + %s * interval '1 microsecond'
  AND finished_at < now() - 5 * interval '1 second' AND status IN ('SUCCESSFUL', 'FAILED')
GROUP BY 1, 2
"""


def django_tasks_native(dsn: str, app: App, runs: int) -> None:
    """The finished-rows reader with the index made: a read after its baseline."""
    from tests.conformance.adapters.django_tasks import FINISHED_INDEX

    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(FINISHED_INDEX.encode())
        connection.execute("ANALYZE")
    source = next(r.source for r in app.runners if r.source.name == "native:django_tasks")
    source.sample()  # the baseline, now the index is there
    finished = presets.expand("django_tasks")["sources"]["postgres"]["finished"][0]
    with psycopg.connect(dsn) as bare:
        row = bare.execute(finished["baseline"].encode()).fetchone()
        assert row is not None and row[0] is not None
        query = DJANGO_TASKS_FINISHED % int(row[0])
        fetch = functools.partial(bare_fetch(bare), query)
        assert fetch() == [[]]  # nothing finished since: the reader counts nothing either
        bare_read, exporter_read = interleaved_medians([fetch, source.sample], runs)
    print("  native reader (index on finished_at made), a read after its baseline")
    print(f"    bare SELECT       {bare_read * 1000:8.1f} ms")
    print(
        f"    exporter reader   {exporter_read * 1000:8.1f} ms   "
        f"ratio {exporter_read / bare_read:.2f}x"
    )


def nonzero_series(samples: list[SampleSet], metric: str) -> dict[tuple[str, ...], float]:
    """The metric's non-zero series as {(queue, state): value}."""
    found: dict[tuple[str, ...], float] = {}
    for sample_set in samples:
        for spec, series in sample_set.metrics():
            if spec.name != metric:
                continue
            at = [
                spec.labels.index(name) if name in spec.labels else None
                for name in ("queue", "state")
            ]
            for labels, value in series.items():
                if value:
                    found[tuple("" if i is None else labels[i] for i in at)] = value
    return found


def _state(status: Any, later: bool, retried: bool) -> str:
    status = status.decode() if isinstance(status, bytes) else status
    if status == "doing":
        return "active"
    if later:
        return "retry" if retried else "scheduled"
    return "pending"


def same_procrastinate(exporter: list[SampleSet], bare: list[Rows]) -> None:
    depths: dict[tuple[str, ...], float] = {}
    for queue, status, later, retried, count, _, _ in bare[0]:
        key = (queue, _state(status, bool(later), retried))
        depths[key] = depths.get(key, 0) + count
    assert nonzero_series(exporter, "queue_depth") == depths, (
        nonzero_series(exporter, "queue_depth"),
        depths,
    )
    ages = set(nonzero_series(exporter, "queue_oldest_age_seconds"))
    assert ages == {(q, "pending") for q, _ in bare[1]} | {(q, "active") for q, _ in bare[2]}
    due = {(queue, ""): float(count) for queue, count in bare[3]}
    assert nonzero_series(exporter, "queue_scheduled_due") == due
    workers = {("", "busy" if busy else "idle"): float(n) for busy, n in bare[4]}
    assert nonzero_series(exporter, "queue_workers") == workers, (workers,)


def same_graphile(exporter: list[SampleSet], bare: list[Rows]) -> None:
    depths: dict[tuple[str, ...], float] = {}
    for queue, later, retried, count, _ in bare[0]:
        key = (queue, _state("todo", bool(later), retried))
        depths[key] = depths.get(key, 0) + count
    assert nonzero_series(exporter, "queue_depth") == depths, (
        nonzero_series(exporter, "queue_depth"),
        depths,
    )
    ages = set(nonzero_series(exporter, "queue_oldest_age_seconds"))
    assert ages == {(q, "pending") for q, later, _, _, since in bare[0] if since is not None}
    assert nonzero_series(exporter, "queue_scheduled_due") == {
        (q, ""): float(n) for q, n in bare[1]
    }


def same_django_tasks(exporter: list[SampleSet], bare: list[Rows]) -> None:
    depths = {
        (queue, "scheduled" if later else "pending"): float(count)
        for queue, later, count, _ in bare[0]
    }
    assert nonzero_series(exporter, "queue_depth") == depths, (
        nonzero_series(exporter, "queue_depth"),
        depths,
    )
    ages = set(nonzero_series(exporter, "queue_oldest_age_seconds"))
    assert ages == {(queue, "pending") for queue, later, _, _ in bare[0] if not later}
    assert nonzero_series(exporter, "queue_scheduled_due") == {
        (q, ""): float(n) for q, n in bare[1]
    }


def _same_depths(exporter: SampleSet, expected: dict[tuple[str, ...], float]) -> None:
    assert nonzero_series([exporter], "queue_depth") == expected, (
        nonzero_series([exporter], "queue_depth"),
    )


def same_procrastinate_failed(exporter: SampleSet, bare: Rows) -> None:
    _same_depths(exporter, {(queue, "failed"): float(count) for queue, count in bare})


def same_graphile_locked(exporter: SampleSet, bare: Rows) -> None:
    expected = {
        (queue, "active" if locked else "failed"): float(count) for queue, locked, count, _ in bare
    }
    _same_depths(exporter, expected)


def same_django_tasks_kept(exporter: SampleSet, bare: Rows) -> None:
    states = {"RUNNING": "active", "FAILED": "failed", "SUCCESSFUL": "completed"}
    _same_depths(exporter, {(queue, states[s]): float(n) for queue, s, n, _ in bare})


SYSTEMS.update(
    procrastinate=(
        create_procrastinate,
        PROCRASTINATE_FILL,
        "procrastinate_failed",
        PROCRASTINATE_BARE,
        PROCRASTINATE_FAILED,
        (same_procrastinate, same_procrastinate_failed),
    ),
    graphile_worker=(
        create_graphile_worker,
        GRAPHILE_FILL,
        "graphile_worker_locked",
        GRAPHILE_BARE,
        GRAPHILE_LOCKED,
        (same_graphile, same_graphile_locked),
    ),
    django_tasks=(
        create_django_tasks,
        DJANGO_TASKS_FILL,
        "django_tasks_kept",
        DJANGO_TASKS_BARE,
        DJANGO_TASKS_KEPT,
        (same_django_tasks, same_django_tasks_kept),
    ),
)


if __name__ == "__main__":
    main()
