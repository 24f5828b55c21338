"""The PostgreSQL source: SQL collectors run on their own intervals over one small pool.

Each collector is a Source of its own (postgres:<name>), so a slow or failing query takes
down only its own series. Every run borrows a pooled connection, runs the query in a
read-only transaction with the collector's statement timeout, and ends the transaction
before the connection goes back: nothing is written and nothing is held open between runs.

The pool opens on the first run without waiting for the database, so an exporter whose
database is down still starts; the pool reconnects in the background and the collectors
recover on their own.

Deadlines are kept on the client's side too, because `statement_timeout` is enforced by the
server and a hung server enforces nothing: connecting is bounded by `connect_timeout` (psycopg
enforces it itself), waiting for a pooled connection by the pool's timeout, and a run as a
whole by `connect_timeout` plus its statement timeout (the runner's deadline, sources/runner.py). When
that passes, the socket of the connection the run is blocked on is shut down under it.
`cancel()` would need the hung server to act, and TCP keepalives or `tcp_user_timeout` never
fire while the server's kernel still acknowledges (tests/sources/test_deadlines.py freezes a proxy).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator
from itertools import islice
from typing import Any, TypeVar, cast

import psycopg
from psycopg import errors
from psycopg_pool import ConnectionPool, PoolTimeout

from exporter.core.logs import LogLimiter
from exporter.sources.postgres.collectors import (
    CollectorRefused,
    QueryShapeError,
    RowConverter,
    SqlCollector,
)
from exporter.sources.postgres.config import PostgresSourceConfig
from exporter.sources.source import SourceReport

Columns = tuple[tuple[str, int], ...]
log = logging.getLogger(__name__)


class _ClosedConnectionReturned(logging.Filter):
    """psycopg's pool warns when a closed connection comes back to it. Here that is one this
    module severed (a read past its deadline, a shutdown: sever()) or one whose read failed,
    and the source reports each with its reason: the pool's line would say it again, as a
    WARNING with no source, even for a clean shutdown."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("discarding closed connection")


logging.getLogger("psycopg.pool").addFilter(_ClosedConnectionReturned())
_limited = LogLimiter(log)
_T = TypeVar("_T")


class DatabaseUnavailable(Exception):
    """No connection within connect_timeout; __cause__ is the last connect error, if any."""


# Seconds closing the pool waits for its connecting threads (daemons, bounded by
# connect_timeout): shutdown must not wait out a connect to a hung server.
POOL_CLOSE_WAIT = 0.5


