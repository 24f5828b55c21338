"""Produce arq jobs and read arq's own view of its queues, with the arq of this Python.

    python -m tests.arq_app.driver REDIS_URL enqueue PLAN_JSON
    python -m tests.arq_app.driver REDIS_URL truth QUEUE...

A plan is a list of {"queue", "function", optional "args", "defer_by" (seconds), "defer_until"
(seconds from now, negative: in the past)}. `truth` prints, per queue, every job in its zset
(queued_jobs()) with its score and Job.status(), and arq's version.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import arq
from arq.connections import ArqRedis, RedisSettings, create_pool
from arq.jobs import Job


async def enqueue(redis: ArqRedis, plan: list[dict[str, Any]]) -> list[str]:
    made = []
    for step in plan:
        options: dict[str, Any] = {"_queue_name": step["queue"]}
        if "defer_by" in step:
            options["_defer_by"] = timedelta(seconds=step["defer_by"])
        if "defer_until" in step:
            options["_defer_until"] = datetime.now(UTC) + timedelta(seconds=step["defer_until"])
        job = await redis.enqueue_job(step["function"], *step.get("args", []), **options)
        assert job is not None
        made.append(job.job_id)
        await asyncio.sleep(0.002)  # distinct enqueue times: the order workers take them in
    return made


async def _queued_jobs(redis: ArqRedis, queue: str) -> list[Any]:
    """arq's queued_jobs, read again when a worker finished a job between its ZRANGE of the
    queue and its GET of the job (arq raises 'job ... not found'): a race of arq's own two reads
    that a busy machine widens."""
    for _ in range(20):
        try:
            return list(await redis.queued_jobs(queue_name=queue))
        except RuntimeError as error:
            if "not found" not in str(error):
                raise
            await asyncio.sleep(0.05)
    return list(await redis.queued_jobs(queue_name=queue))


async def truth(redis: ArqRedis, queues: list[str]) -> dict[str, Any]:
    now_ms = int(time.time() * 1000)
    views: dict[str, Any] = {}
    for queue in queues:
        jobs = []
        for job in await _queued_jobs(redis, queue):
            status = await Job(job.job_id or "", redis, _queue_name=queue).status()
            jobs.append({"id": job.job_id, "score": job.score, "status": status.value})
        views[queue] = jobs
    return {"version": arq.VERSION, "now_ms": now_ms, "queues": views}


async def main() -> None:
    url, command, *args = sys.argv[1:]
    redis = await create_pool(RedisSettings.from_dsn(url))
    try:
        if command == "enqueue":
            print(json.dumps(await enqueue(redis, json.loads(args[0]))))
        elif command == "truth":
            print(json.dumps(await truth(redis, args)))
        else:
            raise SystemExit(f"unknown command {command}")
    finally:
        await redis.aclose()


if __name__ == "__main__":
    asyncio.run(main())
