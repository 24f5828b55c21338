"""Celery on kombu's Redis transport, driven by Celery itself (tests/celery_app) and run by real
`celery worker -E` processes: tasks routed to their queues by task_routes, published under
Celery's default task_send_sent_event = False, read with the preset's defaults (no params).

The truth is Celery's own: kombu's message count per queue (every priority list), the workers'
answers to Celery's inspection (running, prefetched and ETA-held tasks, each with its queue and
start time; each worker's queues and its pool's max-concurrency), and the task events Celery's
own Receiver heard (started, succeeded, failed, retried), each on the queue Celery's router routes its
task's name to.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from tests.celery_app import control
from tests.conformance.adapters.base import Adapter, TruthAt, fixed, require
from tests.conformance.checks import ReadAge, Truth
from tests.conftest import wait_for

# Worker per queue (comma-separated) and its pool's slots: one of one queue, one of two;
# "billing" has tasks and no worker.
WORKERS = (("ingest", 1), ("emails,reports", 2))
QUEUES = ("ingest", "emails", "reports", "billing")
# Per queue served by a worker: tasks of `tests.to_<queue>` (routed there by task_routes) that
# succeed, fail, retry once then succeed.
OUTCOMES = {"ingest": (2, 1, 1), "emails": (3, 1, 1), "reports": (1, 2, 0)}
LONG = 600  # seconds the long task runs: it runs until its worker is stopped
LONG_TASKS = {"ingest": 1}  # queue -> long tasks started there (and running)
BEHIND = 3  # tasks published behind it on its one-slot worker's queue
UNKNOWN = "(unknown)"  # the reader's unknown_queue: a task whose queue it could not learn


class CeleryAdapter(Adapter):
    system = "celery"
    # a loaded host's inspection rounds (a quarter of the 0.5 s interval) miss a worker now and
    # then: a phase may take longer than the default to be served
    timeout: ClassVar[float] = 60.0

    def phases(self) -> Iterator[TruthAt]:
        require(control.PYTHON, "celery", "celery (pyproject's dev extra)")
        env = control.env(self.backend_url)
        # the reader subscribed to Celery's events before any worker or task exists
        yield fixed(Truth("celery", time.time(), None, sources_up=("native:celery",)))
        events = self.tmp_path / "events.jsonl"
        processes = [control.recorder(env, events)]
        try:
            # their logs: what each task did, as Celery took it (read when a phase fails)
            processes += [
                control.worker(env, queues, slots, self.tmp_path / f"{queues}.log")
                for queues, slots in WORKERS
            ]
            slots = wait_for(lambda: self._workers(env), timeout=120)
            # the recorder hears them: subscribed before their first task
            wait_for(lambda: len(control.heard_from(events)) == len(WORKERS), timeout=60)
            # each worker on its queues with its slots, as Celery's inspection says: the reader
            # knows them (and their task_routes) before their first task
            yield fixed(self.workers_truth(slots))
            # first what ends (a retry goes back to the end of its queue), and a queue no worker
            # serves, its tasks at every priority (kombu's priority-step lists)
            control.driver(env, "publish", json.dumps(self._ending()), "--no-sent-event")
            billing = [{"task": "to_billing", "seconds": 0, "priority": p} for p in range(10)]
            control.driver(env, "publish", json.dumps(billing), "--no-sent-event")
            wait_for(lambda: self._recorded(env, events), timeout=120)
            # then a long task on ingest's one slot, tasks waiting behind it (its worker holds
            # one prefetched), and a task held by the emails worker until its countdown
            held = [
                {"task": "to_ingest", "seconds": LONG},
                *({"task": "to_ingest", "seconds": 0} for _ in range(BEHIND)),
                {"task": "to_emails", "seconds": 0, "countdown": 3600},
            ]
            control.driver(env, "publish", json.dumps(held), "--no-sent-event")
            library = wait_for(lambda: self._held(env), timeout=120)
            recorded = wait_for(lambda: self._recorded(env, events, LONG_TASKS), timeout=60)
            yield fixed(self.truth(library, slots, recorded))
        finally:
            control.stop_recorder(processes[0])
            for worker in processes[1:]:
                control.stop(worker)

    @staticmethod
    def _workers(env: dict[str, str]) -> dict[str, dict[str, int]] | None:
        found: dict[str, dict[str, int]] = control.driver(env, "workers")
        return found if set(found) == set(OUTCOMES) else None  # every worker answered

    @staticmethod
    def _ending() -> list[dict[str, Any]]:
        return [
            {"task": f"to_{queue}", "seconds": 0, "outcome": outcome}
            for queue, (ok, fail, retry) in OUTCOMES.items()
            for outcome, times in (("ok", ok), ("fail", fail), ("retry", retry))
            for _ in range(times)
        ]

    @staticmethod
    def _recorded(
        env: dict[str, str], events: Path, long: dict[str, int] | None = None
    ) -> dict[str, dict[str, int]] | None:
        """The task events Celery's Receiver heard, per queue, once every task the plan sends
        has ended (a retried attempt's task-retried may come after the next attempt's end) and
        the `long` tasks started on their queues."""
        recorded: dict[str, dict[str, int]] = control.driver(env, "outcomes", str(events))
        for queue, (ok, fail, retry) in OUTCOMES.items():
            runs = ok + fail + 2 * retry + (long or {}).get(queue, 0)
            planned = {"started": runs, "succeeded": ok + retry, "failed": fail, "retried": retry}
            if recorded.get(queue) != planned:
                return None
        return recorded

    @staticmethod
    def _held(env: dict[str, str]) -> dict[str, Any] | None:
        """Celery's truth once the long task runs, one task is prefetched behind it and the
        countdown task is held (every worker answered the same inspection)."""
        library: dict[str, Any] = control.driver(env, "truth", *QUEUES)
        held = (
            library["active"].get("ingest"),
            library["reserved"].get("ingest"),
            library["waiting"]["ingest"],
            library["scheduled"].get("emails"),
        )
        return library if held == (1, 1, BEHIND - 1, 1) else None

    @staticmethod
    def _slots(slots: dict[str, dict[str, int]]) -> dict[tuple[str, ...], float]:
        """Per queue, the workers that consume it and their pools' max-concurrency (a queue
        no worker consumes: none)."""
        totals: dict[tuple[str, ...], float] = {}
        for queue in QUEUES:
            here = slots.get(queue, {"workers": 0, "slots": 0})
            totals["queue_workers", queue] = here["workers"]
            totals["queue_worker_slots", queue] = here["slots"]
        return totals

    @staticmethod
    def workers_truth(slots: dict[str, dict[str, int]]) -> Truth:
        totals = CeleryAdapter._slots(slots)
        return Truth("celery", time.time(), None, totals=totals, sources_up=("native:celery",))

    @staticmethod
    def truth(
        library: dict[str, Any],
        slots: dict[str, dict[str, int]],
        recorded: dict[str, dict[str, int]],
    ) -> Truth:
        taken_at = time.time()
        depths: dict[tuple[str, str], float] = {}
        ages: dict[tuple[str, str], ReadAge | None] = {}
        for queue in QUEUES:
            # a message prefetched by a worker is out of its list (kombu's unacked hash): still
            # waiting for a slot
            depths[queue, "pending"] = library["waiting"][queue] + library["reserved"].get(queue, 0)
            depths[queue, "active"] = library["active"].get(queue, 0)
            if library["scheduled"].get(queue):
                depths[queue, "scheduled"] = library["scheduled"][queue]
            # the message records no enqueue time: no pending age
            ages[queue, "pending"] = None
            if queue in library["started"]:  # the longest running task, read by the reader
                ages[queue, "active"] = ReadAge(library["started"][queue], "native:celery")
        totals = CeleryAdapter._slots(slots)
        for queue in QUEUES:  # busy: the workers' slots running the queue's tasks
            totals["queue_worker_slots", queue, "state=busy"] = depths[queue, "active"]
        totals["queue_workers", "ingest", "state=busy"] = 1  # its one worker runs the long task
        # each run's start and end as Celery's events say, on the queue Celery routed it to
        for queue, runs in recorded.items():
            totals["queue_jobs_started_total", queue] = runs["started"]
            totals["queue_jobs_completed_total", queue] = runs["succeeded"]
            failed = runs["failed"]
            totals["queue_jobs_failed_total", queue, "error_type=non_retryable"] = failed
            totals["queue_jobs_failed_total", queue, "error_type=retryable"] = runs["retried"]
            totals["queue_jobs_retried_total", queue] = runs["retried"]
        for counted in ("started", "completed", "failed"):  # every task's queue learned
            totals[f"queue_jobs_{counted}_total", UNKNOWN] = 0
        return Truth(
            "celery",
            taken_at,
            depths,
            exact_states=True,
            ages=ages,
            exact_ages=True,
            totals=totals,
            sources_up=("native:celery",),
        )
