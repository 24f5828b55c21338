"""The producer library: lifecycle events from a Python queue library, never in its way.

    emitter = EventEmitter("redis://localhost:6379/0", "myapp:events", system="myapp")
    emitter.emit("enqueued", queue="emails", job_type="send", priority="high")
    with emitter.job("emails", "send", enqueued_at=job.enqueued_at, attempt=job.attempt):
        send(job)                      # started, then completed or failed (+ duration)
    emitter.close()

`emit` only appends to a bounded buffer: it never waits on Redis and never raises. A
background flusher (a thread; an asyncio task for AsyncEventEmitter) sends the buffer in
pipelined `XADD ... MAXLEN ~ maxlen` batches. While Redis is unavailable the flusher keeps
one batch to retry and the buffer fills; once it is full, new events are dropped and
counted (`dropped`, `dropped_by_reason`), never queued without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

import redis
import redis.asyncio
from opentelemetry import context as otel_context
from opentelemetry import trace

from exporter.lifecycle import wire

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
Entry = dict[str, str]


def add_entries(pipe: Any, stream: str, entries: Iterable[Entry], maxlen: int) -> None:
    """Queue an `XADD stream MAXLEN ~ maxlen` per entry on a pipeline, sync or asyncio (queuing
    does not touch the network): how the emitters and `queue-exporter emit` write events."""
    for entry in entries:
        pipe.xadd(stream, entry, maxlen=maxlen, approximate=True)


def traceparent_of(context: otel_context.Context) -> str | None:
    """The W3C traceparent of the span active in an OpenTelemetry context, None without one
    (opentelemetry-api alone: no SDK needed)."""
    span_context = trace.get_current_span(context).get_span_context()
    if not span_context.is_valid:
        return None
    trace_id, span_id, flags = span_context.trace_id, span_context.span_id, span_context.trace_flags
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"


def classify_error(error: BaseException) -> str:
    """The error_type label of an exception: its `error_type` attribute when it names a
    class, `timeout` for timeouts, else `other`."""
    declared = getattr(error, "error_type", None)
    if isinstance(declared, str) and declared in wire.ERROR_TYPES:
        return declared
    if isinstance(error, TimeoutError | asyncio.TimeoutError):
        return "timeout"
    return "other"


def final_error_type(error: BaseException | None) -> str:
    """The error_type of a failure after which the job is not retried (a hook's library says
    so): the class an exception declares (classify_error), else `non_retryable`; `other` when
    no exception is known."""
    if error is None:
        return "other"
    declared = classify_error(error)
    return "non_retryable" if declared == "other" else declared


# A client the emitter makes from a URL gives up on a hung Redis after these seconds.
URL_CLIENT_TIMEOUTS: dict[str, Any] = {"socket_timeout": 2, "socket_connect_timeout": 2}


# The fields that make an event observe a run's execution and total times.
_RUN_TIMES = frozenset({"duration", "started_at", "enqueued_at"})


class EmitterOptions(TypedDict, total=False):
    """The emitters' keyword options; their defaults are _Emitter's."""

    system: str | None
    maxlen: int
    buffer_size: int
    batch_size: int
    flush_interval: float
    retry_interval: float


class _Emitter:
    """Buffering, counting and the job helpers shared by the sync and asyncio emitters."""

    def __init__(
        self,
        stream: str,
        *,
        system: str | None = None,
        maxlen: int = 1_000_000,
        buffer_size: int = 10_000,
        batch_size: int = 500,
        flush_interval: float = 0.05,
        retry_interval: float = 1.0,
    ) -> None:
        self.stream = stream
        self.system = system
        self.maxlen = maxlen
        self.buffer_size = buffer_size
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.retry_interval = retry_interval
        self.sent = 0
        self.dropped_by_reason: dict[str, int] = {}
        self.last_error: str | None = None
        self._buffer: deque[Entry] = deque()
        # The batch being sent, or kept to send again: taken from the buffer is not sent, so it
        # stays here until _sent (flush waits for it).
        self._retry: list[Entry] = []
        self._closed = False

    @property
    def dropped(self) -> int:
        return sum(self.dropped_by_reason.values())

    @property
    def buffered(self) -> int:
        """Events emitted and not sent yet: in the buffer, being sent or kept to retry."""
        return len(self._buffer) + len(self._retry)

    def emit(self, event: str, /, **fields: wire.FieldValue) -> None:
        """Queue one event for sending. Never blocks on Redis, never raises."""
        try:
            if self._closed:
                self._drop("closed")
                return
            if len(self._buffer) >= self.buffer_size:
                self._drop("buffer_full")
                return
            if self.system is not None and fields.get("system") is None:
                fields["system"] = self.system
            # The active span's trace context, unless the caller gave one. Most emits run in
            # the empty context (nothing attached), which one lookup tells: a third of asking
            # for the current span (docs/benchmarks.md, the emit() figure).
            if "traceparent" not in fields and (context := otel_context.get_current()):
                fields["traceparent"] = traceparent_of(context)  # None: left out
            self._buffer.append(wire.encode(event, fields, validate=False))
            if len(self._buffer) >= self.batch_size:
                self._wake()
        except Exception:  # a value that cannot be formatted: count it, never raise
            self._drop("unencodable")

    @contextlib.contextmanager
    def job(
        self,
        queue: str,
        job_type: str = "",
        *,
        classify: Callable[[BaseException], str] = classify_error,
        **fields: wire.FieldValue,
    ) -> Iterator[None]:
        """Time a job: `started` on entry, `completed` or `failed` (with the error class) on
        exit, both with the duration. Pass enqueued_at for wait and total times; attempt,
        priority, job_id and worker as known. The job's own exception is re-raised."""
        fields = {"queue": queue, "job_type": job_type, **fields}
        started_at = time.time()
        clock = time.perf_counter()
        self.emit("started", **fields)
        try:
            yield
        except BaseException as error:
            if not isinstance(error, KeyboardInterrupt | SystemExit | GeneratorExit):
                failed = {
                    **fields,
                    "duration": time.perf_counter() - clock,
                    "started_at": started_at,
                    "error_type": _safe_classify(classify, error),
                }
                self.emit("failed", **failed)
            raise
        done = {**fields, "duration": time.perf_counter() - clock, "started_at": started_at}
        self.emit("completed", **done)

    def timed_out(self, **failed: wire.FieldValue) -> None:
        """A run its time limit ended: `failed` (error_type timeout) with the run's times, then
        `timed_out` without them. Both events observe the times they carry (docs/events.md):
        sent with both, one run would be observed twice."""
        self.emit("failed", **failed, error_type="timeout")
        self.emit("timed_out", **{k: v for k, v in failed.items() if k not in _RUN_TIMES})

    def timed(
        self,
        queue: str,
        job_type: str | None = None,
        *,
        classify: Callable[[BaseException], str] = classify_error,
        **fields: wire.FieldValue,
    ) -> Any:
        """Decorator form of job(); works on plain and async functions. job_type defaults
        to the function's qualified name."""

        def decorate(function: F) -> F:
            kind = job_type or function.__qualname__
            if inspect.iscoroutinefunction(function):

                @functools.wraps(function)
                async def run_async(*args: Any, **kwargs: Any) -> Any:
                    with self.job(queue, kind, classify=classify, **fields):
                        return await function(*args, **kwargs)

                return run_async  # type: ignore[return-value]

            @functools.wraps(function)
            def run(*args: Any, **kwargs: Any) -> Any:
                with self.job(queue, kind, classify=classify, **fields):
                    return function(*args, **kwargs)

            return run  # type: ignore[return-value]

        return decorate

    def heartbeat(self, worker: str, queue: str, active: int, capacity: int) -> None:
        """A worker's liveness and load: busy slots out of capacity."""
        self.emit("worker_heartbeat", worker=worker, queue=queue, active=active, capacity=capacity)

    # -- flushing helpers ---------------------------------------------------------------------

    def _wake(self) -> None:
        """Ask the flusher to send now (the buffer holds a full batch)."""

    def _drop(self, reason: str, count: int = 1) -> None:
        self.dropped_by_reason[reason] = self.dropped_by_reason.get(reason, 0) + count

    def _next_batch(self) -> list[Entry]:
        """The batch to send next: the one kept to send again, else the buffer's next, kept
        (and counted buffered) until _sent says it went."""
        if not self._retry:
            buffer, size = self._buffer, self.batch_size
            while buffer and len(self._retry) < size:
                self._retry.append(buffer.popleft())
        return self._retry

    def _sent(self, batch: list[Entry]) -> None:
        self.sent += len(batch)
        self.last_error = None
        self._retry = []

    def _failed(self, batch: list[Entry], error: Exception) -> None:
        if self.last_error is None:
            log.warning("event stream %s unavailable, buffering: %s", self.stream, error)
        self.last_error = f"{type(error).__name__}: {error}"
        self._retry = batch


