"""node-resque 9 (npm, under Node), its Queue enqueueing and delaying jobs and its Workers
completing, failing and running them (tests/node/resque.cjs); the truth is its own Queue API:
queues() and length(), failed(), allDelayed(), workers(), allWorkingOn() and stats()."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from tests.conformance.adapters.base import Adapter, TruthAt, fixed
from tests.conformance.checks import Age, Truth, served_sum
from tests.conftest import Series
from tests.real_queues import NodeResque

SETUP = [
    {"op": "enqueue", "queue": "emails", "count": 3},
    {"op": "enqueue", "queue": "reports"},
    # a queue whose only job completed: listed in resque:queues, its list gone
    {"op": "enqueue", "queue": "drained"},
    {"op": "work", "queues": ["drained"], "name": "host:10", "completed": 1},
    # a worker completes three and fails two; another queue's job fails too
    {"op": "enqueue", "queue": "work", "count": 3},
    {"op": "enqueue", "queue": "work", "job": "fail", "count": 2},
    {"op": "work", "queues": ["work"], "name": "host:11", "completed": 3, "failed": 2},
    {"op": "enqueue", "queue": "mailers", "job": "fail"},
    {"op": "work", "queues": ["mailers"], "name": "host:12", "failed": 1},
    # delayed an hour: one of a queue with jobs, two of a queue no job was enqueued to yet
    {"op": "enqueueIn", "queue": "emails", "ms": 3_600_000},
    {"op": "enqueueIn", "queue": "later", "ms": 3_600_000, "count": 2},
    # two long jobs running, started 2 s apart (the longest running is the first), and an
    # idle worker of two queues
    {"op": "enqueue", "queue": "busy", "job": "slow", "args": [600_000], "count": 2},
    {"op": "hold", "queues": ["busy"], "name": "host:1"},
    {"op": "sleep", "ms": 2000},
    {"op": "hold", "queues": ["busy"], "name": "host:2"},
    {"op": "idle", "queues": ["drained", "reports_later"], "name": "host:3"},
]
# Run after the native reader's first read (its baseline): two complete, one fails.
COUNTED = [
    {"op": "enqueue", "queue": "counted", "count": 2},
    {"op": "enqueue", "queue": "counted", "job": "fail"},
    {"op": "work", "queues": ["counted"], "name": "host:13", "completed": 2, "failed": 1},
]


class ResqueAdapter(Adapter):
    system = "resque"

    def phases(self) -> Iterator[TruthAt]:
        assert self.redis_db is not None
        resque = NodeResque(self.redis_db)
        try:
            resque.hold(*SETUP)
            before = resque.state()
            assert before["version"].startswith("9."), before["version"]
            truth = self.truth(before)
            truth.sources_up = ("native:resque",)  # its first read: the baseline
            yield fixed(truth)
            resque.steps(*COUNTED)
            after = resque.state()
            yield fixed(self.counted(before["stats"], after["stats"]))
        finally:
            resque.stop_all()

    @staticmethod
    def truth(library: dict[str, Any]) -> Truth:
        """Each listed queue's length (pending) and running jobs (active, 0 when none), the
        failed and delayed jobs per the queue each names; the longest running job's age from
        its run_at; each listed worker a worker (one slot) of every queue its id names."""
        depths: dict[tuple[str, ...], float] = {}
        ages: dict[tuple[str, ...], Age | None] = {}
        for queue, length in library["queues"].items():
            depths[queue, "pending"] = length
            depths[queue, "active"] = 0
            ages[queue, "pending"] = None  # a queued job carries no enqueue time
        started: dict[str, float] = {}
        for job in library["working"].values():
            if job is not None:
                queue = job["queue"]
                depths[queue, "active"] = depths.get((queue, "active"), 0) + 1
                started[queue] = min(job["run_at_ms"] / 1000, started.get(queue, float("inf")))
        for queue, since in started.items():
            ages[queue, "active"] = Age.at(since)
        for state, queues in (("failed", library["failed"]), ("scheduled", library["delayed"])):
            for queue, count in Counter(queues).items():
                depths[queue, state] = count
        totals: dict[tuple[str, ...], float] = {}
        for name, served in library["workers"].items():
            busy = library["working"].get(name) is not None
            for queue in served.split(","):
                for key in (
                    ("queue_workers", queue),
                    ("queue_worker_slots", queue),
                    ("queue_workers", queue, f"state={'busy' if busy else 'idle'}"),
                ):
                    totals[key] = totals.get(key, 0) + 1
        assert totals["queue_workers", "busy", "state=busy"] == 2, library
        return Truth(
            "resque",
            library["now_ms"] / 1000,
            depths,
            exact_states=True,
            ages=ages,
            exact_ages=True,
            totals=totals,
        )

    @staticmethod
    def counted(before: dict[str, str], after: dict[str, str]) -> Truth:
        """stats()' processed and failed grew by what the reader counts, with no queue label
        (Resque counts every queue as one)."""
        grown = {
            kind: int(after.get(kind, 0)) - int(before.get(kind, 0))
            for kind in ("processed", "failed")
        }
        assert grown == {"processed": 2, "failed": 1}, (before, after)

        def served_counters(series: Series) -> list[str]:
            found = []
            for metric, kind in (
                ("queue_jobs_completed_total", "processed"),
                ("queue_jobs_failed_total", "failed"),
            ):
                served = served_sum(series, "resque", metric, queue="")
                if served != grown[kind]:
                    found.append(f"{metric}: served {served}, stats() grew by {grown[kind]}")
            return found

        return Truth("resque", 0.0, None, extra=served_counters)
