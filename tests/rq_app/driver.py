"""Produce RQ jobs and read RQ's own counts, with whichever RQ this Python has.

    python -m tests.rq_app.driver REDIS_URL enqueue PLAN_JSON
    python -m tests.rq_app.driver REDIS_URL truth QUEUE...

A plan is a list of {"queue", "call": "sleep_for"|"fail_after", "seconds", optional
"timeout", "retries", "in" (seconds: scheduled), "after" (index of a job it depends on),
"cancel": true, "rate_limit": [key, concurrency] (RQ 3)}. `truth` prints, per queue, Queue.count and each registry's count, the scheduled jobs already
due, the head job's enqueue time, the earliest start among the started registry's jobs, and
the names of all queues (Queue.all).
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, timedelta

import rq
from redis import Redis
from rq import Queue, Retry
from rq.job import Job
from rq.registry import (
    CanceledJobRegistry,
    DeferredJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    ScheduledJobRegistry,
    StartedJobRegistry,
)

from tests.rq_app import jobs

try:  # RQ 3
    from rq.rate_limit import RateLimit, RateLimitRegistry
except ImportError:
    RateLimit = RateLimitRegistry = None  # type: ignore[assignment,misc]


def enqueue(connection: Redis, plan: list[dict]) -> list[str]:
    made = []
    for step in plan:
        queue = Queue(step["queue"], connection=connection)
        function = getattr(jobs, step["call"])
        options: dict = {}
        if "timeout" in step:
            options["job_timeout"] = step["timeout"]
        if "retries" in step:
            options["retry"] = Retry(max=step["retries"])
        if "rate_limit" in step and RateLimit is not None:  # RQ 3: at most N at a time
            options["rate_limit"] = RateLimit(*step["rate_limit"])
        if "after" in step:
            options["depends_on"] = made[step["after"]]
        if "in" in step:
            job = queue.enqueue_in(
                timedelta(seconds=step["in"]), function, step["seconds"], **options
            )
        else:
            job = queue.enqueue(function, step["seconds"], **options)
        if step.get("cancel"):
            job.cancel()
        made.append(job)
    return [job.id for job in made]


def truth(connection: Redis, names: list[str]) -> dict:
    registries = {
        "started": StartedJobRegistry,
        "finished": FinishedJobRegistry,
        "failed": FailedJobRegistry,
        "deferred": DeferredJobRegistry,
        "scheduled": ScheduledJobRegistry,
        "canceled": CanceledJobRegistry,
    }
    counts = {}
    for name in names:
        queue = Queue(name, connection=connection)
        entry = {"queued": queue.count}
        for state, registry in registries.items():
            entry[state] = registry(name, connection=connection).count
        counts[name] = entry
    if RateLimitRegistry is not None:  # jobs held back by a rate limit, by their queue
        for registry in RateLimitRegistry.all(connection):
            for job_id in registry.get_rate_limited_job_ids():
                origin = Job.fetch(job_id, connection=connection).origin
                if origin in counts:
                    counts[origin]["rate_limited"] = counts[origin].get("rate_limited", 0) + 1
    due, oldest, running_since = {}, {}, {}
    for name in names:
        started = StartedJobRegistry(name, connection=connection).get_job_ids()
        jobs_running = [job for job in Job.fetch_many(started, connection=connection) if job]
        times = [
            job.started_at.replace(tzinfo=UTC).timestamp() for job in jobs_running if job.started_at
        ]
        running_since[name] = min(times, default=None)
    for name in names:
        queue = Queue(name, connection=connection)
        due[name] = len(ScheduledJobRegistry(name, connection=connection).get_jobs_to_schedule())
        head = queue.jobs[:1]
        oldest[name] = head[0].enqueued_at.replace(tzinfo=UTC).timestamp() if head else None
    return {
        "version": rq.__version__,
        "queues": counts,
        "runtimes": _runtimes(connection, names),
        "due": due,
        "oldest_enqueued_at": oldest,
        "running_since": running_since,  # the earliest started_at of the started registry
        "all_queues": sorted(queue.name for queue in Queue.all(connection=connection)),
    }


def _runtimes(connection: Redis, names: list[str]) -> dict[str, dict[str, list[float]]]:
    """Per queue and function, the seconds each finished job ran, by its own started_at and
    ended_at (RQ's Job)."""
    runtimes: dict[str, dict[str, list[float]]] = {}
    for name in names:
        ids = FinishedJobRegistry(name, connection=connection).get_job_ids()
        for job in Job.fetch_many(ids, connection=connection):
            if job is not None and job.started_at and job.ended_at:
                seconds = (job.ended_at - job.started_at).total_seconds()
                runtimes.setdefault(name, {}).setdefault(job.func_name, []).append(seconds)
    return runtimes


def main() -> None:
    url, command, *args = sys.argv[1:]
    connection = Redis.from_url(url)
    if command == "enqueue":
        print(json.dumps(enqueue(connection, json.loads(args[0]))))
    elif command == "truth":
        print(json.dumps(truth(connection, args)))
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main()
