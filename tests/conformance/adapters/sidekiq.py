"""Sidekiq (Debian's ruby-sidekiq), pushed to, scheduled, killed, failed into the retry and dead
sets and kept busy by Sidekiq itself (tests/ruby/); the truth is its own API: Queue#size and
#latency, ScheduledSet, RetrySet, DeadSet and Workers (with each job's run_at), per queue."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tests.conformance.adapters.base import Adapter, TruthAt, fixed
from tests.conformance.checks import Age, Truth
from tests.conftest import wait_for
from tests.real_queues import Sidekiq

# Sidekiq's sets -> our states
SETS = {"scheduled": "scheduled", "retry": "retry", "dead": "dead_letter", "busy": "active"}


class SidekiqAdapter(Adapter):
    system = "sidekiq"

    def phases(self) -> Iterator[TruthAt]:
        assert self.redis_db is not None
        sidekiq = Sidekiq(self.redis_db)
        try:
            sidekiq.push(
                {"queue": "default", "count": 3},
                {"queue": "critical"},
                {"queue": "default", "in": 600},
                {"queue": "mailers", "in": 1},  # soon due, and no scheduler running to move it
                {"queue": "default", "dead": True},
                {"queue": "mailers", "dead": True, "count": 2},
                # for the worker: one to the dead set, one to the retry set, one kept busy
                {"queue": "work", "class": "DoomedJob", "args": [0, "always"]},
                {"queue": "work", "class": "PatientJob", "args": [0, "always"]},
                {"queue": "busy", "args": [600_000]},
            )
            sidekiq.worker(["work", "busy"], scheduler=False)  # the due job stays put

            def settled() -> dict[str, Any] | None:
                library = sidekiq.truth()
                due = library["scheduled_due"].get("mailers")
                busy = library["busy"]
                done = library["retry"].get("work") and library["dead"].get("work") and busy
                return library if done and due else None

            yield fixed(self.truth(wait_for(settled, timeout=30, interval=0.5)))
        finally:
            sidekiq.stop_all()

    @staticmethod
    def truth(library: dict[str, Any]) -> Truth:
        """Every queue's size (pending, the one state each queue has) and each set split per
        queue, only where the set holds the queue's jobs."""
        now = library["now"]
        depths: dict[tuple[str, str], float] = {}
        ages: dict[tuple[str, str], Age | None] = {}
        for queue, view in library["queues"].items():
            depths[queue, "pending"] = view["size"]
            ages[queue, "pending"] = Age.at(now - view["latency"]) if view["size"] else None
        for sidekiq_set, state in SETS.items():
            for queue, count in library[sidekiq_set].items():
                depths[queue, state] = count
        for queue, started in library["busy_since"].items():  # Workers' run_at: seconds
            ages[queue, "active"] = Age.at(started)
        for queue, died_at in library["dead_oldest"].items():
            ages[queue, "dead_letter"] = Age.at(died_at)
        due = {queue: library["scheduled_due"].get(queue, 0) for queue in library["scheduled"]}
        # each live process is a worker of every queue it serves, its threads its slots
        totals: dict[tuple[str, ...], float] = {}
        for process in library["processes"]:
            for queue in process["queues"]:
                workers, slots = ("queue_workers", queue), ("queue_worker_slots", queue)
                totals[workers] = totals.get(workers, 0) + 1
                totals[slots] = totals.get(slots, 0) + process["concurrency"]
        return Truth("sidekiq", now, depths, exact_states=True, due=due, ages=ages, totals=totals)
