"""BullMQ 5/6, Bull 3/4 and Bee-Queue 1/2, driven through their own APIs (tests/node/*.cjs);
the truth is each library's own job counts, next waiting jobs and due delayed ones."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from tests.conformance.adapters.base import Adapter, TruthAt, fixed
from tests.conformance.checks import Age, Gap, ReadAge, Truth
from tests.real_queues import BEE_QUEUE_MAJORS, BULL_MAJORS, BULLMQ_MAJORS, BeeQueue, Bull, BullMQ

# BullMQ's states -> ours. Waiting (also a 5.x paused queue's list) and prioritized jobs are
# pending; flow parents waiting for their children are scheduled like delayed jobs: not runnable
# yet, and not through anything a worker could do.
BULLMQ_STATES = {
    "wait": "pending",
    "paused": "pending",
    "prioritized": "pending",
    "active": "active",
    "delayed": "scheduled",
    "waiting-children": "scheduled",
    "completed": "completed",
    "failed": "failed",
}
BULLMQ_WAITING = ("wait", "paused", "prioritized")
BULL_STATES = {
    "waiting": "pending",
    "paused": "pending",
    "active": "active",
    "delayed": "scheduled",
    "completed": "completed",
    "failed": "failed",
}
# Bull's priorities are not a split of pending depth (docs/presets.md, bull): its `priority` zset
# indexes prioritized jobs that are also in `wait`, and the depths a key group reads only add up
BULL_PRIORITIES = "Bull's priority zset indexes jobs counted in wait: no exact split"
BEE_QUEUE_STATES = {  # checkHealth()'s counts
    "waiting": "pending",
    "active": "active",
    "delayed": "scheduled",
    "succeeded": "completed",
    "failed": "failed",
}


def node_truth(
    system: str, states: dict[str, str], library: dict[str, Any], stamps: dict[str, list[int]]
) -> Truth:
    """The library's counts per queue, summed by our state; the due delayed jobs; the pending
    age from the earliest of `stamps` (ms: the next waiting jobs' timestamps)."""
    depths: dict[tuple[str, str], float] = {}
    due: dict[str, float] = {}
    ages: dict[tuple[str, str], Age | None] = {}
    for queue, view in library["queues"].items():
        for kind, count in view["counts"].items():
            key = (queue, states[kind])
            depths[key] = depths.get(key, 0) + count
        due[queue] = view["due"]
        earliest = min(stamps[queue], default=None)
        ages[queue, "pending"] = None if earliest is None else Age.at(earliest / 1000)
    return Truth(system, library["now_ms"] / 1000, depths, due=due, ages=ages)


def backdated(queue: str, now_ms: int, *ages_s: int) -> list[dict[str, Any]]:
    """Plain jobs created a while ago (the libraries' own timestamp option)."""
    return [{"op": "add", "queue": queue, "opts": {"timestamp": now_ms - s * 1000}} for s in ages_s]


def prioritized(queue: str, now_ms: int) -> list[dict[str, Any]]:
    return [
        {"op": "add", "queue": queue, "opts": {"priority": p, "timestamp": now_ms - s * 1000}}
        for p, s in ((3, 200), (1, 50), (2, 100))
    ]


# a worker completes three, fails two for good and one retried in an hour
FAILING_WORK = [
    {"op": "add", "queue": "work", "count": 3},
    {"op": "add", "queue": "work", "count": 2, "data": {"fail": "always"}},
    {
        "op": "add",
        "queue": "work",
        "data": {"fail": "always"},
        "opts": {"attempts": 2, "backoff": {"type": "fixed", "delay": 3_600_000}},
    },
    {"op": "work", "queue": "work", "completed": 3, "failed": 3},
]
# Run after the native reader's first read (its baseline), in a queue new to it: two complete,
# one fails for good, one fails once and completes on its retry, one fails on its retry too
# (no backoff: retried at once). The worker stops after 3 completions and 4 failed attempts.
COUNTED_WORK = [
    {"op": "add", "queue": "counted", "count": 2},
    {"op": "add", "queue": "counted", "data": {"fail": "always"}},
    {"op": "add", "queue": "counted", "data": {"fail": 1}, "opts": {"attempts": 2}},
    {"op": "add", "queue": "counted", "data": {"fail": "always"}, "opts": {"attempts": 2}},
    {"op": "work", "queue": "counted", "completed": 3, "failed": 4},
]
# a queue whose only job completed and was removed, and one job kept active until the end
DRAINED_AND_BUSY = [
    {"op": "add", "queue": "drained", "opts": {"removeOnComplete": True}},
    {"op": "work", "queue": "drained", "completed": 1},
    {"op": "add", "queue": "busy", "data": {"sleep_ms": 600_000}},
    {"op": "hold", "queue": "busy"},
]


class BullMQAdapter(Adapter):
    system = "bullmq"
    versions: ClassVar[tuple[Any, ...]] = BULLMQ_MAJORS

    def phases(self) -> Iterator[TruthAt]:
        assert self.redis_db is not None
        bullmq = BullMQ(self.version, self.redis_db)
        now_ms = int(time.time() * 1000)
        try:
            bullmq.hold(
                *backdated("emails", now_ms, 90, 60, 30),
                # a queue holding only prioritized jobs: its age comes from the next job's hash
                *prioritized("reports", now_ms),
                # a paused queue: 5.x renames wait to paused, 6.x keeps wait and flags meta
                {"op": "add", "queue": "exports", "count": 2, "opts": {"timestamp": now_ms - 40_000}},
                {"op": "pause", "queue": "exports"},
                # a flow: the parent waits for its children in another queue
                {"op": "flow", "queue": "invoices", "children": ["renders", "renders"]},
                # delayed: one already due (no worker promotes it), one in an hour
                {"op": "add", "queue": "emails", "opts": {"delay": 50}},
                {"op": "add", "queue": "emails", "opts": {"delay": 3_600_000}},
                {"op": "sleep", "ms": 200},
                *FAILING_WORK,
                # rate-limited: one job an hour, so two stay waiting behind the limiter
                {"op": "add", "queue": "limited", "count": 3},
                {
                    "op": "work",
                    "queue": "limited",
                    "completed": 1,
                    "options": {"limiter": {"max": 1, "duration": 3_600_000}},
                },
                *DRAINED_AND_BUSY,
            )  # fmt: skip
            queues = ["emails", "reports", "exports", "invoices", "renders", "work", "limited"]
            library = bullmq.truth([*queues, "drained", "busy"])
            stamps = {
                queue: [
                    stamp
                    for state in BULLMQ_WAITING
                    if (stamp := view["next_timestamp_ms"][state]) is not None
                ]
                for queue, view in library["queues"].items()
            }
            truth = node_truth(self.system, BULLMQ_STATES, library, stamps)
            for queue, view in library["queues"].items():  # from the active jobs' processedOn
                started = view["running_since_ms"]
                truth.ages[queue, "active"] = None if started is None else Age.at(started / 1000)
            # the workers BullMQ lists (getWorkers: its named connections) per queue
            truth.totals = {
                ("queue_workers", queue): view["workers"]
                for queue, view in library["queues"].items()
            }
            assert truth.totals["queue_workers", "busy"] == 1
            truth.sources_up = ("native:bullmq",)  # its first read: the baseline
            yield fixed(truth)
            bullmq.steps(*COUNTED_WORK)
            # BullMQ's attemptsMade counts every attempt: all but the last were retried
            totals = counted(
                bullmq.finished(["counted"])["counted"],
                lambda job: job["attemptsMade"] - 1,
                added=True,
            )
            yield fixed(Truth(self.system, time.time(), None, totals=totals))
        finally:
            bullmq.stop_all()


def counted(
    jobs: dict[str, dict[str, Any]], retries_of: Callable[[dict[str, Any]], int], added: bool
) -> dict[tuple[str, ...], float]:
    """What the native reader counts for the queue `counted` (COUNTED_WORK), new to it so read
    in full, per the library's finished jobs: each completed, each failed for good
    (non_retryable: none stalled or timed out), each earlier failed attempt (`retries_of` a
    job, from its attemptsMade) a retryable failure and a retry (docs/native.md), and with
    `added` (BullMQ's events stream) each job added."""
    states = [job["state"] for job in jobs.values()]
    retries = sum(retries_of(job) for job in jobs.values())
    assert all(
        job["failedReason"].startswith("planned failure")
        for job in jobs.values()
        if job["state"] == "failed"
    ), jobs
    assert (len(states), states.count("completed"), retries) == (5, 3, 2), jobs
    counts = {
        "queue_jobs_completed_total": states.count("completed"),
        "queue_jobs_failed_total": states.count("failed") + retries,
        "queue_jobs_failed_total error_type=non_retryable": states.count("failed"),
        "queue_jobs_failed_total error_type=retryable": retries,
        "queue_jobs_retried_total": retries,
    }
    if added:
        counts["queue_jobs_enqueued_total"] = len(states)
    return {
        (metric, "counted", *labels): float(n)
        for (metric, *labels), n in ((key.split(), n) for key, n in counts.items())
    }


class BullAdapter(Adapter):
    system = "bull"
    versions: ClassVar[tuple[Any, ...]] = BULL_MAJORS

    @staticmethod
    def truth(library: dict[str, Any]) -> Truth:
        stamps = {q: view["next_timestamps_ms"] for q, view in library["queues"].items()}
        truth = node_truth("bull", BULL_STATES, library, stamps)
        # the longest running job's age, at the moment of the read served: an age that grows
        # as a later job's would grow into a window up to the scrape
        for queue, view in library["queues"].items():
            earliest = min(view["active_processed_on_ms"], default=None)
            started = None if earliest is None else ReadAge(earliest / 1000, "redis")
            truth.ages[queue, "active"] = started
        truth.exact_ages = True
        for queue, view in library["queues"].items():  # the waiting jobs per their priority
            prioritized = {p: count for p, count in view["priorities"].items() if p != "0"}
            for priority, count in prioritized.items():
                truth.totals["queue_depth", queue, "state=pending", f"priority={priority}"] = count
            if prioritized:
                truth.gaps += (Gap(f"total queue_depth {queue}", BULL_PRIORITIES, 0),)
        return truth

    def phases(self) -> Iterator[TruthAt]:
        assert self.redis_db is not None
        bull = Bull(self.version, self.redis_db)
        now_ms = int(time.time() * 1000)
        try:
            bull.hold(
                # waiting jobs, FIFO; prioritized ones, each inserted at its place in the list
                *backdated("emails", now_ms, 90, 60, 30),
                *prioritized("reports", now_ms),
                # a paused queue: its jobs wait in the paused list
                {"op": "pause", "queue": "exports"},
                {"op": "add", "queue": "exports", "count": 2, "opts": {"timestamp": now_ms - 40_000}},
                # delayed: one in an hour, one already due (no processor of its queue promotes it)
                {"op": "add", "queue": "later", "opts": {"delay": 3_600_000}},
                {"op": "add", "queue": "later", "opts": {"delay": 50}},
                {"op": "sleep", "ms": 200},
                *FAILING_WORK,
                *DRAINED_AND_BUSY,  # drained: only its id counter is left
                # a second job kept active, started well after the first: the age is the first's
                {"op": "sleep", "ms": 2000},
                {"op": "add", "queue": "busy", "data": {"sleep_ms": 600_000}},
                {"op": "hold", "queue": "busy"},
            )  # fmt: skip
            queues = ["emails", "reports", "exports", "later", "work", "drained", "busy"]
            library = bull.truth(queues)
            assert library["version"].split(".")[0] == str(bull.major)
            later, busy = library["queues"]["later"], library["queues"]["busy"]
            assert later["due"] == 1 and busy["counts"]["active"] == 2
            truth = self.truth(library)
            truth.sources_up = ("native:bull",)  # its first read: the baseline
            yield fixed(truth)
            bull.steps(*COUNTED_WORK)
            # Bull's attemptsMade counts the attempts that failed: a failed job's last one too
            totals = counted(
                bull.finished(["counted"])["counted"],
                lambda job: job["attemptsMade"] - (job["state"] == "failed"),
                added=False,  # Bull writes no events: nothing counts its adds
            )
            yield fixed(Truth(self.system, time.time(), None, totals=totals))
        finally:
            bull.stop_all()


class BeeQueueAdapter(Adapter):
    system = "bee_queue"
    versions: ClassVar[tuple[Any, ...]] = BEE_QUEUE_MAJORS

    @staticmethod
    def truth(library: dict[str, Any]) -> Truth:
        stamps = {
            queue: [] if view["next_timestamp_ms"] is None else [view["next_timestamp_ms"]]
            for queue, view in library["queues"].items()
        }
        return node_truth("bee_queue", BEE_QUEUE_STATES, library, stamps)

    def phases(self) -> Iterator[TruthAt]:
        assert self.redis_db is not None
        bee_queue = BeeQueue(self.version, self.redis_db)
        now_ms = int(time.time() * 1000)
        try:
            bee_queue.hold(
                *backdated("emails", now_ms, 90, 60, 30),  # the oldest served first
                # delayed: one in an hour, one already due (no worker activates delayed jobs)
                {"op": "add", "queue": "later", "opts": {"delay": 3_600_000}},
                {"op": "add", "queue": "later", "opts": {"delay": 50}},
                {"op": "sleep", "ms": 200},
                # a processor: three succeed, two fail for good, one fails and retries in an hour
                {"op": "add", "queue": "work", "count": 3},
                {"op": "add", "queue": "work", "count": 2, "data": {"fail": "always"}},
                {
                    "op": "add",
                    "queue": "work",
                    "data": {"fail": "always"},
                    "opts": {"retries": 1, "backoff": 3_600_000},
                },
                {"op": "work", "queue": "work", "succeeded": 3, "failed": 2, "retrying": 1},
                *DRAINED_AND_BUSY[2:],  # one job kept active until the end
            )
            library = bee_queue.truth(["emails", "later", "work", "busy"])
            assert library["version"].split(".")[0] == str(bee_queue.major)
            queues = library["queues"]
            assert queues["later"]["due"] == 1 and queues["busy"]["counts"]["active"] == 1
            assert queues["work"]["counts"]["delayed"] == 1
            yield fixed(self.truth(library))
        finally:
            bee_queue.stop_all()
