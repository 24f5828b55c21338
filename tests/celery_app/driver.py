"""Publish Celery tasks and read Celery's own counts (QE_CELERY_BROKER, QE_CELERY_SEP).

    python -m tests.celery_app.driver publish PLAN_JSON [--no-sent-event]
    python -m tests.celery_app.driver truth QUEUE...
    python -m tests.celery_app.driver workers
    python -m tests.celery_app.driver events FILE
    python -m tests.celery_app.driver outcomes FILE

A plan is a list of {"task": "sleep_for"|"fail_after"|"retry_once"|"held"|"to_<queue>",
"seconds", optional "queue", "priority", "soft_time_limit", "countdown"; for "held", "release":
the file that ends it; for "to_<queue>", "outcome"}. `truth` prints, per queue, the message
count kombu reports (`queue_declare(passive=True)`, all priority lists), and the tasks the
workers say they run, hold prefetched and hold until their ETA (`inspect().active()`,
`.reserved()`, `.scheduled()`), by queue. `workers` prints, per queue, the workers that consume
it and their pools' slots (`inspect().active_queues()`, `.stats()` max-concurrency).
`publish --no-sent-event` publishes under Celery's default `task_send_sent_event = False`.
`truth` also prints, per queue, when its longest running task started (`active()`'s
time_start, epoch seconds). `events` runs Celery's event Receiver until stopped, appending each
event the workers send to FILE (a JSON line: type, uuid, name, hostname); `outcomes` prints, per
queue, the tasks FILE saw start, succeed, fail and retry, each on the queue task_routes route
its name to (Celery's router).
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

    active = inspect.active()
    started: dict[str, float] = {}
    for tasks in (active or {}).values():
        for task in tasks:
            queue = task["delivery_info"]["routing_key"]
            started[queue] = min(started.get(queue, task["time_start"]), task["time_start"])
    return {
        "waiting": waiting,
        "active": by_queue(active),
        "started": started,
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


EVENT_FIELDS = ("type", "uuid", "name", "hostname")
OUTCOMES = {
    "task-started": "started",
    "task-succeeded": "succeeded",
    "task-failed": "failed",
    "task-retried": "retried",
}


def record_events(path: str) -> None:
    """Every event Celery's workers send, appended to `path` as it comes, until stopped."""
    with open(path, "a") as out, app.connection_for_read() as connection:

        def write(event: dict) -> None:
            out.write(json.dumps({field: event.get(field) for field in EVENT_FIELDS}) + "\n")
            out.flush()

        app.events.Receiver(connection, handlers={"*": write}).capture(limit=None, timeout=None)


def outcomes(path: str) -> dict:
    """{queue: {"started", "succeeded", "failed", "retried"}}: the task events recorded in
    `path`, each task on the queue its name is routed to (its name from its task-received)."""
    with open(path) as recorded:
        events = [json.loads(line) for line in recorded if line.endswith("\n")]
    names = {e["uuid"]: e["name"] for e in events if e["type"] == "task-received"}
    found: dict[str, Counter[str]] = {}
    for event in events:
        if event["type"] in OUTCOMES:
            queue = app.amqp.router.route({}, names[event["uuid"]])["queue"].name
            found.setdefault(queue, Counter())[OUTCOMES[event["type"]]] += 1
    kinds = OUTCOMES.values()
    return {queue: {kind: counts[kind] for kind in kinds} for queue, counts in found.items()}


def main() -> None:
    command, *args = sys.argv[1:]
    if command == "publish":
        print(json.dumps(publish(json.loads(args[0]), "--no-sent-event" not in args)))
    elif command == "workers":
        print(json.dumps(workers()))
    elif command == "events":
        record_events(args[0])
    elif command == "outcomes":
        print(json.dumps(outcomes(args[0])))
    elif command == "truth":
        print(json.dumps(truth(args)))
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main()
