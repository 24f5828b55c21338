"""The README's quick start: one `queue-exporter serve` command per system, run as written
(the only changes: the URL or DSN of the test's own backend, and a free listen port) against
data the real library wrote (RQ, Celery, BullMQ, Bull, Bee-Queue, Sidekiq, arq, Dramatiq, Huey, SAQ,
node-resque, Taskiq, django-q2, pg-boss, graphile-worker, Procrastinate, PgQueuer, Oban,
Django's tasks), or that the system's documented layout describes (Orchestrata, Runner-Q:
docs/queue-layouts; Attune: its queue_stats table).
Each command must serve the depth the library itself reports."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.attune_db import Attune
from tests.config.test_preset_graphile_worker import GraphileWorker, graphile_state
from tests.config.test_preset_pgboss import PgBoss, library_depths, pg_time
from tests.conformance.adapters.base import require, run_json
from tests.conformance.adapters.django_tasks import DjangoTasks
from tests.conformance.adapters.oban import oban_driver
from tests.conformance.adapters.python_queues import (
    ARQ_PYTHON,
    DRAMATIQ_PYTHONS,
    HUEY_PYTHONS,
    Dramatiq,
    Huey,
)
from tests.conformance.adapters.taskiq import TASKIQ_PYTHON
from tests.conftest import Series, wait_for
from tests.djangoq_app.control import DEFAULT, DjangoQ
from tests.pgqueuer_app.control import driver as pgqueuer_driver
from tests.real_queues import BeeQueue, Bull, BullMQ, NodeResque, Sidekiq
from tests.saq_app.control import driver as saq_driver

ROOT = Path(__file__).resolve().parents[2]
README_REDIS_URL = "redis://redis:6379/0"
README_POSTGRES = "postgresql://exporter@db:5432/"  # Attune's database, or the app's


def readme_commands() -> dict[str, list[str]]:
    """The one-command-per-system block's commands, by preset, as argv after the program."""
    text = (ROOT / "README.md").read_text()
    block = text.split("One command per system", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    commands = {}
    for line in block.splitlines():
        argv = shlex.split(line, comments=True)
        if argv[:2] == ["queue-exporter", "serve"]:
            presets = [argv[i + 1] for i, word in enumerate(argv) if word == "--preset"]
            assert len(presets) == 1, line
            commands[presets[0]] = argv[1:]
    return commands


def depth(series: Series, system: str, queue: str, state: str = "pending") -> float | None:
    """queue_depth of one queue and state, its priorities summed (None: not served)."""
    values = [
        value
        for (name, labels), value in series.items()
        if name == "queue_depth"
        and {("system", system), ("queue", queue), ("state", state)} <= labels
    ]
    return sum(values) if values else None


# -- each system's real data and its own count ---------------------------------------------------


def rq_data(redis_url: str, **_: Any) -> dict[tuple[str, str], int]:
    plan = [{"queue": "emails", "call": "sleep_for", "seconds": 1}] * 3
    plan += [{"queue": "reports", "call": "sleep_for", "seconds": 1}]
    python = [sys.executable, "-m", "tests.rq_app.driver", redis_url]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([*python, "enqueue", json.dumps(plan)], env=env, check=True, timeout=60)
    done = subprocess.run(
        [*python, "truth", "emails", "reports"], env=env, check=True, timeout=60,
        capture_output=True, text=True,
    )  # fmt: skip
    queues = json.loads(done.stdout)["queues"]
    return {(queue, "pending"): queues[queue]["queued"] for queue in ("emails", "reports")}


def celery_data(redis_url: str, **_: Any) -> dict[tuple[str, str], int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QE_CELERY_BROKER": redis_url}
    driver = [sys.executable, "-m", "tests.celery_app.driver"]
    plan = [{"task": "sleep_for", "seconds": 1}] * 4  # the default queue, celery
    subprocess.run([*driver, "publish", json.dumps(plan)], env=env, check=True, timeout=60)
    done = subprocess.run(
        [*driver, "truth", "celery"], env=env, check=True, timeout=60,
        capture_output=True, text=True,
    )  # fmt: skip
    return {("celery", "pending"): json.loads(done.stdout)["waiting"]["celery"]}


def bullmq_data(redis_db: int, **_: Any) -> dict[tuple[str, str], int]:
    bullmq = BullMQ(5, redis_db)
    bullmq.steps({"op": "add", "queue": "emails", "count": 3})
    counts = bullmq.truth(["emails"])["queues"]["emails"]["counts"]
    return {("emails", "pending"): counts["wait"] + counts["prioritized"] + counts["paused"]}


def bull_data(redis_db: int, **_: Any) -> dict[tuple[str, str], int]:
    """Bull 4 (the bull package): waiting jobs in one queue, a paused queue's jobs in another."""
    bull = Bull(4, redis_db)
    bull.stop(bull.hold(
        {"op": "add", "queue": "emails", "count": 3},
        {"op": "pause", "queue": "exports"},
        {"op": "add", "queue": "exports", "count": 2},
    ))  # fmt: skip
    queues = bull.truth(["emails", "exports"])["queues"]
    return {
        (queue, "pending"): queues[queue]["counts"]["waiting"] + queues[queue]["counts"]["paused"]
        for queue in ("emails", "exports")
    }


def bee_queue_data(redis_db: int, **_: Any) -> dict[tuple[str, str], int]:
    bee_queue = BeeQueue(2, redis_db)
    bee_queue.stop(bee_queue.hold({"op": "add", "queue": "emails", "count": 3}))
    counts = bee_queue.truth(["emails"])["queues"]["emails"]["counts"]
    return {("emails", "pending"): counts["waiting"]}


def sidekiq_data(redis_db: int, **_: Any) -> dict[tuple[str, str], int]:
    sidekiq = Sidekiq(redis_db)
    sidekiq.push({"queue": "default", "count": 2}, {"queue": "critical"})
    queues = sidekiq.truth()["queues"]
    return {(queue, "pending"): queues[queue]["size"] for queue in ("default", "critical")}


def resque_data(redis_db: int, **_: Any) -> dict[tuple[str, str], int]:
    """node-resque's Queue, its default namespace: jobs waiting in two queues."""
    resque = NodeResque(redis_db)
    resque.steps(
        {"op": "enqueue", "queue": "default", "count": 2}, {"op": "enqueue", "queue": "critical"}
    )
    queues = resque.state()["queues"]
    return {(queue, "pending"): queues[queue] for queue in ("default", "critical")}


def django_q_data(redis_url: str, tmp_path: Path, **_: Any) -> dict[tuple[str, str], int]:
    """django-q2's async_task, its default cluster name: tasks waiting in its broker list."""
    django_q = DjangoQ(redis_url, tmp_path / "django.sqlite3")
    django_q.driver(DEFAULT, "enqueue", "succeed", "2")
    return {(DEFAULT, "pending"): django_q.driver(DEFAULT, "truth")["queued"]}


def attune_data(postgres_dsn: str, **_: Any) -> dict[tuple[str, str], int]:
    attune = Attune(postgres_dsn).create_schema()
    try:
        action = attune.add_action("slack.post_message")
        attune.upsert_stats(
            action,
            queue_length=5,
            active_count=2,
            max_concurrent=3,
            oldest_enqueued_at=attune.now() - timedelta(seconds=30),
        )
    finally:
        attune.close()
    return {("slack.post_message", "pending"): 5, ("slack.post_message", "active"): 2}


def orchestrata_data(redis_client: redis.Redis, **_: Any) -> dict[tuple[str, str], int]:
    """Messages as the kernel RPUSHes them (queue-layouts: orchestrata:queue:<recipient>:p<n>)."""
    for priority, count in ((5, 2), (3, 1)):
        for index in range(count):
            message = {
                "packet": {"type": "charge_card"},
                "queued_at": "2026-01-01T00:00:00+00:00",
                "priority": priority,
                "recipient": "billing",
                "message_id": f"m-{priority}-{index}",
            }
            redis_client.rpush(f"orchestrata:queue:billing:p{priority}", json.dumps(message))
    return {("billing", "pending"): 3}


def runnerq_data(redis_client: redis.Redis, **_: Any) -> dict[tuple[str, str], int]:
    """Activities as runner_q ZADDs them (queue-layouts: {q}:priority_queue, member
    "<uuid>:<JSON>", priority = floor(score / 1e6))."""
    for index, score in enumerate((2_000_100.0, 2_000_200.0, 4_000_100.0)):
        activity = {"id": f"00000000-0000-0000-0000-00000000000{index}", "activity_type": "x",
                    "created_at": "2026-01-01T00:00:00Z", "priority": "Normal", "retry_count": 0}  # fmt: skip
        redis_client.zadd(
            "default:priority_queue", {f"{activity['id']}:{json.dumps(activity)}": score}
        )
    return {("default", "pending"): 3}


def arq_data(redis_url: str, **_: Any) -> dict[tuple[str, str], int]:
    """Jobs on arq's default queue, arq:queue (the preset's default listing)."""
    require(ARQ_PYTHON, "arq", "arq")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    driver = [ARQ_PYTHON, "-m", "tests.arq_app.driver", redis_url]
    plan = [{"queue": "arq:queue", "function": "succeed"}] * 3
    run_json([*driver, "enqueue", json.dumps(plan)], env)
    jobs = run_json([*driver, "truth", "arq:queue"], env)["queues"]["arq:queue"]
    return {("arq:queue", "pending"): sum(1 for job in jobs if job["status"] == "queued")}


def dramatiq_data(redis_url: str, tmp_path: Path, **_: Any) -> dict[tuple[str, str], int]:
    python = require(DRAMATIQ_PYTHONS["2"], "dramatiq", "dramatiq2")
    dramatiq = Dramatiq(python, redis_url, tmp_path / "events.jsonl")
    dramatiq.enqueue(*({"actor": "succeed"} for _ in range(3)))
    return {("default", "pending"): dramatiq.run("truth", "default")["qsize"]["default"]}


def huey_data(redis_url: str, **_: Any) -> dict[tuple[str, str], int]:
    """A RedisHuey named huey: the preset's default name."""
    huey = Huey(require(HUEY_PYTHONS["3"], "huey", "huey3"), redis_url, "huey")
    huey.enqueue(*({"task": "succeed"} for _ in range(3)))
    return {("huey", "pending"): huey.truth()["pending"]}


def saq_data(redis_url: str, **_: Any) -> dict[tuple[str, str], int]:
    plan = [{"queue": "default", "function": "succeed"}] * 2
    saq_driver(redis_url, "enqueue", json.dumps(plan))
    return {("default", "pending"): saq_driver(redis_url, "truth", "default")["queues"]["default"]["queued"]}  # fmt: skip


def taskiq_data(redis_url: str, **_: Any) -> dict[tuple[str, str], int]:
    """Tasks sent through taskiq-redis's RedisStreamBroker to its default queue, taskiq."""
    require(TASKIQ_PYTHON, "taskiq_redis", "taskiq-redis")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TASKIQ_REDIS_URL": redis_url}
    env["TASKIQ_BROKER"] = "stream"
    driver = [TASKIQ_PYTHON, "-m", "tests.taskiq_app.driver"]
    run_json([*driver, "kick", json.dumps([{"task": "succeed"}] * 3)], env)
    return {("taskiq", "pending"): run_json([*driver, "truth"], env)["lag"]}


def pgboss_data(postgres_dsn: str, tmp_path: Path, **_: Any) -> dict[tuple[str, str], int]:
    """pg-boss 12's own schema and jobs (tests/node/pgboss.cjs seed): getJobById of each."""
    boss = PgBoss(12, postgres_dsn, tmp_path)
    boss.seed()

    def settled() -> dict[str, Any] | None:
        """pg-boss's jobs once the one sent due a second later is due: read before, the
        truth would count it scheduled while the exporter, reading later, counts it pending."""
        truth = boss.truth()
        starts = [pg_time(job["startAfter"]) or 0 for job in truth["jobs"]]
        soon = [start for start in starts if truth["now"] < start < truth["now"] + 60]
        return None if soon else truth

    depths, _due = library_depths(wait_for(settled, timeout=30))
    return {key: int(n) for key, n in depths.items() if key[1] == "pending" and n}


def graphile_worker_data(postgres_dsn: str, tmp_path: Path, **_: Any) -> dict[tuple[str, str], int]:
    """graphile-worker 0.18's migrations and addJob (tests/node/graphile_worker.cjs seed)."""
    graphile = GraphileWorker("018", postgres_dsn, tmp_path)
    graphile.seed()

    def settled() -> tuple[list[dict[str, Any]], float] | None:
        """Its jobs once the one added due a second later is due (as for pg-boss)."""
        jobs, now = graphile.jobs()
        soon = [job for job in jobs if now < job["run_at"] < now + 60]
        return None if soon else (jobs, now)

    jobs, now = wait_for(settled, timeout=30)
    pending = [job["queue_name"] or job["task_identifier"] for job in jobs if graphile_state(job, now) == "pending"]  # fmt: skip
    return {(queue, "pending"): pending.count(queue) for queue in set(pending)}


def procrastinate_data(postgres_dsn: str, **_: Any) -> dict[tuple[str, str], int]:
    """Procrastinate's own schema, jobs deferred through its task."""
    import procrastinate

    from tests.procrastinate_app.tasks import app as unbound

    connector = procrastinate.PsycopgConnector(conninfo=postgres_dsn)
    with unbound.replace_connector(connector) as app, app.open():
        app.schema_manager.apply_schema()
        for n in range(3):
            app.tasks["send_email"].configure(queue="emails").defer(to=f"user{n}@example.com")
        todo = app.job_manager.list_jobs(queue="emails", status="todo")
    return {("emails", "pending"): len(todo)}


def pgqueuer_data(postgres_dsn: str, **_: Any) -> dict[tuple[str, str], int]:
    """PgQueuer's own schema (Queries.install), jobs enqueued into two entrypoints."""
    pgqueuer_driver(postgres_dsn, "install")
    plan = [{"entrypoint": "emails"}] * 3 + [{"entrypoint": "reports"}]
    pgqueuer_driver(postgres_dsn, "enqueue", json.dumps(plan))
    sizes = pgqueuer_driver(postgres_dsn, "truth")["sizes"]
    return {(size["entrypoint"], "pending"): size["count"] for size in sizes}


def oban_data(postgres_dsn: str, tmp_path: Path, **_: Any) -> dict[tuple[str, str], int]:
    """Oban's own schema (`oban install`), jobs enqueued through its workers (no queue runs:
    they wait), as Oban's get_job says."""
    driver = oban_driver(postgres_dsn)
    driver("install")
    ids = driver("seed", str(tmp_path / "release"))
    jobs = driver("truth", *map(str, ids))["jobs"]
    pending = [job["queue"] for job in jobs if job["state"] == "available"]
    return {(queue, "pending"): pending.count(queue) for queue in set(pending)}


def django_tasks_data(postgres_dsn: str, **_: Any) -> dict[tuple[str, str], int]:
    """Django's tasks (django-tasks-db's migrations, its Task.enqueue): three waiting."""
    django = DjangoTasks(postgres_dsn)
    django.run("migrate")
    django.enqueue(*({"task": "send_email", "queue": "emails", "args": [n]} for n in "abc"))
    ready = [t for t in django.truth()["tasks"] if t["status"] == "READY"]
    return {("emails", "pending"): len(ready)}


SYSTEMS: dict[str, tuple[str, Callable[..., dict[tuple[str, str], int]]]] = {
    "rq": ("rq", rq_data),
    "celery": ("celery", celery_data),
    "bullmq": ("bullmq", bullmq_data),
    "bull": ("bull", bull_data),
    "bee_queue": ("bee_queue", bee_queue_data),
    "sidekiq": ("sidekiq", sidekiq_data),
    "arq": ("arq", arq_data),
    "dramatiq": ("dramatiq", dramatiq_data),
    "huey": ("huey", huey_data),
    "saq": ("saq", saq_data),
    "resque": ("resque", resque_data),
    "taskiq": ("taskiq", taskiq_data),
    "django_q": ("django_q", django_q_data),
    "pgboss": ("pgboss", pgboss_data),
    "graphile_worker": ("graphile_worker", graphile_worker_data),
    "procrastinate": ("procrastinate", procrastinate_data),
    "pgqueuer": ("pgqueuer", pgqueuer_data),
    "oban": ("oban", oban_data),
    "django_tasks": ("django_tasks", django_tasks_data),
    "attune": ("attune", attune_data),
    "orchestrata": ("orchestrata", orchestrata_data),
    "runnerq": ("runnerq", runnerq_data),
}


def test_the_readme_has_one_command_for_each_system():
    assert set(readme_commands()) == set(SYSTEMS)


@pytest.mark.parametrize("preset", sorted(SYSTEMS))
def test_the_readme_command_serves_the_library_s_own_counts(
    preset: str, request: pytest.FixtureRequest, serve_process: Any
) -> None:
    argv = readme_commands()[preset]
    system, write = SYSTEMS[preset]
    backends: dict[str, Any] = {"tmp_path": request.getfixturevalue("tmp_path")}
    if any(word.startswith(README_POSTGRES) for word in argv):
        backends["postgres_dsn"] = request.getfixturevalue("postgres_dsn")
        argv = [
            backends["postgres_dsn"] if word.startswith(README_POSTGRES) else word for word in argv
        ]
    else:
        for name in ("redis_db", "redis_url", "redis_client"):
            backends[name] = request.getfixturevalue(name)
        argv = [backends["redis_url"] if word == README_REDIS_URL else word for word in argv]
    assert README_REDIS_URL not in argv and not any(w.startswith(README_POSTGRES) for w in argv)
    truth = write(**backends)
    assert truth and all(count > 0 for count in truth.values()), truth
    exporter = serve_process(*argv[1:])  # `serve` and the rest, as the README writes them

    def agrees(series: Series) -> bool:
        return all(depth(series, system, queue, state) == count
                   for (queue, state), count in truth.items())  # fmt: skip

    try:
        exporter.series_when(agrees, timeout=45)
    except AssertionError:
        exporter.stop()
        _, log = exporter.process.communicate()
        raise AssertionError(f"{preset}: {truth} not served; its log:\n{log[-3000:]}") from None
    _, log = exporter.sigterm()  # and it ran without an error
    assert re.search(r"\b(ERROR|CRITICAL|Traceback)\b", log) is None, log[-3000:]
