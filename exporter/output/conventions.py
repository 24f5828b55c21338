"""The OpenTelemetry messaging semantic-convention families, read from the store's families.

Each is a catalog family under its convention's name (catalog.CONVENTIONS): the same series
with the attributes renamed and messaging.operation.name added, the same values and
exemplars. Built at each render or push from what the store returned, so the two names can
never disagree.
"""

from __future__ import annotations

from exporter.output.catalog import CONVENTIONS_BY_SOURCE, Convention, convention_spec
from exporter.output.samples import Series
from exporter.output.store import Family, HistogramFamily, NumberFamily


def with_conventions(families: list[Family], otlp: bool) -> list[Family]:
    """The families, then the convention families read from them: dotted names and
    attributes for OTLP, underscored for Prometheus."""
    derived = [
        _conventional(family, convention, otlp)
        for family in families
        for convention in CONVENTIONS_BY_SOURCE.get(family.spec.name, ())
    ]
    return families + derived


def _conventional(family: Family, convention: Convention, otlp: bool) -> Family:
    spec = convention_spec(family.spec, convention, otlp)
    operation = (convention.operation,)
    if isinstance(family, HistogramFamily):
        points = {labels + operation: point for labels, point in family.series.items()}
        slots = {labels + operation: kept for labels, kept in family.exemplars.items()}
        return HistogramFamily(spec, family.bounds, points, slots)
    return NumberFamily(
        spec,
        Series([{labels + operation: v for labels, v in family.series.items()}]),
        {labels + operation: kept for labels, kept in family.exemplars.items()},
    )
