"""The reader of rows a PostgreSQL job queue writes as jobs finish (sources/postgres/finished_config.py).

Each read runs the preset's query for the rows past the last position counted (read-only,
under the statement timeout and the exporter's deadline, on the SQL collectors' pool) and turns
them into queue_jobs_completed_total / queue_jobs_failed_total / queue_jobs_retried_total and the
execution and wait histograms. The first read of a new reader only takes the baseline: with
leader election a replica that leads again after another one led gets a new reader
(framework.Terms), so no job is counted twice; jobs that finished while no exporter ran (a
restart) are not counted.

The position is the `cursor` column, and where `cursor` alone does not tell two rows apart (a
completion time many jobs share: one transaction finishing a batch) the `cursor_<name>` columns
after it, which the query receives as `{after_<name>}`: it pages by the whole tuple (keyset
pagination, e.g. `(completed_on, name, id) > (...)`), so a page that ends within a run of equal
times resumes inside it, not past it. The next read starts after the last row of the page as the
query ordered it (SQL's order, e.g. a text column's collation, not Python's); `cursor` never
moves back. A baseline without `cursor_<name>` columns leaves them NULL, which the query must
read as "every row at `cursor` counted" (a row comparison with NULL is not true).

A row it cannot read (an unknown outcome, a NULL queue, a negative execution time) costs that
row alone (framework.Signals.record), named with the preset's table and the column at fault; a
negative wait counts as 0 s (`_wait`).
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

from psycopg import sql

from exporter.core import numbers
from exporter.lifecycle.metrics import EventMetrics
from exporter.lifecycle.wire import ERROR_TYPES
from exporter.sources.postgres.collectors import QueryShapeError
from exporter.sources.postgres.config import PostgresSourceConfig
from exporter.sources.postgres.finished_config import OUTCOMES, FinishedRowsConfig
from exporter.sources.postgres.source import PostgresConnector, error_reason
from exporter.sources.readers.framework import NativeSource, Progress, ReaderError, Signals

REQUIRED = ("cursor", "queue", "job_type", "outcome")
OPTIONAL = ("execution_seconds", "wait_seconds", "error_type")


class RowError(ValueError):
    """A finished row that cannot be counted: names the table and the column at fault."""


class FinishedRowsReader:
    def __init__(self, config: FinishedRowsConfig, connector: PostgresConnector, timeout: float):
        self.name = f"native:{config.name}"
        self.config = config
        self._connector = connector
        self._timeout = timeout
        self._ties = config.tie_columns()  # cursor_<name> columns, in the query's order
        # The last position counted: {after: cursor, after_<name>: cursor_<name>}; None until
        # the baseline. It moves once the whole read succeeded (framework.Progress): a read
        # stopped between two rows (its deadline) counts them all at the next read.
        self._after: Progress[dict[str, Any]] = Progress()
        self._thread: int | None = None

    def read(self, signals: Signals) -> None:
        self._collect(signals)
        signals.move_on()

    def _collect(self, signals: Signals) -> None:
        self._thread = threading.get_ident()
        last = self._after.at
        if last is None:
            self._after.move(signals, self._baseline())
            return
        after = {name: sql.Literal(value) for name, value in last.items()}
        query = sql.SQL(self.config.query).format(**after, limit=sql.Literal(self.config.max_rows))
        rows, columns, _ = self._connector.fetch(
            query.as_string(None), self._timeout, self.config.max_rows
        )
        index = self._columns(columns)
        for row in rows:
            position = row[index["cursor"]]
            with signals.record(f"{self.config.table} row {position}"):
                self._count(signals, row, index)
            if position is not None and position >= last["after"]:
                last = self._position(row, index)
        self._after.move(signals, last)

    def _baseline(self) -> dict[str, Any]:
        rows, columns, _ = self._connector.fetch(self.config.baseline, self._timeout, 1)
        if not rows or rows[0][0] is None:  # no finished row yet
            return {"after": 0, **{f"after_{tie}": None for tie in self._ties}}
        index = {name: position for position, (name, _) in enumerate(columns)}
        index["cursor"] = 0  # the baseline's first column, whatever its name
        return self._position(rows[0], index)

    def _position(self, row: Sequence[Any], index: dict[str, int]) -> dict[str, Any]:
        def at(name: str) -> Any:
            return row[index[name]] if name in index else None

        return {
            "after": at("cursor"),
            **{f"after_{tie}": at(f"cursor_{tie}") for tie in self._ties},
        }

    def _columns(self, columns: Sequence[tuple[str, int]]) -> dict[str, int]:
        index = {name: position for position, (name, _) in enumerate(columns)}
        required = (*REQUIRED, *(f"cursor_{tie}" for tie in self._ties))
        missing = [name for name in required if name not in index]
        if missing:
            raise QueryShapeError(
                f"{self.name} ({self.config.table}): the query returns no column "
                f"{', '.join(missing)}"
            )
        return index

    def _count(self, signals: Signals, row: Sequence[Any], index: dict[str, int]) -> None:
        def column(name: str) -> Any:
            return row[index[name]] if name in index else None

        queue, job_type, outcome = column("queue"), column("job_type"), column("outcome")
        if not isinstance(queue, str) or not isinstance(job_type, str):
            raise RowError(f"{self.config.table}: queue/job_type is not a text: {queue!r}")
        if outcome not in OUTCOMES:
            raise RowError(f"{self.config.table}: column outcome is {str(outcome)[:50]!r}")
        labels = (self.config.system, queue, job_type, "")
        tally = signals.tally
        execution = self._seconds(column("execution_seconds"), "execution_seconds")
        wait = self._wait(column("wait_seconds"))
        if outcome == "enqueued":
            tally.count("queue_jobs_enqueued_total", labels)
        elif outcome == "completed":
            tally.count("queue_jobs_completed_total", labels)
        else:
            error_type = column("error_type") or ("retryable" if outcome == "retried" else "other")
            if error_type not in ERROR_TYPES:
                error_type = "other"
            tally.count("queue_jobs_failed_total", (*labels, error_type))
            if outcome == "retried":
                tally.count("queue_jobs_retried_total", labels)
        if execution is not None:
            tally.observe("queue_job_execution_seconds", labels, execution)
        if wait is not None:
            tally.observe("queue_job_wait_seconds", labels, wait)

    def _wait(self, value: Any) -> float | None:
        """A wait compares times no one clock orders: a worker's (a retry's `scheduled_at`)
        with the database's, or two transactions' start times (`now()`: the one that
        committed first may have begun later). A negative one counts as 0 s, as a v1 event's
        wait does (exporter/lifecycle/metrics.py); an execution time, one transaction's start to
        a later one's, is refused when negative, as anything not a finite number is."""
        if isinstance(value, float | int) and math.isfinite(value) and value < 0:
            return 0.0
        return self._seconds(value, "wait_seconds")

    def _seconds(self, value: Any, name: str) -> float | None:
        if value is None:
            return None
        try:
            return numbers.seconds(value)
        except numbers.InvalidValue as error:
            raise numbers.InvalidValue(
                error.reason, f"{self.config.table}: column {name} is {numbers.shown(value)}"
            ) from None

    def interrupt(self) -> None:
        if self._thread is not None:
            self._connector.sever(self._thread)

    def close(self) -> None:
        """Nothing of its own: the pool belongs to the source (FinishedRowsSource)."""


