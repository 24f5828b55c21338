"""The live status line: events per second, queues and series, read where the status page reads
them (http/status_page.py): the exporter's own instruments and the metrics store, never a
parse of its own /metrics."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from exporter.output.store import Family, HistogramFamily

if TYPE_CHECKING:
    from prometheus_client.samples import Sample


class StatusLine:
    def __init__(
        self, own_samples: Callable[[], list[Sample]], families: Callable[[], list[Family]]
    ) -> None:
        """`own_samples`: the exporter's own instruments' samples (Telemetry.own_samples);
        `families`: the store's families as served (MetricStore.families)."""
        self.own_samples = own_samples
        self.families = families
        self._last = (time.monotonic(), 0.0)  # the first line shows the rate since the start

    def render(self, elapsed: float, backlog: int) -> str:
        own = self.own_samples()
        events = sum(sample.value for sample in own if sample.name == "queue_exporter_events_total")
        series = len(own)
        queues: set[tuple[str, str]] = set()
        for family in self.families():
            series += _samples_of(family)
            if family.spec.name == "queue_depth":
                system, queue = (family.spec.labels.index(name) for name in ("system", "queue"))
                queues.update(
                    (labels[system], labels[queue]) for labels, _ in family.series.items()
                )
        now = time.monotonic()
        rate = (events - self._last[1]) / max(now - self._last[0], 1e-3)
        self._last = (now, events)
        return (
            f"[{elapsed:6.0f}s] {rate:7.0f} lifecycle/s  {len(queues):4d} queues  "
            f"{series:6d} series  backlog {backlog}"
        )


def _samples_of(family: Family) -> int:
    """The lines the family takes on /metrics: a histogram's series, a line per bucket (+Inf
    too), _sum and _count."""
    if isinstance(family, HistogramFamily):
        return len(family.series) * (len(family.bounds) + 3)
    return len(family.series)
