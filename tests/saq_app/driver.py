"""Produce SAQ jobs and read SAQ's own view of its queues.

    python -m tests.saq_app.driver REDIS_URL enqueue PLAN_JSON
    python -m tests.saq_app.driver REDIS_URL truth QUEUE...
    python -m tests.saq_app.driver REDIS_URL jobs QUEUE KEY...

A plan is a list of {"queue", "function", optional "kwargs", "in" (seconds: scheduled that
far ahead, negative: already due), "retries", "retry_delay", "timeout", "key", "ttl"}.
`truth` prints each queue's Queue.info() counts, its failed jobs kept (Queue.iter_jobs), its workers (and those an active job names),
the enqueue time (ms) of the oldest queued job and the start of the oldest active one; `jobs` each job as SAQ's Queue.job(key) reads it, with its durations (Job.duration, ms).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import saq
from saq import Queue
from saq.job import Status


async def enqueue(url: str, plan: list[dict[str, Any]]) -> None:
    queues: dict[str, Queue] = {}
    for step in plan:
        queue = queues.setdefault(step["queue"], Queue.from_url(url, name=step["queue"]))
        options: dict[str, Any] = {
            k: step[k] for k in ("retries", "retry_delay", "timeout", "key", "ttl") if k in step
        }
        if "in" in step:
            options["scheduled"] = int(time.time() + step["in"])
        await queue.enqueue(step["function"], **options, **step.get("kwargs", {}))
        await asyncio.sleep(0.002)  # distinct enqueue times
    for queue in queues.values():
        await queue.disconnect()


async def truth(url: str, names: list[str]) -> dict[str, Any]:
    views = {}
    now_ms = int(time.time() * 1000)
    for name in names:
        queue = Queue.from_url(url, name=name)
        info = await queue.info(jobs=True, limit=10_000)
        queued = [job["queued"] for job in info["jobs"] if job["status"] == "queued"]
        active = [job for job in info["jobs"] if job["status"] == "active"]
        failed = [job async for job in queue.iter_jobs(statuses=[Status.FAILED])]
        started = [job["started"] for job in active]
        views[name] = {
            "queued": info["queued"],
            "active": info["active"],
            "scheduled": info["scheduled"],
            "failed": len(failed),  # the failed jobs' records SAQ keeps (for their ttl)
            "oldest_ms": min(queued, default=None),
            "active_started_ms": min(started, default=None),
            "workers": {worker: info["stats"] for worker, info in info["workers"].items()},
            # the workers running a job: those its record names (SAQ 0.26.1 and later)
            "busy": sorted({job["worker_id"] for job in active} & set(info["workers"])),
        }
        await queue.disconnect()
    return {"version": saq.__version__, "now_ms": now_ms, "queues": views}


async def jobs(url: str, name: str, keys: list[str]) -> dict[str, Any]:
    queue = Queue.from_url(url, name=name)
    found = {}
    for key in keys:
        job = await queue.job(key)
        if job is not None:
            fields = ("function", "attempts", "queued", "started", "completed", "scheduled")
            found[key] = {field: getattr(job, field) for field in fields}
            found[key]["status"] = job.status.value
            found[key]["process"] = job.duration("process")
            found[key]["start"] = job.duration("start")
    await queue.disconnect()
    return found


async def main() -> None:
    url, command, *args = sys.argv[1:]
    if command == "enqueue":
        await enqueue(url, json.loads(args[0]))
    elif command == "truth":
        print(json.dumps(await truth(url, args)))
    elif command == "jobs":
        print(json.dumps(await jobs(url, args[0], args[1:])))
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    asyncio.run(main())
