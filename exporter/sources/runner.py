"""The loop every sampling source runs in: its own interval, failure handling, recovery.

A source only knows how to take one sample. The runner calls it on its interval (never
inside a scrape), publishes the snapshot, and while the source fails it withdraws the
source's series, marks it down, counts the error by reason and retries with a backoff
capped at the interval, so it is back within one interval of the backend returning.

Every cycle runs under a client-side deadline (the source's `deadline`): a backend that hangs
without closing its connections is interrupted when it passes, and the cycle fails with reason
`timeout` like any other failure. Shutdown interrupts the cycle in progress the same way, so a
hung backend never holds the exit.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from exporter.output.telemetry import Telemetry
from exporter.sources.outage import Outage
from exporter.sources.source import (
    DeadlineExceeded,
    Source,
    describe,
    interrupt,
    sample_within_deadline,
)

if TYPE_CHECKING:
    from exporter.leader.election import Leadership

log = logging.getLogger(__name__)

# How often a standing-by runner looks whether its replica became leader (a local flag).
STANDBY_POLL = 0.5
# The reason of a sampled source that is down because no replica can hold the leader lease.
LEASE_REASON = "leader_lease"


class SourceRunner:
    """Runs one source; with a Leadership, only while this replica leads (leader/election.py)."""

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
        self.lease_down = False  # reported down because no replica can hold the lease
        self.outage = Outage(
            source.name,
            f"source {source.name}",
            log,
            telemetry.health,
            telemetry.count_error,
            ceiling=source.interval,
            consequence=", its series are withdrawn",
            back="its series are served again",
        )
        self.thread = threading.Thread(target=self._loop, name=f"source:{source.name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def run_once(self) -> bool:
        """Take one sample and publish it; True when it succeeded."""
        name = self.source.name
        fence = self.leadership.fence() if self.leadership is not None else None
        token = self.leadership.token() if self.leadership is not None else None
        started = time.monotonic()
        try:
            samples = sample_within_deadline(self.source)
        except Exception as error:
            if self.stop.is_set():  # interrupted by the shutdown: not a failure of the backend
                log.debug("source %s: cycle interrupted by shutdown", name)
                return False
            if isinstance(error, DeadlineExceeded):
                self._failed("timeout", time.monotonic() - started, str(error))
            else:
                reason = self.source.error_reason(error)
                self._failed(reason, time.monotonic() - started, describe(error))
            return False
        duration = time.monotonic() - started
        if self.leadership is not None and self.leadership.token() != token:
            # Fencing: the lease changed hands during the cycle; the new leader publishes.
            log.info("source %s: lease lost during the cycle, its sample is dropped", name)
            self.stand_by()
            return True
        with self.telemetry.source_change:
            self.telemetry.publish(name, samples, fence)
            self.outage.succeeded(duration)
        self.lease_down = False
        log.debug("source %s sampled %d series in %.3fs", name, len(samples), duration)
        return True

    def interrupt(self) -> None:
        """Shutdown: the cycle in progress, if any, fails now instead of waiting its deadline."""
        interrupt(self.source)

    def _failed(self, reason: str, duration: float, why: str) -> None:
        """Withdraw the source's series (never served stale), mark it down, count and log why."""
        with self.telemetry.source_change:
            self.telemetry.withdraw(self.source.name)
            self.outage.failed(reason, duration, why)

    def _loop(self) -> None:
        interval = self.source.interval
        try:
            while not self.stop.is_set():
                if self.leadership is not None and not self.leadership.is_leader():
                    problem = self.leadership.problem()
                    if problem is None:
                        self.stand_by()
                    else:
                        self.lease_unavailable(problem)
                    self.stop.wait(min(interval, STANDBY_POLL))
                    continue
                self.standing_by = False
                cycle_start = time.monotonic()
                if self.run_once():
                    # A cycle that overran its interval is not made up for: the next one starts
                    # at the next interval boundary, so slow backends never see cycles pile up.
                    elapsed = time.monotonic() - cycle_start
                    wait = interval - (elapsed % interval)
                else:
                    wait = self.outage.retry_in
                self._wait_leading(wait)
        finally:
            self.source.close()

    def _wait_leading(self, seconds: float) -> None:
        """Wait for the next cycle; with leader election, end the wait early when the lease is
        lost, so the source stands by (or is down) within STANDBY_POLL instead of an interval.
        (Its series stop being served at once anyway: the render checks the lease.)"""
        if self.leadership is None:
            self.stop.wait(seconds)
            return
        end = time.monotonic() + seconds
        while not self.stop.is_set() and self.leadership.is_leader():
            left = end - time.monotonic()
            if left <= 0:
                return
            self.stop.wait(min(left, STANDBY_POLL))

    def stand_by(self) -> None:
        """Another replica samples: serve none of this source's series, and do not fail."""
        if not self.standing_by:
            self.standing_by, self.lease_down = True, False
            with self.telemetry.source_change:
                self.telemetry.withdraw(self.source.name)
                self.telemetry.health.standby(self.source.name)

    def lease_unavailable(self, problem: str) -> None:
        """The lease's Redis gives no answer, so no replica may be sampling: this source is down
        (reason leader_lease, source_up 0, /readyz 503), its series withdrawn. Leader election
        logs the cause (leader/election.py); counted once per outage."""
        if self.lease_down:
            return
        self.lease_down, self.standing_by = True, False
        name = self.source.name
        with self.telemetry.source_change:
            self.telemetry.withdraw(name)
            self.telemetry.count_error(name, LEASE_REASON)
            self.telemetry.health.lease_unavailable(name, f"{LEASE_REASON}: {problem}")
