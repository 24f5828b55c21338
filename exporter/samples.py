"""A snapshot of sampled values: what one source cycle publishes to telemetry at once."""

from __future__ import annotations

from collections.abc import Iterator

from exporter.catalog import MetricSpec

LabelValues = tuple[str, ...]


class SampleSet:
    """Values keyed by metric and label values, combined when two keys map to one series.

    How they combine is the metric's (catalog.MetricSpec.combine).
    """

    def __init__(self) -> None:
        self._values: dict[MetricSpec, dict[LabelValues, float]] = {}

    def add(self, spec: MetricSpec, labels: dict[str, str], value: float) -> None:
        """Add a sample; labels the spec does not name are ignored, missing ones are ""."""
        self.add_labelled(spec, tuple(labels.get(name, "") for name in spec.labels), value)

    def add_labelled(self, spec: MetricSpec, label_values: LabelValues, value: float) -> None:
        """Like add, with the label values already in spec.labels order (SQL rows' hot path)."""
        series = self._values.setdefault(spec, {})
        previous = series.get(label_values)
        if previous is None:
            series[label_values] = value
        elif spec.combine == "sum":
            series[label_values] = previous + value
        else:
            series[label_values] = max(previous, value)

    def add_series(self, spec: MetricSpec, series: dict[LabelValues, float]) -> None:
        """Add many samples at once (label values in spec.labels order): whole SQL columns."""
        existing = self._values.get(spec)
        if not existing:
            self._values[spec] = series
        elif existing.keys().isdisjoint(series):
            existing.update(series)
        else:
            for label_values, value in series.items():
                self.add_labelled(spec, label_values, value)

    def metrics(self) -> Iterator[tuple[MetricSpec, dict[LabelValues, float]]]:
        yield from self._values.items()

    def __len__(self) -> int:
        return sum(len(series) for series in self._values.values())
