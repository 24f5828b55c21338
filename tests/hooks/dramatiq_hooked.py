"""A Dramatiq app with exporter.hooks.dramatiq on its broker: the app the hook's tests run.

    python -m tests.hooks.dramatiq_hooked send PLAN_JSON   # one JSON line per message sent
    python -m tests.hooks.dramatiq_hooked work             # a worker until SIGTERM

A plan is a list of {"actor", optional "args", "delay" (ms)}. Each process prints, last, its
emitter's counts (sent, dropped by reason) as one JSON line, once the hook closed its emitter at
the process's end. Environment: REDIS_URL (the
broker), EVENTS_URL and EVENTS_STREAM (the hook's), EVENTS_BUFFER (its buffer size),
EVENTS_NO_TIMEOUT=1 (an events client without socket timeouts: a call of the hook's that waited
on Redis would then wait for ever), OTEL=1 (an SDK tracer provider and OpenTelemetry's Dramatiq
instrumentation, in the sender a span around each send), TRUTH (a file where the actors write,
one JSON line a run, their message id, their own start and end times and the trace id OpenTelemetry
says is active inside them).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
import time
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage
from opentelemetry import trace

from exporter.hooks.dramatiq import LifecycleEvents

OTEL = os.environ.get("OTEL") == "1"
if OTEL:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry_instrumentor_dramatiq import DramatiqInstrumentor

    trace.set_tracer_provider(TracerProvider())
    DramatiqInstrumentor().instrument()


def _events_client() -> redis.Redis | str:
    url = os.environ["EVENTS_URL"]
    if os.environ.get("EVENTS_NO_TIMEOUT") == "1":
        return redis.Redis.from_url(url, socket_timeout=None, socket_connect_timeout=None)
    return url


def _print_counts() -> None:
    print(json.dumps({"sent": emitter.sent, "dropped": emitter.dropped_by_reason}), flush=True)


# registered before the hook registers its own close: so it runs after it, at the process's end
atexit.register(_print_counts)
broker = RedisBroker(url=os.environ["REDIS_URL"])
broker.add_middleware(CurrentMessage())
hook = LifecycleEvents(
    _events_client(),
    os.environ["EVENTS_STREAM"],
    buffer_size=int(os.environ.get("EVENTS_BUFFER", "10000")),
    flush_interval=0.01,
)
broker.add_middleware(hook)  # the one line an app adds
# This process's emitter, made now: its close, registered at its making, runs before the
# counts are printed (atexit runs last registered first).
emitter = hook.emitter
dramatiq.set_broker(broker)


def _ran(begin: float) -> None:
    message = CurrentMessage.get_current_message()
    span = trace.get_current_span().get_span_context()
    line = {
        "id": message.message_id if message else None,
        "begin": begin,
        "end": time.time(),
        "trace_id": f"{span.trace_id:032x}" if span.is_valid else None,
    }
    with open(os.environ["TRUTH"], "a") as out:
        out.write(json.dumps(line) + "\n")


@dramatiq.actor(queue_name="hooked", max_retries=0)
def work(seconds: float) -> None:
    begin = time.time()
    time.sleep(seconds)
    _ran(begin)


@dramatiq.actor(queue_name="hooked", max_retries=0)
def broken() -> None:
    _ran(time.time())
    raise ValueError("failing on purpose")


# fails on each of its two attempts: failed, retried, failed again, then dead-lettered
@dramatiq.actor(queue_name="hooked", max_retries=1, min_backoff=100, max_backoff=200)
def flaky() -> None:
    _ran(time.time())
    raise ValueError("failing on purpose, retried once")


@dramatiq.actor(queue_name="hooked", max_retries=3, throws=(KeyError,))
def refused() -> None:
    _ran(time.time())
    raise KeyError("an error Dramatiq does not retry")


@dramatiq.actor(queue_name="hooked", max_retries=0, time_limit=200)
def slow() -> None:
    _ran(time.time())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # short sleeps: Dramatiq's time limit interrupts them
        time.sleep(0.01)


def send(plan: list[dict[str, Any]]) -> None:
    tracer = trace.get_tracer(__name__)
    for step in plan:
        actor = globals()[step["actor"]]
        with tracer.start_as_current_span("request") as span:
            message = actor.send_with_options(args=step.get("args", ()), delay=step.get("delay"))
            context = span.get_span_context()
        sent = {
            "id": message.message_id,
            "actor": message.actor_name,
            "timestamp": message.message_timestamp,
            "trace_id": f"{context.trace_id:032x}" if context.is_valid else None,
        }
        print(json.dumps(sent), flush=True)


def work_until_stopped() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    broker.emit_after("process_boot")  # as the dramatiq command does: starts the time limits
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    print("ready", flush=True)
    stop.wait()
    worker.stop(timeout=10_000)


if __name__ == "__main__":
    if sys.argv[1] == "send":
        send(json.loads(sys.argv[2]))
    else:
        work_until_stopped()
