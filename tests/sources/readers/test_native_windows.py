"""Every native reader but Bull's (tests/sources/readers/test_native_bull_windows.py) over 30,000 kept finished
jobs (issue 40): a restart and a handover count only what finished after them, and a read that
fails after it fetched what is new loses nothing.

Per reader, the kept jobs are written in the library's own layout, a few thousand writes per
script so that no script holds the server long: RQ's finished registry (scored by expiry) and
job hashes; BullMQ's completed set, job hashes and `completed` entries of its events stream
(trimmed as BullMQ trims it, to about 10,000); SAQ's finished job records (SETEX, as its
`_finish` writes them); Sidekiq's `stat:processed`, the only trace it keeps of a finished job.
The jobs that finish while the readers run are real jobs run by the library's own worker, and
the library's own API says they finished (RQ's FinishedJobRegistry, BullMQ's getJobCounts,
SAQ's Queue.info() worker stats, Sidekiq::Stats). The truth is what the library says, never
what a reader counted. Each reader runs against every installed major of its library (RQ 1-3,
BullMQ 5 and 6).

A read is made to fail after fetching by the server itself: the reader's ACL user may not send
the command a read sends after it fetched the new records (the job hashes' HMGET for RQ and
BullMQ, the finished records' GET for SAQ, SSCAN of the processes after the counters for
Sidekiq), as a command severed at the read's deadline fails.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from exporter.lifecycle.metrics import EventMetrics
from exporter.output.health import HealthBoard
from exporter.output.telemetry import Telemetry
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers.bullmq import BullmqReader
from exporter.sources.readers.config import (
    BullmqReaderConfig,
    RqReaderConfig,
    SaqReaderConfig,
    SidekiqReaderConfig,
)
from exporter.sources.readers.framework import NativeSource, RedisReader, Signals
from exporter.sources.readers.rq import RqReader
from exporter.sources.readers.saq import SaqReader
from exporter.sources.readers.sidekiq import SidekiqReader
from exporter.sources.streams.config import EventsSourceConfig
from tests.applied_source import AppliedSource
from tests.conformance.adapters.base import require
from tests.conformance.adapters.rq import RQ_PYTHONS, rq_driver, rq_worker
from tests.conftest import parse_exposition, stop_process, total, wait_for
from tests.private_redis import PrivateRedis
from tests.real_queues import BULLMQ_MAJORS, BullMQ, Sidekiq
from tests.saq_app.control import driver as saq_driver
from tests.saq_app.control import worker as saq_worker

KEPT = 30_000
JOBS_PER_SCRIPT = 2_500  # a few writes each: at most ~7,500 writes a script
QUEUE = "work"


class System:
    """One library: its kept jobs written in its layout, real jobs run by its worker, what it
    says finished, and its reader."""

    name = ""
    queue = QUEUE  # the queue label the reader counts completions under
    denied = ""  # the command a read sends after it fetched what is new
    refused = ""  # what the server's ACL LOG names as refused: the command, or a key's start
    runtimes = True  # observes each finished job's execution time

    def __init__(self, url: str, client: redis.Redis, major: str = "") -> None:
        self.url, self.client, self.major = url, client, major

    def start(self) -> None:
        """The queue, as the library makes it, and a worker when one runs all along."""

    def stop(self) -> None:
        """Stop what start() started."""

    def fill(self, count: int) -> None:
        raise NotImplementedError

    def finished(self) -> int:
        """How many jobs the library says finished."""
        raise NotImplementedError

    def run(self, count: int) -> None:
        """`count` real jobs, run to their end by the library's worker."""
        raise NotImplementedError

    def finish(self, count: int) -> None:
        """Run `count` real jobs; the library says they finished."""
        before = self.finished()
        self.run(count)
        wait_for(lambda: self.finished() - before == count, timeout=60, interval=0.3)

    def reader(self, url: str) -> RedisReader:
        raise NotImplementedError


