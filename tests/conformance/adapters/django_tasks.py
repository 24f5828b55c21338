"""Django's tasks framework (django-tasks 0.12, its database backend django-tasks-db) on Django
5.2, in a venv of its own (scripts/setup.sh): the backend's own migrations, tasks enqueued
through Task.using().enqueue() and run by a real `db_worker`; the truth is the backend's own
rows (DBTaskResult and its task_result), read at each scrape (tests/django_tasks_app)."""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from collections.abc import Iterator
from typing import Any, ClassVar

import psycopg

from exporter.config import presets
from tests.conformance.adapters.base import ROOT, Adapter, Phase, fixed, require, run_json
from tests.conformance.checks import Age, ReadAge, Truth
from tests.conftest import stop_process, wait_for

PYTHON = ROOT / ".venv/tools/djangotasks/bin/python"
SOURCES = (
    "postgres:django_tasks_ready",
    "postgres:django_tasks_due",
    "postgres:django_tasks_kept",
)
STATES = ("pending", "scheduled", "active", "failed", "completed")
WORKED_QUEUES = "default,emails,slow"  # "idle" has no worker: its tasks wait
DUE_IN = 1.0  # seconds: the one idle task enqueued for later, due soon after
QUEUES = ("default", "emails", "slow", "idle")
# What an operator runs to let the native reader count finished tasks (docs/presets.md)
FINISHED_INDEX = (
    "CREATE INDEX CONCURRENTLY django_tasks_finished_idx ON django_tasks_database_dbtaskresult"
    " (finished_at, id) WHERE finished_at IS NOT NULL"
)
NO_INDEX = "django-tasks-db makes no index on finished_at: the native reader says why, silent"


def library_state(task: dict[str, Any], now: float) -> str:
    """The exporter's state of a task as the backend records it (its status, run_after)."""
    status = task["status"]
    if status == "READY":
        later = task["run_after"] is not None and task["run_after"] > now
        return "scheduled" if later else "pending"
    return {"RUNNING": "active", "FAILED": "failed", "SUCCESSFUL": "completed"}[status]


