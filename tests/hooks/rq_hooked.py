"""RQ jobs and a producer with the RQ hook (exporter.hooks.rq), run by a real `rq worker`.

    python -m tests.hooks.rq_hooked REDIS_URL PLAN_JSON [--traced]

enqueues each step of the plan ({"call", "seconds", optional "retries", "timeout", "after":
the index of the job it depends on}) with
EventQueue on the queue `hooked` (QUEUE_EXPORTER_EVENTS_STREAM names the stream) and prints the
jobs' ids; with --traced each enqueue runs in a span of its own (an SDK tracer), and the ids
come with the trace id of that span. `sleep_for` and `fail_after` are the other RQ tests' jobs
(tests/rq_app/jobs.py); a `traced` job returns the trace id of a span it starts
(with an SDK tracer in the work horse): the job's own word on the trace it ran in.
"""

from __future__ import annotations

import json
import sys
import time

from opentelemetry.sdk.trace import TracerProvider
from redis import Redis
from rq import Retry

from exporter.hooks.rq import EventQueue

QUEUE = "hooked"


def traced(seconds: float) -> str:
    with TracerProvider().get_tracer("tests.hooks").start_as_current_span("job") as span:
        time.sleep(seconds)
        return f"{span.get_span_context().trace_id:032x}"


def enqueue(url: str, plan: list[dict], traced_enqueue: bool) -> list[dict]:
    queue = EventQueue(QUEUE, connection=Redis.from_url(url))
    tracer = TracerProvider().get_tracer("tests.hooks")
    made = []
    for step in plan:
        options: dict = {}
        if "retries" in step:
            options["retry"] = Retry(max=step["retries"])
        if "timeout" in step:
            options["job_timeout"] = step["timeout"]
        if "after" in step:  # deferred until that job of the plan ended
            options["depends_on"] = made[step["after"]]["id"]
        # not __main__'s: the worker's (the plain jobs are the other RQ tests')
        module = "tests.hooks.rq_hooked" if step["call"] == "traced" else "tests.rq_app.jobs"
        function = f"{module}.{step['call']}"
        if traced_enqueue:
            with tracer.start_as_current_span("enqueue") as span:
                job = queue.enqueue(function, step["seconds"], **options)
            made.append({"id": job.id, "trace_id": f"{span.get_span_context().trace_id:032x}"})
        else:
            made.append({"id": queue.enqueue(function, step["seconds"], **options).id})
    return made


if __name__ == "__main__":
    print(json.dumps(enqueue(sys.argv[1], json.loads(sys.argv[2]), "--traced" in sys.argv)))
