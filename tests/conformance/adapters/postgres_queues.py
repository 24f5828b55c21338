"""pg-boss 10/12, graphile-worker 0.16/0.18 and Procrastinate: their own migrations, their
own enqueue and workers; the truth is read from the library at each scrape (getJobById of every
job, graphile-worker's public `jobs` view, Procrastinate's JobManager)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any, ClassVar

import procrastinate
import psycopg

from exporter.config import presets
from tests.config.test_preset_graphile_worker import STATES as GRAPHILE_STATES
from tests.config.test_preset_graphile_worker import GraphileWorker, graphile_state
from tests.config.test_preset_pgboss import QUEUES as PGBOSS_QUEUES
from tests.config.test_preset_pgboss import PgBoss, library_depths, pg_time
from tests.config.test_preset_procrastinate import SOURCES as PROCRASTINATE_SAMPLED
from tests.config.test_preset_procrastinate import WORKED_QUEUES, procrastinate_state
from tests.config.test_preset_procrastinate import _worker as procrastinate_worker
from tests.conformance.adapters.base import Adapter, Phase, fixed
from tests.conformance.checks import Age, ReadAge, Truth
from tests.conftest import Series, stop_process, wait_for

# the finished-rows reader (on by default) is up on pg-boss 10 too, reading nothing and saying why
PGBOSS_SOURCES = (
    "postgres:pgboss_jobs",
    "postgres:pgboss_due",
    "postgres:pgboss_active",
    "native:pgboss",
)
PROCRASTINATE_SOURCES = (
    *PROCRASTINATE_SAMPLED,
    "postgres:procrastinate_failed",
    "postgres:procrastinate_workers",
    "native:procrastinate",
)
GRAPHILE_SOURCES = (
    "postgres:graphile_worker_jobs",
    "postgres:graphile_worker_due",
    "postgres:graphile_worker_locked",
)


def interval_of(system: str, collector: str) -> float:
    """A collector's interval with the preset's defaults."""
    collectors = presets.expand(system)["sources"]["postgres"]["collectors"]
    return float(next(c for c in collectors if c["name"] == collector)["interval"])


class PgBossAdapter(Adapter):
    """send() jobs (some for later, one cancelled); work() handlers complete, fail, fail into an
    hour-long retry wait and hold one job running, then let it complete; then more jobs
    complete, fail, and fail after a retry."""

    system = "pgboss"
    backend = "postgres"
    versions: ClassVar[tuple[Any, ...]] = (10, 12)

    @classmethod
    def not_served(cls, version: Any) -> dict[str, str]:
        """pg-boss 10 has no index on completed_on: its finished jobs are not read (the
        reader says so, silent)."""
        if version == 10:
            why = "pg-boss 10: no index on completed_on, finished rows not read (docs/presets.md)"
            return {"completed": why, "failed": why}
        return {}

    def variants(self) -> dict[str, list[Any]]:
        if self.version >= 12:  # job_i14 holds active and failed jobs: read every cycle
            return super().variants()
        # pg-boss 10 has no index on them: with the defaults they are read every
        # active_interval (30 s), so a change of them shows that late; only the run reading
        # them every 0.5 s follows the release
        tuned = {"name": "pgboss", "params": {"active_interval": 0.5}}
        return {**super().variants(), "tuned": [tuned]}

    def phases(self) -> Iterator[Phase]:
        boss = PgBoss(self.version, self.backend_url, self.tmp_path)
        boss.seed()
        seeded = boss.truth()
        worker = boss.worker()
        try:

            def settled() -> dict[str, Any] | None:
                library = boss.truth()
                states = Counter((job["queue"], job["state"]) for job in library["jobs"])
                done = (
                    states["emails", "completed"] == 4
                    and states["emails", "failed"] == 2
                    and states["slow", "active"] == 1
                    and states["reports", "retry"] == 1
                )
                return library if done else None

            running = wait_for(settled, timeout=60)

            # pg-boss 12's reader takes as its baseline the rows finished a second before its
            # first read: the seed's last finish more than a second ago (database clock), the
            # baseline counts them all, whenever the exporter starts.
            def all_settled() -> dict[str, Any] | None:
                library = boss.truth()
                return library if library["now"] > last_finish(library) + 1.0 else None

            ended_before = frozenset(
                (job["queue"], job["id"])
                for job in wait_for(all_settled, timeout=10)["jobs"]
                if job["state"] in ENDED
            )
            started = next(
                pg_time(job["startedOn"]) for job in running["jobs"] if job["state"] == "active"
            )
            idle_first = min(
                pg_time(job["startAfter"]) or 0 for job in seeded["jobs"] if job["queue"] == "idle"
            )
            assert started is not None

            # pg-boss 12 reads active jobs every cycle (pgboss_jobs, through job_i14); 10 every
            # active_interval (pgboss_active), the age grown between its reads
            active_source = (
                "postgres:pgboss_jobs" if self.version >= 12 else "postgres:pgboss_active"
            )

            def truth(holding: bool) -> Truth:
                library = boss.truth()
                depths, due = library_depths(library)
                # ages on the database clock, read between the source's two last successes
                ages: dict[tuple[str, str], Any] = {
                    ("idle", "pending"): ReadAge(idle_first, "postgres:pgboss_jobs"),
                    ("slow", "active"): ReadAge(started, active_source) if holding else None,
                }
                return Truth(
                    "pgboss",
                    library["now"],
                    depths,
                    exact_states=True,
                    due=due,
                    exact_due=True,
                    ages=ages,
                    exact_ages=True,
                    totals=finished(library, holding),
                    sources_up=PGBOSS_SOURCES,
                )

            def finished(library: dict[str, Any], holding: bool) -> dict[tuple[str, ...], float]:
                """pg-boss 12's finished-rows reader (on by default) counts what finishes after
                its first read, per queue, as getJobById says: the jobs unfinished before the
                exporter started (the held one) or sent since, completed or failed by now (a
                job failing after a retry once: pg-boss keeps no row per attempt). pg-boss 10
                has no index to read them by: its reader reads nothing (test_postgres_states)."""
                if self.version < 12:
                    return {}
                ended = Counter(
                    (job["queue"], job["state"])
                    for job in library["jobs"]
                    if job["state"] in ENDED and (job["queue"], job["id"]) not in ended_before
                )
                assert not holding or ended["slow", "completed"] == 0, ended
                return {
                    (f"queue_jobs_{state}_total", queue, *labels): float(ended[queue, state])
                    for queue in PGBOSS_QUEUES
                    for state, labels in (("completed", ()), ("failed", ("error_type=other",)))
                }

            yield lambda _at: truth(holding=True)
            boss.release.touch()  # the held job completes: active drops to 0, its age goes
            if self.version >= 12:
                yield lambda _at: truth(holding=False)
                boss.send_more()  # after the reader's first read: counted

                def more_ended() -> bool:
                    jobs = boss.truth()["jobs"]
                    states = Counter(job["state"] for job in jobs)
                    retried = [job for job in jobs if job["retryCount"] == 1]
                    return (
                        states["completed"] == 4 + 1 + 3
                        and states["failed"] == 2 + 2
                        and [job["state"] for job in retried] == ["failed"]
                    )

                wait_for(more_ended, timeout=60)
                yield lambda _at: truth(holding=False)
            else:
                interval = interval_of("pgboss", "pgboss_active")
                assert interval == 30, "known gap closed: check the defaults"
                yield (lambda _at: truth(holding=False)), ("tuned",)
        finally:
            boss.release.touch()
            stop_process(worker, 15)


ENDED = ("completed", "failed", "cancelled")  # pg-boss's states of a job that ended


def last_finish(library: dict[str, Any]) -> float:
    """The latest completedOn of pg-boss's jobs (getJobById), epoch seconds (0: none)."""
    return max((pg_time(job["completedOn"]) or 0.0 for job in library["jobs"]), default=0.0)


