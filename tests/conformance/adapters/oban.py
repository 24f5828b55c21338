"""Oban 0.7 (the Python implementation, which writes Elixir Oban's tables): its own schema, its
own enqueue and a real Oban instance running queues, all under the Oban venv's Python 3.12
(tests/oban_app/driver.py); the truth is Oban.get_job of every job the scenario enqueued and
the queues the running instance reported."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.conformance.adapters.base import ROOT, Adapter, Phase, fixed, require, run_json
from tests.conformance.checks import ReadAge, Truth
from tests.conftest import stop_process, wait_for

PYTHON = ROOT / ".venv/tools/oban/bin/python"
DRIVER = ROOT / "tests/oban_app/driver.py"
SOURCES = (
    "postgres:oban_jobs",
    "postgres:oban_due",
    "postgres:oban_workers",
    "postgres:oban_slots",
    "postgres:oban_utilization",
    "native:oban",
)
STATES = ("pending", "scheduled", "retry", "active", "failed")
# Oban's states onto the exporter's (completed and cancelled jobs are not in queue_depth)
STATE_OF = {
    "available": "pending",
    "scheduled": "scheduled",
    "suspended": "scheduled",
    "executing": "active",
    "retryable": "retry",
    "discarded": "failed",
}
ENDED = ("completed", "discarded", "cancelled")


def oban_driver(dsn: str) -> Callable[..., Any]:
    """tests/oban_app/driver.py's commands on the database `dsn`, run with the Oban venv's
    Python: what each printed, as JSON."""
    python = require(PYTHON, "oban", "Oban 0.7")

    def run(command: str, *args: str) -> Any:
        return run_json([python, DRIVER, command, dsn, *args], env=dict(os.environ))

    return run


class ObanAdapter(Adapter):
    """Jobs enqueued through Oban's workers before a real Oban instance starts: they complete,
    fail for good (one attempt), fail into an hour-long retry wait, wait for a schedule, are
    cancelled, and one keeps running until released; "idle" has jobs and no
    producer (a scheduled one stays due: only a queue's producer stages it), "quiet"
    a producer and no job. Then, after the finished-rows reader's first read, more complete,
    fail, and fail once before completing on the retry."""

    system = "oban"
    backend = "postgres"

    def phases(self) -> Iterator[Phase]:
        python = require(PYTHON, "oban", "Oban 0.7")
        release = self.tmp_path / "release"
        driver = oban_driver(self.backend_url)
        driver("install")
        ids: list[int] = driver("seed", str(release))
        worker, queues = self._worker(python)
        try:

            def library() -> dict[str, Any]:
                result: dict[str, Any] = driver("truth", *map(str, ids))
                return result

            def settled() -> dict[str, Any] | None:
                now = library()
                states = Counter((job["queue"], job["state"]) for job in now["jobs"])
                done = (
                    states["emails", "completed"] == 4
                    and states["emails", "discarded"] == 2
                    and states["reports", "retryable"] == 1
                    and states["slow", "executing"] == 1
                    and all(  # the "idle" job scheduled a second ahead is due
                        job["scheduled_at"] < now["now"]
                        for job in now["jobs"]
                        if job["queue"] == "idle"
                    )
                )
                return now if done else None

            running = wait_for(settled, timeout=60)

            # The reader's baseline takes the rows finished a second before its first read:
            # the seed's last finish more than a second ago, it counts them all.
            def all_settled() -> dict[str, Any] | None:
                now = library()
                last = max((job["finished_at"] or 0.0 for job in now["jobs"]), default=0.0)
                return now if now["now"] > last + 1.0 else None

            ended_before = {
                job["id"] for job in wait_for(all_settled)["jobs"] if job["state"] in ENDED
            }
            started = next(
                job["attempted_at"] for job in running["jobs"] if job["state"] == "executing"
            )
            idle_first = min(
                job["scheduled_at"] for job in running["jobs"] if job["queue"] == "idle"
            )

            def truth(holding: bool) -> Truth:
                now = library()
                jobs = now["jobs"]
                depths: Counter[tuple[str, str]] = Counter()
                for queue in {*queues, *(job["queue"] for job in jobs)}:
                    for state in STATES:
                        depths[queue, state] += 0
                due = Counter()
                for job in jobs:
                    if job["state"] in STATE_OF:
                        depths[job["queue"], STATE_OF[job["state"]]] += 1
                    if (
                        job["state"] in ("scheduled", "retryable")
                        and job["scheduled_at"] <= now["now"]
                    ):
                        due[job["queue"]] += 1
                ages: dict[tuple[str, str], Any] = {
                    ("idle", "pending"): ReadAge(idle_first, "postgres:oban_jobs"),
                    ("slow", "active"): ReadAge(started, "postgres:oban_jobs") if holding else None,
                }
                return Truth(
                    "oban",
                    now["now"],
                    {key: float(n) for key, n in depths.items()},
                    exact_states=True,
                    due={queue: float(n) for queue, n in due.items()},
                    exact_due=True,
                    ages=ages,
                    exact_ages=True,
                    totals={**finished(jobs), **workers(jobs)},
                    sources_up=SOURCES,
                )

            def finished(jobs: list[dict[str, Any]]) -> dict[tuple[str, ...], float]:
                """What the finished-rows reader counts after its first read, per queue, as
                get_job says: the jobs that ended since (completed: completed; discarded: a
                failure, `error_type="other"`); a retried attempt leaves no row of its own."""
                ended = Counter(
                    (job["queue"], job["state"]) for job in jobs if job["id"] not in ended_before
                )
                totals: dict[tuple[str, ...], float] = {}
                for queue in ("emails", "reports", "slow", "idle"):
                    totals["queue_jobs_completed_total", queue] = float(ended[queue, "completed"])
                    failed = float(ended[queue, "discarded"])
                    totals["queue_jobs_failed_total", queue, "error_type=other"] = failed
                return totals

            def workers(jobs: list[dict[str, Any]]) -> dict[tuple[str, ...], float]:
                """The one Oban instance started: a producer per queue it runs (with its
                local_limit), busy while one of its jobs executes (get_job's attempted_by)."""
                executing = Counter(job["queue"] for job in jobs if job["state"] == "executing")
                totals: dict[tuple[str, ...], float] = {}
                for queue, limit in queues.items():
                    busy = executing[queue]
                    totals["queue_workers", queue, "state=busy"] = float(busy > 0)
                    totals["queue_workers", queue, "state=idle"] = float(busy == 0)
                    totals["queue_worker_slots", queue, "state=busy"] = float(busy)
                    totals["queue_worker_slots", queue, "state=free"] = float(limit - busy)
                    totals["queue_worker_utilization_ratio", queue] = busy / limit
                return totals

            yield lambda _at: truth(holding=True)
            release.touch()  # the held job completes: active drops to 0, its age goes
            yield lambda _at: truth(holding=False)
            more: list[int] = driver("more")
            ids.extend(more)

            def more_ended() -> bool:
                jobs = {job["id"]: job for job in library()["jobs"]}
                flaky_once = [jobs[i] for i in more if jobs[i]["worker"].endswith("FlakyOnce")]
                return all(
                    jobs[i]["state"] in ENDED for i in more if jobs[i]["queue"] != "idle"
                ) and [(job["state"], job["attempt"]) for job in flaky_once] == [("completed", 2)]

            wait_for(more_ended, timeout=60)
            final = truth(holding=False)
            assert final.totals["queue_jobs_completed_total", "emails"] == 4, final.totals
            assert final.totals["queue_jobs_failed_total", "emails", "error_type=other"] == 2
            yield fixed(final)
        finally:
            release.touch()
            stop_process(worker, signal.SIGTERM, 20)

    def _worker(self, python: Path) -> tuple[subprocess.Popen[str], dict[str, int]]:
        """A real Oban instance running its queues; the queues and their limits it printed."""
        log = (self.tmp_path / "worker.log").open("w")
        process = subprocess.Popen(
            [python, DRIVER, "worker", self.backend_url],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("started "):
            stop_process(process, signal.SIGTERM, 5)
            raise AssertionError(f"the Oban worker did not start: {line!r}")
        return process, json.loads(line.removeprefix("started "))
