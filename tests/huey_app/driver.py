"""Produce Huey tasks and read Huey's own counts.

    python -m tests.huey_app.driver enqueue PLAN_JSON
    python -m tests.huey_app.driver truth

A plan is a list of {"task", optional "args", "priority", "delay" (seconds; negative: an eta
already past)}, on the huey of $HUEY_NAME / $HUEY_PRIORITY; `enqueue` prints each step's
enqueue window, [epoch seconds before, after]. `truth` prints its pending_count(),
scheduled_count(), how many scheduled() tasks are due and how many pending() tasks wait at each
priority.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from collections import Counter
from typing import Any

import huey as huey_package

from tests.huey_app.tasks import TASKS, huey


def _utcnow() -> datetime.datetime:
    """Now as Huey (utc=True, its default) writes etas: naive UTC."""
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None)


def enqueue(plan: list[dict[str, Any]]) -> list[tuple[float, float]]:
    windows = []
    for step in plan:
        before = time.time()
        task = TASKS[step["task"]]
        options: dict[str, Any] = {}
        if "priority" in step:
            options["priority"] = step["priority"]
        if "delay" in step:
            eta = _utcnow() + datetime.timedelta(seconds=step["delay"])
            task.schedule(args=tuple(step.get("args", [])), eta=eta, **options)
        else:
            task(*step.get("args", []), **options)
        windows.append((before, time.time()))
    return windows


def truth() -> dict[str, Any]:
    now = _utcnow()
    return {
        "version": huey_package.__version__,
        "pending": huey.pending_count(),
        "scheduled": huey.scheduled_count(),
        "due": sum(1 for task in huey.scheduled() if task.eta <= now),
        # a task enqueued without a priority is put at 0 (RedisPriorityQueue.enqueue)
        "priorities": Counter(str(task.priority or 0) for task in huey.pending()),
    }


def main() -> None:
    command, *args = sys.argv[1:]
    if command == "enqueue":
        print(json.dumps(enqueue(json.loads(args[0]))))
    elif command == "truth":
        print(json.dumps(truth()))
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main()
