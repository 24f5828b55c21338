"""arq, Dramatiq, Huey and SAQ, driven through their own APIs and run by their own workers
(tests/<system>_app); the truth is each library's own view of its queues."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from tests.conformance.adapters.base import (
    ROOT,
    Adapter,
    Phase,
    TruthAt,
    fixed,
    require,
    run_json,
)
from tests.conformance.checks import Age, Gap, ReadAge, Truth
from tests.conftest import stop_process, wait_for
from tests.saq_app.control import driver as saq_driver
from tests.saq_app.control import worker as saq_worker

ARQ_PYTHON = ROOT / ".venv/tools/arq/bin/python"
# arq's job statuses -> ours: a running job stays in its queue's zset (arq removes it when it
# ends) and carries an `in-progress` key; deferred ones are scheduled
ARQ_STATES = {"queued": "pending", "in_progress": "active", "deferred": "scheduled"}
# not counted but named (unlisted_queue: tests/config/test_preset_arq.py): a zset of job ids need
# not be a queue (arq:abort is one), and nothing else arq keeps names a queue
UNLISTED = "issue 39: arq's queue with jobs and no live worker is found only when listed"


class ArqAdapter(Adapter):
    system = "arq"

    def _env(self, queue: str = "arq:queue") -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "ARQ_REDIS_URL": self.backend_url,
            "ARQ_QUEUE": queue,
        }

    def _driver(self, *args: str) -> Any:
        argv = [ARQ_PYTHON, "-m", "tests.arq_app.driver", self.backend_url, *args]
        return run_json(argv, self._env())

    def phases(self) -> Iterator[TruthAt]:
        require(ARQ_PYTHON, "arq", "arq")
        # the default queue, no worker: two jobs due since 90 s and 30 s, one deferred by an
        # hour; and a queue nobody lists and no worker serves: arq records it nowhere else
        self._driver("enqueue", json.dumps([
            {"queue": "arq:queue", "function": "succeed", "defer_until": -90},
            {"queue": "arq:queue", "function": "succeed", "defer_until": -30},
            {"queue": "arq:queue", "function": "succeed", "defer_by": 3600},
            {"queue": "arq:unlisted", "function": "succeed"},
        ]))  # fmt: skip
        # "arq:emails", not listed: found through its worker's health-check key. One job at a
        # time: two complete, one fails, one is retried an hour later, then a long one runs and
        # holds the last two queued behind it. Each due since a while, in that order: the
        # running one since 560 s, the two queued since 30 and 20 s (the pending age is 30 s)
        ages = iter((600, 590, 580, 570, 560, 30, 20))
        plan = [
            *({"queue": "arq:emails", "function": "succeed"} for _ in range(2)),
            {"queue": "arq:emails", "function": "fail"},
            {"queue": "arq:emails", "function": "retry_later"},
            {"queue": "arq:emails", "function": "sleep_for", "args": [600]},
            *({"queue": "arq:emails", "function": "succeed"} for _ in range(2)),
        ]
        plan = [{**step, "defer_until": -next(ages)} for step in plan]
        self._driver("enqueue", json.dumps(plan))
        worker = subprocess.Popen(  # the real `arq` command (settings: tests/arq_app/jobs.py)
            [ARQ_PYTHON.parent / "arq", "tests.arq_app.jobs.WorkerSettings"],
            env=self._env("arq:emails"),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:

            def settled() -> dict[str, Any] | None:
                library = self._driver("truth", "arq:queue", "arq:emails", "arq:unlisted")
                statuses = sorted(job["status"] for job in library["queues"]["arq:emails"])
                wanted = ["deferred", "in_progress", "queued", "queued"]
                return library if statuses == wanted else None

            yield fixed(self.truth(wait_for(settled, timeout=60, interval=0.5)))
        finally:
            stop_process(worker, signal.SIGTERM)

    @staticmethod
    def truth(library: dict[str, Any]) -> Truth:
        depths: dict[tuple[str, str], float] = {}
        ages: dict[tuple[str, str], Age | None] = {}
        for queue, jobs in library["queues"].items():
            for state in ("pending", "active", "scheduled"):
                depths[queue, state] = sum(1 for job in jobs if ARQ_STATES[job["status"]] == state)
            # the oldest queued job: arq's score is when it is due (ms); a running one is
            # active, its wait over
            scores = [job["score"] for job in jobs if job["status"] == "queued"]
            ages[queue, "pending"] = Age.at(min(scores) / 1000) if scores else None
        gaps = (
            Gap("queues", UNLISTED, ["arq:emails", "arq:queue"]),
            Gap("depth arq:unlisted", UNLISTED),
            Gap("age arq:unlisted", UNLISTED),
            Gap("sum pending", UNLISTED, sum(n for (q, s), n in depths.items()
                                            if s == "pending" and q != "arq:unlisted")),
        )  # fmt: skip
        return Truth("arq", library["now_ms"] / 1000, depths, ages=ages, gaps=gaps)


# Dramatiq 2.x in the project's venv (the dev extra), 1.x in a venv of its own (scripts/setup.sh)
DRAMATIQ_PYTHONS = {
    "2": Path(sys.executable),
    "1": ROOT / ".venv/tools/dramatiq1/bin/python",
}


class Dramatiq:
    """Dramatiq's driver and Worker; what its middleware hooks report in both processes (each
    message enqueued with its delay and creation time, started, ended, dead-lettered)."""

    def __init__(self, python: Path, redis_url: str, events: Path) -> None:
        self.python, self.events = python, events
        self.version = ""  # Dramatiq's, from its truth
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "REDIS_URL": redis_url,
            "DRAMATIQ_EVENTS": str(events),
            "dramatiq_queue_prefetch": "1",  # one message fetched at a time
        }

    def run(self, *args: str) -> Any:
        return run_json([self.python, "-m", "tests.dramatiq_app.driver", *args], self.env)

    def enqueue(self, *steps: dict[str, Any]) -> None:
        self.run("enqueue", json.dumps(list(steps)))

    def worker(self, queues: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [self.python, "-m", "tests.dramatiq_app.worker"],
            env={**self.env, "DRAMATIQ_QUEUES": queues},
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        return process

    def reported(self) -> list[dict[str, Any]]:
        text = self.events.read_text() if self.events.exists() else ""
        return [json.loads(line) for line in text.splitlines()]

    def truth(self, queues: list[str]) -> Truth:
        """Per queue: the broker's qsize, and from the hooks the messages fetched and not ended
        (active), delayed (scheduled), dead-lettered, and the creation time of the oldest
        message enqueued and not started (the next one a worker takes)."""
        result = self.run("truth", *queues)
        self.version = result["version"]
        events = self.reported()
        started = {e["id"] for e in events if e["event"] == "started"}
        ended = Counter(e["queue"] for e in events if e["event"] == "ended")
        enqueued = [e for e in events if e["event"] == "enqueued"]
        depths: dict[tuple[str, str], float] = {}
        ages: dict[tuple[str, str], Age | None] = {}
        for queue in queues:
            active = sum(1 for e in events if e["event"] == "started" and e["queue"] == queue)
            depths[queue, "active"] = active - ended[queue]
            depths[queue, "scheduled"] = sum(
                1 for e in enqueued if e["delay"] is not None and e["queue"] == f"{queue}.DQ"
            )
            depths[queue, "dead_letter"] = sum(
                1 for e in events if e["event"] == "dead_lettered" and e["queue"] == queue
            )
            waiting = [
                e["timestamp"]
                for e in enqueued
                if e["queue"] == queue and e["delay"] is None and e["id"] not in started
            ]
            depths[queue, "pending"] = (
                result["qsize"][queue] - depths[queue, "active"] - depths[queue, "scheduled"]
            )
            ages[queue, "pending"] = Age.at(min(waiting) / 1000) if waiting else None
        return Truth("dramatiq", result["now_ms"] / 1000, depths, ages=ages)


class DramatiqAdapter(Adapter):
    system = "dramatiq"
    versions: ClassVar[tuple[Any, ...]] = tuple(sorted(DRAMATIQ_PYTHONS))

    def phases(self) -> Iterator[TruthAt]:
        python = DRAMATIQ_PYTHONS[self.version]
        require(python, "dramatiq", f"dramatiq{self.version}")
        driver = Dramatiq(python, self.backend_url, self.tmp_path / "events.jsonl")
        # a queue whose one message died: its dead letter is all that is left of it (Redis
        # deletes the emptied messages hash); its own worker, started beside the other
        driver.enqueue({"actor": "doomed"})
        workers = [driver.worker("graveyard")]
        try:
            # one worker thread taking one message at a time: two complete, one fails into the
            # dead-letter queue, one fails and waits an hour for its retry, then a long one runs
            driver.enqueue(
                {"actor": "succeed"},
                {"actor": "succeed"},
                {"actor": "fail"},
                {"actor": "fail_then_retry"},
                {"actor": "sleep_for", "args": [600]},
            )
            workers.append(driver.worker("default"))
            wait_for(lambda: self._events(driver, "graveyard")["dead_lettered"], timeout=60)
            stop_process(workers[0], signal.SIGTERM)

            def running() -> bool:
                kinds = self._events(driver, "default")
                return kinds["started"] == 5 and kinds["ended"] == 4 and kinds["dead_lettered"] == 1

            wait_for(running, timeout=60, interval=0.3)
            # waiting behind the long one, created 90, 60 and 30 s ago; two delayed by an hour;
            # a queue no worker serves nor anyone lists, found by its messages hash; and one
            # holding only a delayed message, found by its delay queue
            driver.enqueue(
                *({"actor": "succeed", "age": age} for age in (90, 60, 30)),
                *({"actor": "succeed", "delay": 3_600_000} for _ in range(2)),
                {"actor": "report", "age": 200},
                {"actor": "digest", "delay": 3_600_000},
            )
            truth = driver.truth(["default", "reports", "digests", "graveyard"])
            assert driver.version.split(".")[0] == self.version
            assert truth.depths is not None and truth.depths["default", "active"] == 1
            assert truth.depths["digests", "scheduled"] == truth.depths["graveyard", "dead_letter"]
            yield fixed(truth)
        finally:
            for worker in workers:
                stop_process(worker, signal.SIGTERM)

    @staticmethod
    def _events(driver: Dramatiq, queue: str) -> Counter[str]:
        return Counter(e["event"] for e in driver.reported() if e["queue"] == queue)


# Huey 3.x in the project's venv (the dev extra), 2.x in a venv of its own (scripts/setup.sh)
HUEY_PYTHONS = {"3": Path(sys.executable), "2": ROOT / ".venv/tools/huey2/bin/python"}
HUEY_DUE_IN = 8  # seconds at least; more on a host slower to run the consumer (measured)


class Huey:
    def __init__(self, python: Path, redis_url: str, name: str, priority: bool = False) -> None:
        self.python, self.name = python, name
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "REDIS_URL": redis_url,
            "HUEY_NAME": name,
            "HUEY_PRIORITY": "1" if priority else "0",
        }

    def run(self, *args: str) -> Any:
        return run_json([self.python, "-m", "tests.huey_app.driver", *args], self.env)

    def enqueue(self, *steps: dict[str, Any]) -> list[tuple[float, float]]:
        """Each step's enqueue window: epoch seconds before and after Huey's call."""
        windows: list[tuple[float, float]] = self.run("enqueue", json.dumps(list(steps)))
        return windows

    def truth(self) -> dict[str, Any]:
        """pending_count(), scheduled_count() and the due tasks among scheduled()."""
        result: dict[str, Any] = self.run("truth")
        return result

    def consumer(self) -> subprocess.Popen[bytes]:
        """The real `huey_consumer`, one worker thread."""
        return subprocess.Popen(
            [self.python.parent / "huey_consumer", "tests.huey_app.tasks.huey", "-w", "1", "-k", "thread"],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip


class HueyAdapter(Adapter):
    """An app's Hueys, named as an app names them: `emails`, a RedisHuey served by a consumer
    for a while, `reports`, a RedisHuey never served, and `vip`, a PriorityRedisHuey. With no
    params all three are found by their keys; the `names` param narrows them to the two
    RedisHueys (the third found and reported, not counted)."""

    system = "huey"
    versions: ClassVar[tuple[Any, ...]] = tuple(sorted(HUEY_PYTHONS))
    timeout: ClassVar[float] = 20.0

    def variants(self) -> dict[str, list[Any]]:
        named = {"name": "huey", "params": {"names": ["emails", "reports"]}}
        return {**super().variants(), "named": [named]}

    def phases(self) -> Iterator[Phase]:
        python = require(HUEY_PYTHONS[self.version], "huey", f"huey{self.version}")
        # Huey puts a task with an eta on the queue; the consumer that takes it moves it to the
        # schedule, and its scheduler moves it back when due. With one worker: two complete, one
        # fails, one is retried in an hour, two wait in the schedule (an hour, and a few seconds)
        emails = Huey(python, self.backend_url, "emails")
        began = time.monotonic()
        emails.enqueue(
            {"task": "succeed"},
            {"task": "succeed"},
            {"task": "fail"},
            {"task": "fail_then_retry"},
            {"task": "succeed", "delay": 3600},
        )
        consumer = emails.consumer()
        try:
            wait_for(lambda: emails.truth()["scheduled"] == 2, timeout=120, interval=0.2)
            # The short delay must reach the schedule and the consumer stop before it is due
            # (else the consumer runs it): sent only now the consumer is running, with a delay
            # of three times what starting it and scheduling the first two took on this host
            due_in = max(HUEY_DUE_IN, 3 * (time.monotonic() - began))
            emails.enqueue({"task": "succeed", "delay": due_in})
            wait_for(lambda: emails.truth()["scheduled"] == 3, timeout=120, interval=0.2)
        finally:
            stop_process(consumer, signal.SIGINT)
        # the consumer gone, three more wait in the queue and the short delay comes due
        emails.enqueue(*({"task": "succeed"} for _ in range(3)))
        emails_truth = wait_for(
            lambda: (t := emails.truth())["due"] == 1 and t, timeout=due_in + 60
        )
        assert (emails_truth["pending"], emails_truth["scheduled"]) == (3, 3)
        # no consumer ever: even the delayed task is pending
        reports = Huey(python, self.backend_url, "reports")
        reports.enqueue(
            {"task": "succeed"}, {"task": "succeed"}, {"task": "succeed", "delay": 3600}
        )
        # a PriorityRedisHuey: its queue is a zset, each member prefixed with its enqueue time
        # and scored by its priority (negated); two at priority 5, one at none (0)
        vip = Huey(python, self.backend_url, "vip", priority=True)
        plan = [{"task": "succeed", "priority": p} for p in (1, 5, None, 5, 10)]
        windows = vip.enqueue(*({k: v for k, v in s.items() if v is not None} for s in plan))
        oldest: dict[str, Age] = {}  # per priority, its first task's enqueue window
        for step, (before, after) in zip(plan, windows, strict=True):
            oldest.setdefault(str(step["priority"] or 0), Age(before, after))
        library = {"emails": emails_truth, "reports": reports.truth(), "vip": vip.truth()}
        assert library["reports"]["pending"] == 3 and library["vip"]["pending"] == len(plan)
        assert library["vip"]["priorities"] == {"1": 1, "5": 2, "0": 1, "10": 1}
        yield self.truth(library, oldest), ("defaults",)
        named = {queue: library[queue] for queue in ("emails", "reports")}
        yield self.truth(named, {}), ("named",)

    @staticmethod
    def truth(library: dict[str, dict[str, Any]], vip_oldest: dict[str, Age]) -> TruthAt:
        """Huey's counts; a PriorityRedisHuey's pending tasks per priority (its pending()), and
        the age of the first enqueued at each; a RedisHuey's list records no enqueue time."""
        depths: dict[tuple[str, ...], float] = {}
        for queue, view in library.items():
            depths[queue, "scheduled"] = view["scheduled"]
            if queue == "vip":
                depths.update({(queue, "pending", p): n for p, n in view["priorities"].items()})
            else:
                depths[queue, "pending"] = view["pending"]
        due = {queue: view["due"] for queue, view in library.items()}
        ages: dict[tuple[str, ...], Age | ReadAge | None] = {
            ("vip", "pending", priority): age for priority, age in vip_oldest.items()
        }
        truth = Truth(
            "huey", time.time(), depths, due=due, exact_due=True, ages=ages, exact_ages=True
        )
        return fixed(truth)


