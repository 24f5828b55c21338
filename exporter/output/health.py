"""What each source last reported: read by /readyz, the status page and the self-metrics.

Besides up/down, the Redis key sampler reports per key group what its last cycle found
(keys matched, series, errors by reason): "no jobs" and "not looking at the right keys" both
read as an absent queue_depth, and these facts are how an operator tells them apart.

A sampler standing by on a follower replica (leader election, leader/election.py) is not failing:
it counts as up for /readyz, and it reports no source_up, duration or last-success series,
so neither readiness nor the source-down alert fires on followers. A sampler whose replica gets
no answer from the lease's Redis is another matter (no replica may be sampling): it is down,
and /readyz names the lease as the reason.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class SourceStatus:
    up: bool = False
    ever_succeeded: bool = False
    last_success: float | None = None
    last_duration: float | None = None
    last_error: str | None = None
    standby: bool = False
    # Why a native reader hears nothing from its system while its backend answers (workers
    # idle, scaled to zero, started without events): up and ready, some series left out.
    silent: str | None = None
    # What a native reader hears but cannot tell (Celery: tasks whose queue it could not
    # learn), while it serves every series it can: a warning, never a fault.
    caveat: str | None = None
    lease_down: bool = False  # down because the leader lease cannot be held (leader/election.py)
    # How the source reads, where that is not every cycle (a costly query on a longer
    # interval, and why): said, so that a value that moves slowly is not taken for a fault.
    reads: str | None = None


@dataclass(frozen=True)
class KeyGroupReport:
    """What one key group found in its source's last completed cycle."""

    source: str
    system: str
    pattern: str
    type: str
    keys_matched: int  # keys that exist: scanned, or built from values and present
    queues: int
    series: int
    errors: dict[str, int] = field(default_factory=dict)  # by reason, in that cycle
    last_warning: str | None = None  # the last problem named in that cycle, in plain words
    example_keys: tuple[str, ...] = ()  # the first few keys matched
    keys_named: int = 0  # keys built from the group's values, present or not
    failed_keys: tuple[tuple[str, str], ...] = ()  # the first few keys that failed: (reason, key)
    # Values found in Redis (queues whose set member or key exists) that the group's `select`
    # leaves out: queues present and not counted (check-config warns about them).
    unselected: tuple[str, ...] = ()
    # The first few queue_depth label sets (system, queue, priority, state) the group gave.
    example_series: tuple[tuple[str, ...], ...] = ()


class HealthBoard:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sources: dict[str, SourceStatus] = {}
        self._key_groups: dict[str, list[KeyGroupReport]] = {}
        self._building = False

    def building(self, building: bool) -> None:
        """While the sources are being built, behind an HTTP listener already serving, none
        has declared itself yet: the process is not ready, whatever the sources say."""
        with self._lock:
            self._building = building

    def expect(self, source: str) -> None:
        """Declare an enabled source: it is not ready until its first success."""
        with self._lock:
            self._sources.setdefault(source, SourceStatus())

    def succeeded(self, source: str, duration: float) -> None:
        with self._lock:
            status = self._sources.setdefault(source, SourceStatus())
            status.up = status.ever_succeeded = True
            status.standby = status.lease_down = False
            status.last_success = time.time()
            status.last_duration = duration
            status.last_error = None

    def failed(self, source: str, duration: float, error: str) -> None:
        with self._lock:
            status = self._sources.setdefault(source, SourceStatus())
            status.up = status.standby = status.lease_down = False
            status.last_duration = duration
            status.last_error = error
            self._key_groups.pop(source, None)  # withdrawn like its series, never stale

    def standby(self, source: str) -> None:
        """Another replica samples this source: ready, and no last error of ours to show."""
        with self._lock:
            status = self._sources.setdefault(source, SourceStatus())
            status.up = status.standby = True
            status.lease_down = False
            status.last_error = None
            self._key_groups.pop(source, None)  # the leader reports them

    def lease_unavailable(self, source: str, why: str) -> None:
        """No replica can hold the leader lease: `source`, sampled under it, is down for that."""
        with self._lock:
            status = self._sources.setdefault(source, SourceStatus())
            status.up = status.standby = False
            status.lease_down = True
            status.last_error = why
            self._key_groups.pop(source, None)

    def silence(self, source: str, why: str | None) -> None:
        """A reader that hears nothing says why (None: it hears again); readiness is not
        touched: idle workers are not a fault."""
        with self._lock:
            status = self._sources.get(source)  # a source the runner declared, never a new one
            if status is not None:
                status.silent = why

    def caveat(self, source: str, why: str | None) -> None:
        """What a reader hears but cannot tell (None: nothing); readiness is not touched."""
        with self._lock:
            status = self._sources.get(source)
            if status is not None:
                status.caveat = why

    def describe_reads(self, source: str, reads: str) -> None:
        """How `source` reads when not every cycle (SourceStatus.reads)."""
        with self._lock:
            self._sources.setdefault(source, SourceStatus()).reads = reads

    def report_key_groups(self, source: str, reports: list[KeyGroupReport]) -> None:
        """Replace what `source` reported about its key groups with its latest cycle's."""
        with self._lock:
            self._key_groups[source] = list(reports)

    def key_groups(self) -> list[KeyGroupReport]:
        with self._lock:
            return [report for reports in self._key_groups.values() for report in reports]

    def snapshot(self) -> dict[str, SourceStatus]:
        with self._lock:
            return {name: SourceStatus(**vars(status)) for name, status in self._sources.items()}

    def ready(self) -> bool:
        return self.not_ready_reason() is None

    def not_ready_reason(self) -> str | None:
        """None when ready, else why not in a few fixed words (safe to show without
        credentials: no source names or errors, which /readyz gives to an authorised client)."""
        with self._lock:
            if self._building:
                return "starting: the sources are being built"
            down = [status for status in self._sources.values() if not status.up]
        if not down:
            return None
        if any(status.lease_down for status in down):
            return "no replica can hold the leader lease: the sampled sources are down"
        if any(not status.ever_succeeded and status.last_error is None for status in down):
            return "a source has not finished its first cycle"
        return "a source is down"
