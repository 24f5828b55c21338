"""What an adapter is: the driver of one queue system's real library and workers, its scenario,
and its truth (the library's own API, mapped to the exporter's states: tests/conformance/checks.py).

`phases()` is a generator: it sets the scenario up, then yields, per phase, a function giving
the truth for a scrape made at a time (epoch seconds; most truths are read once, some at each
scrape), alone or with the names of the only runs it applies to; the test checks every run of the exporter against it, then resumes the generator for
the next phase. The generator's `finally` stops what it started.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from tests.conformance.checks import Truth
from tests.tools import missing

TruthAt = Callable[[float], Truth]
# a phase: its truth, or its truth and the only runs (variants) it applies to
Phase = TruthAt | tuple[TruthAt, tuple[str, ...]]
ROOT = Path(__file__).resolve().parents[3]


class Adapter:
    system: ClassVar[str]
    backend: ClassVar[str] = "redis"  # or "postgres"
    versions: ClassVar[tuple[Any, ...]] = (None,)
    # how long a phase may take to be served as the truth (seconds)
    timeout: ClassVar[float] = 20.0

    def __init__(self, version: Any, backend: str, redis_db: int | None, tmp_path: Path) -> None:
        """`backend`: the Redis URL or the PostgreSQL DSN of the test's own database."""
        self.version, self.backend_url, self.redis_db, self.tmp_path = (
            version,
            backend,
            redis_db,
            tmp_path,
        )

    def variants(self) -> dict[str, list[Any]]:
        """The exporter runs checked, by name: always the preset's defaults (no params) beside
        the library's defaults; an adapter adds a configured run where its system needs params
        today (then the defaults run names that as a gap)."""
        return {"defaults": [self.system]}

    def phases(self) -> Iterator[Phase]:
        raise NotImplementedError

    @classmethod
    def not_served(cls, version: Any) -> dict[str, str]:
        """Signals (exporter.output.catalog.SIGNALS) the system records that no phase of this run
        shows, each with why: a version the exporter does not read it from, a scenario that
        does not play it yet. A signal the system does not record at all is named in its
        preset's `not_recorded` instead (status page, check-config, docs/presets.md)."""
        return {}


def fixed(truth: Truth) -> TruthAt:
    """A truth read once."""
    return lambda _scraped_at: truth


def require(python: Path, module: str, what: str) -> Path:
    """The interpreter of a library's venv, or a skip naming it (a failure under CI)."""
    probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True, check=False)
    if not python.exists() or probe.returncode != 0:
        missing(f"{what}: no {module} at {python} (scripts/setup.sh installs it)")
    return python


def run_json(argv: list[Any], env: dict[str, str]) -> Any:
    """A driver's command, run with the library's interpreter; what it printed, as JSON (None
    for nothing)."""
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout) if done.stdout.strip() else None