class PostgresConnector:
    """The one pool the collectors share, opened on first use and closed with the last user."""

    def __init__(self, config: PostgresSourceConfig) -> None:
        self.config = config
        self.last_connect_error: psycopg.Error | None = None
        self._lock = threading.Lock()
        self._opened = False
        self._users = 0
        # The connection each thread is using, from the pool's check until it goes back:
        # what sever() shuts down when that thread's run passes its deadline.
        self._in_use: dict[int, psycopg.Connection[Any]] = {}
        self.pool: ConnectionPool[Any] = ConnectionPool(
            self._conninfo,
            kwargs=self._connect_kwargs,
            connection_class=_recording_connection_class(self),
            min_size=1,
            max_size=config.pool_size,
            open=False,
            configure=_read_only,
            check=self._check,
            name="queue-exporter",
            timeout=config.connect_timeout,
        )

    def acquire(self) -> None:
        with self._lock:
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users > 0 or not self._opened:
                return
            self._opened = False
        self.pool.close(timeout=POOL_CLOSE_WAIT)

    def sever(self, thread_id: int) -> None:
        """From another thread: fail the call that thread is blocked in on its connection."""
        with self._lock:  # held, so the connection cannot go back to the pool meanwhile
            connection = self._in_use.get(thread_id)
            if connection is None or connection.closed:
                return
            with contextlib.suppress(psycopg.OperationalError):  # raised when already lost
                _shut_down_socket(connection.pgconn.socket)

    def fetch(
        self, query: str, timeout: float, max_rows: int = 1_000_000
    ) -> tuple[list[tuple[Any, ...]], Columns, bool]:
        """Run `query` read-only within `timeout` seconds: at most `max_rows` of its rows, its
        (name, type OID) columns, and whether it had more rows than that."""
        self._open()
        # JIT off: it compiles by the plan's estimated cost, and a preset's query whose costly
        # branch a one-time filter skips (pgboss on pg-boss 10) paid ~200 ms of compilation
        # for a 1 ms read; these queries are short and run every cycle.
        set_timeout = (
            "SELECT set_config('statement_timeout', '"
            f"{max(1, round(timeout * 1000))}', true), set_config('jit', 'off', true)"
        )
        with self._borrowed() as connection:
            rows, columns = _read(connection, set_timeout, query, max_rows + 1)
        return rows[:max_rows], columns, len(rows) > max_rows

    def fetch_text(self, query: str, column: str, timeout: float, owner: str) -> str | None:
        """The text in `column` of `query`'s first row (None: no row, or NULL): the one-row
        checks a preset's query is guarded by (`refuse_when`, `unavailable_when`). A query
        without that column is a QueryShapeError naming `owner`."""
        rows, columns, _ = self.fetch(query, timeout, 1)
        names = [name for name, _ in columns]
        if column not in names:
            raise QueryShapeError(
                f"{owner} returns no column '{column}' (it returns {', '.join(names) or 'nothing'})"
            )
        found = rows[0][names.index(column)] if rows else None
        return None if found is None else str(found)

    def check_answering(self) -> None:
        """Borrow a connection and give it back: the pool checks it with a round trip, so this
        fails as fetch() would while the server does not answer (severable likewise)."""
        self._open()
        with self._borrowed():
            pass

    @contextlib.contextmanager
    def _borrowed(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection of the pool, checked, lent to this thread (sever() reaches it)."""
        try:
            with self.pool.connection(timeout=self.config.connect_timeout) as connection:
                self._lend(connection)
                try:
                    yield connection
                finally:
                    self._give_back(connection)
        except PoolTimeout as error:
            cause = self.last_connect_error
            detail = f": {_first_line(cause)}" if cause is not None else ""
            message = f"no connection within {self.config.connect_timeout:g}s{detail}"
            raise DatabaseUnavailable(message) from (cause or error)

    def _check(self, connection: psycopg.Connection[Any]) -> None:
        """The pool's check before it lends a connection: a round trip, so severable too."""
        self._lend(connection)
        try:
            ConnectionPool.check_connection(connection)
        except BaseException:
            self._give_back(connection)  # the pool closes it: sever() must not reach its fd
            raise

    def _lend(self, connection: psycopg.Connection[Any]) -> None:
        with self._lock:
            self._in_use[threading.get_ident()] = connection

    def _give_back(self, connection: psycopg.Connection[Any]) -> None:
        with self._lock:
            if self._in_use.get(threading.get_ident()) is connection:
                del self._in_use[threading.get_ident()]

    # Secrets are read from their files at each connect, so a rotated password is picked up.
    def _conninfo(self) -> str:
        return self._recorded(self.config.conninfo)

    def _connect_kwargs(self) -> dict[str, Any]:
        return self._recorded(self.config.connect_kwargs)

    def _recorded(self, read: Callable[[], _T]) -> _T:
        try:
            return read()
        except psycopg.Error as error:
            self.last_connect_error = error
            raise

    def _open(self) -> None:
        with self._lock:
            if self._opened:
                return
            self._opened = True
        self.pool.open(wait=False)  # a database that is down must not block the start


# Rows the server sends at a time: a result of a million rows is never held whole (libpq 17+
# sends chunks; an older libpq a row at a time).
STREAM_CHUNK = 2_000 if psycopg.pq.version() >= 170000 else 1
_NO_ROWS = "the query returns no rows (is it a SELECT?)"


def _read(
    connection: psycopg.Connection[Any], set_timeout: str, query: str, max_rows: int
) -> tuple[list[tuple[Any, ...]], Columns]:
    """At most `max_rows` rows, streamed: what lies beyond is cancelled, never fetched."""
    with connection.cursor(binary=True) as cursor:
        # Binary results: numbers arrive without text parsing (~10% of a fetch).
        cursor.execute(set_timeout)
        stream = cast(Generator[tuple[Any, ...]], cursor.stream(query, size=STREAM_CHUNK))
        try:
            rows = list(islice(stream, max_rows))
        except psycopg.ProgrammingError as error:
            if type(error) is psycopg.ProgrammingError:  # a statement without rows (SET, ...)
                raise QueryShapeError(_NO_ROWS) from error
            raise  # the server's error (UndefinedTable, InsufficientPrivilege, ...)
        finally:
            stream.close()  # stopped early: the query is cancelled and the rest drained
        if cursor.description is None and not rows:
            # A stream that yields no row leaves no description: run it again, unstreamed
            # (an empty result: cheap to hold), for its columns.
            cursor.execute(query)
            rows = cursor.fetchmany(max_rows)
        if cursor.description is None:
            raise QueryShapeError(_NO_ROWS)
        columns = tuple((column.name, column.type_code) for column in cursor.description)
    return rows, columns


def _shut_down_socket(fd: int) -> None:
    """Shut a socket down under the thread blocked on it: its wait ends with an error at once."""
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as sock:
        sock.shutdown(socket.SHUT_RDWR)


def _read_only(connection: psycopg.Connection[Any]) -> None:
    connection.read_only = True  # every transaction starts with BEGIN READ ONLY


def _recording_connection_class(connector: PostgresConnector) -> type[psycopg.Connection[Any]]:
    """The pool connects in its own threads and reports only a timeout: keep the real error."""

    class RecordingConnection(psycopg.Connection[Any]):
        @classmethod
        def connect(cls, *args: Any, **kwargs: Any) -> RecordingConnection:
            try:
                connection = super().connect(*args, **kwargs)
            except psycopg.Error as error:
                connector.last_connect_error = error
                raise
            connector.last_connect_error = None
            return connection

    return RecordingConnection


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0].strip() if text else type(error).__name__


