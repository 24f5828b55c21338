"""A Celery application for the tests: real tasks on kombu's Redis transport.

The broker comes from QE_CELERY_BROKER; QE_CELERY_SEP and QE_CELERY_STEPS (comma-separated),
when set, are the transport's `sep` (the documented ":" form) and `priority_steps` options;
QE_CELERY_ACKS_LATE set makes tasks acknowledged when they end (`task_acks_late`).
Tasks `tests.to_<queue>` are routed by `task_routes` to the queue of their name (ROUTED_QUEUES):
a map (plain data), or with QE_CELERY_ROUTER "function" or "class" the same routes by a router
function or class (which Celery's `conf` reply gives as their repr or path, not as routes).
Their `outcome` "fail" raises ValueError, "retry" retries once then succeeds; `tests.unrouted`
takes the same outcomes and no route (the default queue, or the caller's `queue=`).
Workers are started with `celery -A tests.celery_app worker`.
"""

from __future__ import annotations

import os
import time

from celery import Celery

ROUTED_QUEUES = ("ingest", "emails", "reports", "billing", "thumbs")
app = Celery("qe_tests", broker=os.environ.get("QE_CELERY_BROKER", "redis://127.0.0.1:6379/0"))
transport_options: dict[str, object] = {}
if os.environ.get("QE_CELERY_STEPS"):
    transport_options["priority_steps"] = [int(s) for s in os.environ["QE_CELERY_STEPS"].split(",")]
if os.environ.get("QE_CELERY_SEP"):
    transport_options["sep"] = os.environ["QE_CELERY_SEP"]


def route_by_name(name, args, kwargs, options, task=None, **kw):  # type: ignore[no-untyped-def]
    """task_routes as a router function: each `tests.to_<queue>` to its queue."""
    queue = name.removeprefix("tests.to_")
    return {"queue": queue} if queue in ROUTED_QUEUES else None


class RouteByName:
    """task_routes as a router class, named by its path (Celery instantiates it)."""

    def route_for_task(self, task, args=None, kwargs=None):  # type: ignore[no-untyped-def]
        return route_by_name(task, args, kwargs, {})


ROUTERS = {
    "": {f"tests.to_{queue}": {"queue": queue} for queue in ROUTED_QUEUES},
    "function": (route_by_name,),
    "class": ("tests.celery_app.RouteByName",),
}
app.conf.update(
    broker_transport_options=transport_options,
    broker_connection_retry_on_startup=True,
    task_default_priority=0,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    task_acks_late=bool(os.environ.get("QE_CELERY_ACKS_LATE")),
    task_routes=ROUTERS[os.environ.get("QE_CELERY_ROUTER", "")],
)


@app.task(name="tests.sleep_for")
def sleep_for(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@app.task(name="tests.held")
def held(seconds: float, release: str) -> float:
    """Runs until the file `release` exists, `seconds` at most: the test ends it once it has
    seen it run, however long a loaded host took to get there."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.05)
    return seconds


@app.task(name="tests.fail_after")
def fail_after(seconds: float) -> None:
    time.sleep(seconds)
    raise RuntimeError("failing on purpose")


@app.task(name="tests.retry_once", bind=True, max_retries=1, default_retry_delay=0)
def retry_once(self, seconds: float) -> None:  # type: ignore[no-untyped-def]
    time.sleep(seconds)
    raise self.retry(exc=RuntimeError("retrying on purpose"))


def _with_outcome(name: str) -> None:
    @app.task(name=name, bind=True, max_retries=1, default_retry_delay=0)
    def run(self, seconds: float, outcome: str = "ok") -> float:  # type: ignore[no-untyped-def]
        time.sleep(seconds)
        if outcome == "fail":
            raise ValueError("failing on purpose")
        if outcome == "retry" and not self.request.retries:
            raise self.retry(exc=RuntimeError("retrying on purpose"))
        return seconds


for _queue in ROUTED_QUEUES:
    _with_outcome(f"tests.to_{_queue}")
_with_outcome("tests.unrouted")
