"""A Celery app with the Celery hook (exporter.hooks.celery) installed, for real `celery worker`s.

QE_CELERY_BROKER is the broker and the result backend (the truth: each task's state and
result); QE_HOOKS_EVENTS_URL and QE_HOOKS_STREAM where the events go. With QE_HOOKS_OTEL set,
opentelemetry-instrumentation-celery runs (an SDK tracer provider) in the worker's processes
(instrumented at worker_process_init, as its documentation says: after the hook connected) and
in the publisher (`python -m tests.hooks.celery_hooked PLAN_JSON`: publishes the plan's tasks
{"task", "seconds"} and prints their ids).

`ok` returns the trace id and span id active in the task, the task's own word on its span.
"""

from __future__ import annotations

import json
import os
import sys
import time

from celery import Celery
from celery.signals import worker_process_init
from opentelemetry import trace

import exporter.hooks.celery

broker = os.environ.get("QE_CELERY_BROKER", "redis://127.0.0.1:6379/0")
app = Celery("qe_hooks", broker=broker, backend=broker)
app.conf.update(
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    task_default_queue="hooked",
)
exporter.hooks.celery.install(
    app,
    os.environ.get("QE_HOOKS_EVENTS_URL", broker),
    stream=os.environ.get("QE_HOOKS_STREAM", "hooks:events"),
)


def instrument() -> None:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())
    CeleryInstrumentor().instrument()


if os.environ.get("QE_HOOKS_OTEL"):
    worker_process_init.connect(lambda **_: instrument(), weak=False)


@app.task(name="hooks.ok")
def ok(seconds: float) -> list[str]:
    time.sleep(seconds)
    context = trace.get_current_span().get_span_context()
    return [f"{context.trace_id:032x}", f"{context.span_id:016x}"]


@app.task(name="hooks.fail")
def fail(seconds: float) -> None:
    time.sleep(seconds)
    raise ValueError("failing on purpose")


@app.task(name="hooks.slow", soft_time_limit=0.5)
def slow(seconds: float) -> float:
    time.sleep(seconds)  # interrupted by SoftTimeLimitExceeded
    return seconds


@app.task(name="hooks.stuck", time_limit=1)
def stuck(seconds: float) -> float:
    time.sleep(seconds)  # its pool process killed by the hard time limit
    return seconds


@app.task(name="hooks.retry_once", bind=True, max_retries=1, default_retry_delay=0)
def retry_once(self, seconds: float) -> float:  # type: ignore[no-untyped-def]
    time.sleep(seconds)
    if not self.request.retries:
        raise self.retry(exc=RuntimeError("retrying on purpose"))
    return seconds


def publish(plan: list[dict]) -> list[str]:
    if os.environ.get("QE_HOOKS_OTEL"):
        instrument()
    return [app.tasks[f"hooks.{step['task']}"].delay(step["seconds"]).id for step in plan]


if __name__ == "__main__":
    print(json.dumps(publish(json.loads(sys.argv[1]))))