class PostgresCollectorSource:
    """One SQL collector as a Source: postgres:<collector>.

    It is sampled every `interval` seconds and runs its query every `read_interval` (the
    same, unless the collector reads less often than every cycle: a costly query). Between two
    reads it serves the last read's rows again, its ages (SqlValue.age) grown by the time
    since, so an age moves on as the clock does instead of standing still for a whole read
    interval; and only while the database answers (a round trip each cycle), so a database
    that stops answering withdraws them within a cycle, as it does every other collector's,
    instead of leaving a read's numbers served as current for the rest of its interval. A
    failed read withdraws them all, as any failure does.
    """

    def __init__(
        self,
        collector: SqlCollector,
        connector: PostgresConnector,
        interval: float,
        statement_timeout: float,
        read_interval: float | None = None,
    ) -> None:
        self.name = f"postgres:{collector.name}"
        self.interval = interval
        self.read_interval = read_interval or interval
        # (monotonic time of the read, its rows, its columns): what is served until the next
        self._last_read: tuple[float, list[tuple[Any, ...]], Columns] | None = None
        self._last_failure: tuple[float, Exception] | None = None  # when and what, likewise
        self.collector = collector
        self.statement_timeout = statement_timeout
        # Waiting for a connection, then the query: past both, the server is not answering.
        self.deadline = connector.config.connect_timeout + statement_timeout
        self._connector = connector
        self._converter: tuple[Columns, RowConverter] | None = None
        self._sampling_thread: int | None = None
        # refuse_when runs before the first read and after a failed one (an upgrade of the
        # schema under a running exporter is named too), never on the hot path in between
        self._check_due = collector.refuse_when is not None
        self.last_rows: int | None = None  # rows the last sample read (check-config --connect)
        self.reads: str | None = None  # how it reads, when not every cycle (reads_every)
        connector.acquire()

    def reads_every(self, cycle: float) -> None:
        """Say how the collector reads if that is less often than every `cycle` seconds
        (check-config prints it; each report carries it to the status page)."""
        self.reads = self.collector.reads_note(cycle)

    def sample(self) -> SourceReport:
        last, failed = self._last_read, self._last_failure
        now = time.monotonic()
        # within half a sampling cycle of the read interval: read now rather than a cycle late
        if last is not None and now - last[0] + self.interval / 2 < self.read_interval:
            self._sampling_thread = threading.get_ident()  # severable at the deadline
            self._connector.check_answering()
            report = SourceReport(reads=self.reads)
            self._converter_for(last[2]).convert(last[1], report.samples, since_read=now - last[0])
            return report
        if failed is not None and now - failed[0] + self.interval / 2 < self.read_interval:
            # a failed costly read is tried again on its own interval, not every cycle; it
            # stays failed (series withdrawn, the error counted) until then
            raise failed[1].with_traceback(None)
        self._last_read = self._last_failure = None
        try:
            return self._read()
        except Exception as error:
            if self.read_interval > self.interval:
                self._last_failure = (now, error)
            raise

    def _read(self) -> SourceReport:
        self._sampling_thread = threading.get_ident()
        collector = self.collector
        if self._check_due and collector.refuse_when is not None:
            self._refuse_unless_it_applies(collector.refuse_when)
        try:
            rows, columns, more = self._connector.fetch(
                collector.query, self.statement_timeout, collector.max_rows
            )
        except Exception:
            self._check_due = collector.refuse_when is not None
            raise
        self.last_rows = len(rows)
        if self.read_interval > self.interval:
            # timed from the end of the read, after the query's now(): an age grown from here
            # is behind the clock by the query's time at most, never ahead of it
            self._last_read = (time.monotonic(), rows, columns)
        report = SourceReport(reads=self.reads)
        if more:  # counted once per run, whatever the number of rows beyond
            report.count_error("too_many_rows")
            _limited.warning(
                self.name,
                "%s: the query returns more than max_rows (%d) rows: the rest is not read",
                self.name,
                collector.max_rows,
            )
        nulls, refused = self._converter_for(columns).convert(rows, report.samples)
        if nulls:
            report.count_error("null_value", nulls)
        if refused:
            report.count_error("bad_number", refused)
        return report

    def error_reason(self, error: Exception) -> str:
        return error_reason(error)

    def _refuse_unless_it_applies(self, check: str) -> None:
        """Raise CollectorRefused with the text `check`'s `refusal` column holds, if any."""
        owner = f"collector {self.collector.name}: refuse_when"
        refusal = self._connector.fetch_text(check, "refusal", self.statement_timeout, owner)
        if refusal is not None:
            raise CollectorRefused(refusal)
        self._check_due = False

    def interrupt(self) -> None:
        if self._sampling_thread is not None:
            self._connector.sever(self._sampling_thread)

    def close(self) -> None:
        self._connector.release()

    def _converter_for(self, columns: Columns) -> RowConverter:
        if self._converter is None or self._converter[0] != columns:
            self._converter = (columns, RowConverter(self.collector, columns))
        return self._converter[1]


