"""Signals noted by the interpreter and acted on by the main thread, which sleeps until one comes.

A Python signal handler runs in the main thread wherever that thread happens to be, also
inside a lock's critical section: threading.Event.wait() holds the event's lock around its
blocking wait, so an Event.set() from a handler that lands there waits on itself forever. And
a signal the kernel hands to another thread reaches the main thread only when it next runs
Python code, which a main thread parked in an untimed wait never does. So the handlers here do
nothing: the interpreter's own C handler writes each signal's number to a pipe
(signal.set_wakeup_fd) from whichever thread the kernel picked, and the main thread waits on
that pipe. It wakes only for a signal (or its timeout): polling every 50 ms instead cost an
idle `serve` 0.8-1.0 ms of CPU a second, nearly all it used at rest (bench/at_rest.py).
"""

from __future__ import annotations

import os
import select
import signal
import time
from types import FrameType
from typing import overload


def _nothing(_signum: int, _frame: FrameType | None) -> None:
    """The Python-level handler: the signal's number is already in the wakeup pipe."""


class SignalInbox:
    """The signals `signums` received from now on, in order, each taken once. Made in the
    main thread, once a process: the wakeup pipe is the interpreter's one."""

    def __init__(self, *signums: signal.Signals) -> None:
        self._wanted = {int(signum) for signum in signums}
        self._received: list[int] = []
        self._pipe, write = os.pipe()
        os.set_blocking(self._pipe, False)
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        for signum in signums:
            signal.signal(signum, _nothing)

    @overload
    def wait(self) -> signal.Signals: ...
    @overload
    def wait(self, timeout: float) -> signal.Signals | None: ...

    def wait(self, timeout: float | None = None) -> signal.Signals | None:
        """The first signal received and not taken yet (taken now), waiting at most `timeout`
        seconds for one (None: as long as it takes); None when none came."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._received:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            readable, _, _ = select.select([self._pipe], [], [], left)
            if readable:
                self._received += [n for n in os.read(self._pipe, 512) if n in self._wanted]
        return signal.Signals(self._received.pop(0))
