"""The finished-rows reader (exporter/sources/readers/finished_rows.py) pages exactly when many
rows share a completion time: the pgboss preset's reader on pg-boss 12's own schema (made by
PgBoss.start(), its job_i16 index and (name, id) primary key), rows written by SQL as one
complete() of many ids writes them (one completed_on), read page by page with a small max_rows.
The truth is a count taken straight from the job table."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from exporter.config import presets
from exporter.sources.postgres.config import PostgresSourceConfig
from exporter.sources.postgres.finished_config import FinishedRowsConfig
from exporter.sources.postgres.source import PostgresConnector
from exporter.sources.readers.finished_rows import FinishedRowsReader
from exporter.sources.readers.framework import ReadDeadline, ReaderError, Signals
from tests.config.test_preset_pgboss import PgBoss
from tests.conftest import wait_for

MAX_ROWS = 100
# What the test writes, in completion order: 30 emails jobs a millisecond apart, then a run of
# 170 emails and 170 reports jobs sharing one completed_on (the same 170 ids in both queues: the
# key is (name, id)), then 5 idle ones a millisecond later. The first page (100 rows) ends inside
# the run, 70 rows into it; the run alone is more than a page, in either queue.
APART, RUN, AFTER = 30, 170, 5
TOTAL = APART + 2 * RUN + AFTER

_INSERT = """
INSERT INTO pgboss.job (id, name, data, state, start_after, started_on, completed_on)
SELECT md5(%(ids)s || n::text)::uuid, %(queue)s, jsonb_build_object('batch', %(batch)s::text),
       (CASE WHEN n %% 7 = 0 THEN 'failed' ELSE 'completed' END)::pgboss.job_state,
       %(at)s - interval '3 seconds', %(at)s - interval '2 seconds',
       %(at)s + %(step)s * (n - %(count)s - 1) * interval '1 millisecond'
FROM generate_series(1, %(count)s) AS n
"""


@pytest.fixture
def database(postgres_dsn: str, tmp_path: Path) -> Iterator[PostgresConnector]:
    """pg-boss 12's schema and queues (its seed: no job completed or failed), and the pool."""
    PgBoss(12, postgres_dsn, tmp_path).seed()
    connector = PostgresConnector(PostgresSourceConfig(dsn=postgres_dsn))
    connector.acquire()
    yield connector
    connector.release()


def _reader(connector: PostgresConnector) -> FinishedRowsReader:
    finished = presets.expand("pgboss", {"native": True})["sources"]["postgres"]["finished"][0]
    config = FinishedRowsConfig.model_validate({**finished, "max_rows": MAX_ROWS})
    return FinishedRowsReader(config, connector, timeout=30)


def _write(dsn: str, batch: str) -> None:
    """The rows above, the run 0.9 s before now (past a baseline taken before: that one is older
    than a second); then waits until all are past the reader's one-second settling."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        row = connection.execute("SELECT clock_timestamp() - interval '0.9 seconds'").fetchone()
        assert row is not None
        at: datetime = row[0]
        for ids, queue, count, step, when in (
            ("apart", "emails", APART, 1, at),  # 30 ms to 1 ms before the run
            ("run", "emails", RUN, 0, at),
            ("run", "reports", RUN, 0, at),  # the same ids as in emails
            ("after", "idle", AFTER, 0, at + timedelta(milliseconds=1)),
        ):
            parameters = {"ids": batch + ids, "queue": queue, "count": count, "step": step}
            connection.execute(_INSERT, {**parameters, "batch": batch, "at": when})
        wait_for(
            lambda: (
                connection.execute(
                    "SELECT max(completed_on) < now() - interval '1 second' FROM pgboss.job"
                ).fetchone()
                == (True,)
            )
        )


def _truth(dsn: str, batch: str) -> Counter[tuple[str, str]]:
    """(queue, state) of the batch's finished rows, counted by SQL."""
    with psycopg.connect(dsn) as connection:
        rows = connection.execute(
            "SELECT name, state::text, count(*) FROM pgboss.job "
            "WHERE state IN ('completed', 'failed') AND data->>'batch' = %s GROUP BY 1, 2",
            (batch,),
        ).fetchall()
    return Counter({(queue, state): count for queue, state, count in rows})


def _read(reader: FinishedRowsReader, reads: int) -> tuple[Counter[tuple[str, str]], list[int]]:
    """`reads` reads: what they counted by (queue, outcome), and how many rows each counted."""
    counted: Counter[tuple[str, str]] = Counter()
    sizes = []
    for _ in range(reads):
        signals = Signals(source=reader.name)
        reader.read(signals)
        assert not signals.tally.invalid, signals.tally.invalid
        size = 0
        for (metric, labels), number in signals.tally.counts.items():
            outcome = metric.removeprefix("queue_jobs_").removesuffix("_total")
            counted[labels[1], outcome] += int(number)
            size += int(number)
        for histogram in ("queue_job_execution_seconds", "queue_job_wait_seconds"):
            observed = signals.tally.observations.items()
            timed = sum(len(values) for (name, _), values in observed if name == histogram)
            assert timed == size, (histogram, timed, size)
        sizes.append(size)
    return counted, sizes


