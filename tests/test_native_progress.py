"""A reader's state moves only once its whole read succeeded (framework.Progress, issue 40):
a read that fails after the point where its window, positions or counts would have moved
loses nothing, the next read counts it. Bull's own cases are in test_native_bull_windows.py;
the RQ, BullMQ and finished-rows readers keep theirs the same way (their state is proposed
with the read and applied after it), the counts kept as absolute numbers (Sidekiq, SAQ) by
CounterDeltas (test_native_framework.py)."""

from __future__ import annotations

import pytest
import redis

from exporter.redis_connection import RedisConnectionConfig
from exporter.sources.native.config import SidekiqReaderConfig
from exporter.sources.native.framework import Signals
from exporter.sources.native.sidekiq import SidekiqReader
from tests.private_redis import PrivateRedis


def _completed(signals: Signals) -> float:
    return sum(
        count
        for (metric, _), count in signals.tally.counts.items()
        if metric == "queue_jobs_completed_total"
    )


def test_sidekiq_counts_of_a_read_failing_after_them_are_counted_by_the_next(tmp_path):
    """Sidekiq's counters are read first, its processes after: with the processes refused
    (SMEMBERS not allowed, as a severed read fails), the read fails after its counters were
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
        admin.execute_command("ACL", "SETUSER", "reader", "-smembers")
        with pytest.raises(redis.exceptions.NoPermissionError):
            reader.read(Signals())
        admin.execute_command("ACL", "SETUSER", "reader", "+smembers")
        counted = []
        for _ in range(2):
            signals = Signals()
            reader.read(signals)
            counted.append(_completed(signals))
        assert counted == [30, 0]
        reader.close()
    finally:
        server.stop()
