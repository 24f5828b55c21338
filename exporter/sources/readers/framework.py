"""The pieces every native reader shares: its config base, what one read yields, how it runs.

A native reader reads what a queue system records about its own jobs and workers (RQ's
registries and worker hashes, Celery's event protocol, ...) and turns it into the same
families lifecycle events feed (`queue_jobs_*_total`, `queue_job_*_seconds`, `queue_workers`).
The application is not changed and nothing is written to its data.

How a reader runs: as a `Source` (sources/runner.py) wrapped by `NativeSource`. The
SourceRunner calls `NativeSource.sample()` on the reader's interval, which hands the reader
a fresh `Signals`; the reader fills it in `read()` and raises when its backend cannot be
read. What it filled becomes the cycle's report (sources/source.py `SourceReport`, as every
source's), which the runner applies only when the whole read succeeded:
- `signals.tally` (an lifecycle/metrics.py `Tally`: counter increments, histogram observations,
  worker heartbeats) goes to the shared `EventMetrics`, exactly like a batch of stream events;
- `signals.samples` (a `SampleSet`, e.g. depth of a state no key group can see) is published
  as the source's snapshot, withdrawn while the reader fails.
So a reader never touches telemetry itself, and a failing read counts nothing twice.

A read fails as a whole only when its backend fails (connection, deadline, credentials). A
record it cannot read (a key of another type, a hash of garbage, a number numbers.py refuses,
whatever reading it raises: RecursionError, OverflowError, anything) costs that record alone:
the reader wraps each record in `signals.record(key)` (or hands a pipeline's error reply to
`signals.unreadable`), which counts it in `queue_exporter_events_invalid_total` by a bounded
reason, names it in a rate-limited warning (a traceback only for an error of the exporter's
own, rate-limited too), and lets the read go on. Each record also checks the read's deadline
(ReadDeadline): a read that has spent its deadline on CPU (a flood of records) stops between
two records and fails with reason `timeout`, rather than run on for as long as the flood lasts
(the watchdog cuts sockets, not CPU). The budget is the reading thread's own CPU time, so a
healthy read slowed by a loaded host (waiting for a core or the GIL) is not stopped.
Limits bound what one record may bring (queues of one worker: MAX_QUEUES_PER_WORKER) and
what a reader remembers (workers: MAX_WORKERS); what is beyond them is counted as
`over_limit`, once per record and read. Every listing a read takes from its backend (a SCAN, a
set, a zset's members, the queues it discovers) goes through `Signals.names`: a name longer
than MAX_NAME_BYTES is refused (`oversized_field`) before anything parses it, so no parsing
whose cost grows faster than a name (a split by colons) meets a name of 100,000 colons, and a
listing is taken up to its limit (MAX_KEYS keys of a SCAN, MAX_QUEUES queues, MAX_WORKERS
workers), the rest refused (`over_limit`), each once per listing and read and named in a
rate-limited warning; the read's deadline is checked as the listing is taken. With leader
election it runs, like every sampler, only on the leader (leader/election.py), so replicas do not count
the same job twice; a replica that leads again after another replica led gets a new reader,
whose first read is a baseline (without leader election every replica counts every job). Which
replica led in between, the lease's fencing tokens tell (`Terms`), not the time between two
reads: a read late on a loaded host, or a replica whose lease lapsed with none taking it, still
counts what happened meanwhile.

What a reader remembers between reads (its window over the records, the positions it read
to, the last counts it saw) moves only once its whole read succeeded: the reader proposes the
next state with `Progress.move` (or `CounterDeltas.update`), which `RedisReader.read` applies
after `collect` returned (`Signals.move_on`). A read that fails anywhere (its backend, its
deadline between two records, after its window would have moved) moves nothing, so the next
read reads the same records again and nothing is lost; a read that succeeded never fetches
again what it counted. A first read (no state yet) is a baseline taken at the newest records:
what finished before it is not counted.

A reader that follows a stream of events (Celery) reads what arrived since its last read,
within a deadline, in each `read()`; a reader of records (RQ) compares them with what it saw
in the previous read. Counts a system keeps itself as absolute numbers (per worker, per day)
become increments with `CounterDeltas`, so a worker restart is not a counter reset.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import redis

from exporter.core import numbers
from exporter.core.logs import LogLimiter
from exporter.lifecycle.metrics import EventMetrics, Heartbeat, Tally, WorkerRegistry
from exporter.output.catalog import SOURCE_LABEL
from exporter.output.samples import SampleSet
from exporter.redis.connection import (
    RedisConnectionConfig,
    is_cluster_state_error,
    redis_error_reason,
    sever,
)
from exporter.sources.redis_keys.values import selects
from exporter.sources.source import LifecycleRead, SourceReport

# Workers a reader reported are forgotten after this many of its intervals without a report:
# a worker that left (or a reader that fails) leaves queue_workers within that time.
WORKER_TIMEOUT_INTERVALS = 2.5
MAX_WORKERS = 10_000
# Queues one worker record may list (an RQ worker hash, a Sidekiq process): the rest is refused.
MAX_QUEUES_PER_WORKER = 1_000
# What one read takes from a listing (Signals.names): a key, member or queue name longer than
# this is refused unparsed (queue systems' names are short: SAQ's job keys carry a uuid or a
# caller's key, BullMQ's a job id); keys one SCAN yields; queues one read discovers.
MAX_NAME_BYTES = 1024
MAX_KEYS = 100_000
MAX_QUEUES = 10_000
# Names taken between two looks at the read's deadline (a look is a clock read).
_DEADLINE_EVERY = 256

_T = TypeVar("_T")
_Name = TypeVar("_Name", bound=str | bytes)
_S = TypeVar("_S")

log = logging.getLogger(__name__)
_unreadable_log = LogLimiter(log)
_limit_log = LogLimiter(log)

# Failures of the backend rather than of one record: no record can be read, the read fails.
BACKEND_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,  # AuthenticationError too; a severed connection (deadline, shutdown)
    redis.TimeoutError,
    redis.exceptions.NoPermissionError,  # the ACL misses a rule: every such record would fail
)


@dataclass(frozen=True, slots=True)
class ReadDeadline:
    """When a read stops between two records (Signals.record), failing as `timeout`: once the
    reading thread has spent its budget on CPU since the read began.

    CPU time, not wall time, tells a flood from a loaded host: a read waiting for a core or the
    GIL spends none, so a healthy read is not stopped for the host's load (a stop at the wall
    deadline failed healthy reads on a loaded host), and a read busy on CPU stops at its
    deadline. The wall deadline is the watchdog's (sources/runner.py): past it the read's
    sockets are severed, so a read waiting on its backend fails there. Only a read past its
    budget in wall time (a thread spends no more CPU than that) asks for its CPU time, a system
    call the reads within their deadline do not pay for."""

    wall: float = math.inf  # time.monotonic() at which the budget has passed
    cpu: float = math.inf  # time.thread_time() of the reading thread at which it is spent

    @classmethod
    def starting_now(cls, budget: float) -> ReadDeadline:
        """For a read starting now on the calling thread (the one that reads its records)."""
        return cls(time.monotonic() + budget, time.thread_time() + budget)

    def passed(self) -> bool:
        return time.monotonic() > self.wall and time.thread_time() >= self.cpu


@dataclass(slots=True)
class Signals:
    """What one read yields: lifecycle updates and sampled series."""

    tally: Tally = field(default_factory=Tally)
    samples: SampleSet = field(default_factory=SampleSet)
    now: float = field(default_factory=time.time)
    source: str = "native"  # the reader's source name, for the log
    deadline: ReadDeadline = field(default_factory=ReadDeadline)  # never passes by default
    # Why the reader hears nothing from its system (Celery: no event for its timeout), or may
    # not read one figure (BullMQ: CLIENT LIST refused, no workers), when so: its backend
    # answers, so it stays up and ready, leaves out the series it cannot vouch for, and says
    # this (log, status page, queue_exporter_native_silent).
    silent: str | None = None
    # What it hears but cannot tell while it serves what it can (Celery: tasks whose queue
    # it could not learn): named once in the log and on the status page while it lasts.
    caveat: str | None = None
    # What the reader's state becomes once this read succeeded (Progress.move, CounterDeltas)
    moves: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def on_success(self, move: Callable[[], None]) -> None:
        """Run `move` (a window moving on, a baseline taken) once the whole read succeeded
        (`move_on`): a read that fails after it was asked runs none of its moves."""
        self.moves.append(move)

    def move_on(self) -> None:
        """The read succeeded: its moves take effect, in the order they were asked."""
        moves, self.moves = self.moves, []
        for move in moves:
            move()

    @property
    def latest(self) -> float:
        """The latest time a record may name (numbers.horizon)."""
        return numbers.horizon(self.now)

    def worker(
        self,
        system: str,
        queue: str,
        worker: str,
        active: numbers.Number,
        capacity: numbers.Number | None,
    ) -> None:
        """A worker seen alive in this read (busy when active > 0), serving `queue`; active and
        capacity pass numbers.count (InvalidValue: call it within the worker's record);
        capacity None: the system does not say its slots (no slot series for its queue)."""
        busy = numbers.count(active)
        slots = None if capacity is None else numbers.count(capacity)
        self.tally.heartbeats.append(Heartbeat(system, queue, worker, busy, slots, self.now))

    def workers(
        self,
        system: str,
        queues: list[str],
        worker: str,
        active: numbers.Number,
        capacity: numbers.Number,
        selection: list[str] | None = None,
    ) -> None:
        """The worker serving each of `queues`, at most MAX_QUEUES_PER_WORKER of them (the
        rest refused: over_limit, once for the record); with a selection (the preset's queues
        param), only the queues it keeps."""
        for queue in self.at_most(queues, MAX_QUEUES_PER_WORKER):
            if selection is None or selects(selection, queue):
                self.worker(system, queue, worker, active, capacity)

    def at_most(self, items: list[_T], limit: int, what: str = "records") -> list[_T]:
        """The first `limit` items; more are refused as over_limit, once for them all."""
        if len(items) <= limit:
            return items
        self.refuse_beyond("over_limit", what, f"more than {limit}")
        return items[:limit]

    def names(self, listing: Iterable[_Name], limit: int, what: str) -> Iterator[_Name]:
        """The names of one listing (a SCAN, a set's or a zset's members), as it is taken:
        one longer than MAX_NAME_BYTES is refused before anything parses it (oversized_field),
        and no more than `limit` are taken (the rest refused: over_limit, and the listing, a
        SCAN, is not read further), each once for the listing; `what` names it in the log.
        The read's deadline is checked as the names are taken (a SCAN of millions of keys is
        CPU too)."""
        taken = oversized = 0
        for name in listing:
            if (taken + oversized) % _DEADLINE_EVERY == 0:
                self.check_deadline()
            if len(name) > MAX_NAME_BYTES:
                oversized += 1
                continue
            if taken == limit:
                self.refuse_beyond("over_limit", what, f"more than {limit}")
                break
            taken += 1
            yield name
        if oversized:
            self.refuse_beyond("oversized_field", what, f"{oversized} over {MAX_NAME_BYTES} bytes")

    def refuse_beyond(self, reason: str, what: str, detail: str) -> None:
        """Count what a limit refused, once for a listing or record, and name it (rate-limited)."""
        self.tally.refuse(reason)
        _limit_log.log(
            logging.WARNING,
            (self.source, what, reason),
            "%s: %s: %s refused (%s)",
            self.source,
            what,
            detail,
            reason,
        )

    def check_deadline(self) -> None:
        """Raise ReaderError `timeout` once the read has spent its deadline on CPU."""
        if self.deadline.passed():
            raise ReaderError("timeout", f"{self.source}: read stopped past its deadline")

    @contextmanager
    def record(self, key: str | bytes) -> Iterator[None]:
        """One record's fault boundary: whatever reading it raises costs it alone (counted and
        named); a failure of the backend still fails the whole read, and so does a read past
        its deadline (ReaderError `timeout`, raised before the record is read)."""
        self.check_deadline()
        try:
            yield
        except Exception as error:
            self.unreadable(key, error)

    def unreadable(self, key: str | bytes, error: Exception) -> None:
        """Count and name a record that cannot be read (e.g. a pipeline's error reply); a
        backend failure is raised instead, since then the whole read cannot tell the truth."""
        if isinstance(error, (*BACKEND_ERRORS, ReaderError)) or is_cluster_state_error(error):
            raise error  # a read past its deadline too (record() within record())
        reason = record_reason(error)
        self.tally.refuse(reason)
        name = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
        _unreadable_log.log(
            logging.WARNING,
            (self.source, reason),
            "%s: record %r skipped (%s): %s",
            self.source,
            name[:200],
            reason,
            _described(error),
            exc_info=error if reason == "unprocessable" else None,  # the exporter's own bug
        )


def _described(error: Exception) -> str:
    try:
        text = str(error)
    except Exception:  # a message too long to spell (an integer of 10,000 digits)
        text = "?"
    return f"{type(error).__name__}: {text[:200]}"


def record_reason(error: Exception) -> str:
    """A bounded reason (wire.INVALID_REASONS) for what reading one record raised."""
    if isinstance(error, numbers.InvalidValue):
        return error.reason
    if isinstance(error, redis.ResponseError) and str(error).startswith("WRONGTYPE"):
        return "wrong_type"
    if isinstance(error, OverflowError):
        return "bad_number"
    if isinstance(error, ValueError | TypeError | KeyError | IndexError | RecursionError):
        return "bad_value"  # garbage where the system writes JSON, numbers, times
    return "unprocessable"  # an error of the exporter's own, met by this record


class ReaderError(Exception):
    """A read that cannot tell the truth; `reason` is the error counter's label (bounded)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Reader(Protocol):
    """One system's reader: `read` fills `signals` or raises; nothing is applied on a raise."""

    name: str

    def read(self, signals: Signals) -> None: ...

    def interrupt(self) -> None:
        """From another thread: make the read in progress fail now (redis_connection.sever)."""
        ...

    def close(self) -> None: ...


class Progress(Generic[_S]):
    """Where a reader stands in its system's records (a window, positions, what it saw): `at`,
    None until a first read took its baseline. A read works from `at` without changing it and
    proposes where it got to with `move`, which takes effect only once the read succeeded
    (Signals.move_on): so a read that fails after it asked moves nothing, and the next read
    reads the same records again. `at` is replaced, never changed in place."""

    def __init__(self) -> None:
        self.at: _S | None = None

    @property
    def baseline(self) -> bool:
        """The read to come takes the baseline: nothing was read yet."""
        return self.at is None

    def move(self, signals: Signals, to: _S) -> None:
        def moved() -> None:
            self.at = to

        signals.on_success(moved)


class RedisReader:
    """The Redis client every reader holds: opened at the first read that needs it, severed by
    `interrupt` from another thread (the read in progress fails now), dropped by `close` (the
    next read connects again, so a read that lost its connection starts clean).

    `read` runs the reader's `collect` and, once it returned, the moves it asked for
    (Progress.move, CounterDeltas.update): a reader's state moves only after its whole read."""

    def __init__(self, connection: RedisConnectionConfig) -> None:
        self.connection = connection
        self._client: redis.Redis | None = None

    def read(self, signals: Signals) -> None:
        self.collect(signals)
        signals.move_on()

    def collect(self, signals: Signals) -> None:
        """Fill `signals` from the system's records, asking for the state's moves; raise when
        the backend cannot be read."""
        raise NotImplementedError

    def interrupt(self) -> None:
        sever(self._client)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _connect(self) -> redis.Redis:
        if self._client is None:
            self._client = self.connection.connect()
        return self._client


class Terms:
    """Tells whether another replica led since the previous read (leader/election.py), so that what
    changed in between was counted there and must not be again.

    `term` gives the lease's fencing token this replica holds now (Leadership.token); without
    leader election there is none (one term for the life of the process). Every acquisition of the
    lease takes the next token, so a token one past the previous read's is this replica's own
    next lease (its lease lapsed, none took it: nothing was counted elsewhere), and any other
    change is another replica's lease in between (or a fencing counter lost with its Redis).
    Time tells nothing here: a read late on a loaded host, an outage of the backend or a lapse
    of the lease none took is no gap, and what happened during it is counted at the next read.
    """

    def __init__(self, term: Callable[[], int | None] | None) -> None:
        self._term = term
        self._last: int | None = None

    def another_led(self) -> tuple[int, int] | None:
        """Call at the start of each read: (the previous read's token, this one's) when another
        replica may have led in between, else None."""
        now = self._term() if self._term is not None else None
        if now is None:  # no election (or a lease lapsing now: the runner drops such a read)
            return None
        last, self._last = self._last, now
        if last is None or now in (last, last + 1):
            return None
        return last, now


class NativeSource:
    """Runs a Reader as a Source (sources/runner.py): its interval, error handling, leadership.

    `make_reader` builds the reader, again when another replica led since the previous read
    (`Terms`): this replica must not count what the leader of the meantime counted, and a new
    reader's first read is a baseline.
    """

    def __init__(
        self,
        make_reader: Callable[[], Reader],
        interval: float,
        metrics: EventMetrics,
        redis_source: str | None = None,
        term: Callable[[], int | None] | None = None,  # Leadership.token, with an election
    ) -> None:
        self.make_reader = make_reader
        self.redis_source = redis_source  # with several Redis sources, on every series
        self.reader = make_reader()
        self.name = self.reader.name
        self.interval = interval
        self.deadline = interval  # a read that outlasts its interval is cut off (sources/runner.py)
        # The feed's registry and zero-valued self-metrics, declared once: its reads' updates
        # go to `metrics` through the runner (LifecycleRead)
        self.workers: WorkerRegistry = metrics.worker_registry(
            interval * WORKER_TIMEOUT_INTERVALS, MAX_WORKERS, redis_source
        )
        self._terms = Terms(term)
        self._silent: str | None = None
        self._caveat: str | None = None
        metrics.declare_stream(self.name, self.workers)

    def sample(self) -> SourceReport:
        another_led = self._terms.another_led()
        if another_led is not None:
            log.info(
                "%s: leads again under fencing token %d (%d before): another replica led in "
                "between and counted what happened then; a new reader takes its baseline",
                self.name,
                another_led[1],
                another_led[0],
            )
            self.reader.close()
            self.reader = self.make_reader()
        # At the deadline the watchdog (sources/runner.py) severs the reader's sockets, which cannot stop
        # a read busy on CPU: that one stops between two records once it has spent the deadline
        # on CPU (a read late for a loaded host, not for its own work, still tells the truth).
        deadline = ReadDeadline.starting_now(self.deadline)
        signals = Signals(source=self.name, deadline=deadline)
        self.reader.read(signals)
        self._log_silence(signals.silent)
        self._log_caveat(signals.caveat)
        samples = signals.samples
        if self.redis_source is not None:
            samples = samples.with_label(SOURCE_LABEL, self.redis_source)
        heard = LifecycleRead(
            self.name, signals.tally, self.workers, signals.silent, signals.caveat
        )
        return SourceReport(samples, lifecycle=heard)

    def _log_silence(self, silent: str | None) -> None:
        """Say when the reader starts and stops hearing nothing, once each (the runner puts it
        on the health board and queue_exporter_native_silent while it lasts)."""
        if silent is not None and self._silent is None:
            log.warning("%s: %s", self.name, silent)
        elif silent is None and self._silent is not None:
            log.info("%s: hears its system again: every series is served", self.name)
        self._silent = silent

    def _log_caveat(self, caveat: str | None) -> None:
        """Say what the reader cannot tell when it starts or changes (the runner puts it on the
        health board while it lasts)."""
        if caveat is not None and caveat != self._caveat:
            log.warning("%s: %s", self.name, caveat)
        self._caveat = caveat

    def error_reason(self, error: Exception) -> str:
        if isinstance(error, ReaderError):
            return error.reason
        return redis_error_reason(error)

    def interrupt(self) -> None:
        self.reader.interrupt()

    def close(self) -> None:
        self.reader.close()


class CounterDeltas:
    """Increments from counts a system keeps as absolute numbers (per worker, per process).

    The first `update` only takes the baseline (what happened before the exporter started is
    not counted); after that an identity's increase is counted, a count that went down (the
    process restarted) counts from zero, a new identity counts in full (it started after the
    previous read), and identities no longer reported are forgotten. The counts become the
    baseline of the next update only once the read succeeded (Progress): a read that fails
    after its update loses none of its increments, the next one counts them.
    """

    def __init__(self) -> None:
        self._last: Progress[dict[Hashable, float]] = Progress()

    def update(
        self, counts: Mapping[Hashable, float], signals: Signals, dip: float = 0.0
    ) -> dict[Hashable, float]:
        """`dip`: how far a count may go down and come back, for a system that takes back what
        it counted for a moment (node-resque's retry plugin decrements stat:processed, then its
        worker increments it again): a count down by at most that much counts nothing and keeps
        its baseline (counted again once it passes where it was); one down further restarted."""
        last = self._last.at
        baseline = dict(counts)
        self._last.move(signals, baseline)
        if last is None:
            return {}
        deltas: dict[Hashable, float] = {}
        for identity, value in counts.items():
            before = last.get(identity)
            if before is not None and before - dip <= value < before:
                baseline[identity] = before
                continue
            delta = value if before is None or value < before else value - before
            if delta:
                deltas[identity] = delta
        return deltas
