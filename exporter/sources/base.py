"""The loop every sampling source runs in: its own interval, failure handling, recovery.

A source only knows how to take one sample. The runner calls it on its interval (never
inside a scrape), publishes the snapshot, and while the source fails it withdraws the
source's series, marks it down, counts the error by reason and retries with a backoff
capped at the interval, so it is back within one interval of the backend returning.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Protocol

from exporter.logs import redact
from exporter.samples import SampleSet
from exporter.telemetry import Telemetry

if TYPE_CHECKING:
    from exporter.leader import Leadership

log = logging.getLogger(__name__)

FIRST_RETRY = 0.5
# How often a standing-by runner looks whether its replica became leader (a local flag).
STANDBY_POLL = 0.5


class Source(Protocol):
    name: str
    interval: float

    def sample(self) -> SampleSet:
        """One full cycle; raises when the backend cannot be read."""
        ...

    def error_reason(self, error: Exception) -> str:
        """A short, bounded label value for an error (connection, timeout, auth, ...)."""
        ...

    def close(self) -> None: ...


class SourceRunner:
    """Runs one source; with a Leadership, only while this replica leads (leader.py)."""

    def __init__(
        self,
        source: Source,
        telemetry: Telemetry,
        stop: threading.Event,
        leadership: Leadership | None = None,
    ) -> None:
        self.source = source
        self.telemetry = telemetry
        self.stop = stop
        self.leadership = leadership
        self.standing_by = False
        telemetry.health.expect(source.name)
        self.thread = threading.Thread(target=self._loop, name=f"source:{source.name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def run_once(self) -> bool:
        """Take one sample and publish it; True when it succeeded."""
        name = self.source.name
        token = self.leadership.token() if self.leadership is not None else None
        started = time.monotonic()
        try:
            samples = self.source.sample()
        except Exception as error:
            duration = time.monotonic() - started
            reason = self.source.error_reason(error)
            self.telemetry.withdraw(name)
            self.telemetry.count_error(name, reason)
            self.telemetry.health.failed(name, duration, reason)
            log.warning("source %s failed (%s): %s", name, reason, _describe(error))
            return False
        duration = time.monotonic() - started
        if self.leadership is not None and self.leadership.token() != token:
            # Fencing: the lease changed hands during the cycle; the new leader publishes.
            log.info("source %s: lease lost during the cycle, its sample is dropped", name)
            self.stand_by()
            return True
        self.telemetry.publish(name, samples)
        self.telemetry.health.succeeded(name, duration)
        log.debug("source %s sampled %d series in %.3fs", name, len(samples), duration)
        return True

    def _loop(self) -> None:
        interval = self.source.interval
        retry = FIRST_RETRY
        try:
            while not self.stop.is_set():
                if self.leadership is not None and not self.leadership.is_leader():
                    self.stand_by()
                    self.stop.wait(min(interval, STANDBY_POLL))
                    continue
                self.standing_by = False
                cycle_start = time.monotonic()
                if self.run_once():
                    retry = FIRST_RETRY
                    # A cycle that overran its interval is not made up for: the next one starts
                    # at the next interval boundary, so slow backends never see cycles pile up.
                    elapsed = time.monotonic() - cycle_start
                    wait = interval - (elapsed % interval)
                else:
                    wait = min(retry, interval)
                    retry = min(retry * 2, interval)
                self.stop.wait(wait)
        finally:
            self.source.close()

    def stand_by(self) -> None:
        """Another replica samples: serve none of this source's series, and do not fail."""
        if not self.standing_by:
            self.standing_by = True
            self.telemetry.withdraw(self.source.name)
            self.telemetry.health.standby(self.source.name)


def _describe(error: Exception) -> str:
    # redact: driver errors may quote a connection string (libpq quotes a URI it cannot parse)
    text = redact(str(error)).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text[:300]}"
