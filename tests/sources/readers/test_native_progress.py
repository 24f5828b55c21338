"""A reader's state moves only once its whole read succeeded (framework.Progress, issue 40):
a read that fails after the point where its window, positions or counts would have moved
loses nothing, the next read counts it; a new reader's baseline is at the newest records.
Bull's own cases are in test_native_bull_windows.py, the finished-rows reader's in
test_finished_rows.py, the counts kept as absolute numbers (Sidekiq, SAQ) in
test_native_framework.py (CounterDeltas) and below for Sidekiq. The jobs are run by the real
libraries (RQ's SimpleWorker, BullMQ's Worker) against a server of the test's own, whose ACL
the test changes."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Queue, SimpleWorker

from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers.bullmq import BullmqReader
from exporter.sources.readers.config import (
    BullmqReaderConfig,
    RqReaderConfig,
    SidekiqReaderConfig,
)
from exporter.sources.readers.framework import Reader, Signals
from exporter.sources.readers.rq import RqReader
from exporter.sources.readers.sidekiq import SidekiqReader
from tests.private_redis import PrivateRedis
from tests.real_queues import BullMQ


def _completed(signals: Signals) -> float:
    return sum(
        count
        for (metric, _), count in signals.tally.counts.items()
        if metric == "queue_jobs_completed_total"
    )


def test_sidekiq_counts_of_a_read_failing_after_them_are_counted_by_the_next(tmp_path):
    """Sidekiq's counters are read first, its processes after: with the processes refused
    (SSCAN not allowed, as a severed read fails), the read fails after its counters were
    read. Before, their increments became the baseline anyway: 30 completions never counted.
    Now the next read counts all 30 (Sidekiq's layout: stat:processed, written as its
    heartbeat flushes it)."""
    server = PrivateRedis(tmp_path).start()
    admin = server.client()
    try:
        admin.execute_command("ACL", "SETUSER", "reader", "on", ">secret", "~*", "+@all")
        admin.mset({"stat:processed": 100, "stat:failed": 0})
        url = f"redis://reader:secret@127.0.0.1:{server.port}/0"
        reader = SidekiqReader(SidekiqReaderConfig(), RedisConnectionConfig(url=url))
        reader.read(Signals())  # the baseline
        admin.set("stat:processed", 130)
        admin.execute_command("ACL", "SETUSER", "reader", "-sscan")
        with pytest.raises(redis.exceptions.NoPermissionError):
            reader.read(Signals())
        admin.execute_command("ACL", "SETUSER", "reader", "+sscan")
        counted = []
        for _ in range(2):
            signals = Signals()
            reader.read(signals)
            counted.append(_completed(signals))
        assert counted == [30, 0]
        reader.close()
    finally:
        server.stop()


def _read(reader: Reader) -> float:
    signals = Signals()
    reader.read(signals)
    return _completed(signals)


def _rq_jobs(server: PrivateRedis, count: int) -> None:
    """`count` jobs RQ enqueues and its own worker runs to the end."""
    client = server.client()
    queue = Queue("default", connection=client)
    jobs = [queue.enqueue("builtins.len", "abc") for _ in range(count)]
    SimpleWorker([queue], connection=client).work(burst=True)
    assert all(job.get_status() == "finished" for job in jobs)


def _bullmq_jobs(server: PrivateRedis, count: int) -> None:
    """`count` jobs BullMQ adds and its own worker completes."""
    driver = BullMQ(6, 0, port=server.port)
    driver.steps(
        {"op": "add", "queue": "jobs", "name": "j", "count": count},
        {"op": "work", "queue": "jobs", "completed": count},
    )


READERS: dict[str, tuple[Callable[[RedisConnectionConfig], Reader], Any]] = {
    "rq": (lambda c: RqReader(RqReaderConfig(), c), _rq_jobs),
    "bullmq": (lambda c: BullmqReader(BullmqReaderConfig(workers=False), c), _bullmq_jobs),
}


@pytest.mark.parametrize("system", sorted(READERS))
def test_a_read_failing_after_its_jobs_were_found_loses_none(tmp_path: Path, system: str):
    """RQ's and BullMQ's reads find the new jobs (registries, stream entries), then read their
    hashes: with HMGET refused (the ACL, as a severed HMGET fails) the read fails after its
    state would have moved. Nothing is applied; once HMGET is allowed the next read counts all
    20 jobs the real library ran, once."""
    make, run = READERS[system]
    server = PrivateRedis(tmp_path).start()
    admin = server.client()
    try:
        admin.execute_command("ACL", "SETUSER", "reader", "on", ">secret", "~*", "&*", "+@all")
        url = f"redis://reader:secret@127.0.0.1:{server.port}/0"
        reader = make(RedisConnectionConfig(url=url))
        run(server, 1)  # the queue exists
        _read(reader)  # the baseline
        run(server, 20)
        admin.execute_command("ACL", "SETUSER", "reader", "-hmget")
        with pytest.raises(redis.exceptions.NoPermissionError):
            reader.read(Signals())
        admin.execute_command("ACL", "SETUSER", "reader", "+hmget")
        assert [_read(reader) for _ in range(2)] == [20, 0]
        reader.close()
    finally:
        server.stop()


def test_rq_a_restart_over_30k_kept_jobs_counts_only_what_finished_after(tmp_path: Path):
    """30,000 jobs kept in RQ's finished registry (its layout: scored by when they expire,
    their end plus result_ttl), then a restarted exporter, twice: each new reader's baseline is
    the registry's newest members, and it counts exactly the 3 jobs RQ runs after it, once."""
    server = PrivateRedis(tmp_path).start()
    admin = server.client()
    try:
        _rq_jobs(server, 1)  # rq:queues lists the queue
        expiry = time.time() + 400  # ended within the last 100 s, result_ttl 500 s
        for first in range(0, 30_000, 5_000):
            admin.zadd(
                "rq:finished:default",
                {f"kept{i}": expiry - 100 + i / 300 for i in range(first, first + 5_000)},
            )
        for _ in range(2):
            reader = RqReader(RqReaderConfig(), RedisConnectionConfig(url=server.url))
            assert _read(reader) == 0  # the baseline
            _rq_jobs(server, 3)
            assert [_read(reader) for _ in range(2)] == [3, 0]
            reader.close()
    finally:
        server.stop()
