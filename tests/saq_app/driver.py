"""Produce SAQ jobs and read SAQ's own view of its queues.

    python -m tests.saq_app.driver REDIS_URL enqueue PLAN_JSON
    python -m tests.saq_app.driver REDIS_URL truth QUEUE...

A plan is a list of {"queue", "function", optional "kwargs", "in" (seconds: scheduled that
far ahead, negative: already due), "retries", "retry_delay", "timeout"}. `truth` prints each
queue's Queue.info() counts and the enqueue time (ms) of the oldest queued job.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import saq
from saq import Queue


async def enqueue(url: str, plan: list[dict[str, Any]]) -> None:
    queues: dict[str, Queue] = {}
    for step in plan:
        queue = queues.setdefault(step["queue"], Queue.from_url(url, name=step["queue"]))
        options: dict[str, Any] = {
            k: step[k] for k in ("retries", "retry_delay", "timeout") if k in step
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
        views[name] = {
            "queued": info["queued"],
            "active": info["active"],
            "scheduled": info["scheduled"],
            "oldest_ms": min(queued, default=None),
            "workers": {worker: info["stats"] for worker, info in info["workers"].items()},
        }
        await queue.disconnect()
    return {"version": saq.__version__, "now_ms": now_ms, "queues": views}


async def main() -> None:
    url, command, *args = sys.argv[1:]
    if command == "enqueue":
        await enqueue(url, json.loads(args[0]))
    elif command == "truth":
        print(json.dumps(await truth(url, args)))
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    asyncio.run(main())
