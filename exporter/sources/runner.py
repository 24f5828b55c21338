"""The loop every sampling source runs in: its own interval, failure handling, recovery.

A source only knows how to take one sample. The runner calls it on its interval (never
inside a scrape) and applies what the cycle reported (source.SourceReport): this module is
the one place a source's report reaches the store, the health board and the self-metrics
(`apply_report`). While the source fails it withdraws the source's series, marks it down,
counts the error by reason and retries with a backoff capped at the interval, so it is back
within one interval of the backend returning.

A failed cycle reports nothing: its failure is counted under its reason, and what it counted
before it failed (keys of the wrong type, refused records) is not, since the next cycle meets
the same keys and records again. A cycle whose lease passed to another replica meanwhile
(fencing) has its series dropped, but its counts stand: a reader's window has moved past the
records it counted, and no replica counts them again.

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
    SourceReport,
    describe,
    interrupt,
    sample_within_deadline,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from exporter.leader.election import Leadership
    from exporter.lifecycle.metrics import EventMetrics

log = logging.getLogger(__name__)

# How often a standing-by runner looks whether its replica became leader (a local flag).
STANDBY_POLL = 0.5
# The reason of a sampled source that is down because no replica can hold the leader lease.
LEASE_REASON = "leader_lease"


class SourceRunner:
    """Runs one source; with a Leadership, only while this replica leads (leader/election.py).
    `events`: the EventMetrics a native reader's lifecycle updates go to."""

    def __init__(
        self,
        source: Source,
        telemetry: Telemetry,
        stop: threading.Event,
        leadership: Leadership | None = None,
        events: EventMetrics | None = None,
    ) -> None:
        self.source = source
        self.telemetry = telemetry
        self.events = events
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
            report = sample_within_deadline(self.source)
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
            apply_counts(self.telemetry, self.events, name, report)
            self.stand_by()
            return True
        apply_report(
            self.telemetry,
            self.events,
            name,
            report,
            fence,
            lambda: self.outage.succeeded(duration),
        )
        self.lease_down = False
        log.debug("source %s sampled %d series in %.3fs", name, len(report.samples), duration)
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


def apply_report(
    telemetry: Telemetry,
    events: EventMetrics | None,
    source: str,
    report: SourceReport,
    fence: Callable[[], bool] | None = None,
    succeeded: Callable[[], None] | None = None,
) -> None:
    """A cycle's report, applied: its counts, then its series and what it tells the health
    board, together (`succeeded`, the source marked up, among them): no render sees a source's
    new series beside its old status, or its old series beside the new."""
    apply_counts(telemetry, events, source, report)
    with telemetry.source_change:
        telemetry.publish(source, report.samples, fence)
        if report.key_groups is not None:
            telemetry.health.report_key_groups(source, report.key_groups)
        if report.reads is not None:
            telemetry.health.describe_reads(source, report.reads)
        if succeeded is not None:
            succeeded()


def apply_counts(
    telemetry: Telemetry, events: EventMetrics | None, source: str, report: SourceReport
) -> None:
    """What a cycle counted: its errors by reason, a native reader's lifecycle updates."""
    for (reason, system, pattern), count in report.errors.items():
        telemetry.count_error(source, reason, count, system, pattern)
    read = report.lifecycle
    if read is None:
        return
    if events is None:
        raise ValueError(f"source {source} reports lifecycle updates: its runner needs events")
    events.record(read.feed, read.tally, read.workers)
    events.report_silence(read.feed, read.workers, read.silent)
    events.report_caveat(read.feed, read.caveat)
