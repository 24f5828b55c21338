"""The live status line: events per second, queues and series, read from the exporter itself."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families


class StatusLine:
    def __init__(self, render: Callable[[bool], bytes]) -> None:
        self.render_metrics = render
        self._last = (time.monotonic(), 0.0)  # the first line shows the rate since the start

    def render(self, elapsed: float, backlog: int) -> str:
        series = 0
        events = 0.0
        queues: set[tuple[str, str]] = set()
        for family in text_string_to_metric_families(self.render_metrics(False).decode()):
            series += len(family.samples)
            for sample in family.samples:
                if sample.name == "queue_exporter_events_total":
                    events += sample.value
                elif sample.name == "queue_depth":
                    queues.add((sample.labels.get("system", ""), sample.labels.get("queue", "")))
        now = time.monotonic()
        rate = (events - self._last[1]) / max(now - self._last[0], 1e-3)
        self._last = (now, events)
        return (
            f"[{elapsed:6.0f}s] {rate:7.0f} lifecycle/s  {len(queues):4d} queues  "
            f"{series:6d} series  backlog {backlog}"
        )
