"""RQ's lifecycle as v1 events, from RQ's own extension points: a worker class and a queue class.

    rq worker --worker-class exporter.hooks.rq.EventWorker emails      # the worker: one flag
    queue = exporter.hooks.rq.EventQueue("emails", connection=redis)  # the producer: its Queue

with the stream named by `QUEUE_EXPORTER_EVENTS_STREAM` (and, optionally, the Redis by
`QUEUE_EXPORTER_EVENTS_URL`, else the queue's own; the system label by
`QUEUE_EXPORTER_EVENTS_SYSTEM`, else `rq`), or by `configure(...)` in code.

| RQ | event |
|---|---|
| EventQueue.enqueue_job | `enqueued` at RQ's enqueued_at (a retry, re-enqueued by RQ, is not a new job; a job deferred on a dependency is not enqueued yet) |
| EventWorker.execute_job, before the work horse | `started` (with RQ's enqueued_at) |
| the job's status once the horse is done | `completed` / `failed` at RQ's ended_at, with RQ's started_at and the duration between them; a `JobTimeoutException` is error_type `timeout` (and `timed_out`), a job left for another attempt `failed` (`retryable`) then `retried` |

Every event is emitted by the worker's main process, whose emitter lives as long as it does:
the work horse (a fork that ends with os._exit) emits nothing, so the job never waits on the
event stream, and an outage costs buffered events (dropped and counted), never the job.

Trace context: EventQueue stores the traceparent of the span active at enqueue in the job's
meta (`traceparent`); the worker attaches it (opentelemetry-api alone) around the job's
execution, so the worker's events carry it and the spans the job starts are its children.
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import redis
from opentelemetry import context as otel_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from rq import Queue, SimpleWorker, Worker
from rq.exceptions import NoSuchJobError
from rq.job import JobStatus

from exporter.core.logs import LogLimiter
from exporter.hooks.process_emitter import ProcessEmitter
from exporter.lifecycle import wire
from exporter.lifecycle.producer import URL_CLIENT_TIMEOUTS, EventEmitter, traceparent_of
from exporter.lifecycle.rq_failures import rq_error_type

if TYPE_CHECKING:
    from contextvars import Token

    from rq.job import Job
    from typing_extensions import Unpack

    from exporter.lifecycle.producer import EmitterOptions

STREAM_ENV = "QUEUE_EXPORTER_EVENTS_STREAM"
URL_ENV = "QUEUE_EXPORTER_EVENTS_URL"
SYSTEM_ENV = "QUEUE_EXPORTER_EVENTS_SYSTEM"
TRACEPARENT = "traceparent"  # the job.meta key of the enqueuer's trace context
_PROPAGATOR = TraceContextTextMapPropagator()
_limited = LogLimiter(logging.getLogger(__name__))
_configured: dict[str, Any] = {}
_emitters: ProcessEmitter | None = None


def configure(
    client: redis.Redis | str | None = None,
    stream: str | None = None,
    **options: Unpack[EmitterOptions],
) -> None:
    """Where the events go, in code (before the first job): the environment's settings
    otherwise. `client` None: the queue's own Redis."""
    global _emitters
    _configured.clear()
    _configured.update(client=client, stream=stream, options=options)
    _emitters = None


def emitter_for(connection: redis.Redis) -> EventEmitter:
    """This process's emitter, made on first use from configure() or the environment."""
    global _emitters
    if _emitters is None:
        stream = _configured.get("stream") or os.environ.get(STREAM_ENV)
        if not stream:
            raise RuntimeError(
                f"exporter.hooks.rq: no event stream: set {STREAM_ENV} or call configure()"
            )
        client = _configured.get("client") or os.environ.get(URL_ENV) or _own_client(connection)
        options = {"system": os.environ.get(SYSTEM_ENV) or "rq", **_configured.get("options", {})}
        _emitters = ProcessEmitter(client, stream, **options)
    return _emitters.get()


def _own_client(connection: redis.Redis) -> redis.Redis:
    """A client of the queue's Redis with the producer's deadlines (RQ's may have none)."""
    own = connection.connection_pool
    kwargs = {**own.connection_kwargs, **URL_CLIENT_TIMEOUTS}
    return redis.Redis(connection_pool=redis.ConnectionPool(own.connection_class, **kwargs))