class GraphileWorkerAdapter(Adapter):
    """addJob (some for later, one removed with remove_job); runOnce completes, fails for good
    and fails into a retry pushed an hour out; a run() worker holds one job, then lets it go."""

    system = "graphile_worker"
    backend = "postgres"
    versions: ClassVar[tuple[Any, ...]] = ("016", "018")

    def variants(self) -> dict[str, list[Any]]:
        # with the defaults, locked jobs are read every locked_interval (30 s)
        tuned = {"name": "graphile_worker", "params": {"locked_interval": 0.5}}
        return {**super().variants(), "tuned": [tuned]}

    def phases(self) -> Iterator[Phase]:
        graphile = GraphileWorker(self.version, self.backend_url, self.tmp_path)
        graphile.seed()
        worker = graphile.worker()
        try:

            def held() -> float | None:
                jobs, _ = graphile.jobs()
                locked = [job["locked_at"] for job in jobs if job["task_identifier"] == "hold"]
                return locked[0] if locked and locked[0] is not None else None

            locked_at = wait_for(held, timeout=60)
            # the queue label: named queues and every task (graphile-worker's own tables)
            with psycopg.connect(self.backend_url) as connection:
                known = {
                    row[0]
                    for row in connection.execute(
                        "SELECT queue_name FROM graphile_worker._private_job_queues"
                        " UNION SELECT identifier FROM graphile_worker._private_tasks"
                    )
                }
            assert {"emails", "slow", "send_email", "explode", "flaky", "later", "hold"} <= known

            def truth(holding: bool) -> Truth:
                jobs, now = graphile.jobs()
                depths = Counter({(q, s): 0 for q in known for s in GRAPHILE_STATES})
                due: Counter[str] = Counter()
                for job in jobs:
                    queue = job["queue_name"] or job["task_identifier"]
                    state = graphile_state(job, now)
                    depths[queue, state] += 1
                    if state == "pending" and job["run_at"] > job["created_at"]:
                        due[queue] += 1
                first = min(
                    job["run_at"]
                    for job in jobs
                    if job["task_identifier"] == "later" and job["run_at"] <= now
                )
                ages: dict[tuple[str, str], Age | None] = {
                    # the truth is read after the scrape: no slack above it
                    ("later", "pending"): Age.at(first, below=1, above=0),
                    ("slow", "active"): Age.at(locked_at, 3, 3) if holding else None,
                }
                return Truth(
                    "graphile_worker",
                    now,
                    {key: float(n) for key, n in depths.items()},
                    exact_states=True,
                    due={q: float(n) for q, n in due.items()},
                    exact_due=True,
                    ages=ages,
                    exact_ages=True,
                    sources_up=GRAPHILE_SOURCES,
                )

            yield lambda _at: truth(holding=True)
            graphile.release.touch()  # the held job completes (and is deleted): active drops to 0
            interval = interval_of("graphile_worker", "graphile_worker_locked")
            assert interval == 30, "known gap closed: check the defaults"
            yield (lambda _at: truth(holding=False)), ("tuned",)
            assert "hold" not in graphile.names()
        finally:
            graphile.release.touch()
            stop_process(worker, 15)


