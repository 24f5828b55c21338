"""An arq app with exporter.hooks.arq on its worker settings and its pool: the app the hook's
tests run, with the arq venv's Python (arq pins redis-py below 6).

    python -m tests.hooks.arq_hooked send PLAN_JSON     # one JSON line per job, then the counts
    python -m tests.hooks.arq_hooked truth JOB_IDS_JSON  # arq's own result_info() of each job
    arq tests.hooks.arq_hooked.WorkerSettings           # a real worker; prints "ready", and the
                                                        # emitter's counts at exit

A plan is a list of {"function", optional "args", "defer_by" (seconds)}. Environment: REDIS_URL
(arq's Redis), EVENTS_URL and EVENTS_STREAM (the hook's), EVENTS_BUFFER (its buffer size),
EVENTS_NO_TIMEOUT=1 (an events client without socket timeouts: a call of the hook's that waited
on Redis would then wait for ever), OTEL=1 (an SDK tracer provider and OpenTelemetry's arq
instrumentation, in the sender a span around each enqueue), LATE_START (seconds each job's task holds the loop before
its function runs), TRUTH (a file where the jobs write,
one JSON line a run, their id, their own start and end times and the trace id OpenTelemetry
says is active inside them).
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

import redis.asyncio
from arq import Retry
from arq.connections import RedisSettings, create_pool
from arq.jobs import Job
from arq.worker import func
from opentelemetry import trace

from exporter.hooks.arq import LifecycleEvents

QUEUE = "hooked"
if os.environ.get("OTEL") == "1":
    from opentelemetry.instrumentation.arq import ArqInstrumentor
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())
    ArqInstrumentor().instrument()


def _events_client() -> redis.asyncio.Redis | str:
    url = os.environ["EVENTS_URL"]
    if os.environ.get("EVENTS_NO_TIMEOUT") == "1":
        return redis.asyncio.Redis.from_url(url, socket_timeout=None, socket_connect_timeout=None)
    return url


events = LifecycleEvents(
    _events_client(),
    os.environ["EVENTS_STREAM"],
    buffer_size=int(os.environ.get("EVENTS_BUFFER", "10000")),
    flush_interval=0.01,
)


def _ran(ctx: dict[str, Any], begin: float) -> None:
    span = trace.get_current_span().get_span_context()
    line = {
        "id": ctx["job_id"],
        "begin": begin,
        "end": time.time(),
        "trace_id": f"{span.trace_id:032x}" if span.is_valid else None,
    }
    with open(os.environ["TRUTH"], "a") as out:
        out.write(json.dumps(line) + "\n")


async def work(ctx: dict[str, Any], seconds: float) -> float:
    begin = time.time()
    await asyncio.sleep(seconds)
    _ran(ctx, begin)
    return seconds


async def broken(ctx: dict[str, Any]) -> None:
    _ran(ctx, time.time())
    raise ValueError("failing on purpose")


async def again(ctx: dict[str, Any]) -> str:
    """Asks arq for a second try once, then succeeds."""
    _ran(ctx, time.time())
    if ctx["job_try"] == 1:
        raise Retry(defer=timedelta(milliseconds=100))
    return "done at the second try"


async def slow(ctx: dict[str, Any]) -> None:
    _ran(ctx, time.time())
    await asyncio.sleep(60)  # arq cancels it at its timeout


async def _ready(ctx: dict[str, Any]) -> None:
    print("ready", flush=True)


def _print_counts() -> None:
    emitter = events.emitter
    print(json.dumps({"sent": emitter.sent, "dropped": emitter.dropped_by_reason}), flush=True)


@events.worker  # the one line a worker adds
class WorkerSettings:
    functions = [work, broken, again, func(slow, timeout=0.3)]
    redis_settings = RedisSettings.from_dsn(os.environ["REDIS_URL"])
    queue_name = QUEUE
    max_jobs = 1
    poll_delay = 0.05
    keep_result = 3600
    on_startup = _ready


if os.environ.get("LATE_START"):
    # A stand-in for an instrumentation whose wrapper holds the loop before the job's own
    # coroutine runs (a span exporter's work, say): each job's task starts its function this
    # late after arq started the job's timeout.
    late = float(os.environ["LATE_START"])

    def _started_late(coroutine: Any) -> Any:
        async def started_late(ctx: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            time.sleep(late)
            return await coroutine(ctx, *args, **kwargs)

        return started_late

    WorkerSettings.functions = [
        dataclasses.replace(function, coroutine=_started_late(function.coroutine))
        for function in WorkerSettings.functions
    ]


async def send(plan: list[dict[str, Any]]) -> None:
    pool = events.enqueuer(await create_pool(WorkerSettings.redis_settings))  # the app's line
    tracer = trace.get_tracer(__name__)
    for step in plan:
        options: dict[str, Any] = {"_queue_name": QUEUE}
        if "defer_by" in step:
            options["_defer_by"] = step["defer_by"]
        with tracer.start_as_current_span("request") as span:
            job = await pool.enqueue_job(step["function"], *step.get("args", []), **options)
            context = span.get_span_context()
        sent = {
            "id": job.job_id,
            "function": step["function"],
            "trace_id": f"{context.trace_id:032x}" if context.is_valid else None,
        }
        print(json.dumps(sent), flush=True)
        await asyncio.sleep(0.002)  # distinct enqueue times
    await events.aclose()  # the end of a process that enqueues
    await pool.aclose()
    _print_counts()


async def truth(job_ids: list[str]) -> None:
    pool = await create_pool(WorkerSettings.redis_settings)
    for job_id in job_ids:
        info = await Job(job_id, pool, _queue_name=QUEUE).result_info()
        assert info is not None, f"arq has no result of {job_id}"
        result = {
            "id": job_id,
            "enqueue_time": info.enqueue_time.timestamp(),
            "start_time": info.start_time.timestamp(),
            "finish_time": info.finish_time.timestamp(),
            "success": info.success,
            "job_try": info.job_try,
            "error": None if info.success else type(info.result).__name__,
        }
        print(json.dumps(result), flush=True)
    await pool.aclose()


if __name__ == "__main__":
    if sys.argv[1] == "send":
        asyncio.run(send(json.loads(sys.argv[2])))
    else:
        asyncio.run(truth(json.loads(sys.argv[2])))
else:
    atexit.register(_print_counts)  # the worker's counts, once arq closed the emitter
