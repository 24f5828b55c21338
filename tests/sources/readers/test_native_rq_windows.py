"""The RQ reader's windows over the finished and failed registries (issue 40): the baseline is
at the newest members, a read fetches what is new, not again what it counted, and a flood
finishing within one second (one score: RQ scores a member by current_timestamp(), whole
seconds, plus its TTL) is counted in pages, all of it, or what is lost is said (`over_limit`).

The kept jobs are written in the layout RQ's worker writes (the job id in the registry scored
by its end's second plus its TTL, the job hash with description, origin, status and times), a
few thousand writes per script so that no script holds a server long; the jobs that finish
while the reader runs are real RQ jobs run by RQ's own SimpleWorker, and RQ's own registries
say which are kept. The truth is what was written and what RQ says, never what the reader
counted.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from functools import partial
from pathlib import Path

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rq import Queue, SimpleWorker
from rq.registry import FailedJobRegistry, FinishedJobRegistry

from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers import rq_windows
from exporter.sources.readers.config import RqReaderConfig
from exporter.sources.readers.framework import Signals
from exporter.sources.readers.rq import RqReader
from exporter.sources.readers.rq_windows import MAX_NEW
from tests import claims
from tests.private_redis import PrivateRedis
from tests.sources.readers.floods import drain, output_bytes

QUEUE = "work"
FLOOD = 300_000
KEPT = 30_000
JOBS_PER_SCRIPT = 2_500  # two writes each: 5,000 writes a script

# One finished (or failed) job as RQ's worker leaves it: its id in the registry scored
# ARGV[1] (its end's second plus its TTL), its hash.
_FILL = """
for i = tonumber(ARGV[2]), tonumber(ARGV[3]) do
  local id = ARGV[5] .. string.format('%07d', i)
  redis.call('ZADD', KEYS[1], tonumber(ARGV[1]) + i * tonumber(ARGV[6]), id)
  redis.call('HSET', 'rq:job:' .. id, 'description', 'tests.rq_app.jobs.sleep_for(0)',
             'origin', ARGV[4], 'status', ARGV[7],
             'enqueued_at', '2026-01-01T00:00:00.000000Z',
             'started_at', '2026-01-01T00:00:00.000000Z',
             'ended_at', '2026-01-01T00:00:01.000000Z')