class ProcrastinateAdapter(Adapter):
    """Jobs deferred through Procrastinate's tasks and run by a real `procrastinate worker`:
    they succeed, fail, fail into an hour-long retry wait, wait for a schedule, are cancelled,
    and one keeps running until released; then, after the events reader's first read, more are
    deferred: they succeed, fail for good, fail once and succeed on the retry, fail on the
    retry too. The truth is JobManager.list_jobs / list_queues (statuses, attempts, the doing
    job's worker_id), the one worker the adapter started and the times it saw around each
    defer and start."""

    system = "procrastinate"
    backend = "postgres"

    def phases(self) -> Iterator[Phase]:
        from tests.procrastinate_app.tasks import app as unbound

        connector = procrastinate.PsycopgConnector(conninfo=self.backend_url)
        with unbound.replace_connector(connector) as app, app.open():
            app.schema_manager.apply_schema()
            yield from self._phases(app)

    def _phases(self, app: procrastinate.App) -> Iterator[Phase]:
        release = self.tmp_path / "release"
        deferred_before = time.time()
        for n in range(4):
            app.tasks["send_email"].configure(queue="emails").defer(to=f"user{n}@example.com")
        for _ in range(2):
            app.tasks["explode"].configure(queue="emails").defer()
        app.tasks["flaky"].configure(queue="reports").defer()
        for _ in range(3):
            later = app.tasks["send_email"].configure(queue="reports", schedule_in={"hours": 1})
            later.defer(to="x")
        cancelled = app.tasks["send_email"].configure(queue="reports", schedule_in={"hours": 1})
        app.job_manager.cancel_job_by_id(cancelled.defer(to="nobody"))
        app.tasks["hold"].configure(queue="slow").defer(release=str(release))
        # No worker listens to "idle": its jobs wait, the first since its defer.
        for n in range(5):
            app.tasks["send_email"].configure(queue="idle").defer(to=f"later{n}")
        deferred_after = time.time()
        app.tasks["send_email"].configure(queue="idle", schedule_in={"seconds": 1}).defer(to="due")

        started_before = time.time()
        worker = procrastinate_worker(self.backend_url, WORKED_QUEUES)
        try:

            def settled() -> bool:
                jobs = app.job_manager.list_jobs()
                statuses = Counter((job.task_name, job.status) for job in jobs)
                return (
                    statuses["send_email", "succeeded"] == 4
                    and statuses["explode", "failed"] == 2
                    and statuses["hold", "doing"] == 1
                    and any(job.task_name == "flaky" and job.attempts == 1 for job in jobs)
                )

            wait_for(settled, timeout=60)
            started_after = time.time()
            wait_for(lambda: time.time() > deferred_after + 1.5)  # the scheduled "idle" job is due

            def truth(scraped_at: float, holding: bool, before: dict[int, Seen]) -> Truth:
                depths: Counter[tuple[str, str]] = Counter()
                queues = [queue["name"] for queue in app.job_manager.list_queues()]
                for queue in queues:
                    for state in ("pending", "scheduled", "retry", "active", "failed"):
                        depths[queue, state] += 0
                due = 0
                jobs = app.job_manager.list_jobs()
                for job in jobs:
                    state = procrastinate_state(job, scraped_at)
                    if state is not None:
                        depths[job.queue, state] += 1
                    scheduled = job.scheduled_at
                    if job.status == "todo" and scheduled and scheduled.timestamp() <= scraped_at:
                        due += 1
                # Scheduled and retry wait on purpose: no age; an empty state has none either.
                ages: dict[tuple[str, str], Age | None] = {
                    ("idle", "pending"): Age(deferred_before, deferred_after, 1, 1),
                    ("slow", "active"): (
                        Age(started_before, started_after, 1, 1) if holding else None
                    ),
                }
                return Truth(
                    "procrastinate",
                    scraped_at,
                    {key: float(n) for key, n in depths.items()},
                    exact_states=True,
                    due={"idle": float(due)},
                    ages=ages,
                    exact_ages=True,
                    totals=counted_since(before, jobs, queues),
                    sources_up=PROCRASTINATE_SOURCES,
                    extra=lambda series: workers_differ(series, jobs),
                )

            seeded = {job.id: (job.status, job.attempts) for job in app.job_manager.list_jobs()}
            yield lambda at: truth(at, holding=True, before=seeded)
            # The list_queues totals (Procrastinate's own per-queue counts) agree with list_jobs.
            queues = {queue["name"]: queue for queue in app.job_manager.list_queues()}
            assert queues["reports"]["todo"] == 4 and queues["reports"]["cancelled"] == 1
            assert queues["slow"]["doing"] == 1
            release.touch()  # the held job ends: active drops to 0, and its age goes
            wait_for(lambda: app.job_manager.list_jobs(status="doing") == [], timeout=30)
            # deferred after the events reader's first read: counted as enqueued
            for n in range(3):
                app.tasks["send_email"].configure(queue="idle").defer(to=f"after{n}")
            app.tasks["send_email"].configure(queue="emails").defer(to="after")
            yield lambda at: truth(at, holding=False, before=seeded)
            # Failures and retries after that read (a retry waits 0 s: run again at once).
            # Failed jobs are counted every failed_interval (60 s): this phase checks counters.
            counted = [
                app.tasks[task].configure(queue="emails").defer()
                for task in ("explode", "flaky_once", "give_up")
            ]

            def ended() -> bool:
                jobs = {job.id: job for job in app.job_manager.list_jobs(queue="emails")}
                return all(jobs[job].status in ("succeeded", "failed") for job in counted)

            wait_for(ended, timeout=60)
            jobs = app.job_manager.list_jobs()
            queues = [queue["name"] for queue in app.job_manager.list_queues()]
            totals = counted_since(seeded, jobs, queues)
            assert totals["queue_jobs_retried_total", "emails"] == 2, totals
            assert totals["queue_jobs_failed_total", "emails", "error_type=other"] == 2, totals
            yield fixed(Truth("procrastinate", time.time(), None, totals=totals))
        finally:
            release.touch()
            stop_process(worker, 15)


