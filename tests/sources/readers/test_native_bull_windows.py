"""The Bull reader's window over a finished set (issue 40): its baseline is at the newest
members, it moves only once a read succeeded, and a read fetches what is new, not again what it
counted.

The kept jobs are written in the layout Bull's moveToFinished writes (the job's id in
`<prefix>:<queue>:completed` scored by finishedOn, its hash with name, timestamp, processedOn,
finishedOn and attemptsMade), a few thousand writes per script so that no script holds a server
long; the jobs that finish while the reader runs are real Bull jobs, completed by Bull's own
processor, and Bull's own getCompleted() says which they are. The truth is what was written and
what Bull says, never what the reader counted.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.lifecycle.metrics import EventMetrics
from exporter.output.health import HealthBoard
from exporter.output.telemetry import Telemetry
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers import bull as bull_module
from exporter.sources.readers.bull import MAX_NEW, BullReader
from exporter.sources.readers.config import BullReaderConfig
from exporter.sources.readers.framework import NativeSource, ReadDeadline, ReaderError, Signals
from exporter.sources.streams.config import EventsSourceConfig
from tests import claims
from tests.applied_source import AppliedSource
from tests.conftest import parse_exposition, total
from tests.private_redis import PrivateRedis
from tests.real_queues import BULL_MAJORS, Bull
from tests.sources.readers.floods import drain

QUEUE = "work"
COMPLETED = f"bull:{QUEUE}:completed"
KEPT = 30_000
FLOOD = 300_000
JOBS_PER_SCRIPT = 2_500  # two writes each: 5,000 writes a script
RUN_MS = 5  # each written job ran this long (finishedOn - processedOn)

# One finished job as Bull's moveToFinished leaves it: ARGV[1] + i is its finishedOn.
_FILL = """
for i = tonumber(ARGV[2]), tonumber(ARGV[3]) do
  local finished = math.floor(tonumber(ARGV[1]) + i / tonumber(ARGV[4]))
  local id = 'kept' .. i
  redis.call('ZADD', KEYS[1], finished, id)
  redis.call('HSET', KEYS[2] .. id, 'name', '__default__', 'timestamp', finished - 10,
             'processedOn', finished - ARGV[5], 'finishedOn', finished, 'attemptsMade', 0)
end
"""


def _fill(client: redis.Redis, count: int, first_ms: int, per_ms: int) -> None:
    """`count` completed jobs, `per_ms` of them finishing in each ms from `first_ms` on."""
    for first in range(0, count, JOBS_PER_SCRIPT):
        last = min(first + JOBS_PER_SCRIPT, count) - 1
        client.eval(_FILL, 2, COMPLETED, f"bull:{QUEUE}:", first_ms, first, last, per_ms, RUN_MS)


def _complete(bull: Bull, count: int, **opts: Any) -> None:
    """`count` real jobs added and completed by Bull's own processor."""
    step: dict[str, Any] = {"op": "add", "queue": QUEUE, "count": count}
    if opts:
        step["opts"] = opts
    bull.steps(step, {"op": "work", "queue": QUEUE, "completed": count})


def _bull_completed(bull: Bull) -> int:
    """How many jobs Bull itself keeps as completed (getJobCounts)."""
    return int(bull.truth([QUEUE])["queues"][QUEUE]["counts"]["completed"])


def _counted(signals: Signals) -> float:
    return sum(
        count
        for (metric, labels), count in signals.tally.counts.items()
        if metric == "queue_jobs_completed_total" and labels[1] == QUEUE
    )


def _read(reader: BullReader, **signals: Any) -> Signals:
    read = Signals(**signals)
    reader.read(read)
    return read


@pytest.fixture(params=BULL_MAJORS, ids=lambda major: f"bull{major}")
def bull(request: pytest.FixtureRequest, redis_db: int) -> Iterator[Bull]:
    driver = Bull(request.param, redis_db)
    yield driver
    driver.stop_all()


def test_a_restart_over_30k_kept_jobs_counts_only_what_finished_after(
    bull, redis_client, redis_url
):
    """The issue's attack: 30,000 jobs kept in `completed` (finished over the last 30 s, all
    within the late check's reach), a restarted exporter counted 20,000 as new. Each new reader's
    first read is its baseline at the newest members: it counts none of them, then exactly the
    real jobs Bull completes after it, once."""
    _complete(bull, 1)  # the queue exists (its id counter), as Bull made it
    _fill(redis_client, KEPT, int(time.time() * 1000) - 30_000, 1)
    connection = RedisConnectionConfig(url=redis_url)
    for restart in range(2):
        reader = BullReader(BullReaderConfig(workers=False), connection)
        try:
            assert _counted(_read(reader)) == 0  # the baseline
            before = _bull_completed(bull)
            _complete(bull, 3)
            assert _bull_completed(bull) - before == 3
            counted = [_counted(_read(reader)) for _ in range(3)]
            assert counted == [3, 0, 0], (restart, counted)
        finally:
            reader.close()


