"""PgQueuer 1.x: its own schema (Queries.install), its own enqueue and a real worker
(PgQueuer.run), all run by the pgqueuer1 venv's Python (tests/pgqueuer_app/driver.py); the truth is
PgQueuer's own view at each scrape (Queries.queue_size, its queue and log tables)."""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import Iterator
from typing import Any

from tests.conformance.adapters.base import Adapter, Phase, fixed
from tests.conformance.checks import Age, Truth
from tests.conftest import stop_process, wait_for
from tests.pgqueuer_app import control

SOURCES = ("postgres:pgqueuer_jobs", "postgres:pgqueuer_failed", "native:pgqueuer")
STATES = ("pending", "scheduled", "retry", "active")  # the states of a queue found every cycle
LATER = 3600  # seconds: a job deferred this far stays scheduled through the test


class PgQueuerAdapter(Adapter):
    """Jobs enqueued through PgQueuer (some for later) and run by a real PgQueuer worker: they
    succeed, fail (deleted), fail and are kept (on_failure="hold"), fail into an hour-long
    retry wait, fail once and succeed on the retry, and one keeps running until released; an
    entrypoint no worker serves keeps its jobs waiting. Then, after the log reader's first
    read, more are enqueued: they succeed, fail, and are retried once."""

    system = "pgqueuer"
    backend = "postgres"

    def _driver(self, *args: str) -> Any:
        return control.driver(self.backend_url, *args)

    def _enqueue(self, plan: list[dict[str, Any]]) -> list[int]:
        made: list[int] = self._driver("enqueue", json.dumps(plan))
        return made

    def phases(self) -> Iterator[Phase]:
        self._driver("install")
        release = self.tmp_path / "release"
        self._enqueue([
            {"entrypoint": "emails", "payload": "ok"},
            {"entrypoint": "emails", "payload": "ok"},
            {"entrypoint": "emails", "payload": "fail"},
            {"entrypoint": "kept", "payload": "fail"},
            {"entrypoint": "reports", "payload": "retry"},
            {"entrypoint": "reports", "payload": "flaky"},
            {"entrypoint": "reports", "payload": "ok", "execute_after": LATER},
            {"entrypoint": "slow", "payload": "hold"},
            {"entrypoint": "slow", "payload": "ok", "execute_after": LATER},
        ])  # fmt: skip
        # no worker serves "idle": its jobs wait, the first since its enqueue
        self._enqueue([{"entrypoint": "idle"}, {"entrypoint": "idle"}])
        self._enqueue([{"entrypoint": "idle", "execute_after": LATER}])
        worker = control.worker(self.backend_url, release)
        try:

            def settled() -> dict[str, Any] | None:
                library = self._driver("truth")
                sizes = {
                    (size["entrypoint"], size["status"]): size["count"] for size in library["sizes"]
                }
                ended = Counter(entry["status"] for entry in library["log"])
                done = (
                    sizes.get(("slow", "picked")) == 1
                    and sizes.get(("kept", "failed")) == 1
                    and ended["successful"] == 3  # two emails, the flaky report's retry
                    and ended["exception"] == 1
                    # the log reader's baseline takes the rows older than a second: all of them
                    and library["now"] > library["log"][-1]["created"] + 1.0
                )
                return library if done else None

            seeded = wait_for(settled, timeout=60, interval=0.5)
            baseline = seeded["log"][-1]["id"]
            idle_first = min(
                job["execute_after"]
                for job in seeded["jobs"]
                if job["entrypoint"] == "idle" and job["status"] == "queued"
            )
            picked = next(job["updated"] for job in seeded["jobs"] if job["status"] == "picked")
            # the kept failed job is counted at the exporter's start, then every 60 s: found
            # queues stay found (each keeps a job for later), so its count holds all along
            failed_queues = {job["entrypoint"] for job in seeded["jobs"]}

            def truth(holding: bool) -> Truth:
                library = self._driver("truth")
                return Truth(
                    "pgqueuer",
                    library["now"],
                    depths(library, failed_queues),
                    exact_states=True,
                    ages={
                        ("idle", "pending"): Age.at(idle_first, 1, 1),
                        ("slow", "active"): Age.at(picked, 1, 1) if holding else None,
                    },
                    exact_ages=True,
                    totals=counted_since(baseline, library),
                    sources_up=SOURCES,
                )

            yield lambda _at: truth(holding=True)
            release.touch()  # the held job ends: active drops to 0, its age goes
            made = self._enqueue([
                {"entrypoint": "emails", "payload": "ok"},
                {"entrypoint": "emails", "payload": "ok"},
                {"entrypoint": "emails", "payload": "fail"},
                {"entrypoint": "reports", "payload": "flaky"},
                {"entrypoint": "idle"},
            ])  # fmt: skip

            def ended() -> bool:
                library = self._driver("truth")
                last = {entry["job_id"]: entry["status"] for entry in library["log"]}
                return all(last[job] in ("successful", "exception") for job in made[:4]) and (
                    last.get(seeded_slow(seeded)) == "successful"
                )

            wait_for(ended, timeout=60, interval=0.5)
            library = self._driver("truth")
            totals = counted_since(baseline, library)
            assert totals["queue_jobs_retried_total", "reports"] == 1, totals
            assert totals["queue_jobs_failed_total", "emails", "error_type=other"] == 1, totals
            yield lambda _at: truth(holding=False)
            yield fixed(Truth("pgqueuer", library["now"], None, totals=totals))
        finally:
            release.touch()
            stop_process(worker, signal.SIGTERM)


