"""References for timing assertions, measured in the test that asserts.

A duration a test bounds (a takeover, a timeout honoured) is made of what the code promises
(a lease's TTL, a socket timeout) and of how late this machine runs the processes involved. The
second part is not a constant: on a loaded machine every wake-up comes late. So a bound is the
promise plus a margin measured now, in the same test, never an absolute number alone.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any


def wake_up_lag(probe: float = 0.02, samples: int = 10) -> float:
    """How late this machine wakes a sleeping thread now: the worst overshoot of `samples`
    sleeps of `probe` seconds. A bound made of k wake-ups allows k times this."""
    worst = 0.0
    for _ in range(samples):
        started = time.monotonic()
        time.sleep(probe)
        worst = max(worst, time.monotonic() - started - probe)
    return worst


def time_until(
    condition: Callable[[], Any], timeout: float = 30.0, interval: float = 0.02
) -> float:
    """Seconds until condition() holds (polled every `interval`); AssertionError past timeout."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)
    return time.monotonic() - started


def process_cost() -> float:
    """Seconds a Python process importing the exporter takes to start and exit now: what the
    machine's load adds to a bound over a process's takeover or stop (about 0.3 s when idle)."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import exporter.runtime.app"], check=True, timeout=120)
    return time.monotonic() - started
