"""The pgboss preset against real pg-boss: its migrations, its send, its workers, its API.

tests/node/pgboss.cjs drives pg-boss (tests/node/pgboss<major>): PgBoss.start() creates the
schema, createQueue the queues, send() the jobs (some for later, one cancelled), and work()
handlers complete, fail, fail into an hour-long retry wait, and hold one job running. The truth is
pg-boss's own getQueueSize (waiting; and before 'completed') and getJobById of every job.

Depths, due jobs and ages as pg-boss says them are checked by the conformance harness
(tests/conformance/adapters/postgres_queues.py), with these drivers; here: the rest.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from exporter.config import presets
from exporter.config import settings as config_module
from tests.conftest import (
    Series,
    scrape,
    scrape_series,
    scrape_when,
    stop_process,
    value,
    wait_for,
    wait_until_served_as_truth,
)
from tests.tools import missing

NODE = Path(__file__).resolve().parents[1] / "node"
QUEUES = ("emails", "reports", "slow", "idle")
STATES = ("pending", "scheduled", "retry", "active", "failed")


class PgBoss:
    def __init__(self, major: int, dsn: str, tmp_path: Path) -> None:
        # pg-boss 12 needs Node 22: npm's node package in tests/node/node22; 10 runs on Node 20
        self.node = str(NODE / "node22/node_modules/.bin/node") if major >= 12 else "node"
        if shutil.which(self.node) is None:
            missing(f"{self.node} (pg-boss {major}) not found")
        if not (NODE / f"pgboss{major}/node_modules/pg-boss").is_dir():
            missing(f"pg-boss {major}.x in tests/node/pgboss{major} not found")
        parts = conninfo_to_dict(dsn)
        self.url = f"postgres://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"
        self.major = major
        self.ids = tmp_path / "ids.json"
        self.release = tmp_path / "release"

    def _argv(self, command: str, *args: str) -> list[str]:
        return [
            "node",
            str(NODE / "pgboss.cjs"),
            str(self.major),
            command,
            self.url,
            "pgboss",
            *args,
        ]

    def run(self, command: str, *args: str) -> Any:
        done = subprocess.run(
            self._argv(command, *args), capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout) if done.stdout.strip() else None

    def seed(self) -> None:
        self.ids.write_text(json.dumps(self.run("seed")))

    def send_more(self) -> None:
        """To 'emails': three jobs that complete, one that fails, one that fails after a retry."""
        self.run("more", str(self.ids))

    def truth(self) -> dict[str, Any]:
        result: dict[str, Any] = self.run("truth", str(self.ids))
        return result

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


@pytest.fixture(params=[10, 12])
def pgboss(request: pytest.FixtureRequest, postgres_dsn: str, tmp_path: Path) -> Iterator[PgBoss]:
    boss = PgBoss(request.param, postgres_dsn, tmp_path)
    yield boss
    boss.release.touch()


def pg_time(text: str | None) -> float | None:
    return None if text is None else datetime.fromisoformat(text).timestamp()


def library_depths(truth: dict[str, Any]) -> tuple[dict[tuple[str, str], float], dict[str, float]]:
    """Depth per (queue, state) and due per queue, from getJobById of every job."""
    now = truth["now"]
    depths: Counter[tuple[str, str]] = Counter({(q, s): 0 for q in QUEUES for s in STATES})
    due: Counter[str] = Counter()
    for job in truth["jobs"]:
        start_after = pg_time(job["startAfter"])
        assert start_after is not None
        if job["state"] == "created":
            depths[job["queue"], "scheduled" if start_after > now else "pending"] += 1
            if start_after <= now and start_after > (pg_time(job["createdOn"]) or 0):
                due[job["queue"]] += 1
        elif job["state"] in ("retry", "active", "failed"):  # failed: kept until deleted
            depths[job["queue"], job["state"]] += 1
    # pg-boss 10's own counts agree with its jobs (12 has no live count: only getJobById)
    for queue, sizes in truth["sizes"].items():
        waiting = sum(depths[queue, s] for s in ("pending", "scheduled", "retry"))
        assert sizes["waiting"] == waiting, (queue, sizes, depths)
        assert sizes["unfinished"] == waiting + depths[queue, "active"], (queue, sizes, depths)
    return {key: float(n) for key, n in depths.items()}, {q: float(n) for q, n in due.items()}


def _served(series: Series, name: str) -> dict[tuple[str, str], float]:
    return {
        (labels["queue"], labels.get("state", "")): number
        for (metric, label_set), number in series.items()
        if metric == name and (labels := dict(label_set)).get("system") == "pgboss"
    }


def test_hot_path_reads_pgboss_fetch_index_not_the_finished_rows(
    pgboss: PgBoss, postgres_dsn: str
) -> None:
    """300k finished rows (completed and failed) beside the waiting ones, as a busy pg-boss
    keeps them, each query run as the exporter runs it (JIT off, EXPLAIN ANALYZE): the
    collectors that run every cycle reach their rows through pg-boss's own indexes alone (10:
    the fetch index job_i5 of every queue's partition; 12: job_i14 of job_common, pgboss_jobs
    from its entries alone). On pg-boss 10 pgboss_jobs' branches counting active and failed
    jobs are planned but never executed (a one-time filter on job_i14's absence): only
    pgboss_active, on its own longer interval, reads the partitions; on pg-boss 12 it executes
    no scan at all."""
    pgboss.seed()
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute(
            "INSERT INTO pgboss.job (name, state, started_on, completed_on) "
            "SELECT (ARRAY['emails', 'reports', 'slow', 'idle'])[1 + n % 4], "
            "(CASE WHEN n % 10 = 0 THEN 'failed' ELSE 'completed' END)::pgboss.job_state, "
            "now() - interval '2 minutes', now() - interval '1 minute' "
            "FROM generate_series(1, 300000) AS n"
        )
        connection.execute("VACUUM ANALYZE pgboss.job")
        connection.execute(
            "SET jit = off"
        )  # as the exporter runs them (sources/postgres/source.py)
        collectors = presets.expand("pgboss")["sources"]["postgres"]["collectors"]
        for collector in collectors:
            if collector["name"] == "pgboss_active_estimate":  # estimate=true, pg-boss 10
                if pgboss.major < 12:
                    plan = "\n".join(
                        r[0] for r in connection.execute(f"EXPLAIN {collector['query']}")
                    )
                    assert "Scan on j" not in plan, plan  # catalogs only, no job row
                continue
            lines = [
                row[0]
                for row in connection.execute(f"EXPLAIN (ANALYZE, COSTS OFF) {collector['query']}")
            ]
            plan = "\n".join(lines)
            scans = [line for line in lines if "Seq Scan on j" in line]
            executed = [line for line in scans if "never executed" not in line]
            if collector["name"] == "pgboss_active" and pgboss.major < 12:
                assert executed, plan  # the one pass over the partitions, on its interval
                assert collector["interval"] >= 10, collector  # not every cycle
                continue
            assert not executed, plan
            if collector["name"] == "pgboss_active":  # pg-boss 12: no job row read at all
                assert all("never executed" in line for line in lines if " on j" in line), plan
            elif pgboss.major < 12:
                assert plan.count("_i5 on j") == len(QUEUES), plan
            elif collector["name"] == "pgboss_jobs":
                assert "Index Only Scan using job_common_i14" in plan, plan
            else:
                # an index scan of it or a bitmap scan: the planner picks either by the
                # statistics (both read only the unfinished rows the index holds)
                assert re.search(r"(using|Bitmap Index Scan on) job_common_i14\b", plan), plan
        if pgboss.major >= 12:  # the native reader (native=true): through job_i16
            finished = presets.expand("pgboss", {"native": True})["sources"]["postgres"]["finished"]
            baseline = finished[0]["baseline"]
            row = connection.execute(baseline).fetchone()
            assert row is not None and row[0] is not None
            # a position inside the 300k rows' one completed_on (tests/sources/readers/test_finished_rows.py)
            read = finished[0]["query"].replace("{after}", str(row[0]))
            read = read.replace("{after_name}", "'emails'").replace(
                "{after_id}", "'80000000-0000-0000-0000-000000000000'::uuid"
            )
            for query in (baseline, read.replace("{limit}", "10000")):
                plan = "\n".join(r[0] for r in connection.execute(f"EXPLAIN {query}"))
                assert "Seq Scan on j" not in plan, plan
                assert "job_common_i16" in plan and "pkey" not in plan, plan


def test_native_counts_pgboss12_finished_jobs_once(
    postgres_dsn: str, run_exporter: Any, tmp_path: Path
) -> None:
    """pg-boss 12 with native=true: completed and failed jobs, with their run and wait times,
    from the rows by completed_on (job_i16), each counted once; what finished before the
    reader's baseline is not counted."""
    boss = PgBoss(12, postgres_dsn, tmp_path)
    boss.seed()
    exporter = run_exporter(
        postgres_dsn=postgres_dsn,
        preset=[{"name": "pgboss", "params": {"native": True, "active_interval": 0.5}}],
    )
    wait_for(
        lambda: value(scrape_series(exporter), "queue_exporter_source_up", source="native:pgboss")
    )
    worker = boss.worker()
    try:

        def settled() -> dict[str, Any] | None:
            truth = boss.truth()
            states = Counter((job["queue"], job["state"]) for job in truth["jobs"])
            done = states["emails", "completed"] == 4 and states["emails", "failed"] == 2
            return truth if done and states["slow", "active"] == 1 else None

        truth = wait_for(settled, timeout=60)
        finished = Counter(
            (job["queue"], job["state"])
            for job in truth["jobs"]
            if job["state"] in ("completed", "failed")
        )
        assert finished == {("emails", "completed"): 4, ("emails", "failed"): 2}

        def mismatches(series: Series, _: float) -> list[str]:
            found = []
            for (queue, state), number in finished.items():
                metric = f"queue_jobs_{state}_total"
                served = sum(
                    n
                    for (name, labels), n in series.items()
                    if name == metric and {("system", "pgboss"), ("queue", queue)} <= labels
                )
                if served != number:
                    found.append(f"{metric}{{{queue}}}: served {served}, pg-boss says {number}")
            for histogram in ("queue_job_execution_seconds_count", "queue_job_wait_seconds_count"):
                served = value(series, histogram, system="pgboss", queue="emails")
                if served != sum(finished.values()):
                    found.append(f"{histogram}: served {served}, finished {sum(finished.values())}")
            return found

        wait_until_served_as_truth(exporter, mismatches)
        for _ in range(3):  # later reads count nothing again
            time.sleep(0.5)
            wait_until_served_as_truth(exporter, mismatches)
    finally:
        boss.release.touch()
        stop_process(worker, 15)


def _partition_scans(dsn: str, queue: str) -> tuple[int, int]:
    """Sequential and index scans of `queue`'s pg-boss 10 partition, as PostgreSQL counts them."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        row = connection.execute(
            "SELECT t.seq_scan, COALESCE(t.idx_scan, 0) FROM pgboss.queue AS q "
            "JOIN pg_stat_user_tables AS t "
            "ON t.schemaname = 'pgboss' AND t.relname = q.partition_name WHERE q.name = %s",
            (queue,),
        ).fetchone()
    assert row is not None, queue
    return int(row[0]), int(row[1])


def test_estimate_serves_the_planners_active_count_without_the_costly_scan(
    postgres_dsn: str, run_exporter: Any, tmp_path: Path
) -> None:
    """pg-boss 10 with estimate=true: its active jobs (20k rows, 2k of them active through its
    own fetch(), most of the rest completed) are served as queue_depth_estimate, within 5% + 1
    of pg-boss's own getQueueSize after ANALYZE, and the partition is never read sequentially
    (the exact count's scan) while the index-read waiting counts run; the same check sees the
    scan with estimate=false."""
    boss = PgBoss(10, postgres_dsn, tmp_path)
    counts = {"sent": 20000, "fetched": 19900, "completed": 17900}
    sizes = boss.run("bulk", json.dumps(counts))
    active = sizes["unfinished"] - sizes["waiting"]
    assert active == counts["fetched"] - counts["completed"], sizes
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute("ANALYZE pgboss.job")
    seq_before, idx_before = _partition_scans(postgres_dsn, "bulk")
    exporter = run_exporter(
        postgres_dsn=postgres_dsn, preset=[{"name": "pgboss", "params": {"estimate": True}}]
    )

    def estimated() -> float | None:
        series = scrape_series(exporter)
        estimate = value(series, "queue_depth_estimate", system="pgboss", queue="bulk")
        if estimate is None or not abs(estimate - active) <= 0.05 * active + 1:
            return None
        assert value(series, "queue_depth", queue="bulk", state="active") is None
        assert value(series, "queue_exporter_source_up", source="postgres:pgboss_active") is None
        return estimate

    wait_for(estimated, timeout=30)
    # the exporter's own index reads (pgboss_jobs and pgboss_due, every cycle) are counted by
    # now: several cycles' worth, so its backends have reported their scans
    wait_for(lambda: _partition_scans(postgres_dsn, "bulk")[1] >= idx_before + 10, timeout=30)
    assert (
        value(scrape_series(exporter), "queue_depth", queue="bulk", state="pending")
        == sizes["waiting"]
    )
    assert _partition_scans(postgres_dsn, "bulk")[0] == seq_before
    exporter.shutdown()

    exact = run_exporter(
        postgres_dsn=postgres_dsn, preset=[{"name": "pgboss", "params": {"active_interval": 0.5}}]
    )
    scrape_when(exact, "queue_depth", queue="bulk", state="active")
    assert value(scrape_series(exact), "queue_depth", queue="bulk", state="active") == active
    wait_for(lambda: _partition_scans(postgres_dsn, "bulk")[0] > seq_before, timeout=30)


def _schema_version(dsn: str) -> int:
    """The schema version pg-boss's migrations recorded in its version table."""
    with psycopg.connect(dsn) as connection:
        row = connection.execute("SELECT max(version) FROM pgboss.version").fetchone()
    assert row is not None
    return int(row[0])


def test_estimate_on_pgboss12_is_refused_naming_why(
    postgres_dsn: str, run_exporter: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """pgboss:estimate=true on a real pg-boss 12 (its own migrations): the estimate's collector
    is refused before its query runs, reason refused, every cycle (counted, down on the status
    page), the log naming pg-boss 12's schema version and what to do; the other collectors serve
    pg-boss's own depths meanwhile, every state (active and failed from job_i14)."""
    boss = PgBoss(12, postgres_dsn, tmp_path)
    boss.seed()
    version = _schema_version(postgres_dsn)
    assert version > 24, version  # pg-boss 10's schema is version 24
    caplog.set_level(logging.WARNING, logger="exporter.sources.runner")
    exporter = run_exporter(
        postgres_dsn=postgres_dsn, preset=[{"name": "pgboss", "params": {"estimate": True}}]
    )
    source = "postgres:pgboss_active_estimate"

    def refusals() -> float:
        series = scrape_series(exporter)
        count = value(series, "queue_exporter_source_errors_total", source=source, reason="refused")
        return count or 0.0

    wait_for(lambda: refusals() >= 2, timeout=30)  # not once: every cycle while it stands
    series = scrape_series(exporter)
    assert value(series, "queue_exporter_source_up", source=source) == 0
    for other in ("sql_error", "missing_column", "missing_table", "query_shape"):
        assert value(series, "queue_exporter_source_errors_total", source=source, reason=other) in (
            None,
            0,
        )
    assert value(series, "queue_exporter_source_up", source="postgres:pgboss_jobs") == 1

    def depths_differ(series: Series, _: float) -> list[str]:
        # seeded: 5 idle jobs now and one a second later (pending too once a loaded host gets
        # here after that second): what pg-boss says, not a count of our own
        # every state, active and failed too: pgboss_jobs reads them through job_i14 on 12
        served = _served(series, "queue_depth")
        depths, _due = library_depths(boss.truth())
        return [] if served == depths else [f"served {served}, pg-boss says {depths}"]

    wait_until_served_as_truth(exporter, depths_differ)
    assert value(series, "queue_depth_estimate", system="pgboss") is None
    status = json.loads(scrape(exporter.server.port, "/status.json"))
    row = next(s for s in status["sources"] if s["name"] == source)
    assert row["up"] is False and row["last_error"] == "refused", row
    assert row["errors"].get("refused", 0) >= 2, row
    assert any(source in warning for warning in status["view"]["warnings"])
    logged = caplog.text
    assert f"pg-boss schema version {version} (pg-boss 10 is 24)" in logged
    assert "estimate=true applies to pg-boss 10: leave it off" in logged


@pytest.mark.fast
def test_estimate_param_runs_one_of_the_two_active_collectors() -> None:
    """`estimate` enables the estimate's collector and disables the exact one (`${!estimate}`);
    a value that is not true or false is refused, naming the preset and the param."""

    def collectors(spec: str) -> list[str]:
        raw = {
            "sources": {"postgres": {"dsn": "postgresql://exporter@db/app"}},
            "presets": [presets.parse_spec(spec)],
        }
        config = config_module.from_dict(raw)
        assert config.sources.postgres is not None
        return [collector.name for collector in config.sources.postgres.collectors]

    assert collectors("pgboss") == ["pgboss_jobs", "pgboss_due", "pgboss_active"]
    estimated = collectors("pgboss:estimate=true")
    assert estimated == ["pgboss_jobs", "pgboss_due", "pgboss_active_estimate"]
    with pytest.raises(presets.PresetError, match="pgboss: param estimate: expected true or false"):
        presets.expand("pgboss", {"estimate": "maybe"})