class CheckedReader:
    """A reader behind its config's unavailable_when: while the statement names why this
    version of the system cannot give its finished rows cheaply (pg-boss 10: no index on
    completed_on), nothing is read and the reader is silent, saying why; once it names nothing,
    the reader reads, and the statement runs again only after a failed read."""

    def __init__(
        self, reader: FinishedRowsReader, check: str, connector: PostgresConnector, timeout: float
    ) -> None:
        self.name = reader.name
        self._reader = reader
        self._check = check
        self._connector = connector
        self._timeout = timeout
        self._available = False

    def read(self, signals: Signals) -> None:
        if not self._available:
            why = self._unavailable()
            if why is not None:
                signals.silent = why
                return
            self._available = True
        try:
            self._reader.read(signals)
        except Exception:
            self._available = False
            raise

    def _unavailable(self) -> str | None:
        owner = f"{self.name}: unavailable_when"
        return self._connector.fetch_text(self._check, "unavailable", self._timeout, owner)

    def interrupt(self) -> None:
        self._reader.interrupt()

    def close(self) -> None:
        self._reader.close()


class FinishedRowsSource(NativeSource):
    """A FinishedRowsReader as a source: the pool is held while the source lives (a reader is
    rebuilt when another replica led in between, the pool is not), and PostgreSQL's errors get their
    reasons."""

    def __init__(
        self,
        config: FinishedRowsConfig,
        connector: PostgresConnector,
        timeout: float,
        interval: float,
        metrics: EventMetrics,
        term: Callable[[], int | None] | None = None,
    ) -> None:
        connector.acquire()
        self._connector = connector
        make_reader = functools.partial(_reader, config, connector, timeout)
        super().__init__(make_reader, interval, metrics, term=term)
        # Waiting for a connection, then the query: past both, the server is not answering.
        self.deadline = connector.config.connect_timeout + timeout

    def error_reason(self, error: Exception) -> str:
        if isinstance(error, ReaderError):
            return error.reason
        return error_reason(error)

    def close(self) -> None:
        super().close()
        self._connector.release()


def _reader(
    config: FinishedRowsConfig, connector: PostgresConnector, timeout: float
) -> FinishedRowsReader | CheckedReader:
    reader = FinishedRowsReader(config, connector, timeout)
    if config.unavailable_when is None:
        return reader
    return CheckedReader(reader, config.unavailable_when, connector, timeout)


def build_sources(
    config: PostgresSourceConfig,
    connector: PostgresConnector,
    metrics: EventMetrics,
    default_interval: float,
    term: Callable[[], int | None] | None = None,
) -> list[FinishedRowsSource]:
    """A source per enabled reader; `term` as for NativeSource (Leadership.token)."""
    interval = config.sample_interval or default_interval
    return [
        FinishedRowsSource(
            reader,
            connector,
            reader.timeout or config.statement_timeout,
            reader.interval or interval,
            metrics,
            term,
        )
        for reader in config.finished
        if reader.enabled
    ]