end
"""


def _fill(
    client: redis.Redis, registry: str, count: int, score: float, step: float, prefix: str
) -> None:
    """`count` jobs in rq:<registry>:<QUEUE>, the i-th scored score + i * step (step 0: one
    second's finishes)."""
    status = "finished" if registry == "finished" else "failed"
    key = f"rq:{registry}:{QUEUE}"
    for first in range(0, count, JOBS_PER_SCRIPT):
        last = min(first + JOBS_PER_SCRIPT, count) - 1
        client.eval(_FILL, 1, key, score, first, last, QUEUE, prefix, step, status)


def _run(client: redis.Redis, count: int) -> None:
    """`count` real jobs enqueued and finished by RQ's own worker."""
    queue = Queue(QUEUE, connection=client)
    jobs = [queue.enqueue("builtins.len", "abc") for _ in range(count)]
    SimpleWorker([queue], connection=client).work(burst=True)
    assert all(job.get_status() == "finished" for job in jobs)


def _read(reader: RqReader) -> Signals:
    signals = Signals()
    reader.read(signals)
    return signals


def _completed(signals: Signals) -> float:
    counts = signals.tally.counts.items()
    return sum(n for (name, _), n in counts if name == "queue_jobs_completed_total")


def _reader(server: PrivateRedis) -> RqReader:
    return RqReader(RqReaderConfig(), RedisConnectionConfig(url=server.url))


def test_an_idle_read_costs_the_same_whatever_is_kept(tmp_path: Path) -> None:
    """30,000 finished and 30,000 failed jobs kept, scored as RQ scores them (a ms apart: its
    seconds plus TTLs, 500 s and a year): an idle read gets as many bytes as with 300 kept
    (the code before re-read the newest 10,000 of each registry, 401 KB a read). Then 3 real
    jobs finish: counted once."""
    server = PrivateRedis(tmp_path).start()
    admin = server.client()
    try:
        _run(admin, 1)  # rq:queues names the queue
        idle: dict[int, int] = {}
        for kept in (300, KEPT):
            now = time.time()
            _fill(admin, "finished", kept, now + 500 - kept / 1000, 0.001, f"f{kept}-")
            _fill(admin, "failed", kept, now + 31_536_000 - kept / 1000, 0.001, f"x{kept}-")
            reader = _reader(server)
            try:
                _read(reader)  # the baseline
                before = output_bytes(admin)
                signals = _read(reader)
                idle[kept] = output_bytes(admin) - before
                assert (_completed(signals), signals.tally.invalid) == (0, {})
                if kept == KEPT:
                    _run(admin, 3)
                    counted, _, refused = drain(partial(_read, reader), _completed, admin, 5)
                    assert (sum(counted), counted[-1], refused) == (3, 0, {}), counted
            finally:
                reader.close()
        assert idle[KEPT] <= 1.1 * idle[300], idle
        print(f"an idle read: {idle[300]} bytes with 300 kept, {idle[KEPT]} with {KEPT}")
    finally:
        server.stop()


def test_300k_jobs_finishing_in_one_second_are_all_counted(tmp_path: Path) -> None:
    """The issue's attack: 300,000 jobs finishing within one second (one score, their end's
    second plus result_ttl) between two reads, then 5 real RQ jobs (a second later or more).
    Each read takes MAX_NEW of the second's members, the next goes on from its place in the
    score: every job is counted once (300,005), nothing is refused, and no read fetches again
    what it counted (the bytes of a full read do not grow with what was counted before). A
    private server: the flood holds 600,000 keys."""
    server = PrivateRedis(tmp_path).start()
    admin = server.client()
    reader = _reader(server)
    try:
        _run(admin, 1)
        _read(reader)  # the baseline
        second = int(time.time())
        _fill(admin, "finished", FLOOD, second + 500, 0, "flood-")
        assert admin.zcount(f"rq:finished:{QUEUE}", second + 500, second + 500) >= FLOOD
        _run(admin, 5)
        counted, sent, refused = drain(
            lambda: _read(reader), _completed, admin, FLOOD // MAX_NEW + 5
        )
        assert sum(counted) == FLOOD + 5, counted
        assert refused == {}
        assert max(counted) <= MAX_NEW + 5
        full = [size for size, took in zip(sent, counted, strict=True) if took >= MAX_NEW]
        assert len(full) >= FLOOD // MAX_NEW - 1
        assert max(full) <= 1.5 * min(full), full
        print(
            f"{len(counted)} reads counted {sum(counted):.0f}; a full read {min(full)}-"
            f"{max(full)} bytes"
        )
    finally:
        reader.close()
        server.stop()


def test_a_flood_expired_before_it_was_read_is_counted_as_over_limit(tmp_path: Path) -> None:
    """300,000 jobs finish within one second; after the reader took its first MAX_NEW, RQ's
    own cleanup removes them (FinishedJobRegistry.cleanup, as when their TTL passed): those
    never read cannot be counted, and that is said once (`over_limit`), not silently. A real
    job that finishes after is counted once, and a failed one in the failed registry."""
    server = PrivateRedis(tmp_path).start()
    admin = server.client()
    reader = _reader(server)
    try:
        _run(admin, 1)
        _read(reader)  # the baseline
        second = int(time.time())
        _fill(admin, "finished", FLOOD, second + 500, 0, "flood-")
        first = _read(reader)
        assert (_completed(first), first.tally.invalid) == (MAX_NEW, {})
        registry = FinishedJobRegistry(QUEUE, connection=admin)
        registry.cleanup(second + 501)
        assert registry.count == 0
        _run(admin, 1)
        queue = Queue(QUEUE, connection=admin)
        failing = queue.enqueue("builtins.len", 1)  # len(1) raises TypeError
        SimpleWorker([queue], connection=admin).work(burst=True)
        assert failing.id in FailedJobRegistry(QUEUE, connection=admin).get_job_ids()
        refused: dict[str, int] = {}
        totals = {"queue_jobs_completed_total": 0.0, "queue_jobs_failed_total": 0.0}
        for _ in range(4):  # the read that finds them gone, the next goes on past them
            signals = _read(reader)
            for reason, count in signals.tally.invalid.items():
                refused[reason] = refused.get(reason, 0) + count
            for (name, _), count in signals.tally.counts.items():
                if name in totals:
                    totals[name] += count
        assert refused == {"over_limit": 1}
        assert totals == {"queue_jobs_completed_total": 1, "queue_jobs_failed_total": 1}
    finally:
        reader.close()
        server.stop()


# Each step: finishes written between two reads, each (seconds behind the newest second written
# so far, or "inf" for a job kept forever (result_ttl=-1), how many at that one score).
_FINISHES = st.tuples(st.one_of(st.integers(-2, 400), st.just("inf")), st.integers(1, 12))


def _by_job(signals: Signals) -> Counter[str]:
    """Completions counted per job type (each written job has its own description)."""
    found: Counter[str] = Counter()
    for (metric, labels), count in signals.tally.counts.items():
        if metric == "queue_jobs_completed_total" and count:
            found[labels[2]] += int(count)
    return found


def _run_steps(
    client: redis.Redis, url: str, steps: list[list[tuple[int | str, int]]], expire: int | None
) -> tuple[Counter[str], list[str], dict[str, int]]:
    """The steps, a read after each, then reads until the reader caught up: what was counted
    per job, the jobs written and what the reads refused. Job ids are scattered in member
    order, so a second's finishes land anywhere among those of its score already there. With
    `expire`, RQ's cleanup runs before each read, removing the scores `expire` seconds behind
    the newest."""
    claims.flush_keeping_claim(client)
    client.sadd("rq:queues", f"rq:queue:{QUEUE}")
    key = f"rq:finished:{QUEUE}"
    reader = RqReader(RqReaderConfig(), RedisConnectionConfig(url=url))
    newest = 1_800_000_000
    written: list[str] = []
    counted: Counter[str] = Counter()
    refused: Counter[str] = Counter()

    def read() -> int:
        if expire is not None:
            client.zremrangebyscore(key, 0, newest - expire)
        signals = Signals()
        reader.read(signals)
        assert set(signals.tally.invalid) <= {"over_limit"}, signals.tally.invalid
        refused.update(signals.tally.invalid)
        found = _by_job(signals)
        counted.update(found)
        return sum(found.values())

    try:
        read()  # the baseline, of an empty registry
        for step in steps:
            for behind, count in step:
                score = math.inf if behind == "inf" else newest - int(behind)
                newest = max(newest, int(score)) if score != math.inf else newest
                for n in range(len(written), len(written) + count):
                    job_id = f"{n * 7919 % 10007:05d}-{n}"
                    client.zadd(key, {job_id: score})
                    client.hset(f"rq:job:{job_id}", "description", f"{job_id}()")
                    written.append(job_id)
            read()
        for _ in range(len(written)):
            if read() == 0:
                break
        assert [read(), read()] == [0, 0]
    finally:
        reader.close()
    return counted, written, dict(refused)


_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@_SETTINGS
@given(steps=st.lists(st.lists(_FINISHES, max_size=6), min_size=1, max_size=8))
def test_any_order_of_finishes_is_counted_once(redis_client, redis_url, monkeypatch, steps):
    """Finishes in any order (shorter TTLs scored below the newest, runs of one second's score
    landing anywhere among its members, jobs kept forever at +inf), with reads cut anywhere (7
    new members a read): once the reads caught up, every finish was counted exactly once and
    nothing refused (each job has its own type, so a job counted twice and another missed do
    not cancel out)."""
    monkeypatch.setattr(rq_windows, "MAX_NEW", 7)
    counted, written, refused = _run_steps(redis_client, redis_url, steps, None)
    assert counted == Counter(written)
    assert refused == {}


@_SETTINGS
@given(
    steps=st.lists(st.lists(_FINISHES, max_size=6), min_size=1, max_size=8),
    expire=st.integers(0, 300),
    remembered=st.sampled_from([5, 10_000]),
)
def test_finishes_cleaned_up_in_any_order_count_no_job_twice(
    redis_client, redis_url, monkeypatch, steps, expire, remembered
):
    """The same with RQ's cleanup removing the expired scores before each read: no job is
    counted twice, and every job the registry still keeps at the end was counted. With windows
    that remember 5 members below and at the cursor, a late job scored below what they
    remember is not seen (docs/native.md): still none is counted twice."""
    monkeypatch.setattr(rq_windows, "MAX_NEW", 7)
    monkeypatch.setattr(rq_windows, "MAX_REMEMBERED", remembered)
    counted, written, _ = _run_steps(redis_client, redis_url, steps, expire)
    assert max(counted.values(), default=1) == 1, counted
    assert set(counted) <= set(written)
    if remembered > len(written):
        kept = {m.decode() for m in redis_client.zrange(f"rq:finished:{QUEUE}", 0, -1)}
        assert kept <= set(counted), kept - set(counted)
