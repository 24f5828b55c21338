"""The producer library: never blocks or raises, counts drops, times jobs; sync, asyncio, CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest
import redis
import redis.asyncio
from click.testing import CliRunner
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from exporter.commands.cli import main
from exporter.lifecycle.producer import AsyncEventEmitter, EventEmitter
from tests.conftest import REDIS_HOST, REDIS_PORT, scrape_series, value, wait_for
from tests.tcp_proxy import TcpProxy

STREAM = "app:events"


def _events(client) -> list[dict[str, str]]:
    return [
        {k.decode(): v.decode() for k, v in fields.items()} for _, fields in client.xrange(STREAM)
    ]


def test_emit_while_redis_is_down_never_raises_and_counts_drops(redis_client, redis_db):
    proxy = TcpProxy(REDIS_HOST, REDIS_PORT)  # not started: connections are refused
    emitter = EventEmitter(
        f"redis://127.0.0.1:{proxy.port}/{redis_db}",
        STREAM,
        buffer_size=100,
        batch_size=50,
        flush_interval=0.01,
        retry_interval=0.05,
    )
    for n in range(1000):
        emitter.emit("enqueued", queue="q", job_id=n)
    assert emitter.sent == 0
    assert emitter.dropped_by_reason["buffer_full"] >= 850
    # every event kept (a batch being sent included) or counted dropped
    wait_for(lambda: emitter.dropped + emitter.buffered == 1000)
    wait_for(lambda: emitter.last_error)

    proxy.start()  # Redis is back: what was kept is sent
    try:
        assert emitter.flush()
        assert emitter.sent + emitter.dropped == 1000
        assert redis_client.xlen(STREAM) == emitter.sent
        assert emitter.last_error is None
        emitter.close()
    finally:
        proxy.cut()
    emitter.emit("enqueued", queue="q")  # after close: dropped, not raised
    assert emitter.dropped_by_reason["closed"] == 1


def test_flush_waits_for_the_batch_being_sent(redis_client, redis_db):
    """A batch the flusher took from the buffer is not sent yet: flush() waits for it (a hook
    closing at a worker's exit would otherwise lose the last batch)."""
    proxy = TcpProxy(REDIS_HOST, REDIS_PORT).start()
    emitter = EventEmitter(f"redis://127.0.0.1:{proxy.port}/{redis_db}", STREAM)
    try:
        emitter.emit("enqueued", queue="q")
        assert emitter.flush()  # connected
        proxy.freeze()  # Redis hangs: the next batch is in flight, its reply held
        for n in range(10):
            emitter.emit("enqueued", queue="q", job_id=n)
        wait_for(lambda: proxy.held())  # the flusher took the batch and sent it
        assert emitter.buffered == 10
        assert not emitter.flush(timeout=0.2)
        proxy.thaw()
        assert emitter.flush()
        assert redis_client.xlen(STREAM) == 11
    finally:
        emitter.close()
        proxy.cut()


def test_emit_never_raises_on_values_it_cannot_format(redis_client, redis_url):
    class Hostile:
        def __str__(self) -> str:
            raise RuntimeError("no")

    with EventEmitter(redis_url, STREAM) as emitter:
        emitter.emit("enqueued", queue=Hostile())  # type: ignore[arg-type]
        emitter.emit("enqueued", queue="q")
    assert emitter.dropped_by_reason == {"unencodable": 1}
    assert emitter.sent == 1


class Refused(Exception):
    error_type = "non_retryable"


def test_job_timing_context_manager_and_decorator(redis_client, redis_url):
    emitter = EventEmitter(redis_url, STREAM, system="app")
    enqueued_at = time.time() - 5
    with emitter.job("mail", "send", enqueued_at=enqueued_at, attempt=2, priority="high"):
        pass
    with pytest.raises(TimeoutError), emitter.job("mail", "send"):
        raise TimeoutError
    with pytest.raises(Refused), emitter.job("mail", "send"):
        raise Refused

    @emitter.timed("mail")
    def deliver(to: str) -> str:
        return to

    assert deliver("x") == "x"
    emitter.close()
    events = _events(redis_client)
    assert [e["event"] for e in events] == [
        "started",
        "completed",
        "started",
        "failed",
        "started",
        "failed",
        "started",
        "completed",
    ]
    completed = events[1]
    assert completed["enqueued_at"] == repr(enqueued_at)
    assert completed["attempt"] == "2" and completed["priority"] == "high"
    assert completed["system"] == "app" and float(completed["duration"]) >= 0
    assert events[3]["error_type"] == "timeout"
    assert events[5]["error_type"] == "non_retryable"
    assert events[7]["job_type"].endswith("deliver")


class QueueManager:
    """The seed's Orchestrata QueueManager flow (enqueue with backpressure, dequeue by
    priority, dead-letter), reduced to its Redis calls and instrumented with events."""

    def __init__(self, client: redis.asyncio.Redis, events: AsyncEventEmitter) -> None:
        self.client = client
        self.events = events
        self.max_queue_depth = 3

    async def enqueue(self, message_id: str, recipient: str, priority: int) -> bool:
        depth = sum(
            [await self.client.llen(f"orchestrata:queue:{recipient}:p{p}") for p in range(6)]
        )
        if depth >= self.max_queue_depth:
            return False  # backpressure: refused, nothing enqueued
        queued_at = datetime.now(UTC)
        message = {
            "message_id": message_id,
            "recipient": recipient,
            "priority": priority,
            "queued_at": queued_at.isoformat(),
        }
        await self.client.rpush(f"orchestrata:queue:{recipient}:p{priority}", json.dumps(message))
        self.events.emit("enqueued", queue=recipient, priority=priority, job_id=message_id)
        return True

    async def dequeue(self, recipient: str) -> dict[str, object] | None:
        for priority in range(5, -1, -1):
            raw = await self.client.lpop(f"orchestrata:queue:{recipient}:p{priority}")
            if raw:
                message: dict[str, object] = json.loads(raw)
                job_id = str(message["message_id"])
                self.events.emit("dequeued", queue=recipient, priority=priority, job_id=job_id)
                return message
        self.events.emit("dequeue_empty", queue=recipient)
        return None

    async def move_to_dead_letter(self, message: dict[str, object], reason: str) -> None:
        await self.client.rpush(f"orchestrata:dlq:{message['recipient']}", json.dumps(message))
        recipient, priority = str(message["recipient"]), str(message["priority"])
        self.events.emit("dead_lettered", queue=recipient, priority=priority, attempt=1)


async def _deliver_all(redis_url: str) -> AsyncEventEmitter:
    client = redis.asyncio.Redis.from_url(redis_url)
    events = AsyncEventEmitter(client, STREAM, system="orchestrata", flush_interval=0.01)
    manager = QueueManager(client, events)
    for n, priority in enumerate((1, 5, 3, 3)):  # the fourth is refused: backpressure
        await manager.enqueue(f"m{n}", "billing", priority)
    while (message := await manager.dequeue("billing")) is not None:
        queued_at = datetime.fromisoformat(str(message["queued_at"])).timestamp()
        try:
            priority = str(message["priority"])
            with events.job("billing", "deliver", priority=priority, enqueued_at=queued_at):
                if message["priority"] == 1:
                    raise ConnectionError("recipient offline")
                await asyncio.sleep(0.01)
        except ConnectionError:
            await manager.move_to_dead_letter(message, "recipient offline")
    await events.aclose()
    await client.aclose()
    return events


def test_orchestrata_style_queue_manager_instrumented_with_asyncio(redis_url, run_exporter):
    app = run_exporter(
        {
            "sources": {
                "redis": {"url": redis_url},
                "events": {"streams": [{"key": STREAM, "system": "orchestrata"}], "block_ms": 50},
            }
        }
    )
    wait_for(lambda: app.health.snapshot()[f"events:{STREAM}"].up)
    events = asyncio.run(_deliver_all(redis_url))
    assert events.dropped == 0
    series = wait_for(
        lambda: (
            (s := scrape_series(app))
            and value(s, "queue_exporter_events_total", stream=STREAM) == events.sent
            and s
        )
    )
    assert events.sent == 14  # 3 enqueued, 3 dequeued, 1 empty, 6 job, 1 dead letter
    labels = {"system": "orchestrata", "queue": "billing"}

    def total(name: str, **extra: str) -> float:
        return sum(
            v
            for (n, ls), v in series.items()
            if n == name and set({**labels, **extra}.items()) <= set(ls)
        )

    assert total("queue_jobs_enqueued_total") == 3
    assert total("queue_jobs_dequeued_total") == 3
    assert value(series, "queue_dequeue_attempts_total", **labels, result="empty") == 1
    assert total("queue_jobs_completed_total", job_type="deliver") == 2
    assert total("queue_jobs_failed_total", job_type="deliver", error_type="other") == 1
    assert value(series, "queue_jobs_dead_lettered_total", **labels, priority="1") == 1
    assert total("queue_job_wait_seconds_count", job_type="deliver") == 3
    assert value(series, "queue_exporter_events_invalid_total", stream=STREAM) is None


def test_emit_command(redis_client, redis_url):
    runner = CliRunner()
    args = ["emit", "--redis-url", redis_url, "--stream", STREAM]
    result = runner.invoke(main, [*args, "event=completed", "queue=q", "duration=0.5"])
    assert result.exit_code == 0, result.output
    [event] = _events(redis_client)
    assert event["event"] == "completed" and event["v"] == "1" and event["duration"] == "0.5"
    result = runner.invoke(main, [*args, "event=completed", "queue=q", "duration=-1"])
    assert result.exit_code == 1 and "negative_duration" in result.output
    result = runner.invoke(main, [*args, "event=completed", "queue=q", "traceparent=00-x"])
    assert result.exit_code == 1 and "bad_traceparent" in result.output
    result = runner.invoke(main, [*args, "queue=q"])
    assert result.exit_code == 2 and "event=NAME is required" in result.output
    result = runner.invoke(main, [*args, "--repeat", "3", "event=dequeue_empty", "queue=q"])
    assert result.exit_code == 0 and redis_client.xlen(STREAM) == 4


def _propagated_traceparent() -> str:
    """The traceparent OpenTelemetry's own propagator sends for the active span."""
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier["traceparent"]


def test_events_carry_the_active_spans_trace_context(redis_client, redis_url):
    tracer = TracerProvider().get_tracer("tests")  # a real SDK span, no global provider set
    with EventEmitter(redis_url, STREAM) as emitter:
        emitter.emit("enqueued", queue="q", job_id="untraced")
        with tracer.start_as_current_span("enqueue", kind=SpanKind.PRODUCER):
            enqueue_traceparent = _propagated_traceparent()
            emitter.emit("enqueued", queue="q", job_id="traced")
        # an unsampled span is still the job's trace (sampled bit clear): its context is carried
        unsampled = TracerProvider(sampler=ALWAYS_OFF).get_tracer("tests")
        with unsampled.start_as_current_span("job") as span:
            job_traceparent = _propagated_traceparent()
            with emitter.job("q", "t"):
                pass
            emitter.emit("enqueued", queue="q", traceparent="given by the caller")
        assert span.get_span_context().is_valid and not span.get_span_context().trace_flags.sampled
    events = _events(redis_client)
    assert [event.get("traceparent") for event in events] == [
        None,
        enqueue_traceparent,
        job_traceparent,
        job_traceparent,
        "given by the caller",
    ]
    assert enqueue_traceparent != job_traceparent
    assert emitter.dropped == 0


def test_a_non_recording_span_from_the_api_alone_is_carried_too(redis_client, redis_url):
    """No SDK: a context propagated into the app (NonRecordingSpan) is the active span."""
    incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
    context = TraceContextTextMapPropagator().extract({"traceparent": incoming})
    with EventEmitter(redis_url, STREAM) as emitter:
        token = otel_context.attach(context)
        try:
            emitter.emit("started", queue="q")
        finally:
            otel_context.detach(token)
        emitter.emit("started", queue="q")
    assert [event.get("traceparent") for event in _events(redis_client)] == [incoming, None]


_API_ONLY_APP = """
import sys
sys.modules["opentelemetry.sdk"] = None  # an app without the SDK: importing it fails
from opentelemetry import context, trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from exporter.lifecycle.producer import EventEmitter

with EventEmitter(sys.argv[1], sys.argv[2]) as emitter:
    emitter.emit("started", queue="q")
    incoming = TraceContextTextMapPropagator().extract({"traceparent": sys.argv[3]})
    token = context.attach(incoming)
    emitter.emit("started", queue="q")
    with trace.get_tracer("app").start_as_current_span("no sdk: a non-recording span"):
        emitter.emit("started", queue="q")
    context.detach(token)
assert emitter.sent == 3, emitter.dropped_by_reason
"""


def test_the_producer_needs_no_opentelemetry_sdk(redis_client, redis_url):
    incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    subprocess.run(
        [sys.executable, "-c", _API_ONLY_APP, redis_url, STREAM, incoming], check=True, timeout=60
    )
    # without an SDK a tracer's span continues the incoming context: the same traceparent
    assert [event.get("traceparent") for event in _events(redis_client)] == [
        None,
        incoming,
        incoming,
    ]
