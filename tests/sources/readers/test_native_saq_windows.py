"""The SAQ reader's finished jobs (issue 40): it hears SAQ's announcements of each job's status
(PUBLISH on the job's key, saq/queue/redis.py `notify`) and reads only the jobs announced, so a
read fetches what finished since the last one, not again the 30,000 kept; a flood of 300,000
finishes is observed whole; a gap in the subscription is counted and caught up by a look, which
observes the jobs finished during it once; a read cut off at its deadline keeps the subscription.

Kept jobs are written in SAQ's layout (test_native_windows.Saq); the flood is written as SAQ's
`_finish` and `notify` write a finished job, by a script (SAQ's own Queue API finishes a few
thousand a second, not 300,000); the other jobs are real SAQ jobs run by a real worker. The
truth is SAQ's (Queue.info()'s worker stats, Queue.job(), Queue.iter_jobs()) or what was
written, never what the reader counted. Private servers: each holds 30,000 keys or more, and
one has its subscriber cut off.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest
import redis

from exporter.lifecycle.metrics import EventMetrics
from exporter.output.health import HealthBoard
from exporter.output.telemetry import Telemetry
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers.config import SaqReaderConfig
from exporter.sources.readers.framework import NativeSource, Signals
from exporter.sources.readers.saq import DEPTH, SaqReader
from exporter.sources.readers.saq_jobs import MAX_READS
from exporter.sources.source import DeadlineExceeded, sample_within_deadline
from exporter.sources.streams.config import EventsSourceConfig
from tests.conftest import wait_for
from tests.private_redis import PrivateRedis
from tests.saq_app.control import driver
from tests.sources.readers.floods import output_bytes
from tests.sources.readers.test_native_windows import JOBS_PER_SCRIPT, KEPT, QUEUE, Saq
from tests.tcp_proxy import TcpProxy
from tests.tools import missing

FLOOD = 300_000

# SAQ 0.26's RedisQueue._finish (saq/queue/redis.py) for each job, as its worker finishes one:
# a MULTI of LREM of the active list, ZREM of `incomplete` and SETEX of the finished record for
# its ttl (600 s), then notify(): PUBLISH on the job's id (its key) of its status. The record is
# what Job.to_dict() gives a job that ran 5 ms, queued 10 ms before it finished.
_FINISH = """
for i = tonumber(ARGV[2]), tonumber(ARGV[3]) do
  local completed = tonumber(ARGV[1]) + math.floor(i / 300)
  local key = 'flood' .. i
  local id = KEYS[1] .. key
  local job = '{"function":"succeed","kwargs":{},"queue":"' .. ARGV[4] .. '","key":"' .. key
    .. '","status":"complete","attempts":1,"queued":' .. (completed - 10)
    .. ',"started":' .. (completed - 5) .. ',"completed":' .. completed
    .. ',"scheduled":0,"ttl":600}'
  redis.call('LREM', KEYS[2], 1, id)
  redis.call('ZREM', KEYS[3], id)
  redis.call('SETEX', id, 600, job)
  redis.call('PUBLISH', id, 'complete')
end
"""


@pytest.fixture
def saq_installed() -> None:
    if importlib.util.find_spec("saq") is None:
        missing("saq not installed (pyproject's dev extra has it)")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PrivateRedis]:
    private = PrivateRedis(tmp_path).start()
    try:
        yield private
    finally:
        private.stop()


def _reader(server: PrivateRedis) -> SaqReader:
    return SaqReader(SaqReaderConfig(queues=[QUEUE]), RedisConnectionConfig(url=server.url))


class _Reads:
    """A reader's reads, and what they counted: completions, execution times, refusals, gaps."""

    def __init__(self, reader: SaqReader) -> None:
        self.reader = reader
        self.completed = self.timed = self.lost = 0.0
        self.refused: Counter[str] = Counter()
        self.failed: float | None = None  # queue_depth{state="failed"} of the last read

    def read(self) -> tuple[float, int]:
        """One read: (completions, execution times) it counted."""
        signals = Signals(source="native:saq")
        self.reader.read(signals)
        completed = sum(
            n for (m, _), n in signals.tally.counts.items() if m == "queue_jobs_completed_total"
        )
        timed = sum(
            len(values)
            for (m, _), values in signals.tally.observations.items()
            if m == "queue_job_execution_seconds"
        )
        self.completed += completed
        self.timed += timed
        self.lost += signals.tally.lost
        self.refused.update(signals.tally.invalid)
        self.failed = signals.samples.table(DEPTH).get(("saq", QUEUE, "", "failed"))
        return completed, timed

    def until_timed(self, count: float, within: float = 60.0) -> list[int]:
        """Reads, 0.1 s apart, until `count` execution times were observed in all, then one
        more: what each observed. `within` seconds is the bound of a busy machine (a worker
        that has not run the jobs yet), not of the reader: one that misses a job never counts
        it, however long it reads."""
        timed: list[int] = []
        deadline = time.monotonic() + within
        while self.timed < count:
            assert time.monotonic() < deadline, (self.timed, count, timed)
            timed.append(self.read()[1])
            time.sleep(0.1)
        timed.append(self.read()[1])
        return timed


