"""SAQ's live workers, busy or idle, as SAQ records them.

A worker lists its record `saq:<queue>:worker_info:<worker id>` in the `saq:<queue>:stats`
zset, scored by when the record expires (ms): a worker is live while its score is ahead and
its record exists (what SAQ's Queue.info() lists as workers). The record holds its counts,
not whether it runs a job. What does: since SAQ 0.26.1 a worker writes its id into a job it
takes (`worker_id`, with `status` active and `started`, one SET right after it took the job
into `saq:<queue>:active`). So a worker is busy while an active job of its queue names it,
idle otherwise; SAQ records no concurrency, so no slots are served.

An active job whose record says active but names no worker was written by a SAQ before
0.26.1: then which worker runs what cannot be told, and the queue's workers are not served
(none invented as idle) while such a job runs; the reader says so (Signals.caveat). A job taken
whose worker has not written it yet (status still queued, for a moment) names no worker, or
the worker of its last attempt: it is not counted for anyone.

Cost per read: per queue with live workers, one LRANGE of its active list and one GET per
active job (at most MAX_ACTIVE_JOBS over the read, the rest refused: over_limit), so a queue
with no job running costs the LRANGE alone.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from exporter.core import numbers
from exporter.sources.readers.framework import Signals
from exporter.sources.readers.saq_jobs import MAX_JOB_BYTES

# Active jobs read per read, over every queue: SAQ runs as many as its workers' concurrency.
MAX_ACTIVE_JOBS = 10_000
SAQ_WITH_WORKER_ID = "0.26.1"


def worker_id(queue: str, record_key: str) -> str:
    """The id a worker writes into its jobs, from its record's key."""
    return record_key.removeprefix(f"saq:{queue}:worker_info:")


def active_jobs(
    client: redis.Redis, queue: str, room: int, signals: Signals
) -> tuple[dict[str, int] | None, int]:
    """The active jobs of `queue` per worker id that runs them (None: an active job names no
    worker, SAQ before 0.26.1), and how many jobs were read (at most `room`)."""
    active_key = f"saq:{queue}:active"
    ids: list[bytes] = []
    with signals.record(active_key):
        found: list[bytes] = client.lrange(active_key, 0, room)  # type: ignore[assignment]
        ids = list(signals.names(found, room, f"jobs of {active_key}"))
    if not ids:
        return {}, 0
    pipe = client.pipeline(transaction=False)
    for job_id in ids:
        pipe.get(job_id)  # not MGET: a record of another type must say so (WRONGTYPE)
    running: dict[str, int] = {}
    told = True
    for job_id, raw in zip(ids, pipe.execute(raise_on_error=False), strict=True):
        with signals.record(job_id):  # a bad record costs itself
            active, runner = _runner(raw)
            if runner is not None:
                running[runner] = running.get(runner, 0) + 1
            elif active:
                told = False
    return (running if told else None), len(ids)


def _runner(raw: Any) -> tuple[bool, str | None]:
    """Whether a job in the active list is active by its record, and the worker id it names
    (None for an active job: SAQ before 0.26.1). Not active: taken, not written yet by its
    worker (it may name the worker of its last attempt), or gone since the list was read."""
    if isinstance(raw, Exception):
        raise raw
    if raw is None:
        return False, None
    if len(raw) > MAX_JOB_BYTES:
        raise numbers.InvalidValue("oversized_field", f"a job of {len(raw)} bytes")
    job = json.loads(raw)
    if not isinstance(job, dict):
        raise numbers.InvalidValue("bad_value", "a job that is not an object")
    if job.get("status") != "active":
        return False, None
    runner = job.get("worker_id")
    if runner is not None and not isinstance(runner, str):
        raise numbers.InvalidValue("bad_value", "worker_id is not a name")
    return True, runner
