"""What `check-config --connect` asks of each source kind: reach its backend once, print what
serve would find there, and name what is wrong (commands/check_config.py runs them in turn).

Each kind's probe lives with the kind (redis_keys/probe.py, streams/probe.py, ...) and runs
the code serve runs, so what it prints is what /metrics would show.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exporter.core.logs import scrub

Echo = Callable[[str], None]


@dataclass
class Findings:
    """What the probe found wrong: failures (a backend that did not answer) and warnings
    (what answered, but not as the configuration means)."""

    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Targets (masked Redis URLs, PostgreSQL DSNs) that did not answer: named once, not tried
    # again by the later parts
    unreachable: set[str] = field(default_factory=set)

    def add(self, other: Findings) -> None:
        self.failures += other.failures
        self.warnings += other.warnings
        self.unreachable |= other.unreachable


@dataclass(frozen=True)
class ProbeContext:
    echo: Echo  # where each line goes
    sample_interval: float
    # Redis targets named FAILED by an earlier kind: not tried again
    unreachable: set[str] = field(default_factory=set)


def text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def first_line(error: BaseException) -> str:
    """An error's first line, secrets scrubbed, at most 300 characters."""
    lines = scrub(str(error)).strip().splitlines()
    return lines[0][:300] if lines else type(error).__name__