_REASONS: tuple[tuple[type[Exception] | tuple[type[Exception], ...], str], ...] = (
    (CollectorRefused, "refused"),
    (QueryShapeError, "query_shape"),
    (errors.QueryCanceled, "timeout"),
    (errors.InsufficientPrivilege, "permission"),
    (errors.ReadOnlySqlTransaction, "read_only"),
    ((errors.UndefinedTable, errors.InvalidSchemaName), "missing_table"),
    (errors.UndefinedColumn, "missing_column"),
    ((errors.InvalidAuthorizationSpecification, errors.InvalidPassword), "auth"),
    (psycopg.OperationalError, "connection"),
    (psycopg.Error, "sql_error"),
)
_AUTH_FAILURE = re.compile(r"authentication failed|pg_hba\.conf|role .* does not exist")


def is_auth_failure(error: BaseException) -> bool:
    """The server refused who connects (password, pg_hba.conf, role), not the connection."""
    return _AUTH_FAILURE.search(str(error)) is not None


def error_reason(error: Exception) -> str:
    """A short, bounded reason for queue_exporter_source_errors_total."""
    if isinstance(error, DatabaseUnavailable):
        cause = error.__cause__
        if cause is not None and is_auth_failure(cause):
            return "auth"
        return "connection"
    for kinds, reason in _REASONS:
        if isinstance(error, kinds):
            return reason
    return "other"


def build_sources(
    config: PostgresSourceConfig,
    default_interval: float,
    connector: PostgresConnector | None = None,
) -> list[PostgresCollectorSource]:
    """A source per collector, on `connector`'s pool (default: a pool of their own)."""
    connector = connector or PostgresConnector(config)
    interval = config.sample_interval or default_interval
    sources = [
        PostgresCollectorSource(
            collector,
            connector,
            sampled_every(collector, interval),
            collector.timeout or config.statement_timeout,
            read_interval=collector.interval or interval,
        )
        for collector in config.collectors
    ]
    for source in sources:
        source.reads_every(interval)
    return sources


def sampled_every(collector: SqlCollector, interval: float) -> float:
    """Seconds between the collector's samples: every cycle (`interval`), also when it reads
    less often, so that its ages move on and an outage withdraws its series between reads;
    its own interval when that is shorter."""
    return min(collector.interval or interval, interval)