class DjangoTasks:
    """The test's Django project (tests/django_tasks_app) on its own database."""

    def __init__(self, dsn: str) -> None:
        self.python = require(PYTHON, "django_tasks_db", "djangotasks")
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DJANGO_TASKS_DSN": dsn,
            "DJANGO_SETTINGS_MODULE": "tests.django_tasks_app.settings",
        }

    def run(self, *args: str) -> Any:
        return run_json([self.python, "-m", "tests.django_tasks_app.driver", *args], self.env)

    def enqueue(self, *steps: dict[str, Any]) -> list[tuple[float, float]]:
        windows: list[tuple[float, float]] = self.run("enqueue", json.dumps(list(steps)))
        return windows

    def truth(self) -> dict[str, Any]:
        """Every task row ({"tasks": [...]}) and the database's now ("now")."""
        found: dict[str, Any] = self.run("truth")
        return found

    def worker(self) -> subprocess.Popen[bytes]:
        """The real `db_worker` management command, on the library's defaults but its queues."""
        return subprocess.Popen(
            [self.python, "-m", "django", "db_worker", "--queue-name", WORKED_QUEUES],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


class DjangoTasksAdapter(Adapter):
    """Tasks enqueued on four queues: on `default` they complete and fail, on `slow` one runs
    until released, on `idle` (no worker) they wait, one of them enqueued to run a second
    later (then due), two an hour later; one on `emails` waits an hour. Then the held task
    completes, and more complete and fail. Version `_indexed`: the operator made the index on
    finished_at the native reader needs (FINISHED_INDEX); it counts what finishes after its
    first read."""

    system = "django_tasks"
    backend = "postgres"
    versions: ClassVar[tuple[Any, ...]] = (None, "_indexed")

    @classmethod
    def not_served(cls, version: Any) -> dict[str, str]:
        return {} if version else {"completed": NO_INDEX, "failed": NO_INDEX}

    def variants(self) -> dict[str, list[Any]]:
        # with the defaults, running, failed and completed tasks are read every scan_interval
        tuned = {"name": "django_tasks", "params": {"scan_interval": 0.5}}
        return {**super().variants(), "tuned": [tuned]}

    def phases(self) -> Iterator[Phase]:
        django = DjangoTasks(self.backend_url)
        django.run("migrate")
        if self.version:
            with psycopg.connect(self.backend_url, autocommit=True) as connection:
                connection.execute(FINISHED_INDEX)
        release = self.tmp_path / "release"
        django.enqueue(
            *({"task": "send_email", "args": [f"user{n}"]} for n in range(3)),
            *({"task": "explode"} for _ in range(2)),
            {"task": "send_email", "queue": "emails", "args": ["x"], "delay": 3600},
            {"task": "hold", "queue": "slow", "args": [str(release)]},
            *({"task": "send_email", "queue": "idle", "args": [f"w{n}"]} for n in range(4)),
            {"task": "send_email", "queue": "idle", "args": ["due"], "delay": DUE_IN},
            *({"task": "send_email", "queue": "idle", "args": ["y"], "delay": 3600} for _ in "ab"),
        )
        worker = django.worker()
        try:

            def settled() -> dict[str, Any] | None:
                library = django.truth()
                statuses = Counter((t["queue"], t["status"]) for t in library["tasks"])
                due = [t["run_after"] for t in library["tasks"] if t["run_after"] is not None]
                done = (
                    statuses["default", "SUCCESSFUL"] == 3
                    and statuses["default", "FAILED"] == 2
                    and statuses["slow", "RUNNING"] == 1
                    and library["now"] > min(due) + 0.5  # the idle task for later is due
                )
                return library if done else None

            running = wait_for(settled, timeout=60)
            if self.version:
                # the reader's baseline: rows finished finished_margin before its first read
                # (database clock); the seed's last finish that long ago, it counts them all
                margin = float(presets.read("django_tasks")["params"]["finished_margin"])
                last = max(t["finished_at"] or 0.0 for t in running["tasks"])
                wait_for(lambda: django.truth()["now"] > last + margin + 0.5, timeout=30)
            seeded = {t["id"] for t in running["tasks"] if t["finished_at"] is not None}
            started = next(t["started_at"] for t in running["tasks"] if t["status"] == "RUNNING")
            idle_first = min(
                t["run_after"] or t["enqueued_at"]
                for t in running["tasks"]
                if t["queue"] == "idle" and library_state(t, running["now"]) == "pending"
            )

            def finished_since(library: dict[str, Any]) -> dict[tuple[str, ...], float]:
                """What the native reader counts, per queue: every task finished since its
                first read (none finished before it: `seeded`), as the backend's rows say."""
                if not self.version:
                    return {}
                ended = Counter(
                    (t["queue"], t["status"])
                    for t in library["tasks"]
                    if t["finished_at"] is not None and t["id"] not in seeded
                )
                return {
                    (f"queue_jobs_{name}_total", queue): float(ended[queue, status])
                    for queue in QUEUES
                    for name, status in (("completed", "SUCCESSFUL"), ("failed", "FAILED"))
                }

            def truth(holding: bool) -> Truth:
                library = django.truth()
                now = library["now"]
                depths = Counter({(t["queue"], s): 0 for t in library["tasks"] for s in STATES})
                due: Counter[str] = Counter()
                for task in library["tasks"]:
                    depths[task["queue"], library_state(task, now)] += 1
                    if task["status"] == "READY" and (task["run_after"] or now + 1) <= now:
                        due[task["queue"]] += 1
                ages: dict[tuple[str, str], Age | ReadAge | None] = {
                    ("idle", "pending"): Age.at(idle_first),
                    ("slow", "active"): (
                        ReadAge(started, "postgres:django_tasks_kept") if holding else None
                    ),
                }
                return Truth(
                    "django_tasks",
                    now,
                    {key: float(n) for key, n in depths.items()},
                    exact_states=True,
                    due={queue: float(n) for queue, n in due.items()},
                    exact_due=True,
                    ages=ages,
                    exact_ages=True,
                    totals=finished_since(library),
                    sources_up=(*SOURCES, "native:django_tasks"),
                )

            yield lambda _at: truth(holding=True)
            release.touch()  # the held task completes: active drops to 0, its age goes
            wait_for(
                lambda: all(t["status"] != "RUNNING" for t in django.truth()["tasks"]),
                timeout=30,
            )
            # read every scan_interval (30 s by default): only the tuned run follows at once
            yield (lambda _at: truth(holding=False)), ("tuned",)
            # more complete and fail after the reader's first read: counted (counters only)
            django.enqueue({"task": "send_email", "args": ["z"]}, {"task": "explode"})
            wait_for(
                lambda: all(
                    t["finished_at"] for t in django.truth()["tasks"] if t["queue"] == "default"
                ),
                timeout=30,
            )
            library = django.truth()
            yield fixed(Truth("django_tasks", library["now"], None, totals=finished_since(library)))
        finally:
            release.touch()
            stop_process(worker, 15)