def test_a_handover_over_30k_kept_jobs_counts_only_what_finished_after(
    bull, redis_client, redis_url
):
    """The issue's handover (the new leader counted 2,075 where 400 had finished): another
    replica led between two reads (its fencing token moved past this replica's next one), so
    the source builds a new reader, whose baseline is at the newest of 30,000 kept jobs. What
    finished while the other led is the other's; what finishes after is counted here once."""
    _complete(bull, 1)
    _fill(redis_client, KEPT, int(time.time() * 1000) - 30_000, 1)
    connection = RedisConnectionConfig(url=redis_url)
    telemetry = Telemetry(HealthBoard())
    metrics = EventMetrics(telemetry, EventsSourceConfig().buckets())
    token = [1]
    reader = NativeSource(
        lambda: BullReader(BullReaderConfig(workers=False), connection),
        10.0,  # its deadline: a baseline over 30,000 kept jobs on a loaded host
        metrics,
        term=lambda: token[0],
    )
    source = AppliedSource(reader, telemetry, metrics)

    def served() -> float:
        series = parse_exposition(telemetry.render(False).decode())
        return total(series, "queue_jobs_completed_total", system="bull", queue=QUEUE)

    try:
        source.sample()  # the baseline
        _complete(bull, 2)
        source.sample()
        assert served() == 2
        token[0] = 3  # another replica held token 2 and counted what finished meanwhile
        _complete(bull, 4)
        source.sample()  # a new reader: its baseline
        assert served() == 2
        _complete(bull, 5)
        source.sample()
        source.sample()
        assert served() == 2 + 5
    finally:
        source.close()


def test_a_read_that_fails_after_fetching_the_new_jobs_loses_none(bull, redis_url):
    """The issue's attack (a read failing after its window moved: 0 of 20 jobs ever counted),
    in its two forms: the read stopped past its deadline between two jobs, after every new
    member was fetched and the jobs read; and its job hashes refused (an HMGET the ACL does not
    allow, as a severed HMGET fails). Nothing is applied, the window stays, and the next read
    counts all 20 real jobs once."""
    _complete(bull, 1)
    reader = BullReader(BullReaderConfig(workers=False), RedisConnectionConfig(url=redis_url))
    try:
        _read(reader)  # the baseline
        _complete(bull, 20)
        with pytest.raises(ReaderError, match="deadline"):
            _read(reader, deadline=ReadDeadline(wall=0.0, cpu=0.0))
        assert [_counted(_read(reader)) for _ in range(2)] == [20, 0]
    finally:
        reader.close()


@pytest.mark.parametrize("major", [4])
def test_a_refused_job_read_loses_none(tmp_path, major):
    """A read whose HMGETs fail (the server refuses them: the ACL, as it would fail when the
    watchdog severs an HMGET held too long) fails whole; once they are allowed, the 20 real jobs
    Bull completed meanwhile are counted, once."""
    server = PrivateRedis(tmp_path).start()
    bull = Bull(major, 0, port=server.port)
    admin = server.client()
    try:
        admin.execute_command(
            "ACL", "SETUSER", "reader", "on", ">secret", "~*", "&*", "+@all", "-hmget"
        )
        url = f"redis://reader:secret@127.0.0.1:{server.port}/0"
        reader = BullReader(BullReaderConfig(workers=False), RedisConnectionConfig(url=url))
        _complete(bull, 1)
        _read(reader)  # the baseline reads no job
        _complete(bull, 20)
        with pytest.raises(redis.exceptions.NoPermissionError):
            _read(reader)
        admin.execute_command("ACL", "SETUSER", "reader", "+hmget")
        assert [_counted(_read(reader)) for _ in range(2)] == [20, 0]
        reader.close()
    finally:
        bull.stop_all()
        server.stop()