def test_jobs_sharing_a_completed_on_are_each_counted_once_page_by_page(
    database: PostgresConnector, postgres_dsn: str
) -> None:
    """More rows at one completed_on than a read takes, and pages ending inside such runs:
    each row counted once (the old read resumed past the time: 105 of the 375 counted)."""
    reader = _reader(database)
    assert _read(reader, 1) == (Counter(), [0])  # the baseline
    _write(postgres_dsn, "a")
    truth = _truth(postgres_dsn, "a")
    assert sum(truth.values()) == TOTAL and truth["reports", "failed"] == RUN // 7, truth

    counted, sizes = _read(reader, 6)
    assert counted == truth
    # Each read at most max_rows; the backlog drained over the next reads, nothing read twice.
    assert sizes == [MAX_ROWS, MAX_ROWS, MAX_ROWS, TOTAL - 3 * MAX_ROWS, 0, 0], sizes


def test_a_new_reader_counts_from_its_baseline_each_later_job_once(
    database: PostgresConnector, postgres_dsn: str
) -> None:
    """A restart, or another replica leading (framework.Terms): the new reader's baseline takes
    every row finished by then as counted, and pages the later ones as exactly."""
    _write(postgres_dsn, "before")
    reader = _reader(database)
    assert _read(reader, 1) == (Counter(), [0])  # the baseline, past the rows before
    _write(postgres_dsn, "after")
    counted, sizes = _read(reader, 6)
    assert counted == _truth(postgres_dsn, "after")
    assert sum(sizes) == TOTAL and max(sizes) == MAX_ROWS, sizes


def test_a_read_goes_through_job_i16_whatever_the_position(
    database: PostgresConnector, postgres_dsn: str
) -> None:
    """100k finished rows in runs of 1000 sharing a completed_on (as complete() of 1000 ids
    writes them), a position inside the last runs: the read bounds completed_on by job_i16
    (name, completed_on) and sorts by id within it, rather than take every row of the queue
    past the id through the primary key (name, id), as the planner did for `completed_on > t OR
    (name, id) > (n, i)`: on 300k such rows, 200 ms a read instead of 3."""
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute(
            "INSERT INTO pgboss.job (name, state, start_after, started_on, completed_on) "
            "SELECT (ARRAY['emails', 'reports', 'slow', 'idle'])[1 + n % 4], "
            "'completed', now() - interval '2 hours', now() - interval '2 hours', "
            "now() - interval '1 hour' + (n / 1000) * interval '1 millisecond' "
            "FROM generate_series(1, 100000) AS n"
        )
        connection.execute("ANALYZE pgboss.job")
        row = connection.execute(
            "SELECT (EXTRACT(EPOCH FROM completed_on) * 1000000)::bigint, name, id "
            "FROM pgboss.job WHERE completed_on IS NOT NULL "
            "ORDER BY completed_on DESC, name DESC, id DESC OFFSET 200 LIMIT 1"
        ).fetchone()
        assert row is not None
        query = _reader(database).config.query.replace("{after}", str(row[0]))
        query = query.replace("{after_name}", f"'{row[1]}'").replace("{after_id}", f"'{row[2]}'")
        query = query.replace("{limit}", str(MAX_ROWS))
        plan = "\n".join(line for (line,) in connection.execute(f"EXPLAIN {query}"))
    assert "Seq Scan on j" not in plan, plan
    assert "job_common_i16" in plan and "pkey" not in plan, plan


@dataclass(frozen=True, slots=True)
class _PassesAfter(ReadDeadline):
    """A read's deadline that passes once `records` rows were counted (a read that spent its
    budget on CPU partway through a page: Signals.record stops it between two rows)."""

    records: int = 0
    checks: list[int] = field(default_factory=lambda: [0])

    def passed(self) -> bool:
        self.checks[0] += 1
        return self.checks[0] > self.records


def test_a_read_stopped_partway_through_a_page_loses_none_of_it(
    database: PostgresConnector, postgres_dsn: str
) -> None:
    """A read stopped at its deadline after 50 of its 100 rows applies nothing, and the position
    stays where it was: the next reads count all 375 rows once (before, the position moved
    row by row, so the 50 counted rows of the stopped read were never counted: 325 of 375)."""
    reader = _reader(database)
    assert _read(reader, 1) == (Counter(), [0])  # the baseline
    _write(postgres_dsn, "stopped")
    with pytest.raises(ReaderError, match="deadline"):
        reader.read(Signals(source=reader.name, deadline=_PassesAfter(records=50)))
    counted, sizes = _read(reader, 6)
    assert counted == _truth(postgres_dsn, "stopped")
    assert sizes == [MAX_ROWS, MAX_ROWS, MAX_ROWS, TOTAL - 3 * MAX_ROWS, 0, 0], sizes
