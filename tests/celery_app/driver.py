"""Publish Celery tasks and read Celery's own counts (QE_CELERY_BROKER, QE_CELERY_SEP).

    python -m tests.celery_app.driver publish PLAN_JSON [--no-sent-event]
    python -m tests.celery_app.driver truth QUEUE...
    python -m tests.celery_app.driver workers

A plan is a list of {"task": "sleep_for"|"fail_after"|"retry_once"|"held"|"to_<queue>",
"seconds", optional "queue", "priority", "soft_time_limit", "countdown"; for "held", "release":
the file that ends it; for "to_<queue>", "outcome"}. `truth` prints, per queue, the message
count kombu reports (`queue_declare(passive=True)`, all priority lists), and the tasks the
workers say they run, hold prefetched and hold until their ETA (`inspect().active()`,
`.reserved()`, `.scheduled()`), by queue. `workers` prints, per queue, the workers that consume
it and their pools' slots (`inspect().active_queues()`, `.stats()` max-concurrency).
`publish --no-sent-event` publishes under Celery's default `task_send_sent_event = False`.
"""

from __future__ import annotations

import json
import sys
from collections import Counter

from amqp.exceptions import ChannelError

from tests.celery_app import app


def publish(plan: list[dict], sent_event: bool = True) -> list[str]:
    app.conf.task_send_sent_event = sent_event  # Celery's default: False
    ids = []
    for step in plan:
        task = app.tasks[f"tests.{step['task']}"]
        options = {
            k: step[k] for k in ("queue", "priority", "soft_time_limit", "countdown") if k in step
        }
        arguments = (
            step["seconds"],
            *([step["release"]] if "release" in step else []),
            *([step["outcome"]] if "outcome" in step else []),
        )
        ids.append(task.apply_async(arguments, **options).id)
    return ids


def truth(queues: list[str]) -> dict:
    waiting = {}
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        for queue in queues:
            try:
                waiting[queue] = channel.queue_declare(queue=queue, passive=True).message_count
            except ChannelError:  # no worker nor producer declared it yet: nothing in it
                waiting[queue] = 0
    inspect = app.control.inspect(timeout=2.0)

    def by_queue(reply: dict | None) -> dict:
        counts: Counter[str] = Counter()
        for tasks in (reply or {}).values():
            for task in tasks:
                counts[task["delivery_info"]["routing_key"]] += 1
        return dict(counts)

    return {
        "waiting": waiting,
        "active": by_queue(inspect.active()),
        "reserved": by_queue(inspect.reserved()),
        "scheduled": by_queue(
            {
                name: [task["request"] for task in tasks]
                for name, tasks in (inspect.scheduled() or {}).items()
            }
        ),
    }


def workers() -> dict:
    """{queue: {"workers": n, "slots": sum of their pools' max-concurrency}}; {} when not
    every worker answered both (a loaded host: ask again)."""
    inspect = app.control.inspect(timeout=2.0)
    stats, queues = inspect.stats() or {}, inspect.active_queues() or {}
    if set(stats) != set(queues):
        return {}
    found: dict[str, dict[str, int]] = {}
    for hostname, consumed in queues.items():
        for queue in consumed:
            entry = found.setdefault(queue["name"], {"workers": 0, "slots": 0})
            entry["workers"] += 1
            entry["slots"] += stats[hostname]["pool"]["max-concurrency"]
    return found


def main() -> None:
    command, *args = sys.argv[1:]
    if command == "publish":
        print(json.dumps(publish(json.loads(args[0]), "--no-sent-event" not in args)))
    elif command == "workers":
        print(json.dumps(workers()))
    elif command == "truth":
        print(json.dumps(truth(args)))
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main()
