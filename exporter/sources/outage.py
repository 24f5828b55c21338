"""What every reader of a backend does about its failures, whatever it reads: the sampling
sources' runner (sources/runner.py) and the event stream consumers (sources/streams/consumer.py).

A failure marks the reader down on the health board with its reason and duration, is
counted by reason, and is logged: the first failure of each outage at once, its repeats
rarely (outages are numbered, so a new one is never held back as a repeat of the last). The
next attempt waits a backoff (backoff.py). A success marks it up again, says once that it is
back, and starts the backoff over.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from exporter.core.logs import LogLimiter
from exporter.output.health import HealthBoard
from exporter.sources.backoff import Backoff


class Outage:
    """One reader's failures. `label` names it in the log ("source redis"); `consequence`
    says what a failure costs (", its series are withdrawn"), `back` what a success brings."""

    def __init__(
        self,
        name: str,
        label: str,
        log: logging.Logger,
        health: HealthBoard | None,
        count_error: Callable[[str, str], object] | None,
        ceiling: float,
        consequence: str = "",
        back: str = "",
    ) -> None:
        self.name, self.label, self.log = name, label, log
        self.health, self.count_error = health, count_error
        self.consequence, self.back = consequence, back
        self.backoff = Backoff(ceiling=ceiling)
        self.failing = False
        self.outages = 0
        self.retry_in = 0.0  # seconds to wait after the last failure
        self.failure_log = LogLimiter(log)
        if health is not None:
            health.expect(name)

    def succeeded(self, duration: float) -> None:
        """A successful attempt: up on the health board, the backoff started over."""
        self.backoff.succeeded()
        if self.health is not None:
            self.health.succeeded(self.name, duration)
        if self.failing:
            self.failing = False
            self.log.info("%s is back: %s", self.label, self.back)

    def failed(self, reason: str, duration: float, why: str) -> float:
        """A failed attempt: down on the health board, counted, logged; the seconds to wait
        before the next one."""
        if self.health is not None:
            self.health.failed(self.name, duration, reason)
        if self.count_error is not None:
            self.count_error(self.name, reason)
        if not self.failing:
            self.failing = True
            self.outages += 1
        self.failure_log.warning(
            (reason, self.outages),
            "%s failed (%s)%s: %s",
            self.label,
            reason,
            self.consequence,
            why,
        )
        self.retry_in = self.backoff.failed()
        return self.retry_in
