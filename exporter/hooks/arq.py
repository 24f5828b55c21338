"""Lifecycle events from arq: one line for the worker, one for the enqueuing pool.

    from exporter.hooks.arq import LifecycleEvents
    events = LifecycleEvents("redis://localhost:6379/0", "arq:events")

    @events.worker                       # on the worker's settings class
    class WorkerSettings:
        functions = [send_email]

    redis = events.enqueuer(await create_pool(settings))   # in the app that enqueues

The worker's functions are wrapped so that `started` and `completed`, `failed`, `retried` or
`timed_out` are emitted from inside the job's own task: the span active there is the job's
(OpenTelemetry's arq instrumentation opens it around the function, and arq's on_job_start and
on_job_end hooks run outside it). Events go through the asyncio producer (lifecycle/producer.py):
`emit` only appends to a bounded buffer and a task sends it, so no Redis call of the events sits
in a job's path and an unavailable events Redis costs dropped events (counted), never the job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import redis.asyncio
from arq.constants import default_queue_name
from arq.worker import Function, Retry, func

from exporter.lifecycle.producer import AsyncEventEmitter, final_error_type

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from typing_extensions import Unpack

    from exporter.lifecycle.producer import EmitterOptions

# arq's Worker defaults, for settings that do not give them.
DEFAULT_JOB_TIMEOUT = 300.0
# The job's ctx key of the clock read in arq's on_job_start, right before arq starts the job's
# task and its timeout (a cancelled job ran its timeout out when this much time has passed).
TIMER_STARTED = "queue_exporter_timer_started"


class LifecycleEvents:
    """enqueued (and scheduled, for a deferred job) from the enqueuing pool; started, completed,
    failed, retried (a job raising arq's Retry) and timed_out from the worker."""

    def __init__(
        self,
        events: AsyncEventEmitter | redis.asyncio.Redis | str,
        stream: str = "arq:events",
        **options: Unpack[EmitterOptions],
    ) -> None:
        options.setdefault("system", "arq")
        self.emitter = (
            events
            if isinstance(events, AsyncEventEmitter)
            else AsyncEventEmitter(events, stream, **options)
        )

    async def aclose(self) -> None:
        """Send what is buffered (up to 5 s) and stop sending: the end of a process that
        enqueues (a worker's settings do it at its shutdown)."""
        await self.emitter.aclose()

    def worker(self, settings: Any) -> Any:
        """Wrap the functions of arq worker settings (a class, as `arq` takes) and flush the
        events at the worker's shutdown; returns the settings (a class decorator)."""
        queue = getattr(settings, "queue_name", None) or default_queue_name
        job_timeout = _seconds(getattr(settings, "job_timeout", None)) or DEFAULT_JOB_TIMEOUT
        retry_jobs = getattr(settings, "retry_jobs", True)
        settings.functions = [
            self._wrap(entry, queue, job_timeout, retry_jobs) for entry in settings.functions
        ]
        settings.on_job_start = _timing(getattr(settings, "on_job_start", None))
        settings.on_shutdown = self._closing(getattr(settings, "on_shutdown", None))
        return settings

    def enqueuer(self, pool: Any) -> Any:
        """An ArqRedis pool whose enqueue_job also emits `enqueued` (and `scheduled` for a
        deferred job) once arq accepted the job; returns the pool."""
        enqueue_job = pool.enqueue_job
        default_queue = pool.default_queue_name

        @functools.wraps(enqueue_job)
        async def enqueue(function: str, *args: Any, **kwargs: Any) -> Any:
            asked_at = time.time()  # arq takes the job's enqueue_time within this call
            job = await enqueue_job(function, *args, **kwargs)
            if job is not None:  # None: a job with this id exists, nothing was enqueued
                self._enqueued(function, job.job_id, asked_at, default_queue, kwargs)
            return job

        pool.enqueue_job = enqueue
        return pool

    def _enqueued(
        self, function: str, job_id: str, asked_at: float, default_queue: str, kwargs: Any
    ) -> None:
        fields = {
            "queue": kwargs.get("_queue_name") or default_queue,
            "job_type": function,
            "job_id": job_id,
        }
        self.emitter.emit("enqueued", **fields, ts=asked_at)
        defer_until, defer_by = kwargs.get("_defer_until"), _seconds(kwargs.get("_defer_by"))
        if defer_until is not None:
            self.emitter.emit(
                "scheduled", **fields, ts=asked_at, scheduled_for=defer_until.timestamp()
            )
        elif defer_by:
            self.emitter.emit("scheduled", **fields, ts=asked_at, delay=defer_by)

    def _wrap(self, entry: Any, queue: str, job_timeout: float, retry_jobs: bool) -> Function:
        """The arq Function of a settings entry (a coroutine function or arq's Function), its
        coroutine wrapped. A plain coroutine is wrapped before arq makes it a Function, so an
        instrumentation wrapping every Function's coroutine wraps this one, once."""
        function = func(entry)
        coroutine = entry if inspect.iscoroutinefunction(entry) else _own_coroutine(function)
        timeout = function.timeout_s or job_timeout
        emit = self.emitter.emit

        @functools.wraps(coroutine)
        async def run(ctx: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            fields = {
                "queue": queue,
                "job_type": function.name,
                "job_id": ctx.get("job_id"),
                "attempt": ctx.get("job_try"),
                "enqueued_at": _epoch(ctx.get("enqueue_time")),
            }
            started_at = time.time()
            clock = time.perf_counter()
            emit("started", **fields, ts=started_at)
            try:
                result = await coroutine(ctx, *args, **kwargs)
            except asyncio.CancelledError:
                duration = time.perf_counter() - clock
                # Timed from before arq's timer started, not from this task's first line: the
                # task starts a loop turn (and an instrumentation's span) after the timer, so a
                # job cancelled at its timeout had run less than it here (seen in CI, under load).
                if time.perf_counter() - ctx.get(TIMER_STARTED, clock) >= timeout:
                    self.emitter.timed_out(**fields, started_at=started_at, duration=duration)
                raise  # cancelled otherwise (shutdown, abort): arq decides, no end is emitted
            except Exception as error:
                ended = {
                    **fields,
                    "started_at": started_at,
                    "duration": time.perf_counter() - clock,
                }
                if retry_jobs and isinstance(error, Retry):
                    emit("failed", **ended, error_type="retryable")
                    emit("retried", **fields, delay=(error.defer_score or 0) / 1000)
                else:
                    emit("failed", **ended, error_type=final_error_type(error))
                raise
            duration = time.perf_counter() - clock
            emit("completed", **fields, started_at=started_at, duration=duration)
            return result

        if isinstance(entry, Function):
            return dataclasses.replace(function, coroutine=run)
        return func(run, name=function.name)

    def _closing(
        self, on_shutdown: Callable[[dict[str, Any]], Awaitable[None]] | None
    ) -> Callable[[dict[str, Any]], Awaitable[None]]:
        async def shutdown(ctx: dict[str, Any]) -> None:
            if on_shutdown is not None:
                await on_shutdown(ctx)
            await self.aclose()

        return shutdown


def _timing(
    on_job_start: Callable[[dict[str, Any]], Awaitable[None]] | None,
) -> Callable[[dict[str, Any]], Awaitable[None]]:
    """The settings' on_job_start, then the clock read into the job's ctx: arq awaits it right
    before it creates the job's task and starts its timeout, with nothing awaited in between."""

    async def on_start(ctx: dict[str, Any]) -> None:
        if on_job_start is not None:
            await on_job_start(ctx)
        ctx[TIMER_STARTED] = time.perf_counter()

    return on_start


def _own_coroutine(function: Function) -> Any:
    """The coroutine of an arq Function as it was given. An instrumentation that wraps the
    coroutine of every Function when it is set (OpenTelemetry's arq one) would wrap ours around
    its own wrapper, running the job under two spans: the second a new trace. Its wrapper is
    taken off what we read, so the Function we make is wrapped once."""
    coroutine = function.coroutine
    marker = _Marker()
    if dataclasses.replace(function, coroutine=marker).coroutine is not marker:
        return getattr(coroutine, "__wrapped__", coroutine)
    return coroutine


class _Marker:
    """A stand-in coroutine: is what a Function is given what it holds?"""

    __name__ = __qualname__ = "marker"

    async def __call__(self, ctx: dict[str, Any]) -> None:
        return None


def _seconds(value: float | timedelta | None) -> float | None:
    return value.total_seconds() if isinstance(value, timedelta) else value


def _epoch(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()
