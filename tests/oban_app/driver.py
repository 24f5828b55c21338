"""Oban's Python implementation driven for tests/conformance (adapters/oban.py): run with the
Oban venv's Python 3.12 (.venv/tools/oban, scripts/setup.sh), never imported by the project's.

    driver.py install DSN           Oban's own schema (oban.schema.install)
    driver.py seed DSN RELEASE      the first jobs, their ids as JSON
    driver.py more DSN              the jobs enqueued once the exporter runs, their ids as JSON
    driver.py worker DSN            a real Oban instance running QUEUES until SIGTERM (it
                                    prints "started" and QUEUES as JSON once running)
    driver.py truth DSN IDS...      Oban.get_job of each id and the database's clock, as JSON

Workers: Ok completes, Fail fails with one attempt (discarded), Flaky fails into an hour-long
retry wait, FlakyOnce fails its first attempt and is retried at once, Hold runs until the
RELEASE file appears.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from oban import Job, Oban, schema, worker
from psycopg_pool import AsyncConnectionPool

# The worker's queues and their local_limit (slots); "quiet" holds no job: it is found
# through oban_producers alone, and reads 0.
QUEUES = {"emails": 5, "reports": 2, "slow": 1, "quiet": 3}


@worker(queue="emails")
class Ok:
    async def process(self, job: Job) -> None:
        return None


@worker(queue="emails", max_attempts=1)
class Fail:
    async def process(self, job: Job) -> None:
        raise ValueError("the job fails on purpose")


@worker(queue="reports", max_attempts=3)
class Flaky:
    async def process(self, job: Job) -> None:
        raise ConnectionError("the job fails on purpose, and is retried in an hour")

    def backoff(self, job: Job) -> int:
        return 3600


@worker(queue="emails", max_attempts=2)
class FlakyOnce:
    async def process(self, job: Job) -> None:
        if job.attempt == 1:
            raise ConnectionError("the first attempt fails on purpose")

    def backoff(self, job: Job) -> int:
        return 0


@worker(queue="slow")
class Hold:
    async def process(self, job: Job) -> None:
        release = Path(job.args["release"])
        for _ in range(2400):  # at most 120 s
            if release.exists():
                return
            await asyncio.sleep(0.05)


def pool(dsn: str) -> AsyncConnectionPool:
    return AsyncConnectionPool(dsn, min_size=1, max_size=4, open=False)


async def install(dsn: str) -> None:
    async with pool(dsn) as connections:
        await schema.install(connections)


async def seed(dsn: str, release: str) -> list[int]:
    async with pool(dsn) as connections, Oban(pool=connections, name="seed") as client:
        jobs = [Ok.new({"to": f"user{n}"}) for n in range(4)]
        jobs += [Fail.new({}) for _ in range(2)]
        jobs += [Flaky.new({})]
        jobs += [Ok.new({"to": "x"}, queue="reports", scheduled_in=3600) for _ in range(3)]
        jobs += [Hold.new({"release": release})]
        jobs += [Ok.new({"to": f"later{n}"}, queue="idle") for n in range(5)]
        # No producer runs "idle", so no stager stages it: due in a second, it stays scheduled.
        jobs += [Ok.new({"to": "due"}, queue="idle", scheduled_in=1)]
        ids = [(await client.enqueue(job)).id for job in jobs]
        cancelled = await client.enqueue(
            Ok.new({"to": "nobody"}, queue="reports", scheduled_in=3600)
        )
        await client.cancel_job(cancelled.id)
        return [*ids, cancelled.id]


async def more(dsn: str) -> list[int]:
    async with pool(dsn) as connections, Oban(pool=connections, name="more") as client:
        jobs = [Ok.new({"to": f"after{n}"}) for n in range(3)]
        jobs += [Fail.new({}) for _ in range(2)]
        jobs += [FlakyOnce.new({})]
        jobs += [Ok.new({"to": "after"}, queue="idle")]
        return [(await client.enqueue(job)).id for job in jobs]


async def run_worker(dsn: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    async with pool(dsn) as connections:
        instance = Oban(pool=connections, queues=QUEUES, name="worker")
        await instance.start()
        print("started", json.dumps(QUEUES), flush=True)
        await stop.wait()
        await instance.stop()


def epoch(moment: datetime | None) -> float | None:
    """Oban's times are UTC without a time zone."""
    return None if moment is None else moment.replace(tzinfo=UTC).timestamp()


async def truth(dsn: str, ids: list[int]) -> dict[str, Any]:
    async with pool(dsn) as connections, Oban(pool=connections, name="truth") as client:
        jobs = []
        for job_id in ids:
            job = await client.get_job(job_id)
            if job is None:
                continue
            jobs.append(
                {
                    "id": job.id,
                    "queue": job.queue,
                    "worker": job.worker,
                    "state": job.state,
                    "attempt": job.attempt,
                    "attempted_by": job.attempted_by,
                    "scheduled_at": epoch(job.scheduled_at),
                    "attempted_at": epoch(job.attempted_at),
                    "finished_at": epoch(job.completed_at or job.discarded_at),
                }
            )
        async with connections.connection() as connection:
            cursor = await connection.execute("SELECT extract(epoch FROM now())::float8")
            row = await cursor.fetchone()
        return {"jobs": jobs, "now": row[0] if row else None}


def main(argv: list[str]) -> None:
    command, dsn, *rest = argv
    if command == "install":
        asyncio.run(install(dsn))
    elif command == "seed":
        print(json.dumps(asyncio.run(seed(dsn, rest[0]))))
    elif command == "more":
        print(json.dumps(asyncio.run(more(dsn))))
    elif command == "worker":
        asyncio.run(run_worker(dsn))
    elif command == "truth":
        print(json.dumps(asyncio.run(truth(dsn, [int(i) for i in rest]))))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
