"""What every source is to the runner: one cycle that returns what it saw, under a deadline.

A source only knows how to take one sample (`Source.sample`); runner.py calls it on its
interval. `sample_within_deadline` is the one way a cycle is run, by the runner and by
check-config alike: past the source's deadline the backend calls it is blocked in are severed.
"""

from __future__ import annotations

import logging
from typing import Protocol

from exporter.core.logs import scrub
from exporter.output.samples import SampleSet
from exporter.sources.watchdog import Watchdog

log = logging.getLogger(__name__)


class Source(Protocol):
    name: str
    interval: float
    deadline: float  # seconds a cycle may take before it is interrupted and counts as failed

    def sample(self) -> SampleSet:
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


def sample_within_deadline(source: Source) -> SampleSet:
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
