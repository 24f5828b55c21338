"""What a native read takes from its backend is bounded (framework.py, Signals.names): a name
longer than MAX_NAME_BYTES is refused before anything parses it, a listing is taken up to its
limit, and each excess is counted once a read; a real worker's counts go on being served.

The SAQ cases are issue 40's attacks, against a real SAQ worker: a key `saq:job:` followed by
100,000 colons (a quadratic split cost 11-13 s of CPU a read before any deadline check, and
the reader went down), and 100,000 fake live workers (the reader went down, nothing counted as
over a limit).
"""

from __future__ import annotations

import importlib.util
import json
import signal
import time
from typing import Any

import pytest

from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers import framework
from exporter.sources.readers.config import SaqReaderConfig
from exporter.sources.readers.framework import ReadDeadline, Signals
from exporter.sources.readers.saq import SaqReader
from tests.conftest import stop_process, wait_for
from tests.private_redis import PrivateRedis
from tests.saq_app.control import driver
from tests.saq_app.control import worker as start_worker
from tests.tools import missing

COMPLETED = ("queue_jobs_completed_total", ("saq", "work", "", ""))
# The CPU a read may spend before it stops: generous for a read of a few records on a loaded
# host, a tenth of what the colon key cost before (11-13 s).
BUDGET = 1.0


def test_names_refuses_the_oversized_and_the_excess_once_each() -> None:
    signals = Signals(source="test")
    long = b"x" * (framework.MAX_NAME_BYTES + 1)
    listing = [b"a", long, b"b", long, b"c", b"d"]
    assert list(signals.names(listing, 3, "a listing")) == [b"a", b"b", b"c"]
    assert signals.tally.invalid == {"over_limit": 1, "oversized_field": 1}
    within = Signals(source="test")
    assert list(within.names([b"a", b"b"], 2, "a listing")) == [b"a", b"b"]
    assert within.tally.invalid == {}


def test_names_stop_at_the_reads_deadline() -> None:
    spent = Signals(source="test", deadline=ReadDeadline(wall=0.0, cpu=0.0))
    with pytest.raises(framework.ReaderError) as stopped:
        list(spent.names(iter([b"a"] * 10), 10, "a listing"))
    assert stopped.value.reason == "timeout"


@pytest.fixture
def saq_installed() -> None:
    if importlib.util.find_spec("saq") is None:
        missing("saq not installed (pyproject's dev extra has it)")


def _completed_by(redis_url: str, worker_id: str, jobs: int) -> int:
    """Wait until SAQ's own Queue.info() shows the worker completed `jobs`."""

    def done() -> dict[str, int] | None:
        workers = driver(redis_url, "truth", "work")["queues"]["work"]["workers"]
        stats: dict[str, int] | None = workers.get(worker_id)
        return stats if stats and stats["complete"] >= jobs else None

    found: dict[str, int] = wait_for(done, timeout=60, interval=0.5)
    return found["complete"]


def _read(reader: SaqReader) -> Signals:
    signals = Signals(source=reader.name, deadline=ReadDeadline.starting_now(BUDGET))
    reader.read(signals)
    return signals


def _jobs(count: int) -> str:
    return json.dumps([{"queue": "work", "function": "succeed"}] * count)


def _counted_across(
    redis_url: str, plant: Any, redis_client: Any, announce: Any = None
) -> list[Signals]:
    """A real worker completes 4 jobs between a baseline and a read of a reader facing what
    `plant` put in Redis (and `announce` published after the baseline); the reads, each
    within BUDGET of CPU."""
    process, worker_id = start_worker(redis_url, "work")
    config = SaqReaderConfig(queues=["work"])
    reader = SaqReader(config, RedisConnectionConfig(url=redis_url))
    try:
        before = _completed_by(redis_url, worker_id, 0)
        plant(redis_client)
        baseline = _read(reader)
        if announce is not None:
            announce(redis_client)
        driver(redis_url, "enqueue", _jobs(4))
        _completed_by(redis_url, worker_id, before + 4)
        after = _read(reader)
        assert after.tally.counts[COMPLETED] == 4  # SAQ's own count, not one less or more
        return [baseline, after]
    finally:
        reader.close()
        stop_process(process, signal.SIGTERM)


def test_a_key_of_100k_colons_is_refused_unparsed(saq_installed, tmp_path):
    """Found by the baseline's look (a SCAN), and announced after it (PUBLISH on the key, as
    SAQ announces a job's status): refused unparsed both times. On a redis-server of its own:
    a PUBLISH reaches every subscriber of the server, whatever its database, so the shared
    server would hand the key to every other test's SAQ reader."""
    key = "saq:job:" + ":" * 100_000

    def plant(client: Any) -> None:
        client.set(key, "{}")

    def announce(client: Any) -> None:
        client.publish(key, "complete")

    server = PrivateRedis(tmp_path).start()
    try:
        for signals in _counted_across(server.url, plant, server.client(), announce):
            assert signals.tally.invalid.get("oversized_field") == 1
    finally:
        server.stop()


def test_100k_fake_live_workers_are_read_up_to_the_limit(saq_installed, redis_client, redis_url):
    """Fakes listed as expiring an hour ahead: a read takes MAX_WORKERS of those expiring
    first (a live worker writes its record every few seconds), the rest counted once."""

    def plant(client: Any) -> None:
        ahead = int(time.time() * 1000) + 3_600_000
        pipe = client.pipeline(transaction=False)
        for start in range(0, 100_000, 10_000):
            fakes = {f"saq:work:worker_info:fake-{n}": ahead for n in range(start, start + 10_000)}
            pipe.zadd("saq:work:stats", fakes)
        pipe.execute()

    for signals in _counted_across(redis_url, plant, redis_client):
        assert signals.tally.invalid == {"over_limit": 1}
