"""A deadline for a call that may hang: when it passes, the call is interrupted from outside.

A socket timeout bounds one read, not a cycle of many, and a server that hangs while its
kernel still answers TCP (a stopped process, a stuck proxy or load balancer) defeats TCP
keepalives and tcp_user_timeout alike: only the client can notice, by the clock. So a cycle
runs under a Watchdog. When its deadline passes, `interrupt` runs in the watchdog's thread and
severs the connections the cycle is blocked on, so the blocked call fails at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType


class Watchdog:
    """`with Watchdog(seconds, interrupt) as watchdog:` ... `watchdog.fired` afterwards."""

    def __init__(self, seconds: float, interrupt: Callable[[], None]) -> None:
        self.seconds = seconds
        self.fired = False
        self._interrupt = interrupt
        self._lock = threading.Lock()
        self._done = False
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def __enter__(self) -> Watchdog:
        self._timer.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()

    def _fire(self) -> None:
        with self._lock:
            if self._done:  # the call ended just in time
                return
            self.fired = True
        self._interrupt()