def _safe_classify(classify: Callable[[BaseException], str], error: BaseException) -> str:
    try:
        return classify(error)
    except Exception:
        return "other"


class EventEmitter(_Emitter):
    """Thread-based emitter for synchronous code (safe to share between threads)."""

    def __init__(
        self, client: redis.Redis | str, stream: str, **options: Unpack[EmitterOptions]
    ) -> None:
        super().__init__(stream, **options)
        self._client = (
            redis.Redis.from_url(client, **URL_CLIENT_TIMEOUTS)
            if isinstance(client, str)
            else client
        )
        self._owns_client = isinstance(client, str)
        self._wakeup = threading.Event()
        self._thread = threading.Thread(target=self._run, name="event-emitter", daemon=True)
        self._thread.start()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything emitted so far was sent; False at the timeout."""
        deadline = time.monotonic() + timeout
        while self.buffered:
            self._wakeup.set()
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Send what is buffered (up to `timeout`), stop the flusher. Later emits are dropped."""
        self.flush(timeout)
        self._closed = True
        self._wakeup.set()
        self._thread.join(timeout)
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> EventEmitter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _wake(self) -> None:
        self._wakeup.set()

    def _run(self) -> None:
        while not self._closed:
            self._wakeup.wait(self.flush_interval)
            self._wakeup.clear()
            while not self._closed:
                batch = self._next_batch()
                if not batch:
                    break
                if not self._send(batch):
                    self._wakeup.wait(self.retry_interval)
                    break
        leftover = self.buffered
        if leftover:
            self._drop("closed", leftover)

    def _send(self, batch: list[Entry]) -> bool:
        try:
            pipe = self._client.pipeline(transaction=False)
            add_entries(pipe, self.stream, batch, self.maxlen)
            pipe.execute()
        except Exception as error:  # redis errors and anything else: keep the caller safe
            self._failed(batch, error)
            return False
        self._sent(batch)
        return True


