"""Celery's lifecycle as v1 events, from Celery's own signals: one line in the app.

    exporter.hooks.celery.install(app, "redis://localhost:6379/0", stream="myapp:events")

| Celery | event |
|---|---|
| after_task_publish (the producer) | `enqueued` (a retry's republish is not a new job) |
| the worker's task init, after every task_prerun receiver | `started` (with enqueued_at) |
| task_success | `completed` (duration: the worker's own clock around the task) |
| task_retry | `failed` (error_type `retryable`), `retried` (the retry's delay) |
| task_failure | `failed` (error_type below); `timed_out` too for a time limit |

A hard time limit or a lost pool process is announced by the worker's main process, where the
task's request is not at hand: its `failed` names the queue Celery's router gives the task.

The publisher stamps the message with its publish time (header `queue_exporter_enqueued_at`),
which the worker reads back for the wait and total times. Celery has no dead-letter queue:
a task out of retries fails with its exception, as the last `failed`.

Trace context: every worker event is emitted while the task runs, inside the span
opentelemetry-instrumentation-celery opened for it: `started` is emitted from the loader's
on_task_init, which Celery calls after all task_prerun receivers whatever their order (at
task_prerun itself the task span is active only when the instrumentation connected first).
`enqueued` carries the message's `traceparent` header (the instrumentation's publish span,
the task's trace), else the span active at publish.

Events go through one emitter per process (process_emitter.py): never blocking the task,
dropped and counted when Redis is away longer than the buffer lasts.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery import signals
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded

from exporter.core.logs import LogLimiter
from exporter.hooks.process_emitter import ProcessEmitter
from exporter.lifecycle import wire
from exporter.lifecycle.producer import final_error_type

if TYPE_CHECKING:
    import redis
    from celery import Celery, Task
    from typing_extensions import Unpack

    from exporter.lifecycle.producer import EmitterOptions

_limited = LogLimiter(logging.getLogger(__name__))

ENQUEUED_AT = "queue_exporter_enqueued_at"
TIMEOUTS = (TimeLimitExceeded, SoftTimeLimitExceeded)
MAX_FAILURES_REMEMBERED = 1024
# Tasks started and not ended that a process remembers: more than a pool process runs at once
# (one; a thread pool's threads), bounding what tasks ending unannounced (no success, failure
# or retry signal: Reject, Ignore) leave; no task_postrun receiver to pop them costs a signal
# dispatch per task less.
MAX_RUNNING_REMEMBERED = 1024


def install(
    app: Celery,
    client: redis.Redis | str,
    stream: str,
    **options: Unpack[EmitterOptions],
) -> CeleryHooks:
    """Emit `app`'s task lifecycle to `stream` (a Redis URL or client; the system label
    `celery` unless options say); returns the hooks (their `emitters.get()` is this process's
    EventEmitter, with its counts)."""
    options.setdefault("system", "celery")
    hooks = CeleryHooks(app, ProcessEmitter(client, stream, **options))
    hooks.connect()
    return hooks


class CeleryHooks:
    def __init__(self, app: Celery, emitters: ProcessEmitter) -> None:
        self.app = app
        self.emitters = emitters
        # task id -> (perf_counter at start, epoch at start), popped at the task's outcome
        self._started: dict[str, tuple[float, float]] = {}
        self._failures: OrderedDict[str, None] = OrderedDict()  # the latest failed task ids

    def connect(self) -> None:
        # weak=False: the receivers are bound methods of an object nobody else holds
        signals.before_task_publish.connect(self._stamp, weak=False)
        signals.after_task_publish.connect(self._published, weak=False)
        signals.task_success.connect(self._succeeded, weak=False)
        signals.task_retry.connect(self._retried, weak=False)
        signals.task_failure.connect(self._failed, weak=False)
        signals.worker_process_shutdown.connect(self._shutdown, weak=False)
        loader = self.app.loader
        on_task_init = loader.on_task_init

        def task_init(task_id: str, task: Task) -> None:
            on_task_init(task_id, task)
            self._task_started(task_id, task)

        loader.on_task_init = task_init

    # -- the producer -------------------------------------------------------------------------

    def _stamp(self, headers: dict[str, Any] | None = None, **_: Any) -> None:
        if headers is not None:
            headers[ENQUEUED_AT] = time.time()

    def _published(
        self,
        sender: str = "",
        headers: dict[str, Any] | None = None,
        routing_key: str = "",
        **_: Any,
    ) -> None:
        headers = headers or {}
        if headers.get("retries"):
            return  # a retry republished: counted by `retried`
        traceparent, stamped = headers.get("traceparent"), headers.get(ENQUEUED_AT)
        fields: dict[str, wire.FieldValue] = {
            "ts": stamped if isinstance(stamped, float) else None,  # as the worker reads it
            "queue": routing_key or "",
            "job_type": str(headers.get("task") or sender),
            "job_id": str(headers.get("id") or ""),
        }
        if isinstance(traceparent, str):
            fields["traceparent"] = traceparent
        self.emitters.get().emit("enqueued", **fields)

    # -- the worker -----------------------------------------------------------------------------

    def _task_started(self, task_id: str, task: Task) -> None:
        if task.app is not self.app:
            return
        if len(self._started) >= MAX_RUNNING_REMEMBERED:  # ended unannounced (Reject, Ignore)
            del self._started[next(iter(self._started))]
        started = self._started[task_id] = (time.perf_counter(), time.time())
        self.emitters.get().emit("started", **self._fields(task), ts=started[1])

    def _succeeded(self, sender: Task, **_: Any) -> None:
        if sender.app is not self.app:
            return
        self.emitters.get().emit("completed", **self._ended(sender))

    def _retried(self, sender: Task, reason: Any = None, **_: Any) -> None:
        if sender.app is not self.app:
            return
        emitter = self.emitters.get()
        fields = self._ended(sender)
        emitter.emit("failed", **fields, error_type="retryable")
        when = getattr(reason, "when", None)
        retry: dict[str, wire.FieldValue] = {}
        if isinstance(when, int | float):
            retry["delay"] = float(when)
        elif isinstance(when, datetime):
            retry["scheduled_for"] = when.timestamp()
        emitter.emit("retried", **self._fields(sender), **retry)

    def _failed(
        self, sender: Task, task_id: str = "", exception: BaseException | None = None, **_: Any
    ) -> None:
        if sender.app is not self.app or self._reported_before(task_id):
            return
        emitter = self.emitters.get()
        if sender.request.id == task_id:
            fields = self._ended(sender)
        else:  # the worker's main process (a hard time limit, a lost pool process): no request
            fields = {"queue": self._routed_queue(sender), "job_type": sender.name}
            fields["job_id"] = task_id
        if isinstance(exception, TIMEOUTS):
            emitter.timed_out(**fields)
        else:
            emitter.emit("failed", **fields, error_type=final_error_type(exception))

    def _reported_before(self, task_id: str) -> bool:
        """Whether a failure of this task was emitted already: Celery 5.7's main process
        sends task_failure twice for a hard time limit (on the timeout, then on the result)."""
        if task_id in self._failures:
            return True
        self._failures[task_id] = None
        if len(self._failures) > MAX_FAILURES_REMEMBERED:
            self._failures.popitem(last=False)
        return False

    def _shutdown(self, **_: Any) -> None:
        self.emitters.close()

    def _routed_queue(self, task: Task) -> str:
        """The queue Celery's router sends the task to (its message's is not known here)."""
        try:
            return str(self.app.amqp.router.route({}, task.name)["queue"].name)
        except Exception as error:  # a router of the app's own that fails: no guess at a queue
            _limited.warning(
                ("router", task.name),
                "celery hook: the router gave no queue for %s (%s: %s): its failure event "
                "carries none",
                task.name,
                type(error).__name__,
                str(error)[:200],
            )
            return ""

    def _fields(self, task: Task) -> dict[str, wire.FieldValue]:
        request = task.request
        delivery = request.delivery_info or {}
        enqueued_at = getattr(request, ENQUEUED_AT, None)
        return {
            "queue": str(delivery.get("routing_key") or ""),
            "job_type": task.name,
            "job_id": str(request.id or ""),
            "worker": str(request.hostname or ""),
            "attempt": (request.retries or 0) + 1,
            "enqueued_at": enqueued_at if isinstance(enqueued_at, int | float) else None,
        }

    def _ended(self, task: Task) -> dict[str, wire.FieldValue]:
        """The task's fields with its duration and start, by the worker's clock."""
        fields = self._fields(task)
        started = self._started.pop(str(task.request.id), None)
        if started is not None:
            fields["duration"] = time.perf_counter() - started[0]
            fields["started_at"] = started[1]
        return fields
