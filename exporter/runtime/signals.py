"""Signals noted by their handlers and acted on by the main thread, at its next look.

A Python signal handler runs in the main thread wherever that thread happens to be, also
inside a lock's critical section: threading.Event.wait() holds the event's lock around its
blocking wait, so an Event.set() from a handler that lands there waits on itself forever. And
a signal the kernel hands to another thread reaches the main thread only when it next runs
Python code, which a main thread parked in one untimed wait never does. So the handlers here
only note the signal, and the main thread looks for it every LOOK seconds.
"""

from __future__ import annotations

import signal
import time
from types import FrameType
from typing import overload

# Seconds between the main thread's looks for a signal received: how late a stop may begin.
LOOK = 0.05


class SignalInbox:
    """The signals `signums` received from now on, in order, each taken once."""

    def __init__(self, *signums: signal.Signals) -> None:
        self._received: list[int] = []
        for signum in signums:
            signal.signal(signum, self._note)

    def _note(self, signum: int, _: FrameType | None) -> None:
        self._received.append(signum)  # no lock: see the module's docstring

    @overload
    def wait(self) -> signal.Signals: ...
    @overload
    def wait(self, timeout: float) -> signal.Signals | None: ...

    def wait(self, timeout: float | None = None) -> signal.Signals | None:
        """The first signal received and not taken yet (taken now), waiting at most `timeout`
        seconds for one (None: as long as it takes); None when none came."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._received:
            left = LOOK if deadline is None else min(LOOK, deadline - time.monotonic())
            if left <= 0:
                return None
            time.sleep(left)
        return signal.Signals(self._received.pop(0))