class Rq(System):
    name = "rq"
    denied = refused = "hmget"

    def __init__(self, url: str, client: redis.Redis, major: str = "3") -> None:
        super().__init__(url, client, major)
        self.python: Path = require(RQ_PYTHONS[major], "rq", f"rq{major}")

    # RQ's finished registry scores a job by when its result expires (its end + result_ttl,
    # 500 s by default); its hash as the worker leaves it.
    _FILL = """
    for i = tonumber(ARGV[2]), tonumber(ARGV[3]) do
      local ended = tonumber(ARGV[1]) + i / 1000
      local id = 'kept' .. i
      redis.call('ZADD', KEYS[1], ended + 500, id)
      redis.call('HSET', KEYS[2] .. id, 'description', 'tests.rq_app.jobs.sleep_for(0)',
                 'origin', ARGV[4], 'status', 'finished',
                 'enqueued_at', '2026-01-01T00:00:00.000000Z',
                 'started_at', '2026-01-01T00:00:00.000000Z',
                 'ended_at', '2026-01-01T00:00:01.000000Z')
    end
    """

    def start(self) -> None:
        self.finish(1)  # rq:queues names the queue, as RQ's enqueue makes it

    def fill(self, count: int) -> None:
        first_s = time.time() - 60  # ended within the last minute: below any new job's score
        for first in range(0, count, JOBS_PER_SCRIPT):
            last = min(first + JOBS_PER_SCRIPT, count) - 1
            self.client.eval(
                self._FILL, 2, f"rq:finished:{QUEUE}", "rq:job:", first_s, first, last, QUEUE
            )

    def finished(self) -> int:
        """FinishedJobRegistry.count (the driver's truth would fetch every kept job)."""
        script = (
            "import sys; from redis import Redis; from rq.registry import FinishedJobRegistry; "
            "print(FinishedJobRegistry(sys.argv[2], connection=Redis.from_url(sys.argv[1])).count)"
        )
        done = subprocess.run(
            [str(self.python), "-c", script, self.url, QUEUE],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return int(done.stdout)

    def run(self, count: int) -> None:
        plan = [{"queue": QUEUE, "call": "sleep_for", "seconds": 0}] * count
        rq_driver(self.python, self.url, "enqueue", json.dumps(plan))
        assert rq_worker(self.python, self.url, QUEUE, burst=True).wait(timeout=120) == 0

    def reader(self, url: str) -> RedisReader:
        return RqReader(RqReaderConfig(), RedisConnectionConfig(url=url))


class Bullmq(System):
    name = "bullmq"
    denied = refused = "hmget"

    def __init__(self, url: str, client: redis.Redis, major: str = "6") -> None:
        super().__init__(url, client, major)
        connection = client.connection_pool.connection_kwargs
        self.driver = BullMQ(int(major), connection.get("db", 0), port=connection["port"])

    # moveToFinished: the job in `completed` scored by finishedOn, its hash, and a `completed`
    # entry on the events stream, trimmed to about 10,000 (maxLenEvents)
    _FILL = """
    for i = tonumber(ARGV[2]), tonumber(ARGV[3]) do
      local finished = math.floor(tonumber(ARGV[1]) + i)
      local id = 'kept' .. i
      redis.call('ZADD', KEYS[1], finished, id)
      redis.call('HSET', KEYS[2] .. id, 'name', 'kept', 'timestamp', finished - 10,
                 'processedOn', finished - 5, 'finishedOn', finished, 'atm', 1)
      redis.call('XADD', KEYS[3], 'MAXLEN', '~', 10000, '*', 'event', 'completed',
                 'jobId', id, 'returnvalue', 'null')
    end
    """

    def start(self) -> None:
        self.finish(1)  # the queue's meta hash, as BullMQ makes it

    def stop(self) -> None:
        self.driver.stop_all()

    def fill(self, count: int) -> None:
        first_ms = int(time.time() * 1000) - count
        prefix = f"bull:{QUEUE}:"
        for first in range(0, count, JOBS_PER_SCRIPT):
            last = min(first + JOBS_PER_SCRIPT, count) - 1
            keys = (f"{prefix}completed", prefix, f"{prefix}events")
            self.client.eval(self._FILL, 3, *keys, first_ms, first, last)

    def finished(self) -> int:
        return int(self.driver.truth([QUEUE])["queues"][QUEUE]["counts"]["completed"])

    def run(self, count: int) -> None:
        self.driver.steps(
            {"op": "add", "queue": QUEUE, "count": count},
            {"op": "work", "queue": QUEUE, "completed": count},
        )

    def reader(self, url: str) -> RedisReader:
        return BullmqReader(BullmqReaderConfig(workers=False), RedisConnectionConfig(url=url))


class Saq(System):
    name = "saq"
    denied = "get"  # of the finished records alone: the workers' stats may be read
    refused = f"saq:job:{QUEUE}:"

    # SAQ's _finish: the finished job's JSON written again with SETEX for its ttl (600 s)
    _FILL = """
    for i = tonumber(ARGV[2]), tonumber(ARGV[3]) do
      local completed = math.floor(tonumber(ARGV[1]) + i)
      local key = KEYS[1] .. 'kept' .. i
      local job = '{"function":"succeed","kwargs":{},"queue":"' .. ARGV[4] .. '","key":"kept'
        .. i .. '","status":"complete","attempts":1,"queued":' .. (completed - 10)
        .. ',"started":' .. (completed - 5) .. ',"completed":' .. completed
        .. ',"scheduled":0,"ttl":600}'
      redis.call('SET', key, job, 'EX', 600)
    end
    """

    def __init__(self, url: str, client: redis.Redis, major: str = "") -> None:
        super().__init__(url, client, major)
        self.worker: Any = None

    def start(self) -> None:
        self.worker, _ = saq_worker(self.url, QUEUE)
        self.finish(1)

    def stop(self) -> None:
        if self.worker is not None:
            stop_process(self.worker, signal.SIGTERM)

    def fill(self, count: int) -> None:
        first_ms = int(time.time() * 1000) - count
        for first in range(0, count, JOBS_PER_SCRIPT):
            last = min(first + JOBS_PER_SCRIPT, count) - 1
            self.client.eval(self._FILL, 1, f"saq:job:{QUEUE}:", first_ms, first, last, QUEUE)

    def finished(self) -> int:
        workers = saq_driver(self.url, "truth", QUEUE)["queues"][QUEUE]["workers"]
        return sum(int(stats.get("complete", 0)) for stats in workers.values())

    def run(self, count: int) -> None:
        plan = [{"queue": QUEUE, "function": "succeed"}] * count
        saq_driver(self.url, "enqueue", json.dumps(plan))

    def reader(self, url: str) -> RedisReader:
        return SaqReader(SaqReaderConfig(queues=[QUEUE]), RedisConnectionConfig(url=url))


class SidekiqSystem(System):
    name = "sidekiq"
    queue = ""  # Sidekiq's counters carry no queue (an empty label)
    denied = refused = "sscan"  # the processes, read after the counters
    runtimes = False  # Sidekiq records no runtime per job

    def __init__(self, url: str, client: redis.Redis, major: str = "") -> None:
        super().__init__(url, client, major)
        connection = client.connection_pool.connection_kwargs
        self.driver = Sidekiq(connection.get("db", 0), port=connection["port"])

    def start(self) -> None:
        self.driver.worker([QUEUE], concurrency=2)

    def stop(self) -> None:
        self.driver.stop_all()

    def fill(self, count: int) -> None:
        self.client.incrby("stat:processed", count)  # what Sidekiq's heartbeat adds up

    def finished(self) -> int:
        truth = self.driver.truth()  # the heartbeat flushes the counts every 5 s
        return int(truth["processed"]) - int(truth["failed"])

    def run(self, count: int) -> None:
        self.driver.push({"queue": QUEUE, "count": count})

    def reader(self, url: str) -> RedisReader:
        return SidekiqReader(SidekiqReaderConfig(), RedisConnectionConfig(url=url))


# Each reader against each installed major of its library: (the system, the major)
SYSTEMS: dict[str, tuple[type[System], str]] = {
    **{f"rq{major}": (Rq, major) for major in sorted(RQ_PYTHONS)},
    **{f"bullmq{major}": (Bullmq, str(major)) for major in BULLMQ_MAJORS},
    "saq": (Saq, ""),
    "sidekiq": (SidekiqSystem, ""),
}


def _made(name: str, url: str, client: redis.Redis) -> System:
    kind, major = SYSTEMS[name]
    return kind(url, client, major)


def _counted(system: System, signals: Signals) -> float:
    """Completions the read counted for the system's queue."""
    return sum(
        count
        for (metric, labels), count in signals.tally.counts.items()
        if metric == "queue_jobs_completed_total" and labels[1] == system.queue
    )


def _timed(signals: Signals) -> int:
    """Execution times the read observed."""
    return sum(
        len(values)
        for (metric, _), values in signals.tally.observations.items()
        if metric == "queue_job_execution_seconds"
    )


def _read(system: System, reader: RedisReader, timed: list[int] | None = None) -> float:
    """One read, which refuses nothing and loses nothing: the completions it counted; the
    execution times it observed are added to `timed`."""
    signals = Signals(source=system.name)
    reader.read(signals)
    assert (signals.tally.invalid, signals.tally.lost) == ({}, 0), system.name
    if timed is not None:
        timed.append(_timed(signals))
    return _counted(system, signals)


def _baseline(system: System, reader: RedisReader) -> None:
    """A reader's first read: no completion counted, no execution time observed."""
    timed: list[int] = []
    assert (_read(system, reader, timed), timed) == (0, [0]), system.name


def _settled(system: System, reader: RedisReader, count: int) -> list[float]:
    """Reads until `count` were counted (SAQ's and Sidekiq's workers write their counts every
    second or five), then one more: what each read counted. A reader with runtimes observed
    one execution time per completion, over the same reads."""
    counted: list[float] = []
    timed: list[int] = []
    deadline = time.monotonic() + 30
    while (sum(counted) < count or (system.runtimes and sum(timed) < count)) and (
        time.monotonic() < deadline
    ):
        counted.append(_read(system, reader, timed))
        time.sleep(0.3)
    counted.append(_read(system, reader, timed))
    if system.runtimes:
        assert sum(timed) == count and timed[-1] == 0, (system.name, timed)
    return counted


@pytest.fixture(params=sorted(SYSTEMS))
def system(request: pytest.FixtureRequest, redis_url: str, redis_client: redis.Redis) -> Iterator:
    made = _made(request.param, redis_url, redis_client)
    made.start()
    try:
        yield made
    finally:
        made.stop()


def test_a_restart_over_30k_kept_jobs_counts_only_what_finished_after(system):
    """30,000 kept finished jobs; a reader counts none of them, then the 3 real jobs that finish
    after its first read; restarted (a new reader, as a restarted exporter makes), it counts
    none of what was counted before, then the 3 that finish after, once."""
    system.fill(KEPT)
    for restart in range(2):
        reader = system.reader(system.url)
        try:
            _baseline(system, reader)  # BullMQ: from the positions the last read stored
            system.finish(3)
            counted = _settled(system, reader, 3)
            assert sum(counted) == 3 and counted[-1] == 0, (restart, counted)
            print(
                f"{system.name}{system.major}: restart {restart}: counted {counted}, the library 3"
            )
        finally:
            reader.close()


def test_a_handover_over_30k_kept_jobs_counts_only_what_finished_after(system):
    """A leads (token 1) and counts 2; B leads (token 2: its own reader, its own series) and
    counts the 4 that finish while it leads; A leads again (token 3): a new reader, which counts
    none of the 30,000 kept nor B's 4, and then the 5 that finish after, once. Served: the
    completions, and as many execution times (RQ, BullMQ, SAQ)."""
    system.fill(KEPT)

    def replica(token: list[int]) -> tuple[AppliedSource, Callable[[], tuple[float, float]]]:
        telemetry = Telemetry(HealthBoard())
        metrics = EventMetrics(telemetry, EventsSourceConfig().buckets())
        native = NativeSource(
            lambda: system.reader(system.url), 10.0, metrics, term=lambda: token[0]
        )
        source = AppliedSource(native, telemetry, metrics)

        def served() -> tuple[float, float]:
            """Completions served, and execution times (as many, with runtimes; else 0)."""
            series = parse_exposition(telemetry.render(False).decode())
            labels = {"system": system.name, "queue": system.queue}
            return (
                total(series, "queue_jobs_completed_total", **labels),
                total(series, "queue_job_execution_seconds_count", **labels),
            )

        return source, served

    a_token, b_token = [1], [2]
    a, a_served = replica(a_token)
    b, b_served = replica(b_token)
    runtimes = 1 if system.runtimes else 0

    def settle(
        source: AppliedSource, served: Callable[[], tuple[float, float]], count: int
    ) -> None:
        def counted() -> bool:
            source.sample()
            completed, timed = served()
            return completed >= count and timed >= count * runtimes

        wait_for(counted, timeout=30, interval=0.3)
        source.sample()
        assert served() == (count, count * runtimes)

    try:
        a.sample()  # the baseline
        system.finish(2)
        settle(a, a_served, 2)
        b.sample()  # B leads: its baseline (BullMQ: from A's stored positions)
        system.finish(4)
        settle(b, b_served, 4)
        a_token[0] = 3  # A leads again, after B
        a.sample()  # a new reader
        assert a_served() == (2, 2 * runtimes)
        system.finish(5)
        settle(a, a_served, 2 + 5)
        print(
            f"{system.name}{system.major}: A served {a_served()}, B {b_served()}; the library 2 + 4 + 5"
        )
    finally:
        a.close()
        b.close()


@pytest.fixture
def private(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize(("name", "denied"), [(name, None) for name in sorted(SYSTEMS)])
def test_a_read_that_fails_after_fetching_loses_nothing(private, name, denied):
    """20 real jobs finish after the baseline; the read that fetched them fails (the server
    refuses the command it sends next) and counts nothing; once allowed, the next reads count
    the 20, once. (SAQ's PTTLs refused cost the runtimes alone: tests/sources/readers/test_native_permissions.py.)"""
    admin = private.client()
    system = _made(name, private.url, admin)
    if denied is not None:
        system.denied = system.refused = denied
    system.start()
    try:
        admin.execute_command("ACL", "SETUSER", "reader", "on", ">secret", "~*", "&*", "+@all")
        url = f"redis://reader:secret@127.0.0.1:{private.port}/0"
        reader = system.reader(url)
        try:
            _baseline(system, reader)
            denied = [f"-{system.denied}"]
            if (system.name, system.denied) == ("saq", "get"):  # its workers' stats may be read
                denied.append(f"(+get ~saq:{QUEUE}:worker_info:*)")
            admin.execute_command("ACL", "SETUSER", "reader", *denied)
            system.finish(20)
            with pytest.raises(redis.exceptions.NoPermissionError):
                _read(system, reader)
            # refused where meant: the command after the fetch (SAQ: a finished record's GET)
            refused = {str(entry["object"]) for entry in admin.acl_log()}
            assert refused and all(item.startswith(system.refused) for item in refused), refused
            admin.execute_command("ACL", "SETUSER", "reader", f"+{system.denied}")
            counted = _settled(system, reader, 20)
            assert sum(counted) == 20 and counted[-1] == 0, counted
            print(
                f"{system.name}{system.major}: after a failed read counted {counted}, the library 20"
            )
        finally:
            reader.close()
    finally:
        system.stop()


FLOOD = 300_000


@pytest.mark.parametrize(
    "name", [name for name in ("rq3", "bullmq6", "sidekiq") if name in SYSTEMS]
)
def test_a_flood_between_two_reads_is_counted_or_lost_never_silently(private, name):
    """300,000 jobs finish between two reads, written in the library's layout (RQ: its
    finished registry, scored below the newest job counted; BullMQ: `completed` events on the
    stream it trims to about 10,000; Sidekiq: its processed counter). The reads that follow
    count every one, or what the library discarded before a read could get to it is counted as
    lost (BullMQ's trimmed events, queue_exporter_events_lost_total): counted + lost is
    300,000, and nothing else is refused. A private server: the flood holds 300,000 keys."""
    admin = private.client()
    system = _made(name, private.url, admin)
    system.start()
    reader = system.reader(private.url)
    try:
        _baseline(system, reader)
        system.fill(FLOOD)
        counted: list[float] = []
        lost = 0
        for _ in range(FLOOD // 10_000 + 5):
            signals = Signals(source=system.name)
            reader.read(signals)
            assert signals.tally.invalid == {}, (name, len(counted), signals.tally.invalid)
            counted.append(_counted(system, signals))
            lost += signals.tally.lost
            if not counted[-1] and not signals.tally.lost:
                break
        assert sum(counted) + lost == FLOOD, (name, counted, lost)
        print(f"{name}: {len(counted)} reads counted {sum(counted):.0f}, lost {lost}")
    finally:
        reader.close()
        system.stop()