def seeded_slow(library: dict[str, Any]) -> int:
    """The id of the job the worker holds (picked)."""
    return int(next(job["id"] for job in library["jobs"] if job["status"] == "picked"))


def depths(library: dict[str, Any], failed_queues: set[str]) -> dict[tuple[str, ...], float]:
    """PgQueuer's own counts (Queries.queue_size) per entrypoint, its queued ones split by its
    rows: pending once execute_after passed, else retry when attempts > 0, else scheduled.
    Every entrypoint with a queued or picked job reads 0 in each of STATES it has no job in;
    the kept failed jobs are counted for the entrypoints found at the exporter's start."""
    counted: Counter[tuple[str, ...]] = Counter()
    queued: Counter[str] = Counter()
    for size in library["sizes"]:
        entrypoint, status = size["entrypoint"], size["status"]
        if status in ("queued", "picked"):
            for state in STATES:
                counted[entrypoint, state] += 0
        if status == "picked":
            counted[entrypoint, "active"] += size["count"]
        if status == "queued":
            queued[entrypoint] += size["count"]
        if status == "failed":
            counted[entrypoint, "failed"] += size["count"]
    for entrypoint in failed_queues:
        counted[entrypoint, "failed"] += 0
    for job in library["jobs"]:
        if job["status"] != "queued":
            continue
        if job["execute_after"] <= library["now"]:
            state = "pending"
        else:
            state = "retry" if job["attempts"] > 0 else "scheduled"
        counted[job["entrypoint"], state] += 1
        queued[job["entrypoint"]] -= 1
    assert not +queued and not -queued, f"queue_size and the rows differ: {queued}"
    return {key: float(n) for key, n in counted.items()}


def counted_since(baseline: int, library: dict[str, Any]) -> dict[tuple[str, ...], float]:
    """What the log reader counts after its first read (its baseline: every log row older
    than a second then, `baseline` the last), per entrypoint, from PgQueuer's own log: each
    enqueue (queued, no traceback), each retry (queued with the traceback of what asked for
    it; a retryable failure too), each success and each failure for good (exception, or
    failed when kept)."""
    names = ("enqueued", "completed", "failed", "retried")
    counts: Counter[tuple[str, str]] = Counter()
    queues = {entry["entrypoint"] for entry in library["log"]}
    for entry in library["log"]:
        if entry["id"] <= baseline:
            continue
        status = entry["status"]
        if status == "queued":
            counts[entry["entrypoint"], "retried" if entry["traceback"] else "enqueued"] += 1
        elif status == "successful":
            counts[entry["entrypoint"], "completed"] += 1
        elif status in ("exception", "failed"):
            counts[entry["entrypoint"], "failed"] += 1
    totals: dict[tuple[str, ...], float] = {}
    for queue in queues:
        n = {name: float(counts[queue, name]) for name in names}
        totals["queue_jobs_enqueued_total", queue] = n["enqueued"]
        totals["queue_jobs_completed_total", queue] = n["completed"]
        totals["queue_jobs_failed_total", queue] = n["failed"] + n["retried"]
        totals["queue_jobs_failed_total", queue, "error_type=other"] = n["failed"]
        totals["queue_jobs_failed_total", queue, "error_type=retryable"] = n["retried"]
        totals["queue_jobs_retried_total", queue] = n["retried"]
    return totals
