"""Lifecycle events from Dramatiq: one middleware, one line in the app.

    from exporter.hooks.dramatiq import LifecycleEvents
    broker.add_middleware(LifecycleEvents("redis://localhost:6379/0", "dramatiq:events"))

The middleware emits through the producer library (lifecycle/producer.py): `emit` only
appends to a bounded buffer, a thread sends it, so no Redis call of the events sits in a
message's path and an unavailable events Redis costs dropped events (counted), never the job.
Events carry the trace context of the span active where Dramatiq calls the middleware: inside
the worker's processing of the message, where OpenTelemetry's Dramatiq instrumentation has
attached the job's context.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import redis
from dramatiq import worker as dramatiq_worker
from dramatiq.common import q_name
from dramatiq.middleware import Middleware
from dramatiq.middleware.time_limit import TimeLimitExceeded

from exporter.hooks.process_emitter import ProcessEmitter
from exporter.lifecycle.producer import EventEmitter, classify_error

# The thread class of a Worker's consumers: ConsumerThread since Dramatiq 2, _ConsumerThread before.
_CONSUMER_THREADS = tuple(
    kind
    for name in ("ConsumerThread", "_ConsumerThread")
    if isinstance(kind := getattr(dramatiq_worker, name, None), type)
)

if TYPE_CHECKING:
    from dramatiq import Broker, Message
    from dramatiq.broker import MessageProxy
    from typing_extensions import Unpack

    from exporter.lifecycle.producer import EmitterOptions


class LifecycleEvents(Middleware):
    """enqueued (and scheduled, for a delayed message), started, completed or failed, retried
    (Dramatiq's Retries middleware enqueueing the next attempt) and dead_lettered (a failed
    message nacked into Dramatiq's dead-letter queue), with Dramatiq's own times."""

    def __init__(
        self,
        events: EventEmitter | redis.Redis | str,
        stream: str = "dramatiq:events",
        **options: Unpack[EmitterOptions],
    ) -> None:
        options.setdefault("system", "dramatiq")
        # From a URL or a client: an emitter per process (a broker module imported before a
        # fork, as a preloading web server does, would otherwise buffer in a flusher the child
        # lacks), closed at each process's exit. An emitter of the app's own is used as given.
        self._given: EventEmitter | None = None
        self._emitters: ProcessEmitter | None = None
        if isinstance(events, EventEmitter):
            self._given = events
        else:
            self._emitters = ProcessEmitter(events, stream, **options)
        # Per message being processed: when its attempt started (wall clock, monotonic).
        self._started: dict[str, tuple[float, float]] = {}

    @property
    def emitter(self) -> EventEmitter:
        """This process's emitter."""
        if self._emitters is not None:
            return self._emitters.get()
        assert self._given is not None
        return self._given

    def after_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        if _moved_from_delay_queue(delay):
            return  # a delayed message now due, not a new one: it was counted when sent
        fields = _job_fields(message)
        if delay is not None and message.options.get("retries"):
            # the Retries middleware enqueueing the next attempt
            self.emitter.emit("retried", **fields, delay=delay / 1000)
            return
        self.emitter.emit("enqueued", **fields, ts=message.message_timestamp / 1000)
        if delay is not None:
            self.emitter.emit("scheduled", **fields, delay=delay / 1000)

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        started_at = time.time()
        self._started[message.message_id] = (started_at, time.perf_counter())
        self.emitter.emit("started", **self._attempt_fields(message), ts=started_at)

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        start = self._started.pop(message.message_id, None)
        if start is None:
            return  # its start was not seen (a middleware before this one skipped it)
        started_at, clock = start
        fields = {
            **self._attempt_fields(message),
            "started_at": started_at,
            "duration": time.perf_counter() - clock,
        }
        if exception is None:
            self.emitter.emit("completed", **fields)
            return
        error_type = _error_type(broker, message, exception)
        if error_type == "timeout":
            self.emitter.timed_out(**fields)
        else:
            self.emitter.emit("failed", **fields, error_type=error_type)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        self._started.pop(message.message_id, None)

    def after_nack(self, broker: Broker, message: MessageProxy) -> None:
        # The Retries middleware counted this attempt in `retries` before failing the message.
        attempt = max(int(message.options.get("retries", 0)), 1)
        self.emitter.emit("dead_lettered", **_job_fields(message), attempt=attempt)

    def after_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        self.emitter.flush(timeout=2.0)  # a worker stopping waits this long at most

    def _attempt_fields(self, message: MessageProxy) -> dict[str, Any]:
        return {
            **_job_fields(message),
            "enqueued_at": message.message_timestamp / 1000,
            "attempt": int(message.options.get("retries", 0)) + 1,
        }


def _job_fields(message: Message[Any] | MessageProxy) -> dict[str, Any]:
    return {
        "queue": q_name(message.queue_name),  # a delayed message's queue, not its `.DQ`
        "job_type": message.actor_name,
        "job_id": message.message_id,
    }


def _moved_from_delay_queue(delay: int | None) -> bool:
    """Dramatiq's worker moves a due delayed message to its queue by enqueueing it again from
    its consumer thread (Worker's `handle_delayed_messages`), with no delay."""
    return delay is None and isinstance(threading.current_thread(), _CONSUMER_THREADS)


def _error_type(broker: Broker, message: MessageProxy, error: BaseException) -> str:
    """`timeout` for Dramatiq's time limit, `non_retryable` for an exception the actor
    `throws` (Dramatiq fails those without retrying), else classify_error's."""
    if isinstance(error, TimeLimitExceeded):
        return "timeout"
    throws = message.options.get("throws") or broker.get_actor(message.actor_name).options.get(
        "throws"
    )
    if throws and isinstance(error, throws):
        return "non_retryable"
    return classify_error(error)
