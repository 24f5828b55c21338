"""Every queue system against its real library and workers, through one set of checks.

Per system an adapter (tests/conformance/adapters/) drives the library and reads its own API
as the truth; tests/conformance/checks.py compares every exporter run with it: every queue
found, depth per queue and state and their sums, due jobs, the ages of the oldest waiting and
longest running jobs, counters, workers, the sources up. Each system runs with the library's
defaults and the preset's defaults (no params); where a system needs params today, a second
run with them beside it, and the defaults run names what it misses as known gaps of issue 39.
Across a run's phases each signal operators page on (exporter.output.catalog.SIGNALS) is served or
named by the preset as not recorded (checks.unnamed_signals), and the defaults run's series
are the recording the alerts' table is proven on (alerts/recorded.py).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from alerts.recorded import record_or_compare
from exporter.runtime.app import App
from tests.conformance.adapters.base import Adapter, TruthAt
from tests.conformance.adapters.celery import CeleryAdapter
from tests.conformance.adapters.django_q import DjangoQAdapter
from tests.conformance.adapters.django_tasks import DjangoTasksAdapter
from tests.conformance.adapters.node_queues import BeeQueueAdapter, BullAdapter, BullMQAdapter
from tests.conformance.adapters.oban import ObanAdapter
from tests.conformance.adapters.pgqueuer import PgQueuerAdapter
from tests.conformance.adapters.postgres_queues import (
    GraphileWorkerAdapter,
    PgBossAdapter,
    ProcrastinateAdapter,
)
from tests.conformance.adapters.python_queues import (
    ArqAdapter,
    DramatiqAdapter,
    HueyAdapter,
    SaqAdapter,
)
from tests.conformance.adapters.resque import ResqueAdapter
from tests.conformance.adapters.rq import RqAdapter
from tests.conformance.adapters.sidekiq import SidekiqAdapter
from tests.conformance.adapters.taskiq import TaskiqAdapter
from tests.conformance.checks import ReadTimes, mismatches, served_signals, unnamed_signals
from tests.conftest import Series, scrape_series, wait_until_served_as_truth

ADAPTERS: list[type[Adapter]] = [
    RqAdapter,
    BullMQAdapter,
    BullAdapter,
    BeeQueueAdapter,
    SidekiqAdapter,
    ArqAdapter,
    DramatiqAdapter,
    HueyAdapter,
    SaqAdapter,
    PgBossAdapter,
    GraphileWorkerAdapter,
    ProcrastinateAdapter,
    CeleryAdapter,
    ResqueAdapter,
    TaskiqAdapter,
    DjangoQAdapter,
    PgQueuerAdapter,
    ObanAdapter,
    DjangoTasksAdapter,
]


@dataclass(frozen=True)
class Case:
    adapter: type[Adapter]
    version: Any

    def __str__(self) -> str:
        return f"{self.adapter.system}{'' if self.version is None else self.version}"


CASES = [Case(adapter, version) for adapter in ADAPTERS for version in adapter.versions]


def _served_as_truth(
    runs: dict[str, App], truth_at: TruthAt, reads: dict[str, ReadTimes], timeout: float
) -> None:
    """Every run of the exporter agrees with the phase's truth (each named in what differs)."""
    for name, app in runs.items():

        def differences(series: Series, at: float, name: str = name) -> list[str]:
            found = mismatches(series, truth_at(at), at, name, reads[name])
            return [f"{name}: {difference}" for difference in found]

        wait_until_served_as_truth(app, differences, timeout=timeout)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_served_as_the_library_says(
    case: Case, request: pytest.FixtureRequest, run_exporter: Any, tmp_path: Path
) -> None:
    redis_db = None
    if case.adapter.backend == "redis":
        redis_db = request.getfixturevalue("redis_db")
        backend = request.getfixturevalue("redis_url")
        where = {"redis_url": backend}
    else:
        backend = request.getfixturevalue("postgres_dsn")
        where = {"postgres_dsn": backend}
    adapter = case.adapter(case.version, backend, redis_db, tmp_path)
    phases = adapter.phases()
    served: list[Series] = []  # the defaults run's series: alerts/recorded.py
    try:
        first = next(phases)
        started = time.time()
        runs = {
            name: run_exporter(**where, preset=spec) for name, spec in adapter.variants().items()
        }
        reads = {name: ReadTimes(started) for name in runs}
        for phase in itertools.chain([first], phases):  # each phase, once it is set
            truth_at, only = phase if isinstance(phase, tuple) else (phase, tuple(runs))
            checked = {name: app for name, app in runs.items() if name in only}
            _served_as_truth(checked, truth_at, reads, adapter.timeout)
            if "defaults" in checked:  # what the alerts read, once the phase agreed
                served.append(scrape_series(runs["defaults"]))
        # the scenario played out: each signal served in some phase, or named
        not_recorded = runs["defaults"].config.not_recorded.get(adapter.system, {})
        signals = set().union(*(served_signals(scrape, adapter.system) for scrape in served))
        unnamed = unnamed_signals(signals, not_recorded, adapter.not_served(case.version))
        assert not unnamed, f"{case}: " + "; ".join(unnamed)
    finally:
        phases.close()
    stale = record_or_compare(str(case), adapter.system, "conformance", served)
    assert stale is None, stale
