"""A source a test drives cycle by cycle, each cycle's report applied as its runner applies it
(sources/runner.py apply_report): what it counted, its series and what it tells the health
board are then served, as the exporter serves them."""

from __future__ import annotations

from exporter.lifecycle.metrics import EventMetrics
from exporter.output.telemetry import Telemetry
from exporter.sources.runner import apply_report
from exporter.sources.source import Source, SourceReport


class AppliedSource:
    def __init__(
        self, source: Source, telemetry: Telemetry, events: EventMetrics | None = None
    ) -> None:
        self.source = source
        self.telemetry = telemetry
        self.events = events
        self.name, self.interval, self.deadline = source.name, source.interval, source.deadline

    def sample(self) -> SourceReport:
        report = self.source.sample()
        apply_report(self.telemetry, self.events, self.name, report)
        return report

    def interrupt(self) -> None:
        self.source.interrupt()

    def error_reason(self, error: Exception) -> str:
        return self.source.error_reason(error)

    def close(self) -> None:
        self.source.close()
