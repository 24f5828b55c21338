"""Enqueue Django tasks and read the database backend's own rows.

    python -m tests.django_tasks_app.driver migrate
    python -m tests.django_tasks_app.driver enqueue PLAN_JSON
    python -m tests.django_tasks_app.driver truth

Run with the djangotasks venv (scripts/setup.sh) and DJANGO_TASKS_DSN. `migrate` applies
django-tasks-db's migrations. A plan is a list of {"task", optional "queue", "args",
"priority", "delay" (seconds: run_after)}; `enqueue` prints each step's window, [epoch
seconds before, after]. `truth` prints every task as the backend's DBTaskResult model holds it
(its `task_result`: status, queue, run_after, the enqueue, start and finish times as epoch
seconds) and the database's now().
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django_tasks_app.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402
from django_tasks_db.models import DBTaskResult, get_date_max  # noqa: E402

from tests.django_tasks_app.tasks import TASKS  # noqa: E402


def enqueue(plan: list[dict[str, Any]]) -> list[tuple[float, float]]:
    windows = []
    for step in plan:
        options: dict[str, Any] = {"queue_name": step.get("queue", "default")}
        if "priority" in step:
            options["priority"] = step["priority"]
        if "delay" in step:
            options["run_after"] = timezone.now() + datetime.timedelta(seconds=step["delay"])
        before = time.time()
        TASKS[step["task"]].using(**options).enqueue(*step.get("args", []))
        windows.append((before, time.time()))
    return windows


def _epoch(moment: datetime.datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


def truth() -> dict[str, Any]:
    tasks = []
    for row in DBTaskResult.objects.all():
        result = row.task_result
        run_after = row.run_after
        tasks.append(
            {
                "id": result.id,
                "queue": row.queue_name,
                "status": str(result.status),
                # the backend stores "no run_after" as its date max (9999-01-01)
                "run_after": None if run_after == get_date_max() else run_after.timestamp(),
                "enqueued_at": _epoch(result.enqueued_at),
                "started_at": _epoch(result.started_at),
                "finished_at": _epoch(result.finished_at),
            }
        )
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM now())::float8")
        (now,) = cursor.fetchone()
    return {"now": now, "tasks": tasks}


def main() -> None:
    command = sys.argv[1]
    if command == "migrate":
        call_command("migrate", verbosity=0)
    elif command == "enqueue":
        print(json.dumps(enqueue(json.loads(sys.argv[2]))))
    elif command == "truth":
        print(json.dumps(truth()))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main()
