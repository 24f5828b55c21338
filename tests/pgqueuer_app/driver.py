"""Enqueue PgQueuer jobs, run a real PgQueuer worker, and read PgQueuer's own view of its jobs,
with the pgqueuer of this Python (the pgqueuer1 venv).

    python -m tests.pgqueuer_app.driver DSN install
    python -m tests.pgqueuer_app.driver DSN enqueue PLAN_JSON
    python -m tests.pgqueuer_app.driver DSN worker RELEASE_PATH
    python -m tests.pgqueuer_app.driver DSN truth

`install` is PgQueuer's own schema (Queries.install, the library's defaults: no prefix, the
public schema). A plan is a list of {"entrypoint", "payload" (what the handler does: ok, fail,
retry, flaky, hold), optional "priority", "execute_after" (seconds from now)}. `worker` runs
PgQueuer's app (PgQueuer.run: its QueueManager and SchedulerManager) serving the entrypoints
below, until SIGTERM; `hold` runs until RELEASE_PATH exists. `truth` prints PgQueuer's own
counts (Queries.queue_size), every row of its queue table and of its log table (pgqueuer_log:
Queries.queue_log's rows, with their ids), with the database's clock.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pgqueuer
from pgqueuer import AsyncpgDriver, Job, PgQueuer, Queries, RetryRequested

# The entrypoints the worker serves; "idle" has jobs but no worker serves it.
SERVED = ("emails", "reports", "kept", "slow")
RETRY_LATER = timedelta(hours=1)


class Failed(Exception):
    """What a job told to fail raises."""


def handler(release: Path) -> Any:
    async def run(job: Job) -> None:
        what = (job.payload or b"ok").decode()
        if what == "fail":
            raise Failed("told to fail")
        if what == "retry":  # a retry an hour out: waits as queued, execute_after ahead
            raise RetryRequested(delay=RETRY_LATER, reason="told to retry later")
        if what == "flaky" and job.attempts == 0:  # fails once, retried at once, then succeeds
            raise RetryRequested(delay=timedelta(0), reason="flaky")
        if what == "hold":
            while not release.exists():
                await asyncio.sleep(0.1)

    return run


async def worker(dsn: str, release: Path) -> None:
    connection = await asyncpg.connect(dsn)
    app = PgQueuer(AsyncpgDriver(connection))
    run = handler(release)
    for entrypoint in SERVED:
        # "kept": PgQueuer's on_failure="hold" keeps a failed job as status failed
        on_failure = "hold" if entrypoint == "kept" else "delete"
        app.entrypoint(entrypoint, on_failure=on_failure)(run)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, app.shutdown.set)
    print("ready", flush=True)
    await app.run(
        dequeue_timeout=timedelta(seconds=1), log_aggregation_interval=timedelta(seconds=2)
    )


async def enqueue(queries: Queries, plan: list[dict[str, Any]]) -> list[int]:
    ids = await queries.enqueue(
        [step["entrypoint"] for step in plan],
        [step.get("payload", "ok").encode() for step in plan],
        [step.get("priority", 0) for step in plan],
        [timedelta(seconds=step.get("execute_after", 0)) for step in plan],
    )
    return [int(job_id) for job_id in ids]


def epoch(value: Any) -> float | None:
    return None if value is None else value.timestamp()


async def truth(connection: asyncpg.Connection, queries: Queries) -> dict[str, Any]:
    now = await connection.fetchval("SELECT now()")
    sizes = [
        {"entrypoint": s.entrypoint, "priority": s.priority, "status": s.status, "count": s.count}
        for s in await queries.queue_size()
    ]
    rows = await connection.fetch(
        "SELECT id, entrypoint, status::text AS status, priority, attempts, created, updated,"
        " heartbeat, execute_after FROM pgqueuer ORDER BY id"
    )
    jobs = [
        {
            "id": row["id"],
            "entrypoint": row["entrypoint"],
            "status": row["status"],
            "priority": row["priority"],
            "attempts": row["attempts"],
            "created": epoch(row["created"]),
            "updated": epoch(row["updated"]),
            "execute_after": epoch(row["execute_after"]),
        }
        for row in rows
    ]
    log = [
        {
            "id": row["id"],
            "job_id": row["job_id"],
            "entrypoint": row["entrypoint"],
            "status": row["status"],
            "traceback": row["traceback"],
            "created": epoch(row["created"]),
        }
        for row in await connection.fetch(
            "SELECT id, job_id, entrypoint, status::text AS status, created,"
            " traceback IS NOT NULL AS traceback FROM pgqueuer_log ORDER BY id"
        )
    ]
    return {
        "version": pgqueuer.__version__,
        "now": epoch(now),
        "sizes": sizes,
        "jobs": jobs,
        "log": log,
    }


async def main() -> None:
    dsn, command, *args = sys.argv[1:]
    if command == "worker":
        await worker(dsn, Path(args[0]))
        return
    connection = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(connection))
    try:
        if command == "install":
            await queries.install()
        elif command == "enqueue":
            print(json.dumps(await enqueue(queries, json.loads(args[0]))))
        elif command == "truth":
            print(json.dumps(await truth(connection, queries)))
        else:
            raise SystemExit(f"unknown command {command}")
    finally:
        await connection.close()


if __name__ == "__main__":
    asyncio.run(main())
