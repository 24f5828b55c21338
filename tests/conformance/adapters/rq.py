"""RQ 1/2/3: jobs produced by RQ (tests/rq_app/driver.py), run by real `rq worker` processes;
the truth is RQ's own Queue.count and registries, read by the same RQ version."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from tests.conformance.adapters.base import ROOT, Adapter, Phase, fixed, require, run_json
from tests.conformance.checks import Age, Truth
from tests.conftest import (
    Series,
    assert_runtimes_bucketed,
    descendants,
    stop_process,
    total,
    wait_for,
)

RQ_PYTHONS = {
    "3": Path(sys.executable),
    "2": ROOT / ".venv/tools/rq2/bin/python",
    "1": ROOT / ".venv/tools/rq1/bin/python",
}
SLEEP = 0.3  # seconds each completing job sleeps: more than the 0.25 bucket
PLAN = [
    *({"queue": "default", "call": "sleep_for", "seconds": SLEEP} for _ in range(4)),
    {"queue": "default", "call": "fail_after", "seconds": 0},
    # fails twice: one retryable attempt (it runs long enough to be seen started), then final
    {"queue": "default", "call": "fail_after", "seconds": 1.0, "retries": 1},
    {"queue": "default", "call": "sleep_for", "seconds": 5, "timeout": 1},
    {"queue": "default", "call": "sleep_for", "seconds": 0.1, "in": 3600},  # scheduled
    {"queue": "default", "call": "sleep_for", "seconds": 0.1, "in": -60},  # due: no scheduler
    {"queue": "default", "call": "sleep_for", "seconds": 0.1, "after": 7},  # deferred on 7
    {"queue": "default", "call": "sleep_for", "seconds": 0.1, "cancel": True},
    *({"queue": "other", "call": "sleep_for", "seconds": 0.1} for _ in range(2)),
    # RQ 3: one of three may run at a time, the other two wait in the rate limit's zset
    *(
        {"queue": "limited", "call": "sleep_for", "seconds": 0.1, "rate_limit": ["lim", 1]}
        for _ in range(3)
    ),
]
STATE_OF_REGISTRY = {
    "queued": "pending",
    "started": "active",
    "finished": "completed",
    "failed": "failed",
    "canceled": "failed",
    "deferred": "scheduled",
    "scheduled": "scheduled",
    "rate_limited": "pending",
}
JOB_TYPE = "tests.rq_app.jobs.sleep_for"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def rq_driver(python: Path, redis_url: str, *args: str) -> Any:
    argv = [python, "-m", "tests.rq_app.driver", redis_url, *args]
    return run_json(argv, ENV)


def rq_worker(python: Path, redis_url: str, *queues: str, burst: bool) -> subprocess.Popen[bytes]:
    rq = python.parent / "rq"
    args = [rq, "worker", "--url", redis_url, *(["--burst"] if burst else []), *queues]
    return subprocess.Popen(
        args, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT
    )


def stop_rq_worker(worker: subprocess.Popen[bytes]) -> None:
    stop_process(worker, signal.SIGINT)  # warm shutdown: RQ deregisters the worker


def stop_rq_worker_now(worker: subprocess.Popen[bytes]) -> None:
    """Its running job's work horse killed (a process group of its own, which a second
    SIGINT does not reach in RQ 3), then the worker stopped: it fails the job and exits."""
    for horse in descendants(worker.pid) if worker.poll() is None else ():
        with contextlib.suppress(ProcessLookupError):
            os.kill(horse, signal.SIGKILL)
    stop_rq_worker(worker)


class RqAdapter(Adapter):
    system = "rq"
    versions: ClassVar[tuple[Any, ...]] = ("1", "2", "3")
    # beside busy loops a worker's reads take long: its counts and workers may take a while
    timeout: ClassVar[float] = 120.0

    def phases(self) -> Iterator[Phase]:
        python = require(RQ_PYTHONS[self.version], "rq", f"rq{self.version}")
        url = self.backend_url
        # The default interval: a job that fails after 1 s is seen started by a read during its
        # run. The native reader's first read is its baseline: jobs are produced after it.
        yield fixed(Truth("rq", time.time(), None, sources_up=("native:rq",)))
        rq_driver(python, url, "enqueue", json.dumps(PLAN))
        idle = rq_worker(python, url, "idle", burst=False)
        try:
            rq_worker(python, url, "default", burst=True).wait(timeout=120)
            library = rq_driver(python, url, "truth", "default", "other", "idle", "limited")
            yield fixed(self.truth(library))
            # a worker that stays is idle on its queue; stopped, it leaves
            stop_rq_worker(idle)
            workers = ("queue_workers", "idle", "state=idle")
            yield fixed(Truth("rq", time.time(), None, totals={workers: 0}))
            # another worker process: the counts go on from where they were
            rq_driver(python, url, "enqueue", json.dumps(PLAN[:2]))
            rq_worker(python, url, "default", burst=True).wait(timeout=120)
            completed = ("queue_jobs_completed_total", "default")
            yield fixed(Truth("rq", time.time(), None, totals={completed: 6}))
            yield from self._running(python, url)
        finally:
            stop_rq_worker(idle)

    @staticmethod
    def _running(python: Path, url: str) -> Iterator[Phase]:
        """Two jobs running on two workers: the first started with a long timeout, the second
        with a short one. RQ scores its started registry by each job's deadline, so the second
        heads it; the longest running is the first, by RQ's own started_at."""
        workers = []
        try:
            for running, timeout in ((1, 900), (2, 120)):
                step = {"queue": "slow", "call": "sleep_for", "seconds": 600, "timeout": timeout}
                rq_driver(python, url, "enqueue", json.dumps([step]))
                workers.append(rq_worker(python, url, "slow", burst=False))

                def started(running: int = running) -> dict[str, Any] | None:
                    library = rq_driver(python, url, "truth", "slow")
                    return library if library["queues"]["slow"]["started"] == running else None

                library = wait_for(started, timeout=60, interval=0.3)
            since = library["running_since"]["slow"]
            ages = {("slow", "active"): Age.at(since)}
            yield fixed(Truth("rq", time.time(), None, ages=ages))
        finally:
            for worker in workers:
                stop_rq_worker_now(worker)

    @staticmethod
    def truth(library: dict[str, Any]) -> Truth:
        if library["version"].startswith("3."):
            assert library["queues"]["limited"]["rate_limited"] == 2
        depths: dict[tuple[str, str], float] = {}
        for queue, counts in library["queues"].items():
            for registry, count in counts.items():
                key = (queue, STATE_OF_REGISTRY[registry])
                depths[key] = depths.get(key, 0) + count
        assert depths["default", "completed"] == 4
        assert depths["default", "failed"] == 4  # 3 failures and 1 canceled
        # "idle" has no job: RQ does not know it either
        unknown = {key: n for key, n in depths.items() if key[0] not in library["all_queues"]}
        assert not any(unknown.values()), unknown
        assert library["due"]["default"] == 1
        runtimes = library["runtimes"]["default"][JOB_TYPE]
        assert len(runtimes) == 4 and min(runtimes) >= SLEEP
        counted = {
            "queue_jobs_completed_total": 4,
            "queue_jobs_failed_total": 4,
            "queue_jobs_failed_total error_type=non_retryable": 2,
            "queue_jobs_failed_total error_type=timeout": 1,
            "queue_jobs_failed_total error_type=retryable": 1,
            "queue_jobs_retried_total": 1,
            "queue_jobs_timed_out_total": 1,
            "queue_jobs_started_total": 8,  # 7 jobs, 1 retry
        }
        totals: dict[tuple[str, ...], float] = {
            (metric, "default", *labels): n
            for (metric, *labels), n in ((key.split(), n) for key, n in counted.items())
        }
        totals["queue_workers", "idle", "state=idle"] = 1

        def runs_bucketed(series: Series) -> list[str]:
            """Each run in the bucket RQ's own started_at and ended_at put it in; the bounds
            below the job timed out at 1 s, whose end RQ's failed record does not give."""
            bucket = {"queue": "default", "job_type": JOB_TYPE}
            try:
                assert_runtimes_bucketed(series, runtimes, below=1.0, **bucket)
            except AssertionError as error:
                return [f"runtimes not bucketed as RQ's: {error}"]
            waits = total(series, "queue_job_wait_seconds_count", **bucket)
            return [] if waits >= 4 else [f"queue_job_wait_seconds_count {waits}, 4 runs"]

        ages = {
            (queue, "pending"): None if enqueued is None else Age.at(enqueued, below=5, above=0)
            for queue, enqueued in library["oldest_enqueued_at"].items()
        }
        return Truth(
            "rq",
            time.time(),
            {key: n for key, n in depths.items() if key[0] in library["all_queues"]},
            due={queue: library["due"][queue] for queue in library["all_queues"]},
            ages=ages,
            exact_ages=True,
            totals=totals,
            extra=runs_bucketed,
        )
