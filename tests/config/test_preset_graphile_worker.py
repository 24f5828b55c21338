"""The graphile_worker preset against real graphile-worker: its migrations, addJob, its workers.

tests/node/graphile_worker.cjs drives graphile-worker (tests/node/graphile_worker<version>):
WorkerUtils.migrate() creates the schema, addJob adds jobs (some for later, one removed with
remove_job), runOnce completes, fails for good and fails into a retry (pushed an hour out with
rescheduleJobs), and a run() worker holds one job. The truth is graphile-worker's own public
`jobs` view (queue_name, task_identifier, run_at, attempts, max_attempts, locked_at), read at
each scrape.

Depths, due jobs and ages as graphile-worker says them are checked by the conformance harness
(tests/conformance/adapters/postgres_queues.py), with these drivers; here: the rest.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from exporter.config import presets
from exporter.config import settings as config_module
from tests.conftest import (
    scrape_series,
    scrape_when,
    value,
    wait_for,
)
from tests.tools import missing

NODE = Path(__file__).resolve().parents[1] / "node"
STATES = ("pending", "scheduled", "retry", "active", "failed")


class GraphileWorker:
    def __init__(self, version: str, dsn: str, tmp_path: Path) -> None:
        # 0.18 needs Node 22.18: npm's node package in tests/node/node22; 0.16 runs on Node 20
        self.node = str(NODE / "node22/node_modules/.bin/node") if version >= "018" else "node"
        if shutil.which(self.node) is None:
            missing(f"{self.node} (graphile-worker {version}) not found")
        if not (NODE / f"graphile_worker{version}/node_modules/graphile-worker").is_dir():
            missing(f"graphile-worker in tests/node/graphile_worker{version} not found")
        parts = conninfo_to_dict(dsn)
        self.url = f"postgres://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"
        self.dsn = dsn
        self.version = version
        self.release = tmp_path / "release"

    def _argv(self, command: str, *args: str) -> list[str]:
        script = str(NODE / "graphile_worker.cjs")
        return [self.node, script, self.version, command, self.url, "graphile_worker", *args]

    def seed(self) -> None:
        done = subprocess.run(
            self._argv("seed"), capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr[-2000:]

    def worker(self) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            self._argv("work", str(self.release)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stderr is not None
        line = process.stderr.readline()
        assert line.strip() == "working", line + process.stderr.read()[-2000:]
        return process

    def jobs(self) -> tuple[list[dict[str, Any]], float]:
        """Every row of graphile-worker's own `jobs` view, and the database's now."""
        with psycopg.connect(self.dsn) as connection:
            cursor = connection.execute(
                "SELECT queue_name, task_identifier, extract(epoch FROM run_at)::float8 AS run_at,"
                " extract(epoch FROM created_at)::float8 AS created_at, attempts, max_attempts,"
                " extract(epoch FROM locked_at)::float8 AS locked_at,"
                " extract(epoch FROM now())::float8 AS now FROM graphile_worker.jobs"
            )
            names = [column.name for column in cursor.description or ()]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
            now = connection.execute("SELECT extract(epoch FROM now())::float8").fetchone()
        assert now is not None
        return rows, now[0]

    def names(self) -> set[str]:
        with psycopg.connect(self.dsn) as connection:
            rows = connection.execute(
                "SELECT DISTINCT coalesce(queue_name, task_identifier) FROM graphile_worker.jobs"
            ).fetchall()
        return {row[0] for row in rows}


@pytest.fixture(params=["016", "018"])
def graphile(
    request: pytest.FixtureRequest, postgres_dsn: str, tmp_path: Path
) -> Iterator[GraphileWorker]:
    worker = GraphileWorker(request.param, postgres_dsn, tmp_path)
    yield worker
    worker.release.touch()


def graphile_state(job: dict[str, Any], now: float) -> str:
    if job["locked_at"] is not None:
        return "active"
    if job["attempts"] >= job["max_attempts"]:
        return "failed"
    if job["run_at"] > now:
        return "retry" if job["attempts"] > 0 else "scheduled"
    return "pending"


def test_hot_path_reads_graphile_workers_main_index(
    graphile: GraphileWorker, postgres_dsn: str
) -> None:
    """200k permanently failed jobs beside the available ones: the collectors that run every
    cycle reach their rows through graphile-worker's jobs_main_index (WHERE is_available);
    only graphile_worker_locked, on its own longer interval, reads the rest, and its estimate
    reads no job row."""
    graphile.seed()
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute(
            "INSERT INTO graphile_worker._private_jobs (task_id, attempts, max_attempts) "
            "SELECT (SELECT id FROM graphile_worker._private_tasks WHERE identifier = 'explode'),"
            " 1, 1 FROM generate_series(1, 200000)"
        )
        connection.execute("ANALYZE")
        for collector in presets.expand("graphile_worker")["sources"]["postgres"]["collectors"]:
            plan = "\n".join(row[0] for row in connection.execute(f"EXPLAIN {collector['query']}"))
            if collector["name"] == "graphile_worker_locked":
                assert collector["interval"] >= 10, collector  # not every cycle
                continue
            if collector["name"] == "graphile_worker_locked_estimate":  # estimate=true
                assert "_private_jobs " not in plan, plan  # catalogs only, no job row
                continue
            assert "Seq Scan on _private_jobs" not in plan, plan
            assert "jobs_main_index" in plan, plan


# The estimate's test table, as a deployment whose failed jobs pile up (graphile-worker keeps
# them until someone deletes them; the completed ones it deletes): a small backlog of available
# jobs, locked ones (a fleet of workers) and permanently failed ones, gathered in the tasks that
# fail. A named queue holds some of each.
ESTIMATE_ROWS = {  # task or queue: (available, locked, failed)
    "send_email": (3000, 120, 2000),
    "resize_image": (1500, 80, 12000),
    "report": (400, 40, 0),
    "webhook": (800, 50, 60000),
    "explode": (0, 0, 25000),
    "queue:emails": (200, 1, 500),
}


def _fill_for_the_estimate(dsn: str) -> None:
    """ESTIMATE_ROWS written beside the seed's jobs, in the rows graphile-worker's own add_job
    makes (its tasks and queues, is_available generated by its schema), then ANALYZE."""
    insert = (
        "INSERT INTO graphile_worker._private_jobs"
        " (task_id, job_queue_id, attempts, max_attempts, locked_at, locked_by)"
        " SELECT %s, %s, %s, %s, %s, %s FROM generate_series(1, %s)"
    )
    with psycopg.connect(dsn, autocommit=True) as connection:
        for name, (available, locked, failed) in ESTIMATE_ROWS.items():
            queue = name.removeprefix("queue:") if name.startswith("queue:") else None
            task = "send_email" if queue else name
            connection.execute(
                "SELECT graphile_worker.add_job(%s, queue_name => %s)", (task, queue)
            )
            ids = connection.execute(
                "SELECT t.id, q.id FROM graphile_worker._private_tasks AS t"
                " LEFT JOIN graphile_worker._private_job_queues AS q ON q.queue_name = %s"
                " WHERE t.identifier = %s",
                (queue, task),
            ).fetchone()
            assert ids is not None
            connection.execute(insert, (*ids, 0, 25, None, None, available))
            connection.execute(insert, (*ids, 1, 25, "now", "worker-x", locked))
            connection.execute(insert, (*ids, 3, 3, None, None, failed))
        connection.execute("ANALYZE graphile_worker._private_jobs")


def _jobs_scans(dsn: str) -> tuple[int, int]:
    """Sequential and index scans of _private_jobs, as PostgreSQL counts them."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        row = connection.execute(
            "SELECT seq_scan, COALESCE(idx_scan, 0) FROM pg_stat_user_tables"
            " WHERE schemaname = 'graphile_worker' AND relname = '_private_jobs'"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _sample_tolerance(dsn: str, count: int) -> float:
    """Four standard errors of a count estimated from ANALYZE's sample (300 rows per unit of
    default_statistics_target, without replacement), plus one: the statistics' own error."""
    with psycopg.connect(dsn) as connection:
        row = connection.execute(
            "SELECT c.reltuples, 300 * current_setting('default_statistics_target')::int"
            " FROM pg_class AS c WHERE c.oid = 'graphile_worker._private_jobs'::regclass"
        ).fetchone()
    assert row is not None
    rows, sample = float(row[0]), min(float(row[1]), float(row[0]))
    share = count / rows
    return 4 * math.sqrt(count * (rows / sample) * (1 - share) * (1 - sample / rows)) + 1