def test_a_read_after_jobs_finished_fetches_what_is_new_over_30k_kept(saq_installed, server):
    """Issue 40: 30,000 finished jobs kept (100 of them failed) and a live real worker. The
    first reads take the baseline (a look: SCAN and PTTLs) and read the kept records'
    statuses, 10,000 a read, and then serve the failed ones as SAQ's own Queue.iter_jobs counts
    them. Idle reads count nothing. Then 3 real jobs finish: the bytes Redis sent from before
    they were enqueued to the read that observed them (announcements, reads, and the worker's
    own traffic) are a small part of one look over the kept jobs (1.13 MB: what every read
    that counted cost before), and their 3 completions and execution times are counted once."""
    admin = server.client()
    system = Saq(server.url, admin)
    reader = _reader(server)
    reads = _Reads(reader)
    try:
        system.start()  # a live worker, which completed one job
        system.fill(KEPT)
        for index in range(100):  # failed for good, kept for their ttl as SAQ's _finish writes
            key = f"saq:job:{QUEUE}:kept{index}"
            job = json.loads(admin.get(key))
            admin.set(key, json.dumps({**job, "status": "failed"}), ex=600)
        truth = driver(server.url, "truth", QUEUE)["queues"][QUEUE]["failed"]
        assert truth == 100
        warm: list[int] = []
        for _ in range(math.ceil((KEPT + 1) / MAX_READS)):
            before = output_bytes(admin)
            assert reads.read() == (0, 0)
            warm.append(output_bytes(admin) - before)
        assert reads.failed == truth
        # the look: the baseline's read less the next, which read as many statuses
        look = warm[0] - warm[1]
        idle = []
        for _ in range(3):
            before = output_bytes(admin)
            assert reads.read() == (0, 0)
            idle.append(output_bytes(admin) - before)
        assert reads.failed == truth
        finished_before = system.finished()
        before = output_bytes(admin)
        system.run(3)
        counting = reads.until_timed(3)
        while reads.completed < 3:  # the worker writes its counts every second
            assert len(counting) < 100, counting
            time.sleep(0.1)
            counting.append(reads.read()[1])
        spent = output_bytes(admin) - before
        assert system.finished() - finished_before == 3
        assert (reads.completed, reads.timed, reads.lost, reads.refused) == (3, 3, 0, {})
        assert reads.failed == truth
        print(
            f"saq over {KEPT} kept jobs: first reads {warm} B (a look {look} B), idle reads "
            f"{idle} B; 3 jobs enqueued, run and counted in {len(counting)} reads: {spent} B"
        )
        assert spent * 20 < look, (spent, look)
    finally:
        reader.close()
        system.stop()


def test_300k_jobs_finishing_in_a_second_are_all_observed(saq_installed, server):
    """300,000 jobs finish within about a second after the baseline, each written and
    announced as SAQ's _finish and notify do: every announcement waits on the subscription
    (no gap), each job's execution time is observed once, MAX_READS a read, and a read that
    reads 10,000 gets as many bytes as any other (none fetched again). The reader remembers
    MAX_KEYS of them: the rest it forgets, counted as over_limit, not silently."""
    admin = server.client()
    reader = _reader(server)
    reads = _Reads(reader)
    try:
        assert reads.read() == (0, 0)  # the baseline
        started = time.monotonic()
        first_ms = int(time.time() * 1000)
        keys = [f"saq:job:{QUEUE}:", f"saq:{QUEUE}:active", f"saq:{QUEUE}:incomplete"]
        for first in range(0, FLOOD, JOBS_PER_SCRIPT):
            last = min(first + JOBS_PER_SCRIPT, FLOOD) - 1
            admin.eval(_FINISH, len(keys), *keys, first_ms, first, last, QUEUE)
        took = time.monotonic() - started
        assert admin.dbsize() == FLOOD
        sent, timed = [], []
        while reads.timed < FLOOD:
            assert len(timed) < FLOOD // MAX_READS + 10, timed
            before = output_bytes(admin)
            timed.append(reads.read()[1])
            sent.append(output_bytes(admin) - before)
        timed.append(reads.read()[1])
        assert timed[-1] == 0 and reads.timed == FLOOD, timed
        assert max(timed) == MAX_READS
        assert reads.lost == 0
        assert set(reads.refused) <= {"over_limit"}
        # the first read takes the announcements off the subscription (Redis sends them as
        # the reader takes them); the others read MAX_READS records each
        full = [size for size, took in zip(sent[1:], timed[1:], strict=False) if took == MAX_READS]
        assert len(full) >= FLOOD // MAX_READS - 2 and max(full) <= 1.5 * min(full), full
        print(
            f"{FLOOD} jobs finished in {took:.2f} s; {len(timed)} reads observed "
            f"{reads.timed:.0f}, {MAX_READS} a read: the first {sent[0]} B, the others "
            f"{min(full)}-{max(full)} B each; refused {dict(reads.refused)}"
        )
    finally:
        reader.close()