class AsyncEventEmitter(_Emitter):
    """asyncio emitter: emit() is a plain (non-async) call, the flusher an asyncio task
    started on the first emit inside a running loop. Close with `await aclose()`."""

    def __init__(
        self, client: redis.asyncio.Redis | str, stream: str, **options: Unpack[EmitterOptions]
    ) -> None:
        super().__init__(stream, **options)
        self._client = (
            redis.asyncio.Redis.from_url(client, **URL_CLIENT_TIMEOUTS)
            if isinstance(client, str)
            else client
        )
        self._owns_client = isinstance(client, str)
        self._task: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None

    def emit(self, event: str, /, **fields: wire.FieldValue) -> None:
        super().emit(event, **fields)
        if self._task is None and not self._closed:
            with contextlib.suppress(RuntimeError):  # no running loop: started by the next emit
                loop = asyncio.get_running_loop()
                self._wakeup = asyncio.Event()
                self._task = loop.create_task(self._run(), name="event-emitter")

    async def flush(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while self.buffered:
            self._wake()
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    async def aclose(self, timeout: float = 5.0) -> None:
        await self.flush(timeout)
        self._closed = True
        if self._task is not None:
            self._wake()
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._task, timeout)
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> AsyncEventEmitter:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    async def _run(self) -> None:
        assert self._wakeup is not None
        while not self._closed:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), self.flush_interval)
            self._wakeup.clear()
            while not self._closed:
                batch = self._next_batch()
                if not batch:
                    break
                if not await self._send(batch):
                    await asyncio.sleep(self.retry_interval)
                    break
        leftover = self.buffered
        if leftover:
            self._drop("closed", leftover)

    async def _send(self, batch: list[Entry]) -> bool:
        try:
            pipe = self._client.pipeline(transaction=False)
            add_entries(pipe, self.stream, batch, self.maxlen)
            await pipe.execute()
        except Exception as error:
            self._failed(batch, error)
            return False
        self._sent(batch)
        return True
