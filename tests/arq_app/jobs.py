"""The functions real `arq` workers run in the tests, and their settings (from the environment:
ARQ_REDIS_URL, ARQ_QUEUE)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from arq import Retry
from arq.connections import RedisSettings


async def succeed(ctx: dict[str, Any]) -> str:
    return "done"


async def fail(ctx: dict[str, Any]) -> None:
    raise RuntimeError("failing on purpose")


async def retry_later(ctx: dict[str, Any]) -> None:
    raise Retry(defer=3600)  # arq defers it again by an hour: a deferred job with job_try 2


async def sleep_for(ctx: dict[str, Any], seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


class WorkerSettings:
    functions = [succeed, fail, retry_later, sleep_for]
    redis_settings = RedisSettings.from_dsn(os.environ.get("ARQ_REDIS_URL", "redis://"))
    queue_name = os.environ.get("ARQ_QUEUE", "arq:queue")
    max_jobs = 1  # one job at a time: what a long job holds up stays queued behind it
    health_check_interval = 1
    job_timeout = 900
    keep_result = 3600
    poll_delay = 0.1