class EventQueue(Queue):
    """A Queue whose enqueue_job emits `enqueued` and keeps the active trace context."""

    def enqueue_job(self, job: Job, *args: Any, **kwargs: Any) -> Job:
        traceparent = traceparent_of(otel_context.get_current())
        if traceparent is not None:
            job.meta[TRACEPARENT] = traceparent
        job = super().enqueue_job(job, *args, **kwargs)
        if job.get_status(refresh=False) == JobStatus.DEFERRED:
            return job  # reaches the queue when what it waits on ends: not `enqueued` now
        fields = {"queue": self.name, "job_type": job.func_name or "", "job_id": job.id}
        emitter_for(self.connection).emit(
            "enqueued", **fields, ts=_epoch(job.enqueued_at), traceparent=traceparent
        )
        return job


class _EventsOfJobs:
    """execute_job wrapped: `started` before it, the outcome RQ recorded after it."""

    connection: redis.Redis

    def execute_job(self, job: Job, queue: Queue) -> None:
        emitter = emitter_for(self.connection)
        token = _attach(job.meta.get(TRACEPARENT))
        try:
            fields = _fields(job, queue)
            emitter.emit("started", **fields, enqueued_at=_epoch(job.enqueued_at))
            super().execute_job(job, queue)  # type: ignore[misc]
            _emit_outcome(emitter, job, fields)
        finally:
            if token is not None:
                otel_context.detach(token)


class EventWorker(_EventsOfJobs, Worker):
    """RQ's forking Worker, emitting each job's lifecycle (`--worker-class`)."""


class SimpleEventWorker(_EventsOfJobs, SimpleWorker):
    """RQ's SimpleWorker (the job runs in the worker's process), emitting the same."""


def _attach(traceparent: object) -> Token[otel_context.Context] | None:
    if not isinstance(traceparent, str):
        return None
    return otel_context.attach(_PROPAGATOR.extract({TRACEPARENT: traceparent}))


def _fields(job: Job, queue: Queue) -> dict[str, wire.FieldValue]:
    return {"queue": queue.name, "job_type": job.func_name or "", "job_id": job.id}


def _emit_outcome(emitter: EventEmitter, job: Job, fields: dict[str, wire.FieldValue]) -> None:
    """What RQ recorded of the run: its status, started_at, ended_at and exception."""
    try:
        job.refresh()  # type: ignore[no-untyped-call]
    except NoSuchJobError:  # deleted at once (result_ttl=0): finished, its times gone
        emitter.emit("completed", **fields)
        return
    status = job.get_status(refresh=False)
    times: dict[str, wire.FieldValue] = {}
    started_at, ended_at = _epoch(job.started_at), _epoch(job.ended_at)
    if started_at is not None and ended_at is not None:
        times = {"ts": ended_at, "started_at": started_at, "duration": ended_at - started_at}
    if status == JobStatus.FINISHED:
        emitter.emit("completed", **fields, **times, enqueued_at=_epoch(job.enqueued_at))
    elif status in (JobStatus.QUEUED, JobStatus.SCHEDULED):  # RQ left it another attempt
        emitter.emit("failed", **fields, error_type="retryable")
        emitter.emit("retried", **fields)
    elif status in (JobStatus.FAILED, JobStatus.STOPPED):
        error_type = rq_error_type(_exception_text(job)) if status == JobStatus.FAILED else "other"
        if error_type == "timeout":
            emitter.timed_out(**fields, **times)
        else:
            emitter.emit("failed", **fields, **times, error_type=error_type)
    else:  # canceled or deleted under the run, say: no end RQ recorded, none made up
        _limited.warning(
            ("status", status),
            "RQ job %s of %s ended its run with status %r: no end event emitted",
            job.id,
            fields["job_type"],
            str(status),
        )


def _exception_text(job: Job) -> str:
    result = job.latest_result()
    text = getattr(result, "exc_string", None) if result is not None else None
    return text or job.exc_info or ""


def _epoch(moment: datetime | None) -> float | None:
    """RQ's times are UTC, naive in RQ 1 and 2."""
    if moment is None:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
