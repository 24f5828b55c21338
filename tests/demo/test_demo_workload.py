"""The demo's workload on a host too busy to tick on time: arrivals still follow the clock."""

from __future__ import annotations

import threading
import time

import pytest

from exporter.demo import sim_orchestrata
from exporter.demo.command import exporter_config
from exporter.demo.workload import TICK, Workload


def test_a_late_tick_brings_the_arrivals_of_the_time_it_was_late(
    redis_url: str, postgres_dsn: str
) -> None:
    """Each orchestrata tick is made three TICKs late (a loaded host): the time its arrivals
    cover adds up to at least the time the ticks took. With a fixed TICK a step, arrivals fell
    to a third while workers went on finishing by the clock, and the demo's under-provisioned
    backlog drained (under load, test_demo saw its priority lists' key group match nothing)."""
    work = Workload(redis_url, postgres_dsn, rate=20, seed=1)
    real_tick = work.orchestrata.tick
    steps: list[float] = []
    enough = threading.Event()

    def late_tick(now: float, dt: float) -> None:
        time.sleep(3 * TICK)
        real_tick(now, dt)
        steps.append(dt)
        if len(steps) >= 8:
            enough.set()

    work.orchestrata.tick = late_tick  # type: ignore[method-assign]
    stop = threading.Event()
    work.start(stop)
    try:
        assert enough.wait(120), "the workload did not tick 8 times"
    finally:
        stop.set()
        work.join()
        work.stop_events()
    later = steps[1:]  # the first covers one TICK; each later one at least the sleep before it
    assert sum(later) >= 3 * TICK * len(later), steps


@pytest.mark.fast
def test_the_exporter_reads_the_demos_event_stream_from_its_first_entry() -> None:
    """The workload writes before the exporter starts (seconds before on a loaded host): read
    from the stream's first entry, the invalid event staged once at 3 s is counted whenever the
    exporter's group is made (at $, load run 1 never served queue_exporter_events_invalid_total)."""
    raw = exporter_config("redis://127.0.0.1:6379/0", "dbname=x", "127.0.0.1:0", 1.0, "info")
    streams = {s["key"]: s for s in raw["sources"]["events"]["streams"]}
    assert streams[sim_orchestrata.EVENTS_STREAM]["start"] == "0"