def _subscribers(client: redis.Redis) -> set[str]:
    return {entry["id"] for entry in client.client_list() if entry.get("psub") == "1"}


def test_a_gap_is_counted_and_its_jobs_caught_up_once(saq_installed, server, caplog):
    """A real worker's jobs: 2 finish and are observed; then the reader's subscription is cut
    (CLIENT KILL) and 4 finish, announced to nobody. The next read subscribes anew: one gap
    counted (queue_exporter_events_lost_total) and named in the log; its look finds the 4
    (not the 2 nor the kept ones) and observes each once. 3 more jobs after: observed once."""
    admin = server.client()
    system = Saq(server.url, admin)
    reader = _reader(server)
    reads = _Reads(reader)
    try:
        system.start()
        system.fill(1000)  # kept before: never observed
        others = _subscribers(admin)
        assert reads.read() == (0, 0)  # the baseline, the kept records' statuses read
        assert reads.failed == 0
        (mine,) = _subscribers(admin) - others
        system.finish(2)
        reads.until_timed(2)
        admin.execute_command("CLIENT", "KILL", "ID", mine)
        wait_for(lambda: mine not in _subscribers(admin))
        system.finish(4)
        with caplog.at_level(logging.WARNING):
            timed = reads.until_timed(2 + 4)
        assert reads.lost == 1 and "[resubscribed]" in caplog.text
        assert (reads.timed, timed[-1]) == (6, 0), timed
        system.finish(3)
        timed = reads.until_timed(2 + 4 + 3)
        assert (reads.timed, timed[-1], reads.lost) == (9, 0, 1), timed
        for _ in range(3):
            assert reads.read()[1] == 0
        assert reads.refused == {}
        print(f"a gap of 4 jobs: lost {reads.lost:.0f} gap, observed {reads.timed:.0f} of 9")
    finally:
        reader.close()
        system.stop()


class _Kept(SaqReader):
    """A SAQ reader that keeps what each read that succeeded counted."""

    def __init__(self, url: str) -> None:
        super().__init__(SaqReaderConfig(queues=[QUEUE]), RedisConnectionConfig(url=url))
        self.succeeded: list[Signals] = []

    def read(self, signals: Signals) -> None:
        super().read(signals)
        self.succeeded.append(signals)

    def timed_and_lost(self) -> tuple[int, int]:
        timed = sum(
            len(values)
            for signals in self.succeeded
            for (m, _), values in signals.tally.observations.items()
            if m == "queue_job_execution_seconds"
        )
        return timed, sum(signals.tally.lost for signals in self.succeeded)


def test_a_read_cut_off_at_its_deadline_keeps_the_subscription(saq_installed, server):
    """The reader reads through a proxy that freezes (a hung Redis) and runs under its
    deadline's watchdog, as the exporter runs it: the read is cut off while 3 real jobs
    finish; the subscription stays, so once Redis answers again the next reads observe those
    3 and the 2 before, once, with no gap."""
    admin = server.client()
    system = Saq(server.url, admin)
    proxy = TcpProxy("127.0.0.1", server.port).start()
    reader = _Kept(f"redis://127.0.0.1:{proxy.port}/0")
    telemetry = Telemetry(HealthBoard())
    metrics = EventMetrics(telemetry, EventsSourceConfig().buckets())
    source = NativeSource(lambda: reader, 2.0, metrics)
    try:
        system.start()
        sample_within_deadline(source)  # the baseline

        def observed(count: int) -> bool:
            with suppress(Exception):  # a read cut off on a loaded host: the next one
                sample_within_deadline(source)
            return reader.timed_and_lost()[0] >= count

        system.finish(2)
        wait_for(lambda: observed(2), timeout=30)
        proxy.freeze()
        system.finish(3)
        with pytest.raises(DeadlineExceeded):
            sample_within_deadline(source)
        proxy.thaw()
        wait_for(lambda: observed(5), timeout=30)
        for _ in range(3):
            sample_within_deadline(source)
        assert reader.timed_and_lost() == (5, 0)
    finally:
        source.close()
        telemetry.shutdown()
        proxy.cut()
        system.stop()
