"""A scrape sees a sampled source whole: its series and its queue_exporter_source_up from the
same moment. Found by the suite under load: a cycle's series were served for a moment before
its source was marked up, and tests waiting for a series then asserting up==1 failed now and
then; a failure's withdrawal and its up==0 likewise."""

from __future__ import annotations

import threading
import time

import pytest

from exporter.output.catalog import BY_NAME
from exporter.output.health import HealthBoard
from exporter.output.telemetry import Telemetry
from exporter.sources.runner import SourceRunner
from exporter.sources.source import SourceReport
from tests.conftest import parse_exposition, value
from tests.plain_source import PlainSource

pytestmark = pytest.mark.fast  # no server (scripts/test.sh --fast)


class _Flapping(PlainSource):
    """Fails every other cycle, as fast as the runner turns: its series come and go."""

    name = "flapping"
    interval = 0.001

    def __init__(self) -> None:
        self.cycles = 0

    def sample(self) -> SourceReport:
        self.cycles += 1
        if self.cycles % 2:
            raise RuntimeError("down this cycle")
        report = SourceReport()
        report.samples.add(BY_NAME["queue_depth"], {"system": "s", "queue": "q"}, 1.0)
        return report


def test_a_scrape_never_shows_a_sources_series_beside_its_other_health():
    source, stop = _Flapping(), threading.Event()
    telemetry = Telemetry(HealthBoard())
    runner = SourceRunner(source, telemetry, stop)
    runner.start()
    seen = {0.0: 0, 1.0: 0}
    give_up = time.monotonic() + 120  # a bound on the loop, not an assertion
    try:
        while min(seen.values()) < 100 and time.monotonic() < give_up:
            series = parse_exposition(telemetry.render(False).decode())
            up = value(series, "queue_exporter_source_up", source="flapping")
            depth = value(series, "queue_depth", queue="q")
            if up is None:  # not reached yet
                continue
            assert (depth is not None) == (up == 1), (up, depth, source.cycles)
            seen[up] += 1
    finally:
        stop.set()
        runner.thread.join(timeout=10)
        telemetry.shutdown()
    assert min(seen.values()) >= 100, seen  # both states met, many times over