SAQ_STATES = {
    "queued": "pending",
    "active": "active",
    "scheduled": "scheduled",
    "failed": "failed",  # the failed jobs' records SAQ keeps, Queue.iter_jobs([FAILED])
}
SAQ_COUNTERS = {  # metric -> the field of SAQ's worker stats, the metric's labels
    "queue_jobs_completed_total": ("complete",),
    "queue_jobs_failed_total": ("failed", "error_type=non_retryable"),
    "queue_jobs_retried_total": ("retried",),
}


class SaqAdapter(Adapter):
    system = "saq"

    def phases(self) -> Iterator[TruthAt]:
        require(Path(sys.executable), "saq", "saq (pyproject's dev extra)")
        # the native reader's first read is its baseline: the workers count from there on
        yield fixed(Truth("saq", time.time(), None, sources_up=("native:saq",)))
        # a worker taking one job at a time: two complete, one fails, one fails and is retried
        # an hour later, then a long one stays active with three queued behind it; one job is
        # scheduled an hour ahead
        work = [
            {"queue": "work", "function": "succeed"},
            {"queue": "work", "function": "succeed"},
            {"queue": "work", "function": "fail"},
            {"queue": "work", "function": "fail", "retries": 2, "retry_delay": 3600},
            {"queue": "work", "function": "sleep_for", "kwargs": {"seconds": 600}, "timeout": 900},
            *({"queue": "work", "function": "succeed"} for _ in range(3)),
            {"queue": "work", "function": "succeed", "in": 3600},
        ]
        # no worker, found by its incomplete jobs: two queued, one scheduled already due
        idle = [
            {"queue": "idle", "function": "succeed"},
            {"queue": "idle", "function": "succeed"},
            {"queue": "idle", "function": "succeed", "in": -60},
        ]
        saq_driver(self.backend_url, "enqueue", json.dumps(work + idle))
        worker, _ = saq_worker(self.backend_url, "work")
        try:

            def settled() -> dict[str, Any] | None:
                library = saq_driver(self.backend_url, "truth", "default", "work", "idle")
                view = library["queues"]["work"]
                counts = (view["queued"], view["active"], view["scheduled"])
                # and its worker's stats, written every second, counted what it ran
                stats = [
                    (s["complete"], s["failed"], s["retried"]) for s in view["workers"].values()
                ]
                # and the long job written as its worker's (its start and worker id)
                busy = view["busy"] == list(view["workers"])
                return library if counts == (3, 1, 2) and stats == [(2, 1, 1)] and busy else None

            library = wait_for(settled, timeout=60, interval=0.3)
            assert library["queues"]["idle"]["scheduled"] == 1
            yield fixed(self.truth(library))
        finally:
            stop_process(worker, signal.SIGTERM)

    @staticmethod
    def truth(library: dict[str, Any]) -> Truth:
        """SAQ's Queue.info() of each queue and the enqueue time of its oldest queued job."""
        depths = {
            (queue, state): view[kind]
            for queue, view in library["queues"].items()
            for kind, state in SAQ_STATES.items()
        }
        ages: dict[tuple[str, str], Age | None] = {}
        for queue, view in library["queues"].items():
            oldest, started = view["oldest_ms"], view["active_started_ms"]
            ages[queue, "pending"] = None if oldest is None else Age.at(oldest / 1000)
            if started is not None:  # the longest running job, from the time SAQ started it
                ages[queue, "active"] = Age.at(started / 1000)
        # the live workers of each queue, from their stats keys (Queue.info()'s workers), busy
        # those an active job names, and what those workers counted: completed, failed for
        # good, retried
        totals: dict[tuple[str, ...], float] = {}
        for queue, view in library["queues"].items():
            stats = list(view["workers"].values())
            totals["queue_workers", queue] = len(stats)
            totals["queue_workers", queue, "state=busy"] = len(view["busy"])
            totals["queue_workers", queue, "state=idle"] = len(stats) - len(view["busy"])
            for metric, (field, *labels) in SAQ_COUNTERS.items():
                totals[(metric, queue, *labels)] = sum(s[field] for s in stats)
        return Truth("saq", library["now_ms"] / 1000, depths, ages=ages, totals=totals)