def test_300k_jobs_finishing_in_a_second_are_all_counted(tmp_path):
    """The issue's attack: 300,000 jobs finishing within one second (300 a ms, in Bull's
    layout) between two reads, then 5 real Bull jobs. Each read takes MAX_NEW new members and
    the next goes on from there: every job is counted once (300,005), nothing is refused, and
    no read fetches again what it counted (the bytes a read gets do not grow with what was
    counted before: the code before fetched everything seen plus 10,000). A private server:
    the flood holds 600,000 keys."""
    server = PrivateRedis(tmp_path).start()
    bull = Bull(4, 0, port=server.port)
    admin = server.client()
    reader = BullReader(BullReaderConfig(workers=False), RedisConnectionConfig(url=server.url))
    try:
        _complete(bull, 1)
        _read(reader)  # the baseline
        # the second after the baseline; the real jobs finish within it, so they are
        # scored below most of the flood (found as late members, as a slow worker's are)
        _fill(admin, FLOOD, int(time.time() * 1000) + 1, FLOOD // 1_000)
        _complete(bull, 5)
        counted, sent, refused = drain(
            partial(_read, reader), _counted, admin, FLOOD // MAX_NEW + 5
        )
        assert sum(counted) == FLOOD + 5, counted
        assert refused == {}
        # MAX_NEW past the cursor, and the rest of the 300 of one ms a full read cut into
        per_ms = FLOOD // 1_000
        assert max(counted) <= MAX_NEW + per_ms + 5
        full = [size for size, took in zip(sent, counted, strict=True) if took >= MAX_NEW]
        assert len(full) >= FLOOD // MAX_NEW - 1
        assert max(full) <= 1.5 * min(full), full
        print(
            f"{len(counted)} reads counted {sum(counted):.0f}; a full read {min(full)}-{max(full)} bytes"
        )
    finally:
        reader.close()
        bull.stop_all()
        server.stop()


def test_a_backlog_trimmed_before_it_was_read_is_counted_as_over_limit(tmp_path):
    """300,000 jobs finish within a second; after the reader took its first MAX_NEW, a real
    Bull job with removeOnComplete: 12000 completes and Bull trims the set to its 12,000 newest:
    the jobs trimmed before the reader got to them cannot be counted, and that is said once
    (`over_limit`), not silently; the 12,000 Bull kept are all counted, once."""
    server = PrivateRedis(tmp_path).start()
    bull = Bull(4, 0, port=server.port)
    admin = server.client()
    reader = BullReader(BullReaderConfig(workers=False), RedisConnectionConfig(url=server.url))
    try:
        _complete(bull, 1)
        _read(reader)  # the baseline
        _fill(admin, FLOOD, int(time.time() * 1000) + 1, FLOOD // 1_000)
        first = _read(reader)
        assert _counted(first) == MAX_NEW
        _complete(bull, 1, removeOnComplete=12_000)
        assert admin.zcard(COMPLETED) == 12_000
        counted, _, refused = drain(partial(_read, reader), _counted, admin, 10)
        assert refused == {"over_limit": 1}
        assert sum(counted) == 12_000, counted
        print(f"after the trim: {sum(counted):.0f} counted in {len(counted)} reads, {refused}")
    finally:
        reader.close()
        bull.stop_all()
        server.stop()


def test_late_finishes_are_counted_once_and_a_late_flood_in_parts(tmp_path):
    """Finishes written after the reader's cursor passed their score (a worker whose clock is
    10 s behind; a finish written a moment after its time was taken): the late check's ZCOUNT
    finds them, and they are counted once. 30,000 of them at once are counted over several
    reads, at most MAX_NEW late ones and a run of one score a read, all of them once."""
    server = PrivateRedis(tmp_path).start()
    bull = Bull(4, 0, port=server.port)
    admin = server.client()
    reader = BullReader(BullReaderConfig(workers=False), RedisConnectionConfig(url=server.url))
    try:
        _complete(bull, 1)
        _read(reader)  # the baseline, its cursor at the real job's finishedOn
        _complete(bull, 2)  # the cursor moves to the newest of these
        assert _counted(_read(reader)) == 2
        cursor_ms = float(admin.zrange(COMPLETED, -1, -1, withscores=True)[0][1])
        _fill(admin, 3, int(cursor_ms) - 10_000, 1)  # 10 s behind the cursor
        assert [_counted(_read(reader)) for _ in range(2)] == [3, 0]
        # 30,000 more, 30 a ms over the second before the cursor (ids after the three above)
        admin.eval(
            _FILL,
            2,
            COMPLETED,
            f"bull:{QUEUE}:",
            int(cursor_ms) - 1_000 - 100,
            3,
            KEPT + 2,
            30,
            RUN_MS,
        )
        counted, _, refused = drain(partial(_read, reader), _counted, admin, 10)
        assert sum(counted) == KEPT and refused == {}, counted
        assert len(counted) > 2 and max(counted) <= MAX_NEW + 30, counted
    finally:
        reader.close()
        bull.stop_all()
        server.stop()


# Each step: finishes written between two reads, each (ms behind the newest finish written so
# far, how many at that one score; a negative offset is a finish ahead of all before).
_FINISHES = st.tuples(st.integers(min_value=-3, max_value=50_000), st.integers(1, 12))


def _by_job(signals: Signals) -> Counter[str]:
    """Completions counted per job type (each written job has its own name)."""
    found: Counter[str] = Counter()
    for (metric, labels), count in signals.tally.counts.items():
        if metric == "queue_jobs_completed_total" and count:
            found[labels[2]] += int(count)
    return found


def _run_steps(
    client: redis.Redis, url: str, steps: list[list[tuple[int, int]]], keep: int | None = None
) -> tuple[Counter[str], list[str]]:
    """The steps, a read after each, then reads until the reader caught up: what was counted
    per job, and the jobs written. Small limits (7 new a read, ranges of 3 members) cut the
    reads anywhere. With `keep`, each finish cuts the set to its `keep` newest right after it
    is added, as Bull's moveToFinished does for a job with removeOnComplete: <keep>."""
    claims.flush_keeping_claim(client)
    client.set(f"bull:{QUEUE}:id", 1)  # the queue, as Bull's first add makes it
    reader = BullReader(BullReaderConfig(workers=False), RedisConnectionConfig(url=url))
    newest = int(time.time() * 1000) - 5_000  # all within the 60 s a late finish is looked for
    written: list[str] = []
    counted: Counter[str] = Counter()

    def read() -> int:
        signals = Signals()
        reader.read(signals)
        assert set(signals.tally.invalid) <= {"over_limit"}, signals.tally.invalid
        found = _by_job(signals)
        counted.update(found)
        return sum(found.values())

    try:
        read()  # the baseline, of an empty set
        for step in steps:
            for behind, count in step:
                score = newest - behind
                newest = max(newest, score)
                for job_id in [f"j{len(written) + i}" for i in range(count)]:
                    client.zadd(COMPLETED, {job_id: score})
                    client.hset(f"bull:{QUEUE}:{job_id}", "name", job_id)
                    if keep is not None:
                        client.zremrangebyrank(COMPLETED, 0, -(keep + 1))
                    written.append(job_id)
            read()
        for _ in range(len(written)):
            if read() == 0:
                break
        assert [read(), read()] == [0, 0]
    finally:
        reader.close()
    return counted, written


_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@_SETTINGS
@given(steps=st.lists(st.lists(_FINISHES, max_size=6), min_size=1, max_size=8))
def test_any_order_of_finishes_is_counted_once(redis_client, redis_url, monkeypatch, steps):
    """Finishes in any order within the late check's reach (up to 50 s behind the newest, runs
    of one score, ahead of all before), with reads cut anywhere: once the reads caught up,
    every finish was counted exactly once (each job has its own name, so a job counted twice
    and another missed do not cancel out)."""
    monkeypatch.setattr(bull_module, "MAX_NEW", 7)
    monkeypatch.setattr(bull_module, "CHUNK", 3)
    counted, written = _run_steps(redis_client, redis_url, steps)
    assert counted == Counter(written)


@_SETTINGS
@given(
    steps=st.lists(st.lists(_FINISHES, max_size=6), min_size=1, max_size=8),
    keep=st.integers(1, 30),
)
def test_finishes_of_a_kept_count_in_any_order_count_no_job_twice(
    redis_client, redis_url, monkeypatch, steps, keep
):
    """The same for jobs with removeOnComplete: <keep> (Bull cuts the set to its newest after
    each finish, late ones too): no job is counted twice, and every job Bull still keeps at the
    end was counted once (the trims are told from late members by the set's lowest member)."""
    monkeypatch.setattr(bull_module, "MAX_NEW", 7)
    monkeypatch.setattr(bull_module, "CHUNK", 3)
    counted, written = _run_steps(redis_client, redis_url, steps, keep)
    kept = {member.decode() for member in redis_client.zrange(COMPLETED, 0, -1)}
    assert max(counted.values(), default=1) == 1, counted
    assert set(counted) <= set(written)
    assert kept <= set(counted), kept - set(counted)
