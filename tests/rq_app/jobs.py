"""The functions RQ workers run in the tests."""

from __future__ import annotations

import time


def sleep_for(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def fail_after(seconds: float) -> None:
    time.sleep(seconds)
    raise RuntimeError("failing on purpose")