def test_estimate_serves_the_planners_locked_and_failed_counts_without_a_scan(
    graphile: GraphileWorker, postgres_dsn: str, run_exporter: Any
) -> None:
    """graphile_worker:estimate=true over a realistic table (its own migrations and runOnce,
    then 5.9k available, 291 locked and 99.5k failed jobs): the whole table's locked and failed
    jobs are served as queue_depth_estimate within four standard errors of ANALYZE's sample of
    graphile-worker's own `jobs` view, no exact locked or failed series is served, and
    _private_jobs is never read sequentially meanwhile (the same check sees
    graphile_worker_locked's scan with estimate=false)."""
    graphile.seed()
    _fill_for_the_estimate(postgres_dsn)
    jobs, now = graphile.jobs()
    states = Counter(graphile_state(job, now) for job in jobs)
    truth = {"active": states["active"], "failed": states["failed"]}
    report = sum(1 for job in jobs if job["task_identifier"] == "report")
    tolerance = {state: _sample_tolerance(postgres_dsn, n) for state, n in truth.items()}
    seq_before, idx_before = _jobs_scans(postgres_dsn)
    exporter = run_exporter(
        postgres_dsn=postgres_dsn,
        preset=[{"name": "graphile_worker", "params": {"estimate": True}}],
    )
    served: dict[str, float] = {}

    def estimated() -> bool:
        series = scrape_series(exporter)
        for state in truth:
            estimate = value(series, "queue_depth_estimate", system="graphile_worker", state=state)
            if estimate is None:
                return False
            served[state] = estimate
        assert all(abs(served[s] - truth[s]) <= tolerance[s] for s in truth), (served, truth)
        assert not [
            labels
            for (name, labels), _ in series.items()
            if name in ("queue_depth", "queue_oldest_age_seconds")
            and dict(labels).get("state") in ("active", "failed")
        ]
        source = "postgres:graphile_worker_locked"
        assert value(series, "queue_exporter_source_up", source=source) is None
        return True

    wait_for(estimated, timeout=30)
    print(f"estimate {served}, graphile-worker's jobs view {truth}, tolerance {tolerance}")
    # the hot path's index reads (every cycle) are counted by now: several cycles' worth, so the
    # exporter's backends have reported their scans
    wait_for(lambda: _jobs_scans(postgres_dsn)[1] >= idx_before + 10, timeout=30)
    assert value(scrape_series(exporter), "queue_depth", queue="report", state="pending") == (
        report - ESTIMATE_ROWS["report"][1]
    )
    assert _jobs_scans(postgres_dsn)[0] == seq_before
    exporter.shutdown()

    exact = run_exporter(
        postgres_dsn=postgres_dsn,
        preset=[{"name": "graphile_worker", "params": {"locked_interval": 0.5}}],
    )
    series = scrape_when(exact, "queue_depth", queue="webhook", state="failed")
    assert value(series, "queue_depth", queue="webhook", state="failed") == 60000
    wait_for(lambda: _jobs_scans(postgres_dsn)[0] > seq_before, timeout=30)


@pytest.mark.fast
def test_estimate_param_runs_one_of_the_two_locked_collectors() -> None:
    """`estimate` enables the estimate's collector and disables the exact one (`${!estimate}`)."""

    def collectors(spec: str) -> list[str]:
        raw = {
            "sources": {"postgres": {"dsn": "postgresql://exporter@db/app"}},
            "presets": [presets.parse_spec(spec)],
        }
        config = config_module.from_dict(raw)
        assert config.sources.postgres is not None
        return [collector.name for collector in config.sources.postgres.collectors]

    hot = ["graphile_worker_jobs", "graphile_worker_due"]
    assert collectors("graphile_worker") == [*hot, "graphile_worker_locked"]
    estimated = collectors("graphile_worker:estimate=true")
    assert estimated == [*hot, "graphile_worker_locked_estimate"]
