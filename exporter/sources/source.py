"""What every source is to the runner: one cycle that returns what it saw, under a deadline.

A source only knows how to take one sample (`Source.sample`), which returns a `SourceReport`:
its series, the errors it counted, what its key groups matched, what a reader heard. runner.py
calls it on its interval and alone applies the report to the store, the health board and the
self-metrics; a source holds none of them, so a cycle that fails (raises) applies nothing.
`sample_within_deadline` is the one way a cycle is run, by the runner and by check-config
alike: past the source's deadline the backend calls it is blocked in are severed.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from exporter.core.logs import scrub
from exporter.output.health import KeyGroupReport
from exporter.output.samples import SampleSet
from exporter.sources.watchdog import Watchdog

if TYPE_CHECKING:  # the lifecycle loads the OpenTelemetry API: only with a reader's source
    from exporter.lifecycle.metrics import Tally, WorkerRegistry

log = logging.getLogger(__name__)

# The labels an error is counted under besides its source: (reason, system, pattern); a key
# group's carry its system and pattern, other errors leave them empty.
ErrorLabels = tuple[str, str, str]


@dataclass(slots=True)
class LifecycleRead:
    """What a native reader heard in one read, for the lifecycle families (EventMetrics)."""

    feed: str  # the reader's name: its self-metrics' `stream` label
    tally: Tally
    workers: WorkerRegistry  # the feed's registry, which names its Redis
    silent: str | None = None  # why it hears nothing from its system (framework.Signals)
    caveat: str | None = None  # what it hears but cannot tell


@dataclass(slots=True)
class SourceReport:
    """What one cycle saw; runner.py applies it whole once the cycle succeeded."""

    samples: SampleSet = field(default_factory=SampleSet)
    # queue_exporter_source_errors_total's increments: what the cycle could not read, by reason
    errors: Counter[ErrorLabels] = field(default_factory=Counter)
    key_groups: list[KeyGroupReport] | None = None  # a key sampler's: what each group matched
    reads: str | None = None  # how the source reads, when not every cycle (SourceStatus.reads)
    lifecycle: LifecycleRead | None = None  # a native reader's

    def count_error(self, reason: str, count: int = 1, system: str = "", pattern: str = "") -> None:
        self.errors[(reason, system, pattern)] += count


class Source(Protocol):
    name: str
    interval: float
    deadline: float  # seconds a cycle may take before it is interrupted and counts as failed

    def sample(self) -> SourceReport:
        """One full cycle; raises when the backend cannot be read."""
        ...

    def interrupt(self) -> None:
        """From another thread: make the cycle in progress fail now (sever its connections)."""
        ...

    def error_reason(self, error: Exception) -> str:
        """A short, bounded label value for an error (connection, timeout, auth, ...)."""
        ...

    def close(self) -> None: ...


class DeadlineExceeded(TimeoutError):
    """A cycle ran past its source's deadline and was cut off."""


def sample_within_deadline(source: Source) -> SourceReport:
    """One cycle under the source's deadline: past it, the backend calls it is blocked in are
    severed (source.interrupt) and DeadlineExceeded is raised."""
    watchdog = Watchdog(source.deadline, lambda: interrupt(source))
    try:
        with watchdog:
            return source.sample()
    except Exception as error:
        if watchdog.fired:
            message = f"no answer within its {source.deadline:g}s deadline"
            raise DeadlineExceeded(message) from error
        raise


def interrupt(source: Source) -> None:
    """source.interrupt(), whose failure is logged: it must not end a shutdown or a watchdog."""
    try:
        source.interrupt()
    except Exception as error:
        log.warning("source %s: interrupting its cycle failed: %s", source.name, describe(error))


def describe(error: Exception) -> str:
    # scrub: driver errors may quote a connection string (libpq quotes a URI it cannot parse)
    text = scrub(str(error)).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text[:300]}"
