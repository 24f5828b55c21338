"""The dashboards and recording rules against a real Prometheus, fed by real Procrastinate,
pg-boss 12 and graphile-worker workers through the procrastinate, pgboss (native=true) and
graphile_worker presets alone, all three in one database: every query by system returns series
of the three, except where NOT_FED says why a library cannot feed it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import procrastinate

from tests.config.test_preset_graphile_worker import GraphileWorker
from tests.config.test_preset_pgboss import PgBoss
from tests.config.test_preset_procrastinate import WORKED_QUEUES, _worker
from tests.conftest import stop_process, wait_for
from tests.dashboard_queries import NotFed, not_fed_by_redis_alone, wait_until_fed
from tests.deploy.test_keda_example import _scaled_object
from tests.prometheus.test_prometheus_e2e import FAST_RULES, SCRAPE_JOB, Prometheus

SYSTEMS = ("procrastinate", "pgboss", "graphile_worker")
ALL = frozenset(SYSTEMS)
PGBOSS = frozenset({"pgboss"})
GRAPHILE = frozenset({"graphile_worker"})
NOT_FED: NotFed = {
    **not_fed_by_redis_alone(ALL),
    "jobs_enqueued": (ALL, "no count of enqueues is read"),
    "jobs_started": (ALL, "no count of starts is read"),
    "dequeue": (ALL, "no dequeue apart from a start"),
    "timed_out": (ALL, "no timeout count"),
    "dead_lettered": (ALL, "no dead-letter queues read"),
    "requeued": (ALL, "no count of requeues"),
    "max_retries_exceeded": (ALL, "a final failure is counted as failed"),
    "jobs_scheduled": (ALL, "no count of scheduled jobs"),
    "total_seconds": (ALL, "execution and wait times only"),
    "retry_delay": (ALL, "no retry delays"),
    "schedule_delay": (ALL, "no schedule delays"),
    "job_attempts": (ALL, "no attempts per finished job"),
    "worker": (ALL, "no busy/idle per worker"),
    "backend_operation": (ALL, "backend_op events only"),
    "reaper": (ALL, "no reaper"),
    "scheduler_": (ALL, "scheduler_cycle events only"),
    "idempotency": (ALL, "no idempotency keys"),
    'state="dead_letter"': (ALL, "final failures stay in the job table"),
    "dead_letter_depth": (ALL, "final failures stay in the job table"),
    "retried": (PGBOSS | GRAPHILE, "a retried attempt leaves no row of its own"),
    "jobs_retry": (PGBOSS | GRAPHILE, "a retried attempt leaves no row of its own"),
    "completed": (GRAPHILE, "graphile-worker deletes a job when it completes"),
    "failed": (GRAPHILE, "graphile-worker keeps no row per failed attempt"),
    "jobs_finished": (GRAPHILE, "graphile-worker deletes a job when it completes"),
    "jobs_failure": (GRAPHILE, "graphile-worker keeps no row per failed attempt"),
    "execution_seconds": (GRAPHILE, "no runtimes without finished rows"),
    "wait_seconds": (GRAPHILE, "no wait times without finished rows"),
}


def test_postgres_queue_dashboards_have_data(
    postgres_dsn: str, run_exporter: Any, tmp_path: Path
) -> None:
    from tests.procrastinate_app.tasks import app as procrastinate_app

    boss = PgBoss(12, postgres_dsn, tmp_path / "pgboss")
    graphile = GraphileWorker("016", postgres_dsn, tmp_path / "graphile")
    (tmp_path / "pgboss").mkdir()
    (tmp_path / "graphile").mkdir()
    connector = procrastinate.PsycopgConnector(conninfo=postgres_dsn)
    with procrastinate_app.replace_connector(connector) as app, app.open():
        app.schema_manager.apply_schema()
        boss.seed()
        graphile.seed()
        exporter = run_exporter(
            {
                "presets": [
                    "procrastinate",
                    {"name": "pgboss", "params": {"native": True, "active_interval": 0.5}},
                    {"name": "graphile_worker", "params": {"locked_interval": 0.5}},
                ],
                "sample_interval": 0.5,
            },
            postgres_dsn=postgres_dsn,
        )
        wait_for(lambda: exporter.health.snapshot()["native:procrastinate"].up, timeout=30)
        wait_for(lambda: exporter.health.snapshot()["native:pgboss"].up, timeout=30)
        prometheus = Prometheus(tmp_path, [f"127.0.0.1:{exporter.server.port}"])
        started = []
        try:
            wait_for(prometheus.ready, timeout=30)
            wait_for(lambda: prometheus.query(f'up{{job="{SCRAPE_JOB}"}} == 1'), timeout=60)
            release = tmp_path / "release"
            for _ in range(60):
                app.tasks["nap"].configure(queue="emails").defer(seconds=0.15)
            for _ in range(6):
                app.tasks["explode"].configure(queue="emails").defer()
            app.tasks["flaky"].configure(queue="reports").defer()
            app.tasks["send_email"].configure(queue="reports", schedule_in={"hours": 1}).defer(
                to="x"
            )
            app.tasks["send_email"].configure(queue="idle").defer(to="waits")
            app.tasks["send_email"].configure(queue="idle", schedule_in={"seconds": 1}).defer(
                to="due"
            )
            app.tasks["hold"].configure(queue="slow").defer(release=str(release))
            started.append(_worker(postgres_dsn, WORKED_QUEUES))
            started.append(boss.worker())
            started.append(graphile.worker())
            wait_until_fed(prometheus.query, FAST_RULES, SYSTEMS, NOT_FED)
            _keda_reads_what_each_library_holds(prometheus, app, boss, graphile)
        finally:
            prometheus.stop()
            for path in (tmp_path / "release", boss.release, graphile.release):
                path.touch()
            for process in started:
                stop_process(process, 15)


def _keda_reads_what_each_library_holds(
    prometheus: Prometheus, app: procrastinate.App, boss: PgBoss, graphile: GraphileWorker
) -> None:
    """The KEDA example's ScaledObject, unchanged, for a queue of each system that no worker
    serves: its depth trigger's query returns what the library holds there, its age trigger an
    age."""
    jobs, _ = graphile.jobs()
    holds = {
        ("procrastinate", "idle"): len(app.job_manager.list_jobs(queue="idle", status="todo")),
        ("pgboss", "idle"): sum(
            1
            for job in boss.truth()["jobs"]
            if job["queue"] == "idle" and job["state"] == "created"
        ),
        ("graphile_worker", "later"): sum(1 for job in jobs if job["task_identifier"] == "later"),
    }
    queues = [
        {"system": system, "queue": queue, "depthPerReplica": 1, "oldestAgePerReplica": 1}
        for system, queue in holds
    ]
    prometheus_values = {
        "serverAddress": "http://prometheus:9090",
        "selector": f'job="{SCRAPE_JOB}"',
    }
    triggers = _scaled_object({"queues": queues, "prometheus": prometheus_values})["spec"][
        "triggers"
    ]
    served: dict[str, float] = {}

    def answers() -> bool:
        for trigger in triggers:
            result = prometheus.query(trigger["metadata"]["query"])
            served[trigger["name"]] = float(result[0]["value"][1]) if result else -1.0
        depths = [served[f"{s.replace('_', '-')}-{q}-depth"] for s, q in holds]
        ages = [served[f"{s.replace('_', '-')}-{q}-oldest-age"] for s, q in holds]
        return depths == [float(n) for n in holds.values()] and all(age > 0 for age in ages)

    try:
        wait_for(answers, timeout=30, interval=1.0)
    except AssertionError:
        raise AssertionError(
            f"KEDA's queries return {served}; the libraries hold {holds}"
        ) from None