Seen = tuple[str, int]  # a job's status and attempts, as list_jobs gave them


def counted_since(
    before: dict[int, Seen], jobs: list[Any], queues: list[str]
) -> dict[tuple[str, ...], float]:
    """What the events reader counts after its first read (taken once the exporter starts,
    after `before` was read with nothing moving: every job then had ended, waited an hour, or
    was held), per queue, from Procrastinate's jobs: every job deferred since (not in
    `before`) an enqueue; every job ended since (succeeded: completed; failed: a final failure,
    `error_type="other"`); every attempt ended since that was not its last, a retry
    (`attempts` counts each ended attempt: a retried one, then the last), which the reader
    counts as a retryable failure too (docs/native.md)."""
    names = ("enqueued", "completed", "failed", "retryable", "retried")
    counts = {(queue, name): 0 for queue in queues for name in names}
    for job in jobs:
        status, attempts = before.get(job.id, ("new", 0))
        if status not in ("new", "todo", "doing"):
            continue  # ended before the reader's first read
        ended = job.status in ("succeeded", "failed")
        retries = job.attempts - attempts - (1 if ended else 0)
        counts[job.queue, "enqueued"] += status == "new"
        counts[job.queue, "completed"] += job.status == "succeeded"
        counts[job.queue, "failed"] += job.status == "failed"
        counts[job.queue, "retryable"] += retries
        counts[job.queue, "retried"] += retries
    totals: dict[tuple[str, ...], float] = {}
    for queue in queues:
        n = {name: float(counts[queue, name]) for name in names}
        totals["queue_jobs_enqueued_total", queue] = n["enqueued"]
        totals["queue_jobs_completed_total", queue] = n["completed"]
        totals["queue_jobs_failed_total", queue] = n["failed"] + n["retryable"]
        totals["queue_jobs_failed_total", queue, "error_type=other"] = n["failed"]
        totals["queue_jobs_failed_total", queue, "error_type=retryable"] = n["retryable"]
        totals["queue_jobs_retried_total", queue] = n["retried"]
    return totals


def workers_differ(series: Series, jobs: list[Any]) -> list[str]:
    """Procrastinate's live workers, with no queue label (it records no worker's queues): the
    one the adapter started, busy while a doing job carries its id (list_jobs' worker_id)."""
    busy = len({job.worker_id for job in jobs if job.status == "doing"})
    truth = {"busy": float(busy), "idle": float(1 - busy)}
    served = {
        labels.get("state", ""): number
        for (metric, label_set), number in series.items()
        if metric == "queue_workers"
        and (labels := dict(label_set)).get("system") == "procrastinate"
    }
    return [] if served == truth else [f"workers: served {served}, truth {truth}"]
